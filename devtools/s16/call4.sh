#!/usr/bin/env bash
# Session 16, call 4: the GPU suite with the C++ node as the default eager backward (benzene left
# out: its kernels compile for minutes; its half-precision tests ran in call 1).
source .bundle/unpack-bundle.sh > /dev/null
export PYTHONPATH=/tmp/e3nn044:$PWD:$PYTHONPATH PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tc
SKIP_BENZENE=1 LIMIT=${LIMIT:-500} bash devtools/gpu_tests.sh > /dev/null 2>&1
cat $OUT/gpu_tests_summary.txt
