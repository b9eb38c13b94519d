#!/usr/bin/env bash
# Session 15, device call 2 (issue 4): the direct double backward for split kernels (_KernelSet,
# nequip-lips) on CUDA (test_fast_launch whole), ncu of nequip-water's double backward (ours and
# cuEquivariance's kernels, 50k rows), then interleaved timing of nequip-lips (two processes) and
# nequip-water (one).
set -u
OUT=${OUT:-/tmp/out}; L="$OUT/call2.log"; mkdir -p "$OUT" /tmp/c2
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a "$L"; }
export TRITON_CACHE_DIR=/tmp/tcache EQUIKERNELS_CACHE_DIR=/tmp/ekc
timeout 300 python -m pytest -q -p no:cacheprovider tests/test_fast_launch.py > /tmp/c2/pytest.log 2>&1
stamp "pytest test_fast_launch (CUDA): $(tail -1 /tmp/c2/pytest.log)"
grep -E "FAILED|Error" /tmp/c2/pytest.log | head -10 | tee -a "$L"
SEC="--section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats"
for impl in equikernels_ir_mul cue_ir_mul; do
  timeout 150 ncu --clock-control none --profile-from-start off $SEC python devtools/s15/ncu_dbwd.py $impl nequip-water 50000 \
    > /tmp/c2/ncu_$impl.txt 2>&1
  stamp "ncu $impl rc $?"
  grep -E "^  [a-zA-Z_].*\(|Duration|DRAM Throughput|Memory Throughput|Registers Per|Achieved Occupancy|Theoretical Occupancy|Block Size|Grid Size|Eligible Warps|Issued Warp|No Eligible" /tmp/c2/ncu_$impl.txt | head -80 | tee -a "$L"
done
for rep in 1 2; do
  timeout 150 python benchmarks/bench_interleaved.py --problems nequip-lips --rows 20000,50000 \
    --impls equikernels_ir_mul,oeq,cue_ir_mul --rounds 15 --calls 60 --out /tmp/c2/lips_$rep > /tmp/c2/lips_$rep.log 2>&1
  stamp "lips rep $rep rc $?"
  grep -E "^   [a-z_]+ +[0-9]" /tmp/c2/lips_$rep.log | sed "s/^/lips $rep: /" | tee -a "$L"
done
timeout 120 python benchmarks/bench_interleaved.py --problems nequip-water --rows 20000,50000 \
  --impls equikernels_ir_mul,oeq,cue_ir_mul --rounds 15 --calls 100 --out /tmp/c2/water > /tmp/c2/water.log 2>&1
stamp "water rc $?"
grep -E "^   [a-z_]+ +[0-9]" /tmp/c2/water.log | sed "s/^/water: /" | tee -a "$L"
cp /tmp/c2/lips_*/*.md /tmp/c2/water/*.md "$OUT/" 2>/dev/null
tar -czf "$OUT/c2.tgz" -C /tmp/c2 .
