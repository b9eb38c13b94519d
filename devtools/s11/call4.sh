#!/usr/bin/env bash
# Session 11, device call 4 (issue 4): with the split one-kernel double backward (_dbwd_part_paths) as
# the default, every §7 problem but benzene side by side in the double backward (20k / 50k rows), and
# the GPU tests that run nequip-lips (fp32 and half precision) and the double-backward kernel tests.
#   source .bundle/unpack-bundle.sh; export PYTHONPATH=$PWD:$PYTHONPATH EQUIKERNELS_CACHE_DIR=/tmp/ekc
set -u
OUT=${OUT:-/tmp/out}; L="$OUT/call4.log"; mkdir -p "$OUT" /tmp/tcache /tmp/gl
export TRITON_CACHE_DIR=/tmp/tcache
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a "$L"; }
P=mace-large,mace-mp-medium-L2,mace-medium,nequip-lips,nequip-water,diffdock-L2,tetris-poly-1
for p in ${P//,/ }; do for i in 0 1; do
    timeout 200 python devtools/s9/precompile.py --problem $p --real-driver --like-rows 20000,50000,1040 \
        --directions dbwd --shard $i/2 > "/tmp/gl/pre_${p}_$i.log" 2>&1 &
done; done
t() { timeout 300 python -m pytest -q -p no:cacheprovider "$@" > "/tmp/gl/test_$(echo "$*" | tr -c 'a-zA-Z0-9' _ | cut -c1-50).log" 2>&1; }
t -m gpu tests/test_kernels.py -k "lips or gradgradcheck_gpu" &
t -m gpu tests/test_parity.py -k "lips" &
t -m gpu tests/test_mixed_precision.py -k "lips" &
t -m gpu tests/test_fast_launch.py &
t tests/test_kernels.py -k "one_or_two or split_over" &
wait
stamp "precompile + tests done ($(ls /tmp/tcache | wc -l) cache folders)"
for f in /tmp/gl/test_*.log; do stamp "$(tail -1 $f) <- $(basename $f)"; done
timeout 240 python benchmarks/bench_tp.py --problems $P --dtypes float32 --directions dbwd \
    --dbwd-rows 20000,50000 --impls equikernels_ir_mul,cue_ir_mul,oeq --check-rows 1040 --target-ms 100 \
    --out "$OUT" --tag s11dbwd >> "$L" 2>&1
stamp "bench rc=$?"
tar -czf "$OUT/logs4.tgz" -C /tmp/gl .
grep -A30 -- "-- summary" "$L" | head -24
