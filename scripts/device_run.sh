#!/usr/bin/env bash
# One call on a GPU machine. Usage (repo root, CuTe DSL wheel carried in .whl/):
#   bash scripts/device_run.sh measure   # GPU tests, ladder, bench (full+causal, MHA and GQA), tune
#   bash scripts/device_run.sh explain   # attnlab profile (ncu) and roofline
#   bash scripts/device_run.sh knobs     # GPU tests of the ladder and the knob configs only
#   bash scripts/device_run.sh ladder    # attnlab ladder, bf16 and fp16 (k01..k16, lab variants)
# Results (JSON, PNG, one log) go to $OUT (default ./results); tables print as they come.
set -uo pipefail
mode=${1:-measure}
OUT=${OUT:-$PWD/results}
mkdir -p "$OUT"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/python_packages:$PWD/src
fi
export PYTHONUNBUFFERED=1 COLUMNS=150
export ATTNLAB_TUNE_CACHE=$OUT/tune_cache.json
log=$OUT/run.log
attnlab() { python3 -m attnlab "$@" 2>&1 | tee -a "$log"; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee -a "$log"
case $mode in
  measure)
    # Compile-bound: 12 workers (pytest-xdist, on the GPU machine) run it in ~2.5 min.
    python3 -m pytest -m gpu -q -p no:cacheprovider -n 12 2>&1 | tee -a "$log" | tail -3
    attnlab ladder --out "$OUT"
    attnlab bench --out "$OUT"
    attnlab bench --gqa 4 --dtypes bf16 --out "$OUT/gqa"
    attnlab tune --seqlens 4096 --max-timed 16
    # attention() now dispatches to the tuned entry: bench it again (outputs not kept).
    attnlab bench --quick --impls attnlab --out /tmp/after_tune
    ;;
  knobs)
    python3 -m pytest -m gpu -q -p no:cacheprovider -x tests/test_features_gpu.py \
      -k "knob or tiles or static or carveout or every_ladder or d_head_tile or row_sum" 2>&1 | tee -a "$log" | tail -5
    ;;
  ladder)
    attnlab ladder --out "$OUT"
    attnlab ladder --dtype fp16 --seqlens 4096 --out "$OUT/fp16"
    ;;
  explain)
    attnlab profile k07 --out "$OUT"
    attnlab roofline k02 k07 --out "$OUT"
    ;;
  *) echo "unknown mode $mode (measure|explain|knobs|ladder)"; exit 2 ;;
esac
