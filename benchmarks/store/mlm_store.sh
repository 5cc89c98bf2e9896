#!/usr/bin/env bash
# LightPAFF's MLM store on SST-2 sentences: what it costs per masked token (issue 10, LightPAFF 1-2).
#
#   1. the corpus: the first ROWS SST-2 training sentences, one per line (labels dropped)
#   2. hsk teacher --objective mlm: an MLM head (decoder tied to the word embeddings) on the offline
#      MiniLM-L6-H384 encoder, trained MLM_EPOCHS (3) epochs on that corpus at MLM_LR (5e-4) with the top
#      MLM_TRAIN_LAYERS (2) layers (1 epoch at 1e-4 with 1 layer left it at 3.9% held-out accuracy)
#   3. hsk dump --objective mlm --top-k 64: BERT masking (15%; 80/10/10, seed 0), top-64 + lse
#   4. hsk info: bytes per masked token vs Megatron's top-128 fp16 (~528 B) and DistillKit (114-300 B)
#
# Usage: bash benchmarks/store/mlm_store.sh [DATA_DIR]   (default ../shared/data/glue)
set -euo pipefail
DATA_DIR="${1:-${HSK_DATA_DIR:-../shared/data/glue}}"
WORK="${WORK:-runs/mlm_sst2}"
ROWS="${ROWS:-4000}"
export HF_HUB_OFFLINE=1
mkdir -p "$WORK" benchmarks/store/results

sed -n "2,$((ROWS + 1))p" "$DATA_DIR/SST-2/train.tsv" | cut -f1 > "$WORK/corpus.txt"
if [ ! -f "$WORK/teacher/hsk_teacher.json" ]; then
  hsk teacher --objective mlm --base minilm --text-file "$WORK/corpus.txt" \
    --train-layers "${MLM_TRAIN_LAYERS:-2}" --epochs "${MLM_EPOCHS:-3}" --lr "${MLM_LR:-5e-4}" \
    --batch-size 32 --max-length 64 --no-progress --out "$WORK/teacher"
fi
if ! hsk verify "$WORK/corpus.zarr" >/dev/null 2>&1; then
  hsk dump --objective mlm --text-file "$WORK/corpus.txt" --teacher "$WORK/teacher" --top-k 64 \
    --max-length 64 --no-progress --out "$WORK/corpus.zarr"
fi
hsk info "$WORK/corpus.zarr" | tee benchmarks/store/results/mlm_store_info.txt
