# session 5, device call 1: where MACE 10k E+F spends its time; conv gradient-kernel variants
source .bundle/unpack-bundle.sh
export PYTHONPATH=$PWD:$PYTHONPATH EQUIKERNELS_CACHE_DIR=/tmp/ekc
M=/tmp/e3nn044
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python devtools/warm_conv.py mace-mp-medium-L2 deterministic dbwd float32 ir_mul > $OUT/w0.log 2>&1 &
EQUIKERNELS_CONV_GRAD_LOOPS=in1 python devtools/warm_conv.py mace-mp-medium-L2 deterministic dbwd float32 ir_mul > $OUT/w1.log 2>&1 &
PYTHONPATH=$M:$PYTHONPATH timeout 240 python devtools/profile_mace.py 13,14,14 float32 > $OUT/profile10k.txt 2>&1
wait
timeout 120 python devtools/conv_diag.py mace-mp-medium-L2 10192 > $OUT/conv_default.json
EQUIKERNELS_CONV_GRAD_LOOPS=in1 timeout 120 python devtools/conv_diag.py mace-mp-medium-L2 10192 > $OUT/conv_in1.json
timeout 150 python benchmarks/bench_conv.py --atoms 10192 --impls ek_det,cue_fused --check-atoms 256 --out $OUT/conv.json 2>&1 | tail -15
head -c 3000 $OUT/profile10k.txt
