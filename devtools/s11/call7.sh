#!/usr/bin/env bash
# Session 11, device call 7 (issue 10): half-precision kernels capped at the occupancy step
# (launch.register_cap): ours in fp32 / bf16 / fp16 on the MACE uvu problems (call 6: mace-large bf16
# backward 0.742 ms, fp16 0.568), and the GPU tests of the half paths and of the cap.
set -u
OUT=${OUT:-/tmp/out}; L="$OUT/call7.log"; mkdir -p "$OUT" /tmp/gl7
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a "$L"; }
t() { timeout 280 python -m pytest -q -p no:cacheprovider -m gpu "$@" > "/tmp/gl7/$(echo "$*" | tr -c 'a-zA-Z0-9' _ | cut -c1-50).log" 2>&1; }
t tests/test_fast_launch.py &
t tests/test_mixed_precision.py -k "mace and not benzene" &
wait
for f in /tmp/gl7/*.log; do stamp "$(tail -1 $f) <- $(basename $f)"; done
timeout 200 python benchmarks/bench_mixed.py --problems mace-large,mace-medium --dtypes fp32,bf16,fp16 --impls ek \
    --out "$OUT" >> "$L" 2>&1
stamp "bench_mixed rc=$?"
tar -czf "$OUT/logs7.tgz" -C /tmp/gl7 .
grep -E "^\| mace|target" "$OUT"/mixed_*.md | head -8
