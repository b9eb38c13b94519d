#!/usr/bin/env bash
# session 8 call 1: is ncu usable here; where does the fused radial conv forward spend its time
source .bundle/unpack-bundle.sh > /dev/null
export PYTHONPATH=$PWD:$PYTHONPATH EQUIKERNELS_CACHE_DIR=/tmp/ekc PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
which ncu || ls /opt/nvidia/nsight-compute/*/ncu
NCU=$(which ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
python devtools/s8/rconv_t.py once fwd > $OUT/warm.log 2>&1; tail -2 $OUT/warm.log
for k in fwd edge; do
  timeout 200 $NCU --clock-control none -k regex:rconv --launch-skip 1 --launch-count 1 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
    --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section InstructionStats \
    python devtools/s8/rconv_t.py once $k > $OUT/ncu_$k.txt 2>&1
  echo "== $k rc=$?"; grep -E "Duration|Throughput|Registers|Achieved Occ|Theoretical Occ|Stall|Issued|Executed Ipc|Block Limit|Shared Memory Config|Dynamic Shared|Local" $OUT/ncu_$k.txt | head -40
done
