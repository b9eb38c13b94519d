# session 6, device call 4: tuner table (issue 6), second half of the TP problems and the conv graphs
source .bundle/unpack-bundle.sh > /dev/null
export PYTHONPATH=$PWD:$PYTHONPATH EQUIKERNELS_CACHE_DIR=/tmp/ekc
timeout 570 python benchmarks/bench_tune.py --problems nequip-water,diffdock-L2,tetris-poly-1 --out $OUT/tune2 > $OUT/tune2.log 2>&1
grep -v -E "Warning|warn|visitor|^\s*$" $OUT/tune2.log | tail -22
