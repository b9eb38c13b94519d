#!/usr/bin/env bash
# Session 16, call 3: the C++ autograd node on the GPU (tests: bit for bit against the Python node),
# then nequip-water's double backward interleaved with OpenEquivariance and cuEquivariance.
source .bundle/unpack-bundle.sh > /dev/null
export PYTHONPATH=$PWD:$PYTHONPATH PYTHONUNBUFFERED=1 EQUIKERNELS_CACHE_DIR=/tmp/ekc TRITON_CACHE_DIR=/tmp/tc
timeout 300 python -m pytest -q -p no:cacheprovider tests/test_native_node.py -x > $OUT/test_native_node.log 2>&1
echo "native tests: $(tail -1 $OUT/test_native_node.log)"
timeout 200 python -m pytest -q -p no:cacheprovider tests/test_fast_launch.py > $OUT/test_fast_launch.log 2>&1
echo "fast launch tests: $(tail -1 $OUT/test_fast_launch.log)"
timeout ${BENCH_S:-420} python benchmarks/bench_interleaved.py --problems nequip-water --directions dbwd \
  --rows 20000,50000 --impls equikernels_ir_mul,oeq,cue_ir_mul --rounds 15 --calls 100 --out $OUT --tag native \
  > $OUT/interleaved_water.log 2>&1
grep -E "==|ms" $OUT/interleaved_water.log | tail -12
