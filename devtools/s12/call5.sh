#!/usr/bin/env bash
# Session 12, device call 5 (issue 10): the new defaults for wide channel-wise products (partial
# channel sums and one-warp programs in the backward, loads issued 4 early in forward and backward,
# float32 register cap for those kernels). GPU tests of the touched paths, bench_mixed side by side
# with cuEquivariance (fp32 / bf16 / fp16), and bench_tp forward + backward fp32 of the three MACE
# problems side by side with cuEquivariance and OpenEquivariance.
set -u
OUT=${OUT:-/tmp/out}; L="$OUT/call5.log"; mkdir -p "$OUT" /tmp/gl5
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a "$L"; }
export TRITON_CACHE_DIR=/tmp/tcache EQUIKERNELS_CACHE_DIR=/tmp/ekc
P=mace-large,mace-mp-medium-L2,mace-medium
t() { timeout 250 python -m pytest -q -p no:cacheprovider -m gpu "$@" > "/tmp/gl5/test_$(echo "$*" | tr -c 'a-zA-Z0-9' _ | cut -c1-50).log" 2>&1; }
timeout 230 python benchmarks/bench_mixed.py --problems mace-large,mace-medium --dtypes fp32,bf16,fp16 --impls ek,cue \
    --rows 2000 --check-rows 500 --min-reps 1 --max-reps 2 --out /tmp/gl5/warm_mixed > /tmp/gl5/warm_mixed.log 2>&1 &
timeout 230 python benchmarks/bench_tp.py --problems $P --dtypes float32 --directions fwd,bwd --rows 2000 \
    --impls equikernels_ir_mul,cue_ir_mul,oeq --check-rows 500 --target-ms 5 --out /tmp/gl5/warm_tp > /tmp/gl5/warm_tp.log 2>&1 &
t tests/test_fast_launch.py &
t tests/test_mixed_precision.py -k "mace and not benzene" &
t tests/test_kernels.py -k "standard_problems_gpu or gradgradcheck_gpu" &
wait
stamp "warm + tests done"
for f in /tmp/gl5/test_*.log; do stamp "$(tail -1 $f) <- $(basename $f)"; done
timeout 130 python benchmarks/bench_mixed.py --problems mace-large,mace-medium --dtypes fp32,bf16,fp16 --impls ek,cue \
    --out "$OUT" > /tmp/gl5/mixed.log 2>&1
stamp "bench_mixed rc=$?"
grep -E "^\| mace|target" /tmp/gl5/mixed.log | tee -a "$L"
timeout 130 python benchmarks/bench_tp.py --problems $P --dtypes float32 --directions fwd,bwd \
    --impls equikernels_ir_mul,cue_ir_mul,oeq --target-ms 100 --out "$OUT" --tag s12 > /tmp/gl5/tp.log 2>&1
stamp "bench_tp rc=$?"
grep -A12 -- "-- summary" /tmp/gl5/tp.log | tee -a "$L"
tar -czf "$OUT/logs5.tgz" -C /tmp/gl5 .
