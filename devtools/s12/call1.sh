#!/usr/bin/env bash
# Session 12, device call 1 (issue 10): half-precision backward. Variants of the generated kernels,
# ours only, fp32 and bf16 on the MACE uvu problems at 50k rows (bench_mixed):
#   base     EQUIKERNELS_PARTIAL_SUM=0 (session 11)
#   partial  per-thread partial channel sums (emit.KernelBuilder._partial)
#   pclamp   partial + loads clamp the row index (EQUIKERNELS_CLAMP_ROWS=1)
#   pall     partial + register cap for float32 too (EQUIKERNELS_REG_CAP=all)
#   pcall    partial + clamp + cap for float32
# First all variants once in parallel at 2k rows (compiles into the shared Triton cache), then each
# at 50k rows one after another (timed).
set -u
OUT=${OUT:-/tmp/out}; L="$OUT/call1.log"; mkdir -p "$OUT" /tmp/gl1
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a "$L"; }
export TRITON_CACHE_DIR=/tmp/tcache
declare -A V=( [base]="EQUIKERNELS_PARTIAL_SUM=0" [partial]="" [pclamp]="EQUIKERNELS_CLAMP_ROWS=1"
               [pall]="EQUIKERNELS_REG_CAP=all" [pcall]="EQUIKERNELS_CLAMP_ROWS=1 EQUIKERNELS_REG_CAP=all" )
ORDER=${ORDER:-"base partial pclamp pall pcall"}
for v in $ORDER; do
  env ${V[$v]} EQUIKERNELS_CACHE_DIR=/tmp/ekc_$v timeout 250 python benchmarks/bench_mixed.py --problems mace-large,mace-medium \
      --dtypes fp32,bf16 --impls ek --rows 2000 --check-rows 500 --min-reps 1 --max-reps 2 --out /tmp/gl1/warm_$v \
      > /tmp/gl1/warm_$v.log 2>&1 &
done
wait
stamp "warm done"
for rep in 1 2; do
  for v in $ORDER; do
    env ${V[$v]} EQUIKERNELS_CACHE_DIR=/tmp/ekc_$v timeout 120 python benchmarks/bench_mixed.py --problems mace-large,mace-medium \
        --dtypes fp32,bf16 --impls ek --out /tmp/gl1/${v}_$rep > /tmp/gl1/${v}_$rep.log 2>&1
    stamp "$v rep $rep rc=$?"
    grep -E "^\| mace" /tmp/gl1/${v}_$rep.log | sed "s/^/$v r$rep /" | tee -a "$L"
  done
done
tar -czf "$OUT/logs1.tgz" -C /tmp/gl1 .
