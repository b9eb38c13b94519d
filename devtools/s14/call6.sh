#!/usr/bin/env bash
# Session 14, device call 6 (issue 4): nequip-water's double-backward launch shape (rows x warps
# per program; default 8 x 4) against its GPU time (bench_tp's queued column) at 20k / 50k rows.
set -u
OUT=${OUT:-/tmp/out}; L="$OUT/call6.log"; mkdir -p "$OUT" /tmp/c6
export TRITON_CACHE_DIR=/tmp/tcache
V="8x4 4x4 4x2 2x2 16x4 16x8 8x8 8x2 4x1"
for v in $V; do
  EQUIKERNELS_ROWS_DBWD=${v%x*} EQUIKERNELS_WARPS_DBWD=${v#*x} EQUIKERNELS_CACHE_DIR=/tmp/ekc6_$v timeout 240 \
    python benchmarks/bench_tp.py --problems nequip-water --directions dbwd --dtypes float32 --impls equikernels_ir_mul \
    --dbwd-rows 2000 --no-gpu-time --out /tmp/c6/warm_$v > /tmp/c6/warm_$v.log 2>&1 &
done
wait
for rep in 1 2; do for v in $V; do
  EQUIKERNELS_ROWS_DBWD=${v%x*} EQUIKERNELS_WARPS_DBWD=${v#*x} EQUIKERNELS_CACHE_DIR=/tmp/ekc6_$v timeout 60 \
    python benchmarks/bench_tp.py --problems nequip-water --directions dbwd --dtypes float32 --impls equikernels_ir_mul \
    --out /tmp/c6/${v}_$rep > /tmp/c6/${v}_$rep.log 2>&1
  grep -E "^\[.*dbwd" /tmp/c6/${v}_$rep.log | sed "s/^/$v r$rep: /" | cut -c1-200 | tee -a "$L"
done; done
tar -czf "$OUT/c6.tgz" -C /tmp/c6 .
