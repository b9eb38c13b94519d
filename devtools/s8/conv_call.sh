#!/usr/bin/env bash
# Device script for issue 5 (conv backward): kernel times, variant scans and Nsight Compute profiles.
# usage (repo root, on the GPU machine):  bash devtools/s8/conv_call.sh STEP [STEP ...]
#   scan:DIR:VARIANTS   devtools/s8/conv_once.py DIR --scan VARIANTS   (VARIANTS: 'A;B', see conv_once.py)
#   ncu:DIR:VARIANT     ncu on DIR's conv kernels and the segment sum, with VARIANT's settings ('-': defaults)
#   diag                devtools/conv_diag.py mace-mp-medium-L2 10192 (kernel times of every direction)
#   bench               benchmarks/bench_conv.py side by side with cuEquivariance and OpenEquivariance
#                       (IMPLS=...: OpenEquivariance's JIT-built extension segfaulted on this machine)
# Everything lands in $OUT; a summary is printed last. Steps start only before BUDGET_S seconds and
# diag / bench stop at END_S seconds (defaults 330 / 400), so the call ends inside its limit.
source .bundle/unpack-bundle.sh > $OUT/versions.txt 2>&1
export PYTHONPATH=$PWD:$PYTHONPATH EQUIKERNELS_CACHE_DIR=/tmp/ekc PYTHONUNBUFFERED=1
NCU=$(which ncu 2>/dev/null || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader >> $OUT/versions.txt
SUM=$OUT/summary.txt; : > $SUM
n=0
for step in "$@"; do
  n=$((n + 1)); IFS=: read -r what dir var <<< "$step"; t0=$SECONDS
  if [ $SECONDS -gt ${BUDGET_S:-330} ]; then echo "-- step $n ($step) skipped: ${SECONDS}s used" >> $SUM; continue; fi
  case $what in
  scan)
    python devtools/s8/conv_once.py $dir --scan "$var" > $OUT/scan$n.txt 2>&1
    grep -E " ms |FAILED" $OUT/scan$n.txt | sed 's/  {.*//' >> $SUM ;;
  ncu)
    envs=(); [ "$var" != "-" ] && for kv in $var; do envs+=("EQUIKERNELS_CONV_$kv"); done
    env "${envs[@]}" python devtools/s8/conv_once.py $dir > /dev/null 2>&1  # compile outside the profiler
    # every launch of both runs (the first run's too: its kernels are compiled already)
    env "${envs[@]}" timeout 240 $NCU --clock-control none -k regex:"conv_|_segment_sum" --launch-count 8 \
      --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
      --section MemoryWorkloadAnalysis --section InstructionStats --section SourceCounters \
      python devtools/s8/conv_once.py $dir > $OUT/ncu$n.txt 2>&1
    echo "== ncu $dir [$var] rc=$?" >> $SUM
    grep -E "^  [a-z_]+.*\(|Duration|DRAM Throughput|Memory Throughput|Registers Per|Achieved Occupancy|Theoretical Occ|Block Limit Reg|Warp Cycles Per Issued|Issue Slots Busy|Executed Ipc A|L2 Hit|L1/TEX Hit|stalled|Local" \
      $OUT/ncu$n.txt | sed 's/  */ /g' | cut -c1-300 >> $SUM ;;
  diag)
    timeout $(( ${END_S:-400} - SECONDS )) python devtools/conv_diag.py mace-mp-medium-L2 10192 > $OUT/diag$n.json 2> $OUT/diag$n.err
    tail -1 $OUT/diag$n.err >> $SUM ;;
  bench)
    timeout $(( ${END_S:-400} - SECONDS )) python benchmarks/bench_conv.py --atoms 10192 2916 --impls ${IMPLS:-ek_det,cue_fused,oeq_det} --check-atoms 256 \
      --out $OUT/conv.json > $OUT/bench.txt 2>&1
    tail -25 $OUT/bench.txt >> $SUM ;;
  esac
  echo "-- step $n ($what $dir) took $((SECONDS - t0)) s" >> $SUM
done
cat $OUT/versions.txt $SUM
