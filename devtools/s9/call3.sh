#!/usr/bin/env bash
# Session 9, device call 3 (issue 3): the direct backward A/B (devtools/s9/host_ab.py) and nequip-water
# side by side with cue and OEQ; and the parts of one kernel's Triton cache key on this machine
# (precompile.py --log-keys), to see why the offline-filled cache of call 2 missed. Everything is
# written straight to $OUT (call 2 lost its results to the time limit before its final tar).
#   source .bundle/unpack-bundle.sh; export PYTHONPATH=$PWD:$PYTHONPATH EQUIKERNELS_CACHE_DIR=/tmp/ekc
#   bash devtools/s9/call3.sh
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" /tmp/tcache
for t in build/s9/tc_*.tgz; do [ -f "$t" ] && tar -xzf "$t" -C /tmp/tcache; done
export TRITON_CACHE_DIR=/tmp/tcache
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a "$OUT/host_ab.log"; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader >> "$OUT/host_ab.log"
n0=$(ls /tmp/tcache | wc -l)
timeout 60 python devtools/s9/precompile.py --problem nequip-water --directions fwd --real-driver \
    --log-keys "$OUT/keys_gpu.jsonl" >> "$OUT/host_ab.log" 2>&1; stamp "keys rc=$? (cache folders $n0 -> $(ls /tmp/tcache | wc -l))"
timeout 100 python devtools/s9/host_ab.py --out "$OUT/host_ab.json" >> "$OUT/host_ab.log" 2>&1; stamp "host_ab rc=$?"
timeout 150 python benchmarks/bench_tp.py --problems nequip-water --dtypes float32 --directions fwd,bwd,dbwd \
    --dbwd-rows 50000 --impls equikernels_ir_mul,cue_ir_mul,oeq --check-rows 1040 --out "$OUT/tp" --tag water \
    > "$OUT/water.log" 2>&1; stamp "water rc=$?"
grep -v Warn "$OUT/host_ab.log" | tail -6; grep -hE "^\[" "$OUT/water.log" | cut -c1-150
