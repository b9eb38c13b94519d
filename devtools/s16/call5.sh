#!/usr/bin/env bash
# Session 16, call 5: host-affected double-backward cells interleaved with the baselines, with the
# C++ node (water again, then the 20k cells of the other channel-wise problems).
source .bundle/unpack-bundle.sh > /dev/null
export PYTHONPATH=$PWD:$PYTHONPATH PYTHONUNBUFFERED=1 EQUIKERNELS_CACHE_DIR=/tmp/ekc TRITON_CACHE_DIR=/tmp/tc
B="python benchmarks/bench_interleaved.py --directions dbwd --impls equikernels_ir_mul,oeq,cue_ir_mul --rounds 11 --calls 100 --out $OUT"
timeout 200 $B --problems nequip-water --rows 20000,50000 --tag water > $OUT/water.log 2>&1
timeout 330 $B --problems nequip-lips,mace-medium,mace-mp-medium-L2 --rows 20000 --tag cw20k > $OUT/cw20k.log 2>&1
grep -E "^==|ms \(" $OUT/water.log $OUT/cw20k.log
