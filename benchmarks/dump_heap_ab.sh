#!/bin/bash
# The dump's heap settings (pipelines/dump/heap.py: mmap threshold fixed at 1 MiB, trim per shard) against
# glibc's dynamic threshold, alternated: peak RSS and examples/s of a fresh `hsk dump` process per run.
#   bash benchmarks/dump_heap_ab.sh TEACHER ROWS ROUNDS   (from the repository root, its venv active)
# Results of a run on this machine: benchmarks/results/dump_heap_ab.json (written by hand from the output).
set -euo pipefail
teacher=$1 rows=$2 rounds=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for r in $(seq 0 $((rounds - 1))); do
  if [ $((r % 2)) -eq 0 ]; then arms="fixed dynamic"; else arms="dynamic fixed"; fi
  for m in $arms; do
    res=$(python -c "
import sys, resource
from pipelines.dump import stage
if sys.argv[1] == 'dynamic':
    stage.pin_mmap_threshold = stage.release_free_memory = lambda: None
from pipelines.cli import main
rc = main(sys.argv[2:]); print('PEAK', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss/1024); sys.exit(rc)" \
      "$m" dump --task sst2 --teacher "$teacher" --config 3,8,0.2 --data-dir ../shared/data/glue --limit "$rows" \
      --no-progress --out "$work/$m-$r.zarr" 2>&1 | grep -E "PEAK|ex/s" | tr '\n' ' ')
    echo "round $r $m: $res load $(cut -d' ' -f1-3 /proc/loadavg)"
  done
done
