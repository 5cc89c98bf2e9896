#!/usr/bin/env bash
# 4-bit points on the SST-2 storage-accuracy curve, beside float16 from the same dump
# (benchmarks/evidence/sweep_sst2/sweep_sst2.sh's recipe: MiniLM-L6 teacher, 4,000 training rows dumped at 3,32,1,
# bert2 student, 1 + 1 epochs at lr 1e-4, batch 32, 2 seeds, all 872 dev examples).
#
# Usage: bash benchmarks/evidence/sweep_sst2_4bit/sweep_sst2_4bit.sh [DATA_DIR]
#   TEACHER=path  reuse a fine-tuned teacher (default: the one sweep_sst2.sh trains)
#   WORK=path     stores and run folders (large, not committed); results land in benchmarks/evidence/sweep_sst2_4bit/
#   WORKERS=n     runs at once (default 2)
# Budget: 12 runs of about 4 minutes each on 2 free cores (2 workers): about 25 minutes. The mxfp4
# runs come last (a second sweep into the same table; finished runs are skipped), so a sweep cut
# short still has the int4 and float16 points of both seeds.
set -euo pipefail

DATA_DIR="${1:-${HSK_DATA_DIR:-../shared/data/glue}}"
WORK="${WORK:-runs/sweep_sst2}"
TEACHER="${TEACHER:-$WORK/teacher}"
OUT="benchmarks/evidence/sweep_sst2_4bit"
export HF_HUB_OFFLINE=1
mkdir -p "$WORK" "$OUT"

if ! hsk verify "$WORK/sst2-3_32_1.zarr" >/dev/null 2>&1; then
  hsk dump --task sst2 --teacher "$TEACHER" --data-dir "$DATA_DIR" --limit 4000 \
    --student-layers 2 --config 3,32,1.0 --values float16 --no-progress --out "$WORK/sst2-3_32_1.zarr"
fi

for configs in '1,9,0.1;1,9,0.1@int4;3,8,0.2;3,8,0.2@int4' '1,9,0.1@mxfp4;3,8,0.2@mxfp4'; do
  hsk sweep --source "$WORK/sst2-3_32_1.zarr" --configs "$configs" \
    --students bert2 --seeds 0,1 --values float16 \
    --epochs-hsk 1 --epochs-pred 1 --lr-hsk 1e-4 --lr-pred 1e-4 --batch-size 32 \
    --data-dir "$DATA_DIR" --work-dir "$WORK/sweep_4bit" --results "$OUT/results.parquet" \
    --workers "${WORKERS:-2}"
done

hsk report "$OUT/results.parquet" --out "$OUT/report"
