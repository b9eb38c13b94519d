#!/usr/bin/env bash
# session 7, call 2: fused radial conv after the edge-kernel rewrite (call 1: its compile never ended)
source .bundle/unpack-bundle.sh > /dev/null
export PYTHONPATH=$PWD:$PYTHONPATH EQUIKERNELS_CACHE_DIR=/tmp/ekc PYTHONUNBUFFERED=1
timeout 100 python devtools/s7/rconv_diag.py mace-mp-medium-L2 edge > $OUT/diag_edge.log 2>&1
grep -v "Warn\|warn\|visitor" $OUT/diag_edge.log | tail -8
timeout 200 python -m pytest -q -x -m gpu tests/test_radial_conv.py > $OUT/pytest_rconv.log 2>&1
tail -3 $OUT/pytest_rconv.log
timeout 240 python benchmarks/bench_radial_conv.py --atoms 10192 2916 --out $OUT/rconv2.json > $OUT/rconv2.log 2>&1
grep -v "Warn\|warn\|visitor" $OUT/rconv2.log | tail -30
