#!/usr/bin/env bash
# Session 10, device call 2: every §7 problem but benzene side by side (fwd / bwd / dbwd at 20k and 50k
# rows) after the one-kernel channel-wise double backward and the direct eager double backward; the
# direct path A/B on nequip-water; MACE-MP-medium E+F at 10,192 atoms next to cuEquivariance; the new
# GPU tests if time is left.
#   source .bundle/unpack-bundle.sh; export PYTHONPATH=$PWD:$PYTHONPATH EQUIKERNELS_CACHE_DIR=/tmp/ekc
set -u
OUT=${OUT:-/tmp/out}; L="$OUT/call2.log"; mkdir -p "$OUT" /tmp/tcache
export TRITON_CACHE_DIR=/tmp/tcache
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a "$L"; }
P=mace-large,mace-mp-medium-L2,mace-medium,nequip-lips,nequip-water,diffdock-L2,tetris-poly-1
for p in ${P//,/ }; do for i in 0 1; do
    timeout 200 python devtools/s9/precompile.py --problem $p --real-driver --like-rows 20000,50000,1040 \
        --shard $i/2 > "/tmp/pre_${p}_$i.log" 2>&1 &
done; done
wait
stamp "precompile done ($(ls /tmp/tcache | wc -l) cache folders)"
timeout 260 python benchmarks/bench_tp.py --problems $P --dtypes float32 --directions fwd,bwd,dbwd \
    --dbwd-rows 20000,50000 --impls equikernels_ir_mul,cue_ir_mul,oeq --check-rows 1040 --target-ms 100 \
    --out "$OUT" --tag s10all >> "$L" 2>&1
stamp "bench rc=$?"
for fb in 0 1; do
    EQUIKERNELS_FAST_BWD=$fb timeout 60 python benchmarks/bench_tp.py --problems nequip-water --dtypes float32 \
        --directions bwd,dbwd --dbwd-rows 20000,50000 --impls equikernels_ir_mul --check-rows 1040 \
        --target-ms 100 --out /tmp/water$fb --tag water-fastbwd$fb >> "$L" 2>&1
    stamp "water fast_bwd=$fb rc=$?"
done
PYTHONPATH=/tmp/e3nn044:$PYTHONPATH timeout 200 python benchmarks/bench_mace.py --systems cu-10192 \
    --dtypes float32 --impls equikernels,mace-cueq --out "$OUT/mace10k.json" >> "$L" 2>&1
stamp "mace rc=$?"
left=$(( 570 - ($(date +%s) - t0) ))
[ $left -gt 30 ] && timeout $left python -m pytest -q -m gpu -p no:cacheprovider tests/test_fast_launch.py \
    > "$OUT/pytest_gpu.txt" 2>&1; stamp "pytest rc=$? $(tail -1 $OUT/pytest_gpu.txt)"
grep -hE "^\[|E\+F" "$L" | grep -v "^\[[0-9]*/" | cut -c1-200
grep -hE "dbwd" "$L" | grep "nequip-water" | cut -c1-150
