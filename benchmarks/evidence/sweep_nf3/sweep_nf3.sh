#!/usr/bin/env bash
# nf3 (3-bit) against float16, int4 and mxfp4 at 3,8,0.2 on SST-2 and MRPC, 3 seeds (issue 38): the
# student-accuracy evidence for docs/guide/adding-a-codec.md. Run on 2026-11-26 (SST-2 on ff67a8c, MRPC on
# 062ceb0; results in benchmarks/evidence/sweep_nf3/): about 30 runs of 2-8 minutes each on two shared CPU cores.
# Recipe as benchmarks/evidence/sweep_sst2_4bit/sweep_sst2_4bit.sh (MiniLM-L6 teacher, dump at 3,32,1, bert2 student, 1 + 1 epochs
# at lr 1e-4, batch 32); each task's stores are derived from one float16 dump.
#
# Usage: bash benchmarks/evidence/sweep_nf3/sweep_nf3.sh [DATA_DIR]
#   TEACHER_SST2=path TEACHER_MRPC=path   fine-tuned teachers (default: runs/teacher-<task>, made by
#                                          `hsk teacher --task <task> --base <MiniLM-L6> --out ...`)
#   WORK=path     stores and run folders (large, not committed); results land in benchmarks/evidence/sweep_nf3/
#   WORKERS=n     runs at once (default 2)
set -euo pipefail

DATA_DIR="${1:-${HSK_DATA_DIR:-../shared/data/glue}}"
WORK="${WORK:-runs/sweep_nf3}"
OUT="benchmarks/evidence/sweep_nf3"
export HF_HUB_OFFLINE=1
mkdir -p "$WORK" "$OUT"

for task in sst2 mrpc; do
  teacher_var="TEACHER_${task^^}"
  teacher="${!teacher_var:-runs/teacher-$task}"
  source="$WORK/$task-3_32_1.zarr"
  if ! hsk verify "$source" >/dev/null 2>&1; then
    hsk dump --task "$task" --teacher "$teacher" --data-dir "$DATA_DIR" --limit 4000 \
      --student-layers 2 --config 3,32,1.0 --values float16 --no-progress --out "$source"
  fi
  hsk sweep --source "$source" --configs '3,8,0.2@float16+int4+mxfp4+nf3;pred-only' \
    --students bert2 --seeds 0,1,2 \
    --epochs-hsk 1 --epochs-pred 1 --lr-hsk 1e-4 --lr-pred 1e-4 --batch-size 32 \
    --data-dir "$DATA_DIR" --work-dir "$WORK/sweep-$task" --results "$OUT/results-$task.parquet" \
    --workers "${WORKERS:-2}"
  hsk report "$OUT/results-$task.parquet" --out "$OUT/report-$task"
done
