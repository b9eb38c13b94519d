#!/usr/bin/env bash
# session 7, call 4: GPU tests of the touched modules; MACE E+F at 10,192 atoms with the fused radial conv forced
source .bundle/unpack-bundle.sh > /dev/null
export PYTHONPATH=$PWD:$PYTHONPATH EQUIKERNELS_CACHE_DIR=/tmp/ekc PYTHONUNBUFFERED=1
timeout 170 python -m pytest -q -m gpu tests/test_radial_conv.py tests/test_mace_model.py tests/test_mace_chunked.py \
  > $OUT/pytest_gpu.log 2>&1; tail -3 $OUT/pytest_gpu.log
EQUIKERNELS_RADIAL_CONV=1 PYTHONPATH=/tmp/e3nn044:$PYTHONPATH timeout 330 python benchmarks/bench_mace.py --dtypes float32 \
  --systems cu-10192 --impls equikernels --target-ms 100 --out $OUT/mace_fused.json > $OUT/mace_fused.log 2>&1
grep "E+F\|err\|Err" $OUT/mace_fused.log | grep -v Warn | tail -6
