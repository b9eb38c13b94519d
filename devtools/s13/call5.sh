#!/usr/bin/env bash
# Session 13, device call 5 (issue 10): why mace-medium's bf16 backward is slower in processes that
# also run cuEquivariance. bench_mixed for mace-medium alone (ek; ek + cue), then call 4's full run
# under torch.profiler (kernel durations kept, devtools/s13/prof_mixed.py).
set -u
OUT=${OUT:-/tmp/out}; L="$OUT/call5.log"; mkdir -p "$OUT" /tmp/gl5
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a "$L"; }
export TRITON_CACHE_DIR=/tmp/tcache EQUIKERNELS_CACHE_DIR=/tmp/ekc
P=mace-large,mace-mp-medium-L2,mace-medium
timeout 300 python benchmarks/bench_mixed.py --problems $P --dtypes fp32,bf16,fp16 --impls ek,cue \
    --rows 2000 --check-rows 500 --min-reps 1 --max-reps 2 --out /tmp/gl5/warm > /tmp/gl5/warm.log 2>&1
stamp "warm rc=$?"
run() { tag=$1; shift; timeout 120 python benchmarks/bench_mixed.py "$@" --out /tmp/gl5/$tag > /tmp/gl5/$tag.log 2>&1
  grep -E "^\| mace.* \| bwd" /tmp/gl5/$tag.log | sed "s/^/$tag /" | tee -a "$L"; }
run ek_med --problems mace-medium --dtypes fp32,bf16,fp16 --impls ek
run ekcue_med --problems mace-medium --dtypes fp32,bf16,fp16 --impls ek,cue
run ekcue_lm --problems mace-large,mace-medium --dtypes fp32,bf16,fp16 --impls ek,cue
run ek_all --problems $P --dtypes fp32,bf16,fp16 --impls ek
timeout 200 python devtools/s13/prof_mixed.py "$OUT/prof_kernels.json" --problems $P --dtypes fp32,bf16,fp16 \
    --impls ek,cue --out /tmp/gl5/prof > /tmp/gl5/prof.log 2>&1
stamp "prof rc=$?"; grep -E "^\| mace.* \| bwd|kernels kept" /tmp/gl5/prof.log | sed "s/^/prof /" | tee -a "$L"
tar -czf "$OUT/logs5.tgz" -C /tmp/gl5 .
