#!/usr/bin/env bash
# Session 14, device call 4 (issue 10): host-bound or not (devtools/s14/queue_probe.py), session-13
# host path (git stash of ops/tp.py is not available on the device: the current one) on
# mace-medium bf16 / fp16 / fp32 and MACE-MP L2 fp16.
set -u
OUT=${OUT:-/tmp/out}; L="$OUT/call4.log"; mkdir -p "$OUT"
export TRITON_CACHE_DIR=/tmp/tcache EQUIKERNELS_CACHE_DIR=/tmp/ekc
TRIALS=12 timeout 300 python devtools/s14/queue_probe.py mace-medium:bfloat16 mace-medium:float16 mace-medium:float32 \
  mace-mp-medium-L2:float16 2>&1 | grep -v -i warn | tee -a "$L"
