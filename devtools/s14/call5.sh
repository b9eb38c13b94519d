#!/usr/bin/env bash
# Session 14, device call 5: GPU tests of the trimmed host paths (test_fast_launch whole file on
# CUDA: the direct backward / double backward bit-identical to the full path; test_autograd), then
# bench_mixed (ours + cue, MACE problems, fp32 / bf16 / fp16) and bench_tp's nequip-water dbwd
# (ours, OEQ; cue in the first of three processes), both with the per-cell GPU time.
set -u
OUT=${OUT:-/tmp/out}; L="$OUT/call5.log"; mkdir -p "$OUT" /tmp/c5
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a "$L"; }
export TRITON_CACHE_DIR=/tmp/tcache EQUIKERNELS_CACHE_DIR=/tmp/ekc
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$L"
timeout 200 python -m pytest -q -p no:cacheprovider tests/test_fast_launch.py tests/test_autograd.py > /tmp/c5/pytest.log 2>&1
stamp "pytest fast_launch + autograd (CUDA): $(tail -1 /tmp/c5/pytest.log)"
grep -E "FAILED|Error" /tmp/c5/pytest.log | head -10 | tee -a "$L"
timeout 330 python benchmarks/bench_mixed.py --problems mace-large,mace-mp-medium-L2,mace-medium --dtypes fp32,bf16,fp16 \
  --impls ek,cue --out /tmp/c5/mixed > /tmp/c5/mixed.log 2>&1
stamp "bench_mixed rc $?"
sed -n '/^| problem | dir/,/^wrote/p' /tmp/c5/mixed.log | tee -a "$L"
for rep in 1 2 3; do
  impls=equikernels_ir_mul,oeq; [ $rep = 1 ] && impls=equikernels_ir_mul,oeq,cue_ir_mul
  timeout 100 python benchmarks/bench_tp.py --problems nequip-water --directions dbwd --dtypes float32 \
    --impls $impls --out /tmp/c5/dbwd_$rep > /tmp/c5/dbwd_$rep.log 2>&1
  grep -E "^\[.*dbwd" /tmp/c5/dbwd_$rep.log | sed "s/^/rep $rep: /" | tee -a "$L"
done
stamp done
cp /tmp/c5/mixed/*.md /tmp/c5/mixed/*.json "$OUT/" 2>/dev/null
tar -czf "$OUT/c5.tgz" -C /tmp/c5 .
