#!/usr/bin/env bash
# Session 16, call 6: after the review's refactor of the node's Python glue: its GPU tests, and
# nequip-water's double backward interleaved once more.
source .bundle/unpack-bundle.sh > /dev/null
export PYTHONPATH=$PWD:$PYTHONPATH PYTHONUNBUFFERED=1 EQUIKERNELS_CACHE_DIR=/tmp/ekc TRITON_CACHE_DIR=/tmp/tc
timeout 300 python -m pytest -q -p no:cacheprovider tests/test_native_node.py > $OUT/test_native_node_review.log 2>&1
echo "native tests: $(tail -1 $OUT/test_native_node_review.log)"
timeout 240 python benchmarks/bench_interleaved.py --problems nequip-water --directions dbwd --rows 20000 \
  --impls equikernels_ir_mul,oeq --rounds 11 --calls 100 --out $OUT --tag review > $OUT/water_review.log 2>&1
grep -E "^==|ms \(" $OUT/water_review.log
