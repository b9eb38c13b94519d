#!/usr/bin/env bash
# Session 15, device call 7: loads issued early in the forward and backward of the narrow channel-wise
# products (nequip-water, nequip-lips), which get none by default; compiled in parallel, timed serially.
set -u
OUT=${OUT:-/tmp/out}; L="$OUT/call7.log"; mkdir -p "$OUT" /tmp/c7
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a "$L"; }
export TRITON_CACHE_DIR=/tmp/tcache
J=()
for p in nequip-water nequip-lips; do for d in fwd bwd; do for pf in 0 8 16; do J+=("$p $d $pf"); done; done; done
for j in "${J[@]}"; do
  set -- $j
  DIR=$2 EQUIKERNELS_PREFETCH=$3 EQUIKERNELS_CACHE_DIR=/tmp/ekc_$1_$3 timeout 200 python devtools/s15/variants.py $1 50000 warm \
    > /tmp/c7/warm_$1_$2_$3.log 2>&1 &
done
wait
stamp "warm done; tracebacks in: $(grep -l Traceback /tmp/c7/warm_*.log | tr '\n' ' ')"
for rep in 1 2; do
  for j in "${J[@]}"; do
    set -- $j
    DIR=$2 EQUIKERNELS_PREFETCH=$3 EQUIKERNELS_CACHE_DIR=/tmp/ekc_$1_$3 timeout 60 python devtools/s15/variants.py $1 50000 2>&1 \
      | grep -E "^nequip|Error" | tee -a "$L"
  done
done
stamp done
