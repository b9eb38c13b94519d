# session 6, device call 2: DiffDock with the weight gradient in its own kernel; training step with cue rows
source .bundle/unpack-bundle.sh > /dev/null
export PYTHONPATH=$PWD:$PYTHONPATH EQUIKERNELS_CACHE_DIR=/tmp/ekc
M=/tmp/e3nn044
timeout 130 python devtools/gpu_diag.py diffdock-L2:bwd diffdock-L2:bwd:4:4 diffdock-L2:dbwd diffdock-L2:dbwd:2:2 > $OUT/diffdock_splitgw.jsonl 2>&1
timeout 60 python -m pytest -q -m gpu tests/test_kernels.py -k "diffdock" -x 2>&1 | tail -1
PYTHONPATH=$M:$PYTHONPATH timeout 420 python benchmarks/bench_train.py --impls mace-cueq-bf16,mace-cueq-fp32,ek-bf16,ek-fp32 --no-cueq-ref --time-budget-s 380 --out $OUT/train.json > $OUT/train.log 2>&1
grep -v -E "Warning|warn|visitor|^\s*$|atomic_numbers" $OUT/train.log | tail -14
grep -h '^{' $OUT/diffdock_splitgw.jsonl | cut -c1-250
