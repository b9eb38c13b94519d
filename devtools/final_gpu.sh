#!/usr/bin/env bash
# One device call: re-measure small problems + dbwd side by side, then the GPU kernel tests.
source .bundle/unpack-bundle.sh > /dev/null
export EQUIKERNELS_CACHE_DIR=/tmp/ekc PYTHONPATH=.:$PYTHONPATH
timeout 330 python benchmarks/bench_tp.py --problems nequip-water,tetris-poly-1,mace-mp-medium-L2 --dtypes float32 \
  --directions fwd,bwd,dbwd --dbwd-rows 50000 --impls equikernels,equikernels_ir_mul,cue_ir_mul,oeq --tag final \
  --time-budget-s 300 --out "$OUT" > "$OUT/bench.log" 2>&1
tail -12 "$OUT/bench.log"
timeout 230 python -m pytest -q -p no:cacheprovider -m gpu tests/test_kernels.py -k "standard_problems_gpu or gradgradcheck_gpu" \
  > "$OUT/pytest_gpu.log" 2>&1
tail -5 "$OUT/pytest_gpu.log"
