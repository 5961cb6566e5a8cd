#!/usr/bin/env bash
# One call on a GPU machine: GPU tests, then the ladder benchmark (with the k07 sweep at
# hd128 bf16) and the ladder at fp16 and hd64.
# Usage (repo root, CuTe DSL wheel carried in .whl/): bash scripts/device_run.sh [pytest args]
# Full logs and JSON go to $OUT (default ./results); the short tables are printed last.
set -uo pipefail
OUT=${OUT:-$PWD/results}
mkdir -p "$OUT"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/python_packages:$PWD/src
fi
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
python3 -m pytest -m gpu -q -p no:cacheprovider "$@" 2>&1 | tee "$OUT/pytest.log" | tail -5
bench() { python3 -m attnlab.bench.compare --json "$OUT/$1.json" "${@:2}" >> "$OUT/bench.log" 2>&1; }
bench ladder_hd128_bf16 --sweep
bench ladder_hd128_fp16 --dtype float16
bench ladder_hd64_bf16 --head-dim 64 --heads 32
cat "$OUT/bench.log"
