# session 6, device call 5: GPU tests of the changed kernels, tuner rows for the short problems with the
# absolute-gain rule, DiffDock / tetris side by side, and where the cue training step spends its first pass
source .bundle/unpack-bundle.sh > /dev/null
export PYTHONPATH=$PWD:$PYTHONPATH EQUIKERNELS_CACHE_DIR=/tmp/ekc
M=/tmp/e3nn044
timeout 110 python -m pytest -q -m gpu tests/test_kernels.py tests/test_tune.py -k "diffdock or tetris or gradgradcheck_gpu or tl_dot or tune" 2>&1 | tail -1
timeout 120 python benchmarks/bench_tune.py --atoms none --problems nequip-water,tetris-poly-1 --no-host --out $OUT/tune3 > $OUT/tune3.log 2>&1
timeout 130 python benchmarks/bench_tp.py --problems diffdock-L2,tetris-poly-1 --dtypes float32 --dbwd-rows 50000 --out $OUT/tp --tag s6 > $OUT/tp.log 2>&1
PYTHONPATH=$M:$PYTHONPATH timeout -s ABRT 190 python -X faulthandler benchmarks/bench_train.py --impls mace-cueq-bf16 --no-cueq-ref --out $OUT/train_cue.json > $OUT/train_cue.log 2>&1
grep -v -E "Warning|warn|visitor|^\s*$" $OUT/tune3.log | grep "^|" | tail -8
grep -A30 "^| problem" $OUT/tp/*.md | head -30
grep -v -E "Warning|warn|visitor|^\s*$" $OUT/train_cue.log | grep -E "File|Thread|ms|reference" | head -40
