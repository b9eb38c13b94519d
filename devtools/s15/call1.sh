#!/usr/bin/env bash
# Session 15, device call 1 (issue 4): double backward of the standard problems timed with the
# implementations interleaved (benchmarks/bench_interleaved.py): nequip-water in three processes,
# the other problems but benzene in one. Our kernels are compiled first, in parallel processes.
set -u
OUT=${OUT:-/tmp/out}; L="$OUT/call1.log"; mkdir -p "$OUT" /tmp/c1
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a "$L"; }
export TRITON_CACHE_DIR=/tmp/tcache EQUIKERNELS_CACHE_DIR=/tmp/ekc
uname -r | tee -a "$L"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$L"
P="mace-large mace-medium mace-mp-medium-L2 nequip-lips diffdock-L2 tetris-poly-1 nequip-water"
for p in $P; do
  timeout 200 python benchmarks/bench_interleaved.py --problems $p --rows 1000 --impls equikernels_ir_mul \
    --rounds 1 --calls 2 --no-check --out /tmp/c1/warm > /tmp/c1/warm_$p.log 2>&1 &
done
timeout 200 python -c "import openequivariance" > /tmp/c1/warm_oeq.log 2>&1 &
wait
stamp "warm: $(grep -l 'fastest' /tmp/c1/warm_*.log | wc -l) of 7 problems ran"
for rep in 1 2 3; do
  timeout 120 python benchmarks/bench_interleaved.py --problems nequip-water --rows 20000,50000 \
    --impls equikernels_ir_mul,oeq,cue_ir_mul --rounds 15 --calls 100 --out /tmp/c1/water_$rep > /tmp/c1/water_$rep.log 2>&1
  stamp "water rep $rep rc $?"
  grep -E "^   [a-z_]+ +[0-9]" /tmp/c1/water_$rep.log | sed "s/^/rep $rep: /" | tee -a "$L"
done
left=$(( 575 - ($(date +%s) - t0) ))
timeout $left python benchmarks/bench_interleaved.py \
  --problems mace-large,mace-medium,mace-mp-medium-L2,nequip-lips,diffdock-L2,tetris-poly-1 --rows 20000,50000 \
  --impls equikernels_ir_mul,oeq,cue_ir_mul --rounds 9 --calls 40 --out /tmp/c1/all > /tmp/c1/all.log 2>&1
stamp "all rc $?"
grep -E "^==|^   [a-z_]+ " /tmp/c1/all.log | tee -a "$L"
cp /tmp/c1/water_*/*.md /tmp/c1/all/*.md "$OUT/" 2>/dev/null
tar -czf "$OUT/c1.tgz" -C /tmp/c1 .
