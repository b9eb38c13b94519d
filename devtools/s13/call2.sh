#!/usr/bin/env bash
# Session 13, device call 2 (issue 10): rows asked into L2 ahead of their loads (prefetch.global.L2 for
# every 128-byte line of the row operands at the top of the row loop; emit._l2_prefetched). Ours only,
# fp32 / bf16, the three MACE problems. Warm-compile in parallel, then time serially, twice.
set -u
OUT=${OUT:-/tmp/out}; L="$OUT/call2.log"; mkdir -p "$OUT" /tmp/gl2
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a "$L"; }
export TRITON_CACHE_DIR=/tmp/tcache
P=mace-large,mace-mp-medium-L2,mace-medium
declare -A V=( [def]="" [l2b]="EQUIKERNELS_L2_PREFETCH_BWD=1 EQUIKERNELS_MAXNREG=168"
  [l2bnc]="EQUIKERNELS_L2_PREFETCH_BWD=1" [l2k0]="EQUIKERNELS_L2_PREFETCH_BWD=1 EQUIKERNELS_PREFETCH_BWD=0 EQUIKERNELS_MAXNREG=168"
  [l2all]="EQUIKERNELS_L2_PREFETCH=1 EQUIKERNELS_MAXNREG=168" )
ORDER="def l2b l2bnc l2k0 l2all"
for v in $ORDER; do
  env ${V[$v]} EQUIKERNELS_CACHE_DIR=/tmp/ekc_$v timeout 300 python benchmarks/bench_mixed.py --problems $P \
      --dtypes fp32,bf16 --impls ek --rows 2000 --check-rows 500 --min-reps 1 --max-reps 2 --out /tmp/gl2/warm_$v \
      > /tmp/gl2/warm_$v.log 2>&1 &
done
wait
stamp "warm done"; for v in $ORDER; do echo "$v: $(grep -c err /tmp/gl2/warm_$v.log) $(grep -m1 -i "error" /tmp/gl2/warm_$v.log)" | tee -a "$L"; done
for rep in 1 2; do for v in $ORDER; do
  env ${V[$v]} EQUIKERNELS_CACHE_DIR=/tmp/ekc_$v timeout 80 python benchmarks/bench_mixed.py --problems $P \
      --dtypes fp32,bf16 --impls ek --out /tmp/gl2/${v}_$rep > /tmp/gl2/${v}_$rep.log 2>&1
  grep -E "^\| mace.* \| (bwd|fwd)" /tmp/gl2/${v}_$rep.log | sed "s/^/$v r$rep /" | tee -a "$L"
  grep -E " err " /tmp/gl2/${v}_$rep.log | sed "s/^/$v r$rep /" >> "$OUT/errors.log"
done; done
tar -czf "$OUT/logs2.tgz" -C /tmp/gl2 .
