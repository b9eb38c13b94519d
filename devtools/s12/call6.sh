#!/usr/bin/env bash
# Session 12, device call 6 (issue 10): mace-medium's bf16 backward took 0.227 ms with the new
# defaults in call 5 against 0.184 with the same settings given by environment in calls 3 and 4.
# Ours only, mace-medium fp32 / bf16: defaults, call 4's k4 environment, defaults + REG_CAP=all,
# defaults without the ek-only restriction (cue in the process). Plus the GPU kernel tests.
set -u
OUT=${OUT:-/tmp/out}; L="$OUT/call6.log"; mkdir -p "$OUT" /tmp/gl6
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a "$L"; }
export TRITON_CACHE_DIR=/tmp/tcache
A11="EQUIKERNELS_REG_CAP=all EQUIKERNELS_ROWS_BWD=1 EQUIKERNELS_WARPS_BWD=1"
declare -A V=( [def]="" [k4]="$A11 EQUIKERNELS_PREFETCH_FWD=4 EQUIKERNELS_PREFETCH_BWD=4" [defall]="EQUIKERNELS_REG_CAP=all" )
ORDER="def k4 defall"
timeout 330 python -m pytest -q -p no:cacheprovider -m gpu tests/test_kernels.py -k "standard_problems_gpu or gradgradcheck_gpu" \
    > /tmp/gl6/test_kernels.log 2>&1 &
for v in $ORDER; do
  env ${V[$v]} EQUIKERNELS_CACHE_DIR=/tmp/ekc_$v timeout 200 python benchmarks/bench_mixed.py --problems mace-medium \
      --dtypes fp32,bf16 --impls ek --rows 2000 --check-rows 500 --min-reps 1 --max-reps 2 --out /tmp/gl6/warm_$v \
      > /tmp/gl6/warm_$v.log 2>&1 &
done
wait
stamp "warm + test: $(tail -1 /tmp/gl6/test_kernels.log)"
for rep in 1 2; do for v in $ORDER; do
  env ${V[$v]} EQUIKERNELS_CACHE_DIR=/tmp/ekc_$v timeout 60 python benchmarks/bench_mixed.py --problems mace-medium \
      --dtypes fp32,bf16 --impls ek --out /tmp/gl6/${v}_$rep > /tmp/gl6/${v}_$rep.log 2>&1
  grep -E "^\| mace-medium \| bwd" /tmp/gl6/${v}_$rep.log | sed "s/^/$v r$rep /" | tee -a "$L"
done; done
EQUIKERNELS_CACHE_DIR=/tmp/ekc_def timeout 90 python benchmarks/bench_mixed.py --problems mace-medium --dtypes fp32,bf16 \
    --impls ek,cue --out /tmp/gl6/defcue > /tmp/gl6/defcue.log 2>&1
grep -E "^\| mace-medium \| bwd" /tmp/gl6/defcue.log | sed "s/^/def+cue /" | tee -a "$L"
tar -czf "$OUT/logs6.tgz" -C /tmp/gl6 .
