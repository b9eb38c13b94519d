#!/usr/bin/env bash
# Session 13, device call 3 (issue 10): backward rows asked into L2 (emit._l2_prefetched) in chunks of
# 1024 elements: all at the top of the row loop (row) or D loads before their first load (D = 8, 16, 32). Ours only,
# fp32 / bf16, the three MACE problems. Warm-compile in parallel, then time serially, twice.
set -u
OUT=${OUT:-/tmp/out}; L="$OUT/call3.log"; mkdir -p "$OUT" /tmp/gl3
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a "$L"; }
export TRITON_CACHE_DIR=/tmp/tcache
P=mace-large,mace-mp-medium-L2,mace-medium
declare -A V=( [def]="" [row]="EQUIKERNELS_L2_PREFETCH_BWD=row" [w8]="EQUIKERNELS_L2_PREFETCH_BWD=8"
  [w16]="EQUIKERNELS_L2_PREFETCH_BWD=16" [w32]="EQUIKERNELS_L2_PREFETCH_BWD=32" [w16c]="EQUIKERNELS_L2_PREFETCH_BWD=16 EQUIKERNELS_MAXNREG=168" )
ORDER="def row w8 w16 w32 w16c"
for v in $ORDER; do
  env ${V[$v]} EQUIKERNELS_CACHE_DIR=/tmp/ekc_$v timeout 300 python benchmarks/bench_mixed.py --problems $P \
      --dtypes fp32,bf16 --impls ek --rows 2000 --check-rows 500 --min-reps 1 --max-reps 2 --out /tmp/gl3/warm_$v \
      > /tmp/gl3/warm_$v.log 2>&1 &
done
wait
stamp "warm done"; for v in $ORDER; do echo "$v: $(grep -c err /tmp/gl3/warm_$v.log) $(grep -m1 -i "error" /tmp/gl3/warm_$v.log)" | tee -a "$L"; done
for rep in 1 2; do for v in $ORDER; do
  env ${V[$v]} EQUIKERNELS_CACHE_DIR=/tmp/ekc_$v timeout 80 python benchmarks/bench_mixed.py --problems $P \
      --dtypes fp32,bf16 --impls ek --out /tmp/gl3/${v}_$rep > /tmp/gl3/${v}_$rep.log 2>&1
  grep -E "^\| mace.* \| bwd" /tmp/gl3/${v}_$rep.log | sed "s/^/$v r$rep /" | tee -a "$L"
  grep -E " err " /tmp/gl3/${v}_$rep.log | sed "s/^/$v r$rep /" >> "$OUT/errors.log"
done; done
tar -czf "$OUT/logs3.tgz" -C /tmp/gl3 .
