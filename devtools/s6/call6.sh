# session 6, device call 6: tuner rows for the short problems (verdict 'same config'), then the changed
# problems side by side with cuEquivariance and OpenEquivariance
source .bundle/unpack-bundle.sh > /dev/null
export PYTHONPATH=$PWD:$PYTHONPATH EQUIKERNELS_CACHE_DIR=/tmp/ekc
timeout 200 python benchmarks/bench_tune.py --atoms none --problems tetris-poly-1,nequip-water --no-host --out $OUT/tune4 > $OUT/tune4.log 2>&1
timeout 330 python benchmarks/bench_tp.py --problems diffdock-L2,tetris-poly-1,nequip-water --dtypes float32 --dbwd-rows 50000 --impls equikernels_ir_mul,cue_ir_mul,oeq --target-ms 100 --out $OUT/tp --tag s6 > $OUT/tp.log 2>&1
grep "^| " $OUT/tune4/*.md | cut -d'|' -f2-11 | head -9
grep -E "^\[[0-9]+/" $OUT/tp.log | cut -c1-120
