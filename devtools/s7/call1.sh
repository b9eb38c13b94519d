#!/usr/bin/env bash
# session 7, call 1: fused radial conv (issue 11): GPU tests, kernel side by side, MACE E+F fused vs unfused
source .bundle/unpack-bundle.sh > /dev/null
export PYTHONPATH=$PWD:$PYTHONPATH EQUIKERNELS_CACHE_DIR=/tmp/ekc
nvidia-smi --query-gpu=name --format=csv,noheader
python -c "import torch,triton;print(torch.__version__,triton.__version__)"
timeout 150 python -m pytest -q -m gpu tests/test_radial_conv.py 2>&1 | tail -5 | tee $OUT/pytest_rconv.log
timeout 240 python benchmarks/bench_radial_conv.py --atoms 10192 2916 --out $OUT/rconv1.json > $OUT/rconv1.log 2>&1
grep -v Warn $OUT/rconv1.log | tail -28
M=/tmp/e3nn044
for f in 1 0; do
  EQUIKERNELS_RADIAL_CONV=$f PYTHONPATH=$M:$PYTHONPATH timeout 100 python benchmarks/bench_mace.py --dtypes float32 \
    --systems cu-10192 --impls equikernels --out $OUT/mace_f$f.json > $OUT/mace_f$f.log 2>&1
  echo "fused=$f"; grep -i "E+F\|ms\|err" $OUT/mace_f$f.log | tail -6
done
