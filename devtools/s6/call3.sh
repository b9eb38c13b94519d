# session 6, device call 3: tuner table (issue 6), first half of the TP problems
source .bundle/unpack-bundle.sh > /dev/null
export PYTHONPATH=$PWD:$PYTHONPATH EQUIKERNELS_CACHE_DIR=/tmp/ekc
timeout 580 python benchmarks/bench_tune.py --atoms none --problems mace-large,mace-medium,mace-mp-medium-L2,nequip-lips --no-host --out $OUT/tune1 > $OUT/tune1.log 2>&1
grep -v -E "Warning|warn|visitor|^\s*$" $OUT/tune1.log | tail -20
