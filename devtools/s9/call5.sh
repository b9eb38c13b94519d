#!/usr/bin/env bash
# Session 9, device call 5: every §7 problem but benzene (measured by call4.sh) side by side after this
# session's changes, fwd / bwd / dbwd (20k and 50k rows), fp32, ir_mul, then GPU tests of the new code
# paths if time is left. Kernels are compiled first in parallel processes (precompile.py --real-driver).
#   source .bundle/unpack-bundle.sh; export PYTHONPATH=$PWD:$PYTHONPATH EQUIKERNELS_CACHE_DIR=/tmp/ekc
#   bash devtools/s9/call5.sh          (timeout_s 590)
set -u
OUT=${OUT:-/tmp/out}; L="$OUT/call5.log"; mkdir -p "$OUT" /tmp/tcache
export TRITON_CACHE_DIR=/tmp/tcache
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a "$L"; }
P=mace-large,mace-mp-medium-L2,mace-medium,nequip-lips,nequip-water,diffdock-L2,tetris-poly-1
for p in ${P//,/ }; do for i in 0 1; do
    timeout 240 python devtools/s9/precompile.py --problem $p --real-driver --shard $i/2 > "/tmp/pre_${p}_$i.log" 2>&1 &
done; done
wait
stamp "precompile done ($(ls /tmp/tcache | wc -l) cache folders)"
timeout $(( 470 - ($(date +%s) - t0) )) python benchmarks/bench_tp.py --problems $P --dtypes float32 \
    --directions fwd,bwd,dbwd --dbwd-rows 20000,50000 --impls equikernels_ir_mul,cue_ir_mul,oeq \
    --check-rows 1040 --target-ms 100 --out "$OUT" --tag s9all >> "$L" 2>&1
stamp "bench rc=$?"
left=$(( 570 - ($(date +%s) - t0) ))
[ $left -gt 40 ] && timeout $left python -m pytest -q -x -m gpu -p no:cacheprovider tests/test_uvw_rows.py \
    tests/test_conv.py tests/test_fast_launch.py > "$OUT/pytest_gpu.txt" 2>&1; stamp "pytest rc=$? $(tail -1 $OUT/pytest_gpu.txt)"
grep -hE "^\[" "$L" | cut -c1-150
