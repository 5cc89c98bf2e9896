#!/usr/bin/env bash
# ROSITA student vs bert3 on SST-2, same store, same method, same CPU schedule (issue 10, ROSITA).
#
#   1. hsk student build rosita: prune the MiniLM-L6-H384 teacher (6 layers, 12 heads, FFN 1536,
#      d 384) to the scaled ROSITA recipe: bottom 3 layers, 4 heads and 384 FFN neurons per layer,
#      word embedding at SVD rank 128; importance from one frozen epoch over the TRAIN_ROWS rows.
#   2. hsk dump: the teacher over the same TRAIN_ROWS rows at the paper's config 3,8,0.2 for a
#      3-layer reference student (both students are 3 layers deep at d 384: same layer map, no projection).
#   3. hsk train, the default method (HSK stage, then prediction stage) with the CPU schedule of
#      benchmarks/evidence/sweep_sst2/sweep_sst2.sh (1 + 1 epochs, lr 1e-4 both stages, batch 32), for bert3 (the
#      teacher's first 3 layers) and the ROSITA student, SEEDS seeds; dev accuracy on all 872 rows.
#   4. A JSON summary: parameters, dev accuracy, train time per run.
#
# Usage: bash benchmarks/evidence/rosita_sst2.sh TEACHER [DATA_DIR]   (DATA_DIR default ../shared/data/glue)
# Every step is skipped when its output exists, so a rerun after an interruption continues.
set -euo pipefail

TEACHER="${1:?usage: rosita_sst2.sh TEACHER [DATA_DIR]}"
DATA_DIR="${2:-${HSK_DATA_DIR:-../shared/data/glue}}"
WORK="${WORK:-runs/rosita_sst2}"
TRAIN_ROWS="${TRAIN_ROWS:-4000}"
SEEDS="${SEEDS:-0 1}"
MAX_STEPS="${MAX_STEPS:-}"              # set to cap each stage (a shorter schedule than the sweep's), e.g. 40
CAP=()
SUFFIX=""
if [ -n "$MAX_STEPS" ]; then CAP=(--max-steps "$MAX_STEPS"); SUFFIX="-cap$MAX_STEPS"; fi
export HF_HUB_OFFLINE=1
mkdir -p "$WORK" benchmarks/evidence/results

if [ ! -f "$WORK/rosita3/hsk_rosita.json" ]; then
  hsk student build rosita --teacher "$TEACHER" --task sst2 --layers 3 --heads 4 --ffn 384 --emb-rank 128 \
    --data-dir "$DATA_DIR" --train-limit "$TRAIN_ROWS" --overwrite --out "$WORK/rosita3"
fi

if ! hsk verify "$WORK/sst2-3_8_0.2.zarr" >/dev/null 2>&1; then
  hsk dump --task sst2 --teacher "$TEACHER" --data-dir "$DATA_DIR" --limit "$TRAIN_ROWS" \
    --student-layers 3 --config 3,8,0.2 --no-progress --out "$WORK/sst2-3_8_0.2.zarr"
fi

# The two students of a seed train side by side (2 cores: one each), so they share the machine's load.
for seed in $SEEDS; do
  for student in bert3 "$WORK/rosita3"; do
    name="$(basename "$student")-seed$seed$SUFFIX"
    if [ ! -f "$WORK/$name/summary.json" ]; then
      OMP_NUM_THREADS=1 hsk train --store "$WORK/sst2-3_8_0.2.zarr" --student "$student" --seed "$seed" \
        --epochs-hsk 1 --epochs-pred 1 --lr-hsk 1e-4 --lr-pred 1e-4 --batch-size 32 "${CAP[@]}" \
        --data-dir "$DATA_DIR" --no-progress --out "$WORK/$name" > "$WORK/$name.log" 2>&1 &
    fi
  done
  wait
done

python - "$WORK" "$SUFFIX" <<'PY'
import json, sys
from pathlib import Path
from transformers import AutoModelForSequenceClassification
import pipelines.core.pruned_bert  # noqa: F401  (the ROSITA student's class)

work = Path(sys.argv[1])
rows = []
runs = [p for p in work.glob("*-seed*/summary.json") if p.parent.name.split("-seed")[1].lstrip("0123456789") == sys.argv[2]]
for summary_path in sorted(runs):
    s = json.loads(summary_path.read_text())
    model = AutoModelForSequenceClassification.from_pretrained(s["model_dir"])
    rows.append({
        "run": summary_path.parent.name,
        "student": s["student"]["name"],
        "kind": s["student"]["kind"],
        "parameters": sum(p.numel() for p in model.parameters()),
        "dev_accuracy": s["score"],
        "train_seconds": s["train_seconds"],
        "examples_per_s": s["examples_per_s"],
    })
build = json.loads((work / "rosita3" / "hsk_rosita.json").read_text())
out = {"runs": rows, "rosita_build": {k: build[k] for k in ("shape", "parameters", "build_seconds",
                                                            "importance_examples", "importance_loss")}}
Path(f"benchmarks/evidence/results/rosita_sst2{sys.argv[2]}.json").write_text(json.dumps(out, indent=2) + "\n")
print(json.dumps(out, indent=2))
PY
