#!/usr/bin/env bash
# Session 11, device call 1: nequip-lips double backward as ONE kernel split by first-input segment
# (EQUIKERNELS_DBWD_ONE=1 + EQUIKERNELS_MAX_PATHS: parts of at most N paths, each reading its
# operands once) against the session-10 default (two kernels, 8 rows), then the baselines.
#   source .bundle/unpack-bundle.sh; export PYTHONPATH=$PWD:$PYTHONPATH EQUIKERNELS_CACHE_DIR=/tmp/ekc
set -u
OUT=${OUT:-/tmp/out}; L="$OUT/call1.log"; mkdir -p "$OUT" /tmp/tcache
export TRITON_CACHE_DIR=/tmp/tcache
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a "$L"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$L"
V=("lips:"
   "lips:EQUIKERNELS_DBWD_ONE=1 EQUIKERNELS_MAX_PATHS=12"
   "lips:EQUIKERNELS_DBWD_ONE=1 EQUIKERNELS_MAX_PATHS=12 EQUIKERNELS_ROWS_DBWD=4"
   "lips:EQUIKERNELS_DBWD_ONE=1 EQUIKERNELS_MAX_PATHS=6"
   "lips:EQUIKERNELS_DBWD_ONE=1 EQUIKERNELS_MAX_PATHS=6 EQUIKERNELS_ROWS_DBWD=4"
   "lips:EQUIKERNELS_DBWD_ONE=1 EQUIKERNELS_MAX_PATHS=6 EQUIKERNELS_ROWS_DBWD=16 EQUIKERNELS_WARPS=8"
   "lips:EQUIKERNELS_MAX_PATHS=12"
   "water:EQUIKERNELS_MAX_PATHS=6")
i=0
for v in "${V[@]}"; do
    p=nequip-${v%%:*}; e=${v#*:}
    env $e timeout 200 python devtools/s9/precompile.py --problem $p --real-driver --like-rows 20000,50000,1040 \
        > "/tmp/pre1_$i.log" 2>&1 &
    i=$((i + 1))
done
wait
stamp "precompile done"
for rep in 1 2; do
i=0
for v in "${V[@]}"; do
    p=nequip-${v%%:*}; e=${v#*:}
    env $e timeout 90 python benchmarks/bench_tp.py --problems $p --dtypes float32 --directions dbwd \
        --dbwd-rows 20000,50000 --impls equikernels_ir_mul --check-rows 1040 --target-ms 100 \
        --out /tmp/v${rep}_$i --tag v$i > /tmp/v${rep}_$i.log 2>&1
    stamp "rep$rep v$i [$p $e] rc=$? $(grep -hE '^\[[0-9]/' /tmp/v${rep}_$i.log | grep dbwd | sed -E 's/.*dbwd ([0-9]+) equikernels_ir_mul: ([0-9.]+ ms \(min [0-9.]+).* err (.*)/\1: \2) e\3/' | tr '\n' ' ')"
    i=$((i + 1))
done
[ $rep = 1 ] && timeout 150 python benchmarks/bench_tp.py --problems nequip-lips --dtypes float32 \
    --directions dbwd --dbwd-rows 20000,50000 --impls cue_ir_mul,oeq --check-rows 1040 --target-ms 100 \
    --out /tmp/base --tag baselines > /tmp/base.log 2>&1; stamp "baselines: $(grep -hE '^\[[0-9]/' /tmp/base.log | grep dbwd | cut -c1-90 | tr '\n' ';')"
done
cp -r /tmp/base "$OUT/baselines" 2>/dev/null
tar -czf "$OUT/logs1.tgz" -C /tmp $(cd /tmp && ls -d pre1_*.log v1_* v2_* base.log)
