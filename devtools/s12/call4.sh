#!/usr/bin/env bash
# Session 12, device call 4 (issue 10). A: prefetch distance for mace-large / mace-medium (ours, fp32
# and bf16, 50k rows; call 3: K=4 best for mace-large bf16 backward, 0.505 ms, K=16 for mace-medium,
# 0.160). B: the float32 backward of every §7 problem with the old defaults against candidate new
# ones (partial sums, 1-warp backward programs, float32 register cap, prefetch), ours only.
set -u
OUT=${OUT:-/tmp/out}; L="$OUT/call4.log"; mkdir -p "$OUT" /tmp/gl4
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a "$L"; }
export TRITON_CACHE_DIR=/tmp/tcache
A11="EQUIKERNELS_REG_CAP=all EQUIKERNELS_ROWS_BWD=1 EQUIKERNELS_WARPS_BWD=1"
pf() { echo "EQUIKERNELS_PREFETCH_FWD=$1 EQUIKERNELS_PREFETCH_BWD=$1"; }
declare -A V=( [k4]="$A11 $(pf 4)" [k4c]="$A11 $(pf 4) EQUIKERNELS_CLAMP_ROWS=1" [k2]="$A11 $(pf 2)"
               [k6]="$A11 $(pf 6)" [k16u]="$A11 $(pf 16) EQUIKERNELS_REG_CAP=0" [k32]="$A11 $(pf 32)"
               [k32u]="$A11 $(pf 32) EQUIKERNELS_REG_CAP=0" )
declare -A B=( [old]="EQUIKERNELS_PARTIAL_SUM=0" [new4]="$A11 $(pf 4)" [new16]="$A11 $(pf 16)" )
ORDER=${ORDER:-"k4 k4c k2 k6 k16u k32 k32u"}
BORDER=${BORDER:-"old new4 new16"}
P=mace-large,mace-mp-medium-L2,mace-medium,nequip-revmd17-benzene,nequip-lips,nequip-water,diffdock-L2,tetris-poly-1
for v in $ORDER; do
  env ${V[$v]} EQUIKERNELS_CACHE_DIR=/tmp/ekc_$v timeout 280 python benchmarks/bench_mixed.py --problems mace-large,mace-medium \
      --dtypes fp32,bf16 --impls ek --rows 2000 --check-rows 500 --min-reps 1 --max-reps 2 --out /tmp/gl4/warm_$v \
      > /tmp/gl4/warm_$v.log 2>&1 &
done
for v in $BORDER; do
  env ${B[$v]} EQUIKERNELS_CACHE_DIR=/tmp/ekcb_$v timeout 280 python benchmarks/bench_tp.py --problems $P --dtypes float32 \
      --directions bwd --rows 2000 --impls equikernels_ir_mul --check-rows 500 --target-ms 5 --out /tmp/gl4/warmb_$v \
      > /tmp/gl4/warmb_$v.log 2>&1 &
done
wait
stamp "warm done"
for v in $ORDER; do
  env ${V[$v]} EQUIKERNELS_CACHE_DIR=/tmp/ekc_$v timeout 120 python benchmarks/bench_mixed.py --problems mace-large,mace-medium \
      --dtypes fp32,bf16 --impls ek --out /tmp/gl4/$v > /tmp/gl4/$v.log 2>&1
  stamp "$v rc=$?"
  grep -E "^\| mace-(large|medium) \| (fwd|bwd)|error" /tmp/gl4/$v.log | sed "s/^/$v /" | tee -a "$L"
done
for v in $BORDER; do
  env ${B[$v]} EQUIKERNELS_CACHE_DIR=/tmp/ekcb_$v timeout 150 python benchmarks/bench_tp.py --problems $P --dtypes float32 \
      --directions bwd --impls equikernels_ir_mul --target-ms 100 --out /tmp/gl4/b_$v > /tmp/gl4/b_$v.log 2>&1
  stamp "B $v rc=$?"
  grep -A14 -- "-- summary" /tmp/gl4/b_$v.log | sed "s/^/$v /" | tee -a "$L"
done
tar -czf "$OUT/logs4.tgz" -C /tmp/gl4 .
