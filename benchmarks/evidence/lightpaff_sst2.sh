#!/usr/bin/env bash
# LightPAFF on SST-2 (issue 10, LightPAFF item 5): a 3-layer student, the same CPU budget, 2 seeds.
#
#   (a) kd:           KD from the fine-tuned teacher into its first 3 layers (bert3), on TRAIN_ROWS rows
#   (a') kd_base:     the same KD into the MiniLM base encoder's first 3 layers (not fine-tuned on the
#                     task), the init (b) and (c) compete with: what pre-training distillation adds
#   (b) lightpaff:    pre-training distillation (lightpaff-pretrain, l = 1) of the MLM teacher's first 3
#                     layers on the SST-2 training sentences (the MLM store of benchmarks/store/mlm_store.sh),
#                     then fine-tuning distillation (lightpaff, l = 0.5) on the same TRAIN_ROWS rows
#   (c) lightpaff+u:  as (b), the fine-tuning store adding UNLABELED_ROWS further SST-2 training rows with
#                     their labels removed (the teacher's distribution is their only target)
#
# Same budget: each fine-tuning run has the same epochs, LR, batch size and step cap (MAX_STEPS);
# (b) and (c) add the pre-training steps (PRE_STEPS), reported in the table.
# Needs the fine-tuned teacher (TEACHER) and the MLM store (runs/mlm_sst2, from benchmarks/store/mlm_store.sh).
#
# Usage: bash benchmarks/evidence/lightpaff_sst2.sh [DATA_DIR]   (default ../shared/data/glue)
set -euo pipefail
DATA_DIR="${1:-${HSK_DATA_DIR:-../shared/data/glue}}"
TEACHER="${TEACHER:-runs/sweep_sst2/teacher}"  # the SST-2 teacher of benchmarks/evidence/sweep_sst2/sweep_sst2.sh
MLM_WORK="${MLM_WORK:-runs/mlm_sst2}"
WORK="${WORK:-runs/lightpaff_sst2}"
TRAIN_ROWS="${TRAIN_ROWS:-4000}"
UNLABELED_ROWS="${UNLABELED_ROWS:-8000}"
SEEDS="${SEEDS:-0 1}"
EPOCHS="${EPOCHS:-2}"
MAX_STEPS="${MAX_STEPS:-400}"
LR="${LR:-1e-4}"  # the sweep's CPU schedule: at the paper's 2e-5 a few hundred steps leave the student at the majority class
PRE_STEPS="${PRE_STEPS:-400}"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
mkdir -p "$WORK" benchmarks/evidence/results

[ -f "$TEACHER/config.json" ] || { echo "no fine-tuned teacher at $TEACHER (set TEACHER)" >&2; exit 2; }
[ -f "$MLM_WORK/corpus.zarr/zarr.json" ] || WORK="$MLM_WORK" bash benchmarks/store/mlm_store.sh "$DATA_DIR"

# Fine-tuning data: the first TRAIN_ROWS rows with labels; (c) adds the next UNLABELED_ROWS without.
python - "$DATA_DIR/SST-2/train.tsv" "$WORK" "$TRAIN_ROWS" "$UNLABELED_ROWS" <<'PY'
import sys
from pathlib import Path
src, work, n, m = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
rows = [line.split("\t") for line in src.read_text().splitlines()[1:]]
labelled = [f"{s}\t{y}" for s, y in rows[:n]]
pool = [f"{s}\t" for s, _ in rows[n:n + m]]
(work / "labelled.tsv").write_text("sentence\tlabel\n" + "\n".join(labelled) + "\n")
(work / "with_pool.tsv").write_text("sentence\tlabel\n" + "\n".join(labelled + pool) + "\n")
PY
for name in labelled with_pool; do
  if ! hsk verify "$WORK/$name.zarr" >/dev/null 2>&1; then
    hsk dump --task sst2 --teacher "$TEACHER" --data-file "$WORK/$name.tsv" --config 0,0,0 --no-progress \
      --out "$WORK/$name.zarr"
  fi
done

COMMON=(--epochs "$EPOCHS" --lr "$LR" --max-steps "$MAX_STEPS" --batch-size 32 --data-dir "$DATA_DIR" --no-progress)
for seed in $SEEDS; do
  if [ ! -f "$WORK/pre-seed$seed/summary.json" ]; then
    OMP_NUM_THREADS="${THREADS:-2}" hsk train --method lightpaff-pretrain --store "$MLM_WORK/corpus.zarr" --student bert3 \
      --seed "$seed" --max-steps "$PRE_STEPS" --batch-size 32 --no-progress --out "$WORK/pre-seed$seed" \
      > "$WORK/pre-seed$seed.log" 2>&1
  fi
  # the three fine-tuning runs of a seed, one core each would starve: run them one after another
  [ -f "$WORK/kd-seed$seed/summary.json" ] || OMP_NUM_THREADS="${THREADS:-2}" hsk train --method kd --store "$WORK/labelled.zarr" \
    --student bert3 --seed "$seed" "${COMMON[@]}" --out "$WORK/kd-seed$seed" > "$WORK/kd-seed$seed.log" 2>&1
  [ -f "$WORK/kd_base-seed$seed/summary.json" ] || OMP_NUM_THREADS="${THREADS:-2}" hsk train --method kd \
    --store "$WORK/labelled.zarr" --student bert3 --student-base minilm --seed "$seed" "${COMMON[@]}" \
    --out "$WORK/kd_base-seed$seed" > "$WORK/kd_base-seed$seed.log" 2>&1
  [ -f "$WORK/lightpaff-seed$seed/summary.json" ] || OMP_NUM_THREADS="${THREADS:-2}" hsk train --method lightpaff \
    --store "$WORK/labelled.zarr" --init "$WORK/pre-seed$seed/best" --seed "$seed" "${COMMON[@]}" \
    --out "$WORK/lightpaff-seed$seed" > "$WORK/lightpaff-seed$seed.log" 2>&1
  [ -f "$WORK/lightpaff_u-seed$seed/summary.json" ] || OMP_NUM_THREADS="${THREADS:-2}" hsk train --method lightpaff \
    --store "$WORK/with_pool.zarr" --init "$WORK/pre-seed$seed/best" --seed "$seed" "${COMMON[@]}" \
    --out "$WORK/lightpaff_u-seed$seed" > "$WORK/lightpaff_u-seed$seed.log" 2>&1
done

python - "$WORK" <<'PY'
import json, sys
from pathlib import Path
work = Path(sys.argv[1])
rows = []
for path in sorted(work.glob("*-seed*/summary.json")):
    s = json.loads(path.read_text())
    if s.get("method") == "lightpaff-pretrain":
        continue
    seed = path.parent.name.rsplit("-seed", 1)[1]
    pre = work / f"pre-seed{seed}" / "summary.json"
    pre_s = json.loads(pre.read_text()) if s["method"] == "lightpaff" and pre.exists() else {}
    rows.append({"run": path.parent.name, "method": s["method"], "dev_accuracy": s["score"],
                 "train_seconds": s.get("train_seconds"), "pretrain_steps": pre_s.get("steps", 0),
                 "pretrain_seconds": pre_s.get("train_seconds", 0)})
(Path("benchmarks/evidence/results") / "lightpaff_sst2.json").write_text(json.dumps(rows, indent=2) + "\n")
print("| run | method | dev accuracy | train s | pre-train steps | pre-train s |")
print("|---|---|---|---|---|---|")
for r in rows:
    print(f"| {r['run']} | {r['method']} | {r['dev_accuracy']} | {r['train_seconds']} | {r['pretrain_steps']} | "
          f"{r['pretrain_seconds']} |")
PY
