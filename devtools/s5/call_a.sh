# session 5: fused radial MLP on the GPU, MACE 10k with it (side by side with cuEquivariance), training step
source .bundle/unpack-bundle.sh >/dev/null 2>&1
export PYTHONPATH=$PWD:$PYTHONPATH EQUIKERNELS_CACHE_DIR=/tmp/ekc PYTHONUNBUFFERED=1
F="Warning|warn|visitor|^\s*$|^\s+File|Traceback"
timeout 150 python devtools/s5/mlp_gpu.py $OUT/mlp.json 2>&1 | grep -v -E "$F" > $OUT/mlp.log; tail -25 $OUT/mlp.log
PYTHONPATH=/tmp/e3nn044:$PYTHONPATH timeout 170 python benchmarks/bench_mace.py --out $OUT/mace10k.json --dtypes float32 \
  --systems cu-1008,cu-10192 --impls equikernels,mace-cueq --target-ms 200 2>&1 | grep -v -E "$F" > $OUT/mace10k.log; tail -8 $OUT/mace10k.log
PYTHONPATH=/tmp/e3nn044:$PYTHONPATH timeout 240 python benchmarks/bench_train.py --out $OUT/train.json --time-budget-s 220 2>&1 \
  | grep -v -E "$F" > $OUT/train.log; tail -25 $OUT/train.log
