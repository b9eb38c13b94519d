#!/usr/bin/env bash
# Session 15, device call 4: loads issued early in the double backward (EQUIKERNELS_PREFETCH_DBWD)
# across the channel-wise problems: compiled in parallel, then timed one after another at 20k / 50k rows.
set -u
OUT=${OUT:-/tmp/out}; L="$OUT/call4.log"; mkdir -p "$OUT" /tmp/c4
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a "$L"; }
export TRITON_CACHE_DIR=/tmp/tcache
J=()
for p in nequip-water nequip-lips mace-medium mace-mp-medium-L2 mace-large; do
  for pf in 0 8 16 32; do
    [ $p = mace-large ] && [ $pf = 8 -o $pf = 32 ] && continue
    J+=("$p $pf")
  done
done
i=0
for j in "${J[@]}"; do
  set -- $j
  EQUIKERNELS_PREFETCH_DBWD=$2 EQUIKERNELS_CACHE_DIR=/tmp/ekc_$1_$2 timeout 300 python devtools/s15/variants.py $1 20000 warm \
    > /tmp/c4/warm_$1_$2.log 2>&1 &
  i=$((i+1)); [ $((i % 10)) = 0 ] && wait
done
wait
stamp "warm done; tracebacks in: $(grep -l Traceback /tmp/c4/warm_*.log | tr '\n' ' ')"
for rep in 1 2; do
  for j in "${J[@]}"; do
    set -- $j
    EQUIKERNELS_PREFETCH_DBWD=$2 EQUIKERNELS_CACHE_DIR=/tmp/ekc_$1_$2 timeout 60 python devtools/s15/variants.py $1 20000,50000 2>&1 \
      | grep -E "^nequip|^mace|Error" | tee -a "$L"
  done
done
stamp done
