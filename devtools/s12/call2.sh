#!/usr/bin/env bash
# Session 12, device call 2 (issue 10): backward launch shape and register cap with per-thread
# partial channel sums (call 1: partial sums alone made mace-large's fp32 backward 182 registers,
# 0.808 -> 0.928 ms, mace-medium fp32 0.334 -> 0.314, bf16 unchanged). Ours, fp32 and bf16, 50k rows.
set -u
OUT=${OUT:-/tmp/out}; L="$OUT/call2.log"; mkdir -p "$OUT" /tmp/gl2
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a "$L"; }
export TRITON_CACHE_DIR=/tmp/tcache
declare -A V=( [half44]="" [all44]="EQUIKERNELS_REG_CAP=all"
               [all22]="EQUIKERNELS_REG_CAP=all EQUIKERNELS_ROWS_BWD=2 EQUIKERNELS_WARPS_BWD=2"
               [all11]="EQUIKERNELS_REG_CAP=all EQUIKERNELS_ROWS_BWD=1 EQUIKERNELS_WARPS_BWD=1"
               [all88]="EQUIKERNELS_REG_CAP=all EQUIKERNELS_ROWS_BWD=8 EQUIKERNELS_WARPS_BWD=8"
               [base11]="EQUIKERNELS_PARTIAL_SUM=0 EQUIKERNELS_ROWS_BWD=1 EQUIKERNELS_WARPS_BWD=1" )
ORDER=${ORDER:-"half44 all44 all22 all11 all88 base11"}
for v in $ORDER; do
  env ${V[$v]} EQUIKERNELS_CACHE_DIR=/tmp/ekc_$v timeout 280 python benchmarks/bench_mixed.py --problems mace-large,mace-medium \
      --dtypes fp32,bf16 --impls ek --rows 2000 --check-rows 500 --min-reps 1 --max-reps 2 --out /tmp/gl2/warm_$v \
      > /tmp/gl2/warm_$v.log 2>&1 &
done
wait
stamp "warm done"
grep -h "error" /tmp/gl2/warm_*.log | head -5 | tee -a "$L"
for v in $ORDER; do
  env ${V[$v]} EQUIKERNELS_CACHE_DIR=/tmp/ekc_$v timeout 120 python benchmarks/bench_mixed.py --problems mace-large,mace-medium \
      --dtypes fp32,bf16 --impls ek --out /tmp/gl2/$v > /tmp/gl2/$v.log 2>&1
  stamp "$v rc=$?"
  grep -E "^\| mace-(large|medium) \| (fwd|bwd)|error" /tmp/gl2/$v.log | sed "s/^/$v /" | tee -a "$L"
done
tar -czf "$OUT/logs2.tgz" -C /tmp/gl2 .
