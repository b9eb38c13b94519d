#!/usr/bin/env bash
# Session 13, device call 6 (issue 10): does the backward's time depend on the tensors' addresses
# (devtools/s13/alloc_probe.py)? mace-medium bf16 / fp16 / fp32, mace-large bf16.
set -u
OUT=${OUT:-/tmp/out}; L="$OUT/call6.log"; mkdir -p "$OUT"
export TRITON_CACHE_DIR=/tmp/tcache EQUIKERNELS_CACHE_DIR=/tmp/ekc
timeout 500 python devtools/s13/alloc_probe.py mace-medium:bfloat16 mace-medium:float16 mace-medium:float32 \
    mace-large:bfloat16 2>&1 | grep -v -i warn | tee -a "$L"
timeout 250 python -m pytest -q -p no:cacheprovider -m gpu tests/test_fast_launch.py -k register_cap > "$OUT/test_fast_launch.log" 2>&1
echo "test_fast_launch -k register_cap: $(tail -1 $OUT/test_fast_launch.log)" | tee -a "$L"
