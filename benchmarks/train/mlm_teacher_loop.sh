#!/usr/bin/env bash
# The MLM teacher before and after it moved into the one training loop (issue 20): the README's (now benchmarks/HISTORY.md's) "1 epoch at
# 1e-4 with 1 layer" run (4,000 SST-2 sentences, MiniLM-L6 base, batch 32, max length 64), once with the
# code of OLD_TREE (a checkout of the earlier commit) and once with this tree, arms alternated ROUNDS times.
# The loop streams batches in its own shuffled order (not length-bucketed) and does not decay biases and
# LayerNorm weights, so the figures may differ; results in benchmarks/train/results/mlm_teacher_loop.json.
#
# Usage: OLD_TREE=/path/to/old/checkout bash benchmarks/train/mlm_teacher_loop.sh [DATA_DIR]
set -euo pipefail
DATA_DIR="${1:-${HSK_DATA_DIR:-../shared/data/glue}}"
NEW_TREE="$(pwd)"
WORK="${WORK:-runs/mlm_teacher_loop}"
ROUNDS="${ROUNDS:-1}"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false OMP_NUM_THREADS=1
mkdir -p "$WORK" benchmarks/train/results
WORK="$(cd "$WORK" && pwd)"
sed -n "2,4001p" "$DATA_DIR/SST-2/train.tsv" | cut -f1 > "$WORK/corpus.txt"
: > "$WORK/rows.jsonl"
for round in $(seq "$ROUNDS"); do
  for arm in old new; do
    tree="$NEW_TREE"; [ "$arm" = old ] && tree="$OLD_TREE"
    rm -rf "$WORK/$arm"
    load="$(cut -d' ' -f1-3 /proc/loadavg)"
    start=$(date +%s.%N)
    (cd "$tree" && PYTHONPATH="$tree" python -m pipelines.cli teacher --objective mlm --base minilm \
      --text-file "$WORK/corpus.txt" --train-layers 1 --epochs 1 --lr 1e-4 --batch-size 32 --max-length 64 \
      --no-progress --device cpu --out "$WORK/$arm" > "$WORK/$arm.log" 2>&1)
    end=$(date +%s.%N)
    python - "$WORK/$arm/hsk_teacher.json" "$arm" "$round" "$load" "$start" "$end" >> "$WORK/rows.jsonl" <<'PY'
import json, sys
path, arm, rnd, load, start, end = sys.argv[1:]
s = json.load(open(path))
print(json.dumps({"arm": arm, "round": int(rnd), "load_before": load, "wall_s": round(float(end) - float(start), 1),
                  "steps": s["steps"], "train_loss": s["history"][-1]["train_loss"], "held_out": s["dev_metrics"]}))
PY
  done
done
python -c "import json,sys; rows=[json.loads(l) for l in open(sys.argv[1])]; json.dump(rows, open('benchmarks/train/results/mlm_teacher_loop.json','w'), indent=1)" "$WORK/rows.jsonl"
cat benchmarks/train/results/mlm_teacher_loop.json
