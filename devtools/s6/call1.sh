# session 6, device call 1 (ran on 3cd9ef6: the power-of-two split and its EQUIKERNELS_SPLIT_POW2 switch, since
# reverted): DiffDock split tables, nequip-water rows, host profile (now devtools/profile_host.py), then train bench
source .bundle/unpack-bundle.sh > /dev/null
export PYTHONPATH=$PWD:$PYTHONPATH EQUIKERNELS_CACHE_DIR=/tmp/ekc
M=/tmp/e3nn044
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
timeout 200 python -m pytest -q -m gpu tests/test_kernels.py -k "diffdock or water" -x 2>&1 | tail -2
D="diffdock-L2:fwd diffdock-L2:bwd diffdock-L2:bwd:2:2 diffdock-L2:bwd:4:4 diffdock-L2:dbwd diffdock-L2:dbwd:2:2 diffdock-L2:dbwd:1:4"
timeout 200 python devtools/gpu_diag.py $D > $OUT/diffdock_split.jsonl 2>&1
EQUIKERNELS_SPLIT_POW2=0 OUT=$OUT/ns timeout 150 python devtools/gpu_diag.py diffdock-L2:fwd diffdock-L2:bwd diffdock-L2:dbwd:2:2 > $OUT/diffdock_nosplit.jsonl 2>&1
W="nequip-water:fwd nequip-water:fwd:8:4 nequip-water:fwd:16:4 nequip-water:fwd:32:4 nequip-water:fwd:16:8 nequip-water:bwd nequip-water:bwd:16:4 nequip-water:bwd:8:4 nequip-water:dbwd nequip-water:dbwd:8:4 nequip-water:dbwd:16:4 host:nequip-water hostbwd:nequip-water"
mkdir -p $OUT/w; OUT=$OUT/w timeout 150 python devtools/gpu_diag.py $W > $OUT/water.jsonl 2>&1
timeout 60 python devtools/profile_host.py nequip-water > $OUT/water_profile.txt 2>&1
PYTHONPATH=$M:$PYTHONPATH timeout 270 python benchmarks/bench_train.py --impls ek-fp32,ek-bf16,mace-cueq-fp32,mace-cueq-bf16 --no-cueq-ref --time-budget-s 240 --out $OUT/train.json > $OUT/train.log 2>&1
tail -25 $OUT/train.log
grep -h -v "profile" $OUT/diffdock_split.jsonl $OUT/diffdock_nosplit.jsonl $OUT/water.jsonl | grep '^{' | cut -c1-230
