#!/usr/bin/env bash
# Session 10, device calls 3 and 4 (VARIANTS=4: the second sweep, with the baselines): double-backward variants (environment knobs) on nequip-lips (25 % behind
# cuEquivariance at 50k rows in call 2) and nequip-water (host-bound at 20k), equikernels only.
#   source .bundle/unpack-bundle.sh; export PYTHONPATH=$PWD:$PYTHONPATH EQUIKERNELS_CACHE_DIR=/tmp/ekc
set -u
OUT=${OUT:-/tmp/out}; L="$OUT/call3.log"; mkdir -p "$OUT" /tmp/tcache
export TRITON_CACHE_DIR=/tmp/tcache
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a "$L"; }
if [ "${VARIANTS:-3}" = 4 ]; then
V=("lips:EQUIKERNELS_ROWS_DBWD=8" "lips:EQUIKERNELS_DBWD_ONE=1 EQUIKERNELS_ROWS_DBWD=8"
   "lips:EQUIKERNELS_ROWS_DBWD=16 EQUIKERNELS_WARPS=8" "lips:EQUIKERNELS_DBWD_ONE=1 EQUIKERNELS_ROWS_DBWD=16 EQUIKERNELS_WARPS=8"
   "water:EQUIKERNELS_DBWD_ONE=1" "water:EQUIKERNELS_DBWD_ONE=1 EQUIKERNELS_ROWS_DBWD=8")
else
V=("lips:" "lips:EQUIKERNELS_ROWS_DBWD=8" "lips:EQUIKERNELS_ROWS_DBWD=2 EQUIKERNELS_WARPS=2"
   "lips:EQUIKERNELS_DBWD_SPLIT=1" "lips:EQUIKERNELS_DBWD_ONE=1 EQUIKERNELS_ROWS_DBWD=2 EQUIKERNELS_WARPS=2"
   "lips:EQUIKERNELS_LAZY_SUM=0" "lips:EQUIKERNELS_VISIT=out" "lips:EQUIKERNELS_DBWD_ONE=1 EQUIKERNELS_LAZY_SUM=0"
   "lips:EQUIKERNELS_DBWD_SPLIT=1 EQUIKERNELS_ROWS_DBWD=8"
   "water:" "water:EQUIKERNELS_DBWD_ONE=1" "water:EQUIKERNELS_ROWS_DBWD=8")
fi
i=0
for v in "${V[@]}"; do
    p=nequip-${v%%:*}; e=${v#*:}
    env $e timeout 200 python devtools/s9/precompile.py --problem $p --real-driver --like-rows 20000,50000,1040 \
        > "/tmp/pre3_$i.log" 2>&1 &
    i=$((i + 1))
done
wait
stamp "precompile done"
i=0
for v in "${V[@]}"; do
    p=nequip-${v%%:*}; e=${v#*:}
    env $e timeout 60 python benchmarks/bench_tp.py --problems $p --dtypes float32 --directions dbwd \
        --dbwd-rows 20000,50000 --impls equikernels_ir_mul --check-rows 1040 --target-ms 100 \
        --out /tmp/v$i --tag v$i > /tmp/v$i.log 2>&1
    stamp "v$i [$p $e] rc=$? $(grep -hE '^\[[0-9]/' /tmp/v$i.log | grep dbwd | sed -E 's/.*dbwd ([0-9]+) equikernels_ir_mul: ([0-9.]+ ms \(min [0-9.]+).*/\1: \2)/' | tr '\n' ' ')"
    i=$((i + 1))
done
tar -czf "$OUT/logs3.tgz" -C /tmp $(cd /tmp && ls pre3_*.log v*.log)
[ "${VARIANTS:-3}" = 4 ] && timeout 120 python benchmarks/bench_tp.py --problems nequip-lips,nequip-water --dtypes float32 \
    --directions dbwd --dbwd-rows 20000,50000 --impls cue_ir_mul,oeq --check-rows 1040 --target-ms 100 \
    --out "$OUT" --tag baselines >> "$L" 2>&1 && stamp "baselines: $(grep -hE '^\[[0-9]/' "$L" | grep dbwd | cut -c1-90 | tr '\n' ';')"
