#!/bin/bash
# glibc's mmap threshold for the dump, alternated: dynamic (the dump's default: glibc's own, heap trimmed once per
# shard, pipelines/dump/heap.py) against fixed at 512 KiB (MALLOC_MMAP_THRESHOLD_=524288, the dump's own setting
# from 4acfc85 to 1a01b22). Peak RSS and examples/s of a fresh `hsk dump` process per run, at each row count.
#   bash benchmarks/dump/dump_heap_ab.sh TEACHER ROWS[,ROWS...] ROUNDS   (from the repository root, its venv active)
# Results of a run on this machine: benchmarks/dump/results/dump_heap_ab.json (written by hand from the output).
set -euo pipefail
teacher=$1 sizes=$2 rounds=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for r in $(seq 0 $((rounds - 1))); do
  if [ $((r % 2)) -eq 0 ]; then arms="dynamic fixed512k"; else arms="fixed512k dynamic"; fi
  for rows in ${sizes//,/ }; do
    for m in $arms; do
      if [ "$m" = fixed512k ]; then env=(MALLOC_MMAP_THRESHOLD_=524288); else env=(); fi
      res=$(env "${env[@]}" python -c "
import sys, resource
from pipelines.cli import main
rc = main(sys.argv[1:]); print('PEAK', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss/1024); sys.exit(rc)" \
        dump --task sst2 --teacher "$teacher" --config 3,8,0.2 --data-dir ../shared/data/glue --limit "$rows" \
        --no-progress --out "$work/$m-$r-$rows.zarr" 2>&1 | grep -E "PEAK|ex/s" | tr '\n' ' ')
      rm -rf "$work/$m-$r-$rows.zarr"
      echo "round $r rows $rows $m: $res load $(cut -d' ' -f1-3 /proc/loadavg)"
    done
  done
done
