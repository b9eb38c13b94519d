#!/usr/bin/env bash
# session 8 call 3: the [channels, edges] gy / gh kernel of the fused radial conv, then the side by side
source .bundle/unpack-bundle.sh > /dev/null
export PYTHONPATH=$PWD:$PYTHONPATH EQUIKERNELS_CACHE_DIR=/tmp/ekc PYTHONUNBUFFERED=1
timeout 200 python devtools/s8/rconv_t.py fwd,gx,edge 16:4:8:1 16:4:8:0 16:8:8:1 > $OUT/sweep3.txt 2>&1
grep -v "Warn\|warn" $OUT/sweep3.txt | tail -4
timeout 240 python benchmarks/bench_radial_conv.py --atoms 10192 2916 --out $OUT/rconv.json > $OUT/rconv.log 2>&1
grep -v "Warn\|warn\|visitor" $OUT/rconv.log | tail -22
