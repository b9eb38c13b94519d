#!/usr/bin/env bash
# Session 16, call 1: benzene's half-precision GPU tests (never run on a GPU before), one process
# per half type so the two cold compiles run concurrently.
source .bundle/unpack-bundle.sh > /dev/null
export PYTHONPATH=$PWD:$PYTHONPATH PYTHONUNBUFFERED=1 EQUIKERNELS_CACHE_DIR=/tmp/ekc
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt
python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a $OUT/gpu.txt
for dt in fp16 bf16; do
  (timeout 570 python -m pytest -v -p no:cacheprovider -m gpu tests/test_mixed_precision.py \
     -k "standard_problems_gpu_half and benzene and $dt" --durations=0 > $OUT/benzene_$dt.log 2>&1; echo "rc=$?" >> $OUT/benzene_$dt.log) &
done
wait
for dt in fp16 bf16; do echo "== $dt"; grep -E "PASS|FAIL|Error|passed|failed|rc=" $OUT/benzene_$dt.log | tail -8; done
