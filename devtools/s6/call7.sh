# session 6, device call 7: training step with cuEquivariance's mixed precision (its first pass JIT-compiles
# its uniform_1d kernels for a few minutes), all the remaining device time
source .bundle/unpack-bundle.sh > /dev/null
export PYTHONPATH=$PWD:$PYTHONPATH EQUIKERNELS_CACHE_DIR=/tmp/ekc
M=/tmp/e3nn044
PYTHONPATH=$M:$PYTHONPATH timeout -s ABRT 470 python -X faulthandler benchmarks/bench_train.py --impls mace-cueq-bf16,ek-bf16,ek-fp32 --no-cueq-ref --time-budget-s 420 --out $OUT/train.json > $OUT/train.log 2>&1
grep -v -E "Warning|warn|visitor|^\s*$|atomic_numbers" $OUT/train.log | grep -v "^  File" | tail -14
