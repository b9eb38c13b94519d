#!/usr/bin/env bash
# Session 9, device call 2 (issues 3, 4): the direct backward (launch.Pinned) A/B,
# nequip-water and benzene (fwd, bwd, then dbwd) side by side with cue and OEQ.
# Carry .bundle and build/s9 (Triton caches filled offline by devtools/s9/precompile.py --pack).
#   source .bundle/unpack-bundle.sh; export PYTHONPATH=$PWD:$PYTHONPATH EQUIKERNELS_CACHE_DIR=/tmp/ekc
#   bash devtools/s9/call2.sh       (results under $OUT)
set -u
OUT=${OUT:-/tmp/out}; R=/tmp/s9res2; mkdir -p "$OUT" "$R" /tmp/tcache
for t in build/s9/tc_*.tgz; do [ -f "$t" ] && tar -xzf "$t" -C /tmp/tcache; done
export TRITON_CACHE_DIR=/tmp/tcache
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
n0=$(ls /tmp/tcache | wc -l)
python devtools/s9/precompile.py --print-key > "$R/key.txt" 2>&1; stamp "$(cat $R/key.txt)"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader >> "$R/key.txt"
timeout 120 python devtools/s9/host_ab.py --out "$R/host_ab.json" > "$R/host_ab.log" 2>&1; stamp "host_ab rc=$?"
echo "triton cache folders: $n0 carried, $(ls /tmp/tcache | wc -l) after host_ab" | tee -a "$R/key.txt"
timeout 170 python benchmarks/bench_tp.py --problems nequip-water --dtypes float32 --directions fwd,bwd,dbwd \
    --dbwd-rows 50000 --impls equikernels_ir_mul,cue_ir_mul,oeq --check-rows 1040 --out "$R/tp" --tag water \
    > "$R/water.log" 2>&1; stamp "water rc=$?"
n1=$(ls /tmp/tcache | wc -l)
OUT=$R BENZENE_TIMEOUT=$(( 200 - ($(date +%s) - t0) )) bash devtools/pending_gpu.sh benzene > "$R/benzene.log" 2>&1
stamp "benzene rc=$?"
OUT=$R BENZENE_TIMEOUT=$(( 315 - ($(date +%s) - t0) )) bash devtools/pending_gpu.sh benzenedbwd > "$R/benzenedbwd.log" 2>&1
stamp "benzenedbwd rc=$?"
echo "triton cache folders: $n1 before benzene, $(ls /tmp/tcache | wc -l) after (new = compiled here)" | tee -a "$R/key.txt"
tar -czf "$OUT/s9_call2.tgz" -C "$R" .
tail -4 "$R/host_ab.log"; grep -hE "^\[" "$R/water.log" "$R/benzene.log" "$R/benzenedbwd.log" | cut -c1-150
