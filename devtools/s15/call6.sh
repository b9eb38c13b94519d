#!/usr/bin/env bash
# Session 15, device call 6: GPU tests the default double-backward prefetch touches (every dtype):
# mixed precision and autograd (cut at call 5's limit), and the standard problems' parity.
set -u
OUT=${OUT:-/tmp/out}; L="$OUT/call6.log"; mkdir -p "$OUT" /tmp/c6
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a "$L"; }
export TRITON_CACHE_DIR=/tmp/tcache EQUIKERNELS_CACHE_DIR=/tmp/ekc
timeout 380 python -m pytest -q -p no:cacheprovider -m gpu tests/test_mixed_precision.py -k "not benzene and not conv" > /tmp/c6/pt_mixed.log 2>&1 &
timeout 380 python -m pytest -q -p no:cacheprovider -m gpu tests/test_mixed_precision.py -k "conv" > /tmp/c6/pt_mixed_conv.log 2>&1 &
timeout 380 python -m pytest -q -p no:cacheprovider -m gpu tests/test_autograd.py tests/test_compile.py > /tmp/c6/pt_autograd.log 2>&1 &
timeout 380 python -m pytest -q -p no:cacheprovider -m gpu tests/test_parity.py -k "standard and (water or lips or mace-medium or mp-medium)" > /tmp/c6/pt_parity.log 2>&1 &
wait
for f in /tmp/c6/pt_*.log; do stamp "$(basename $f): $(tail -1 $f)"; grep -E "^FAILED|^ERROR" $f | head -5 | tee -a "$L"; done
tar -czf "$OUT/c6.tgz" -C /tmp/c6 .
