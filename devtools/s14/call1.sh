#!/usr/bin/env bash
# Session 14, device call 1. Issue 4: host time of nequip-water's double backward, ours / OEQ / a
# floor (devtools/s14/host_probe.py). Issue 10: mace-medium's bf16 backward over 16 allocations per
# L2-prefetch setting (devtools/s13/alloc_probe.py). Warm-compile in parallel, then time serially.
set -u
OUT=${OUT:-/tmp/out}; L="$OUT/call1.log"; mkdir -p "$OUT" /tmp/w
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a "$L"; }
export TRITON_CACHE_DIR=/tmp/tcache
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee -a "$L"
ORDER="off 8 16 32 row"
for v in $ORDER; do
  EQUIKERNELS_L2_PREFETCH_BWD=$v EQUIKERNELS_CACHE_DIR=/tmp/ekc_$v TRIALS=1 timeout 200 \
    python devtools/s13/alloc_probe.py mace-medium:bfloat16 > /tmp/w/warm_$v.log 2>&1 &
done
EQUIKERNELS_CACHE_DIR=/tmp/ekc_16 timeout 200 python devtools/s13/alloc_probe.py mace-medium:float32 > /tmp/w/warm_f32.log 2>&1 &
EQUIKERNELS_CACHE_DIR=/tmp/ekc_h timeout 250 python devtools/s14/host_probe.py --rows 64 --rounds 1 --calls 20 > /tmp/w/warm_host.log 2>&1 &
wait
stamp "warm done"; tail -n 3 /tmp/w/*.log | tee -a "$L"
EQUIKERNELS_CACHE_DIR=/tmp/ekc_h timeout 150 python devtools/s14/host_probe.py --rows 64,20000,50000 --rounds 3 \
  --calls 1000 --profile > "$OUT/host_probe.log" 2>&1
grep -E "event ms" "$OUT/host_probe.log" | tee -a "$L"
stamp "host probe done"
for v in $ORDER; do
  EQUIKERNELS_L2_PREFETCH_BWD=$v EQUIKERNELS_CACHE_DIR=/tmp/ekc_$v TRIALS=16 timeout 90 \
    python devtools/s13/alloc_probe.py mace-medium:bfloat16 2>&1 | grep -v -i warn | sed "s/^/L2=$v /" >> "$OUT/alloc.log"
  grep "L2=$v .*medians" "$OUT/alloc.log" | tee -a "$L"
done
EQUIKERNELS_CACHE_DIR=/tmp/ekc_16 TRIALS=8 timeout 60 python devtools/s13/alloc_probe.py mace-medium:float32 2>&1 \
  | grep -v -i warn | sed "s/^/fp32 /" >> "$OUT/alloc.log"
grep "fp32 .*medians" "$OUT/alloc.log" | tee -a "$L"
stamp done
