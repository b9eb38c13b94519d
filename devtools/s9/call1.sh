#!/usr/bin/env bash
# Session 9, device call 1 (issue 3): the GPU machine's Triton key (for devtools/s9/precompile.py),
# the direct-backward A/B (devtools/s9/host_ab.py) and nequip-water side by side with cue and OEQ.
# Carry .bundle and build/s9 (Triton caches filled offline by devtools/s9/precompile.py --pack).
#   source .bundle/unpack-bundle.sh; export PYTHONPATH=$PWD:$PYTHONPATH EQUIKERNELS_CACHE_DIR=/tmp/ekc
#   bash devtools/s9/call1.sh       (results under $OUT)
set -u
OUT=${OUT:-/tmp/out}; R=/tmp/s9res1; mkdir -p "$OUT" "$R" /tmp/tcache
for t in build/s9/tc_*.tgz; do [ -f "$t" ] && tar -xzf "$t" -C /tmp/tcache; done
export TRITON_CACHE_DIR=/tmp/tcache
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
n0=$(ls /tmp/tcache | wc -l)
python devtools/s9/precompile.py --dump-key "$R/gpu_triton_key.txt" > "$R/key.txt" 2>&1; stamp "$(cat $R/key.txt)"
cp "$R/gpu_triton_key.txt" "$OUT/"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader >> "$R/key.txt"
timeout 120 python devtools/s9/host_ab.py --out "$R/host_ab.json" > "$R/host_ab.log" 2>&1; stamp "host_ab rc=$?"
echo "triton cache folders: $n0 carried, $(ls /tmp/tcache | wc -l) after host_ab" | tee -a "$R/key.txt"
timeout 170 python benchmarks/bench_tp.py --problems nequip-water --dtypes float32 --directions fwd,bwd,dbwd \
    --dbwd-rows 50000 --impls equikernels_ir_mul,cue_ir_mul,oeq --check-rows 1040 --out "$R/tp" --tag water \
    > "$R/water.log" 2>&1; stamp "water rc=$?"
tar -czf "$OUT/s9_call1.tgz" -C "$R" .
tail -4 "$R/host_ab.log"; grep -E "^\[" "$R/water.log" | cut -c1-150
