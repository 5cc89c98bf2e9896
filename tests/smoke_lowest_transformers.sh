#!/usr/bin/env bash
# The lowest transformers that pyproject.toml declares, installed by pip with its own dependencies in a venv
# beside the normal environment, runs `hsk dump` and `hsk train` on tiny teachers (tests/smoke_lowest_transformers.py).
# .ci/run calls it; run it by hand the same way: bash tests/smoke_lowest_transformers.sh
set -euo pipefail
cd "$(dirname "$0")/.."
unset PYTHONPATH  # the venv sees only what pip installed in it
lowest=$(python3 -c 'import re; print(re.search(r"\"transformers>=([0-9.]+)", open("pyproject.toml").read()).group(1))')
venv="${TMPDIR:-/tmp}/hsk-transformers-$lowest"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m venv "$venv"
"$venv/bin/pip" install -q torch==2.13.0 pytest
"$venv/bin/pip" install -q -e . "transformers==$lowest"
HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false "$venv/bin/python" tests/smoke_lowest_transformers.py "$work"
