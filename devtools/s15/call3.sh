#!/usr/bin/env bash
# Session 15, device call 3: nequip-water double-backward kernel variants (loads issued early,
# launch shapes), compiled in parallel, then timed one after another (GPU time at 50k rows).
set -u
OUT=${OUT:-/tmp/out}; L="$OUT/call3.log"; mkdir -p "$OUT" /tmp/c3
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a "$L"; }
export TRITON_CACHE_DIR=/tmp/tcache
V=("" "EQUIKERNELS_PREFETCH_DBWD=2" "EQUIKERNELS_PREFETCH_DBWD=4" "EQUIKERNELS_PREFETCH_DBWD=8"
   "EQUIKERNELS_ROWS_DBWD=1 EQUIKERNELS_WARPS_DBWD=1" "EQUIKERNELS_ROWS_DBWD=2 EQUIKERNELS_WARPS_DBWD=1"
   "EQUIKERNELS_ROWS_DBWD=1 EQUIKERNELS_WARPS_DBWD=1 EQUIKERNELS_PREFETCH_DBWD=4"
   "EQUIKERNELS_ROWS_DBWD=4 EQUIKERNELS_WARPS_DBWD=1 EQUIKERNELS_PREFETCH_DBWD=4"
   "EQUIKERNELS_PREFETCH_DBWD=16" "EQUIKERNELS_ROWS_DBWD=2 EQUIKERNELS_WARPS_DBWD=2 EQUIKERNELS_PREFETCH_DBWD=8")
for i in "${!V[@]}"; do
  env ${V[$i]} EQUIKERNELS_CACHE_DIR=/tmp/ekc$i timeout 200 python devtools/s15/variants.py nequip-water 50000 warm \
    > /tmp/c3/warm_$i.log 2>&1 &
done
wait
stamp "warm done: $(grep -c Traceback /tmp/c3/warm_*.log | grep -v ':0' | wc -l) failed"
for rep in 1 2; do
  for i in "${!V[@]}"; do
    env ${V[$i]} EQUIKERNELS_CACHE_DIR=/tmp/ekc$i timeout 60 python devtools/s15/variants.py nequip-water 50000 2>&1 \
      | grep -E "^nequip|Error" | tee -a "$L"
  done
done
stamp done
tail -3 /tmp/c3/warm_*.log > "$OUT/warm_tails.txt"
