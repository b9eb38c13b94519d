#!/usr/bin/env bash
# session 7, call 1: fused radial conv correctness + side by side (issue 11)
source .bundle/unpack-bundle.sh > /dev/null
export PYTHONPATH=$PWD:$PYTHONPATH EQUIKERNELS_CACHE_DIR=/tmp/ekc
nvidia-smi --query-gpu=name --format=csv,noheader
python -c "import torch,triton;print(torch.__version__,triton.__version__)"
timeout 560 python benchmarks/bench_radial_conv.py --atoms 10192 2916 --out $OUT/rconv1.json 2>&1 | tee $OUT/rconv1.log | grep -v Warning
