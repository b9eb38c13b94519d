#!/usr/bin/env bash
# Session 12, device call 3 (issue 10): loads issued K loads early (EQUIKERNELS_PREFETCH=K,
# emit._prefetched) with 1-warp backward programs and the float32 register cap (call 2: all11).
# Ours, fp32 and bf16, 50k rows.
set -u
OUT=${OUT:-/tmp/out}; L="$OUT/call3.log"; mkdir -p "$OUT" /tmp/gl3
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a "$L"; }
export TRITON_CACHE_DIR=/tmp/tcache
A11="EQUIKERNELS_REG_CAP=all EQUIKERNELS_ROWS_BWD=1 EQUIKERNELS_WARPS_BWD=1"
declare -A V=( [k0]="$A11" [k4]="$A11 EQUIKERNELS_PREFETCH=4" [k8]="$A11 EQUIKERNELS_PREFETCH=8"
               [k16]="$A11 EQUIKERNELS_PREFETCH=16" [k8c]="$A11 EQUIKERNELS_PREFETCH=8 EQUIKERNELS_CLAMP_ROWS=1"
               [k8w4]="EQUIKERNELS_REG_CAP=all EQUIKERNELS_PREFETCH=8" )
ORDER=${ORDER:-"k0 k4 k8 k16 k8c k8w4"}
for v in $ORDER; do
  env ${V[$v]} EQUIKERNELS_CACHE_DIR=/tmp/ekc_$v timeout 280 python benchmarks/bench_mixed.py --problems mace-large,mace-medium \
      --dtypes fp32,bf16 --impls ek --rows 2000 --check-rows 500 --min-reps 1 --max-reps 2 --out /tmp/gl3/warm_$v \
      > /tmp/gl3/warm_$v.log 2>&1 &
done
wait
stamp "warm done"
grep -h "error" /tmp/gl3/warm_*.log | head -5 | tee -a "$L"
for v in $ORDER; do
  env ${V[$v]} EQUIKERNELS_CACHE_DIR=/tmp/ekc_$v timeout 120 python benchmarks/bench_mixed.py --problems mace-large,mace-medium \
      --dtypes fp32,bf16 --impls ek --out /tmp/gl3/$v > /tmp/gl3/$v.log 2>&1
  stamp "$v rc=$?"
  grep -E "^\| mace-(large|medium) \| (fwd|bwd)|error" /tmp/gl3/$v.log | sed "s/^/$v /" | tee -a "$L"
done
tar -czf "$OUT/logs3.tgz" -C /tmp/gl3 .
