#!/usr/bin/env bash
# session 7, call 5: nequip-revmd17-benzene side by side (never measured: cold compiles take minutes)
source .bundle/unpack-bundle.sh > /dev/null
export PYTHONPATH=$PWD:$PYTHONPATH EQUIKERNELS_CACHE_DIR=/tmp/ekc PYTHONUNBUFFERED=1
timeout 570 python benchmarks/bench_tp.py --problems nequip-revmd17-benzene --dtypes float32 --dbwd-rows 50000 \
  --impls equikernels_ir_mul,cue_ir_mul,oeq --target-ms 100 --out $OUT/tp --tag benzene > $OUT/benzene.log 2>&1
grep -v "Warn\|warn\|visitor\|@@RESULT" $OUT/benzene.log | tail -30
