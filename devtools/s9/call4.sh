#!/usr/bin/env bash
# Session 9, device call 4 (issue 4, NOT RUN this session: the device budget was spent): benzene side by
# side. Its ~8 cold Triton compiles (fwd 2 parts, bwd 2, dbwd 2 kernels x 2 parts; ~460 s one after the
# other on the offline 2-core box, so call 2's 120 s did not cover fwd/bwd) run first in 8 processes
# side by side on this machine's 16 cores (precompile.py --real-driver --shard i/8: compile only, nothing
# launched), then bench_tp finds them in TRITON_CACHE_DIR: pending_gpu.sh benzene, then benzenedbwd,
# then kernel-level numbers of the double backward (devtools/gpu_diag.py). Everything lands in $OUT.
#   source .bundle/unpack-bundle.sh; export PYTHONPATH=$PWD:$PYTHONPATH EQUIKERNELS_CACHE_DIR=/tmp/ekc
#   bash devtools/s9/call4.sh          (timeout_s up to 570: this is the long benzene call)
set -u
OUT=${OUT:-/tmp/out}; L="$OUT/call4.log"; mkdir -p "$OUT" /tmp/tcache
export TRITON_CACHE_DIR=/tmp/tcache
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a "$L"; }
for i in 0 1 2 3 4 5 6 7; do
    timeout 300 python devtools/s9/precompile.py --problem nequip-revmd17-benzene --real-driver --shard $i/8 \
        > "/tmp/pre$i.log" 2>&1 &
done
wait
cat /tmp/pre?.log | grep -v -i warn >> "$L"; stamp "precompile done ($(ls /tmp/tcache | wc -l) cache folders)"
OUT=$OUT BENZENE_TIMEOUT=$(( 400 - ($(date +%s) - t0) )) bash devtools/pending_gpu.sh benzene >> "$L" 2>&1
stamp "benzene rc=$?"
OUT=$OUT BENZENE_TIMEOUT=$(( 520 - ($(date +%s) - t0) )) bash devtools/pending_gpu.sh benzenedbwd >> "$L" 2>&1
stamp "benzenedbwd rc=$?"
[ $(( $(date +%s) - t0 )) -lt 500 ] && timeout $(( 560 - ($(date +%s) - t0) )) \
    python devtools/gpu_diag.py nequip-revmd17-benzene:dbwd >> "$L" 2>&1; stamp "gpu_diag rc=$?"
grep -hE "^\[" "$L" | cut -c1-160
