#!/usr/bin/env bash
# Session 10, device call 5: with this session's double-backward defaults, every §7 problem but benzene
# side by side in the double backward (20k / 50k rows; forward and backward are unchanged since call 2);
# MACE-MP-medium E+F at 10,192 atoms: unfused (default), radial-fused (EQUIKERNELS_RADIAL_CONV=1) and
# cuEquivariance; the largest Cu system in 80 GiB (E+F, fp32).
#   source .bundle/unpack-bundle.sh; export PYTHONPATH=$PWD:$PYTHONPATH EQUIKERNELS_CACHE_DIR=/tmp/ekc
set -u
OUT=${OUT:-/tmp/out}; L="$OUT/call5.log"; mkdir -p "$OUT" /tmp/tcache
export TRITON_CACHE_DIR=/tmp/tcache
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a "$L"; }
P=mace-large,mace-mp-medium-L2,mace-medium,nequip-lips,nequip-water,diffdock-L2,tetris-poly-1
for p in ${P//,/ }; do for i in 0 1; do
    timeout 200 python devtools/s9/precompile.py --problem $p --real-driver --like-rows 20000,50000,1040 \
        --shard $i/2 > "/tmp/pre_${p}_$i.log" 2>&1 &
done; done
wait
stamp "precompile done ($(ls /tmp/tcache | wc -l) cache folders)"
timeout 200 python benchmarks/bench_tp.py --problems $P --dtypes float32 --directions dbwd \
    --dbwd-rows 20000,50000 --impls equikernels_ir_mul,cue_ir_mul,oeq --check-rows 1040 --target-ms 100 \
    --out "$OUT" --tag s10dbwd >> "$L" 2>&1
stamp "bench rc=$?"
export PYTHONPATH=/tmp/e3nn044:$PYTHONPATH
timeout 150 python benchmarks/bench_mace.py --systems cu-10192 --dtypes float32 --impls equikernels,mace-cueq \
    --out "$OUT/mace10k.json" >> "$L" 2>&1
stamp "mace rc=$?"
EQUIKERNELS_RADIAL_CONV=1 timeout 100 python benchmarks/bench_mace.py --systems cu-10192 --dtypes float32 \
    --impls equikernels --out "$OUT/mace10k_radialfused.json" >> "$L" 2>&1
stamp "mace radial-fused rc=$?"
left=$(( 575 - ($(date +%s) - t0) ))
timeout $left python benchmarks/bench_mace.py --systems cu-1008 --dtypes float32 --impls equikernels --scan \
    --scan-start 31 --scan-step 8 --mem-cap-gib 80 --out "$OUT/scan.json" >> "$L" 2>&1
stamp "scan rc=$?"
grep -hE "^\[[0-9]+ s\]|E\+F|scan " "$L" | grep -v "^\[[0-9]*/" | cut -c1-160
