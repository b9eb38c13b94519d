#!/usr/bin/env bash
# Session 10, device call 1: the channel-wise double backward in one kernel (EQUIKERNELS_DBWD_ONE=1)
# against two kernels (=0), equikernels only (baselines: session 9's same-machine table), on the five
# channel-wise §7 problems at 20k / 50k rows; then issue 3's mace-large compile times (cold / cached).
#   source .bundle/unpack-bundle.sh; export PYTHONPATH=$PWD:$PYTHONPATH EQUIKERNELS_CACHE_DIR=/tmp/ekc
set -u
OUT=${OUT:-/tmp/out}; L="$OUT/call1.log"; mkdir -p "$OUT" /tmp/tcache
[ -f devtools/s10/ops_tp_head.py ] && cp devtools/s10/ops_tp_head.py equikernels/ops/tp.py  # committed ops (a helper edits the tree)
export TRITON_CACHE_DIR=/tmp/tcache
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a "$L"; }
P=mace-large,mace-mp-medium-L2,mace-medium,nequip-lips,nequip-water
for p in ${P//,/ }; do
    for i in 0 1; do
        timeout 200 python devtools/s9/precompile.py --problem $p --real-driver --like-rows 20000,50000,1040 \
            --shard $i/2 > "/tmp/pre_${p}_$i.log" 2>&1 &
    done
    EQUIKERNELS_DBWD_ONE=1 timeout 200 python devtools/s9/precompile.py --problem $p --real-driver \
        --like-rows 20000,50000,1040 --directions dbwd > "/tmp/pre_${p}_one.log" 2>&1 &
done
wait
stamp "precompile done ($(ls /tmp/tcache | wc -l) cache folders)"
for one in 0 1; do
    EQUIKERNELS_DBWD_ONE=$one timeout 170 python benchmarks/bench_tp.py --problems $P --dtypes float32 \
        --directions dbwd --dbwd-rows 20000,50000 --impls equikernels_ir_mul --check-rows 1040 --target-ms 100 \
        --out "$OUT" --tag one$one >> "$L" 2>&1
    stamp "bench one=$one rc=$?"
done
timeout 200 python benchmarks/bench_tp.py --compile-time --skip-bench --compile-problem mace-large \
    --compile-layouts ir_mul,mul_ir --out "$OUT" --tag compile >> "$L" 2>&1
stamp "compile rc=$?"
tar -czf "$OUT/pre_logs.tgz" -C /tmp $(cd /tmp && ls pre_*.log)
grep -hE "^\[|compile mace-large" "$L" | cut -c1-400
for f in "$OUT"/*one*.md; do grep -E "^\| (mace|nequip)" "$f" | head -12; done
