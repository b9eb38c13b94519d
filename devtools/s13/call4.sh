#!/usr/bin/env bash
# Session 13, device call 4 (issue 10): the new default (half-precision rows of the wide channel-wise
# backward asked into L2 16 loads ahead). GPU tests of the touched paths, then bench_mixed side by
# side with cuEquivariance (fp32 / bf16 / fp16) for the three MACE problems.
set -u
OUT=${OUT:-/tmp/out}; L="$OUT/call4.log"; mkdir -p "$OUT" /tmp/gl4
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a "$L"; }
export TRITON_CACHE_DIR=/tmp/tcache EQUIKERNELS_CACHE_DIR=/tmp/ekc
P=mace-large,mace-mp-medium-L2,mace-medium
t() { timeout 300 python -m pytest -q -p no:cacheprovider "$@" > "/tmp/gl4/test_$(echo "$*" | tr -c 'a-zA-Z0-9' _ | cut -c1-50).log" 2>&1; }
timeout 300 python benchmarks/bench_mixed.py --problems $P --dtypes fp32,bf16,fp16 --impls ek,cue \
    --rows 2000 --check-rows 500 --min-reps 1 --max-reps 2 --out /tmp/gl4/warm > /tmp/gl4/warm.log 2>&1 &
t -m gpu tests/test_mixed_precision.py -k "mace and not benzene" &
t -m gpu tests/test_fast_launch.py &
t tests/test_l2_prefetch.py &
t -m gpu tests/test_kernels.py -k "standard_problems_gpu or gradgradcheck_gpu" &
wait
stamp "warm + tests done"
for f in /tmp/gl4/test_*.log; do stamp "$(tail -1 $f) <- $(basename $f)"; done
timeout 200 python benchmarks/bench_mixed.py --problems $P --dtypes fp32,bf16,fp16 --impls ek,cue \
    --out "$OUT" > /tmp/gl4/mixed.log 2>&1
stamp "bench_mixed rc=$?"
grep -E "^\| mace|target| err " /tmp/gl4/mixed.log | tee -a "$L"
tar -czf "$OUT/logs4.tgz" -C /tmp/gl4 .
