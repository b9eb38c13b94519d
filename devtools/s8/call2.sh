#!/usr/bin/env bash
# session 8 call 2: transposed (channels x edges, wgmma) fwd / gx kernels of the fused radial conv
source .bundle/unpack-bundle.sh > /dev/null
export PYTHONPATH=$PWD:$PYTHONPATH EQUIKERNELS_CACHE_DIR=/tmp/ekc PYTHONUNBUFFERED=1
timeout 330 python devtools/s8/rconv_t.py fwd,gx 16:8:8 32:8:8 16:4:8 16:8:32 > $OUT/sweep.txt 2>&1
grep -v "Warn\|warn" $OUT/sweep.txt | tail -8
NCU=/usr/local/cuda/bin/ncu
EQUIKERNELS_RCONV_WARPS=8 EQUIKERNELS_RCONV_STAGES=1 timeout 150 $NCU --clock-control none -k regex:rconv_fwd --launch-skip 1 --launch-count 1 \
  --section SpeedOfLight --section Occupancy --section WarpStateStats --section InstructionStats \
  python devtools/s8/rconv_t.py once fwd > $OUT/ncu_fwd.txt 2>&1
grep -E "Duration|Registers Per|Achieved Occ|Issued Ipc|Executed Instructions  |L1/TEX Cache|Compute \(SM\)" $OUT/ncu_fwd.txt
