#!/usr/bin/env bash
# LightPAFF pre-training before and after it moved into the one training loop (issue 20): bert3 from an
# MLM store of benchmarks/train/mlm_teacher_loop.sh's new teacher (4,000 SST-2 sentences, top-64, max length 64),
# 40 steps of batch 32, once with OLD_TREE's code and once with this tree, arms alternated ROUNDS times;
# one JSON line per run (wall time, first and last loss) in benchmarks/train/results/lightpaff_pretrain_loop.jsonl.
#
# Usage: OLD_TREE=/path/to/old/checkout bash benchmarks/train/lightpaff_pretrain_loop.sh   (after mlm_teacher_loop.sh)
set -euo pipefail
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false OMP_NUM_THREADS=1
NEW="$(pwd)"
W="${WORK:-$NEW/runs/mlm_teacher_loop}"
RESULTS="$NEW/benchmarks/train/results/lightpaff_pretrain_loop.jsonl"
[ -d "$W/corpus.zarr" ] || PYTHONPATH="$NEW" python -m pipelines.cli dump --objective mlm --text-file "$W/corpus.txt" \
  --teacher "$W/new" --top-k 64 --max-length 64 --no-progress --device cpu --out "$W/corpus.zarr" > "$W/dump.log" 2>&1
: > "$RESULTS"
for round in $(seq "${ROUNDS:-2}"); do
  for arm in old new; do
    tree="$NEW"; [ "$arm" = old ] && tree="$OLD_TREE"
    rm -rf "$W/pre-$arm"
    load="$(cut -d' ' -f1-3 /proc/loadavg)"; s=$(date +%s.%N)
    (cd "$tree" && PYTHONPATH="$tree" python -m pipelines.cli train --store "$W/corpus.zarr" --student bert3 \
      --method lightpaff-pretrain --max-steps 40 --batch-size 32 --log-every 1 --device cpu --workers 0 \
      --no-progress --seed 1 --out "$W/pre-$arm" > "$W/pre-$arm.log" 2>&1)
    e=$(date +%s.%N)
    python - "$W/pre-$arm/metrics.jsonl" "$arm" "$round" "$load" "$s" "$e" >> "$RESULTS" <<'PY'
import json, sys
path, arm, rnd, load, s, e = sys.argv[1:]
r = [json.loads(line) for line in open(path) if '"train"' in line]
print(json.dumps({"arm": arm, "round": int(rnd), "load": load, "wall_s": round(float(e) - float(s), 1), "steps": len(r),
                  "loss_1": r[0]["loss"], "loss_40": r[-1]["loss"]}))
PY
  done
done
cat "$RESULTS"
