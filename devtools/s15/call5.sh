#!/usr/bin/env bash
# Session 15, device call 5: the double backward with loads issued early by default
# (TPKernels._dbwd_prefetched): GPU tests of the changed kernels (in parallel with compiling the
# bench's), then the interleaved double-backward bench for the four problems it changes.
set -u
OUT=${OUT:-/tmp/out}; L="$OUT/call5.log"; mkdir -p "$OUT" /tmp/c5
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a "$L"; }
export TRITON_CACHE_DIR=/tmp/tcache EQUIKERNELS_CACHE_DIR=/tmp/ekc
timeout 250 python -m pytest -q -p no:cacheprovider -m gpu tests/test_kernels.py -k "water or lips or mace-medium or mp-medium or prefetch" > /tmp/c5/pt_kernels.log 2>&1 &
timeout 250 python -m pytest -q -p no:cacheprovider tests/test_fast_launch.py > /tmp/c5/pt_fast.log 2>&1 &
timeout 250 python -m pytest -q -p no:cacheprovider -m gpu tests/test_autograd.py tests/test_mixed_precision.py -k "not benzene" > /tmp/c5/pt_autograd_mixed.log 2>&1 &
for p in nequip-water nequip-lips mace-medium mace-mp-medium-L2; do
  EQUIKERNELS_CACHE_DIR=/tmp/ekw_$p timeout 200 python devtools/s15/variants.py $p 20000 warm > /tmp/c5/warm_$p.log 2>&1 &
done
wait
for f in /tmp/c5/pt_*.log; do stamp "$(basename $f): $(tail -1 $f)"; grep -E "^FAILED|^ERROR" $f | head -5 | tee -a "$L"; done
left=$(( 580 - ($(date +%s) - t0) ))
timeout $left python benchmarks/bench_interleaved.py --problems nequip-water,nequip-lips,mace-medium,mace-mp-medium-L2 \
  --rows 20000,50000 --impls equikernels_ir_mul,oeq,cue_ir_mul --rounds 9 --calls 60 --out /tmp/c5/il > /tmp/c5/il.log 2>&1
stamp "interleaved rc $?"
grep -E "^==|^   [a-z_]+ " /tmp/c5/il.log | tee -a "$L"
cp /tmp/c5/il/*.md /tmp/c5/il/*.json "$OUT/" 2>/dev/null
tar -czf "$OUT/c5.tgz" -C /tmp/c5 .
