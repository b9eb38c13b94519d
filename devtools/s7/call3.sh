#!/usr/bin/env bash
# session 7, call 3: fused radial conv launch configs (kernel-only, 10,192 atoms), then MACE E+F fused
source .bundle/unpack-bundle.sh > /dev/null
export PYTHONPATH=$PWD:$PYTHONPATH EQUIKERNELS_CACHE_DIR=/tmp/ekc PYTHONUNBUFFERED=1
sw() { env "$@" timeout 150 python devtools/s7/rconv_sweep.py "$*" 2>&1 | grep "|" | tee -a $OUT/sweep.txt; }
sw EQUIKERNELS_RCONV_BLOCK=16 EQUIKERNELS_RCONV_STAGES=1
sw EQUIKERNELS_RCONV_BLOCK=32 EQUIKERNELS_RCONV_STAGES=1
sw EQUIKERNELS_RCONV_BLOCK=16 EQUIKERNELS_RCONV_STAGES=1 EQUIKERNELS_RCONV_PRECISION=ieee
EQUIKERNELS_RCONV_BLOCK=32 EQUIKERNELS_RCONV_STAGES=1 EQUIKERNELS_RADIAL_CONV=1 PYTHONPATH=/tmp/e3nn044:$PYTHONPATH \
  timeout 150 python benchmarks/bench_mace.py --dtypes float32 --systems cu-10192 --impls equikernels \
  --out $OUT/mace_fused.json > $OUT/mace_fused.log 2>&1
grep "E+F" $OUT/mace_fused.log | tail -4
