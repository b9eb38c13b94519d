#!/usr/bin/env bash
# Session 11, device call 2 (issue 10): the MACE training step with cuEquivariance's mixed precision.
# cuEquivariance's uniform_1d compiles every candidate algorithm of each kernel with NVRTC on first
# use (549 kernels in 7.3 min in session 7, first pass unfinished); CUEQUIVARIANCE_OPS_U1D_ALGOS=0
# restricts it to algorithm 0. ALGOS=${ALGOS-0}; set ALGOS= (empty) for cuEquivariance's default.
#   source .bundle/unpack-bundle.sh; export PYTHONPATH=$PWD:$PYTHONPATH EQUIKERNELS_CACHE_DIR=/tmp/ekc
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" /tmp/cuecache
export CUEQUIVARIANCE_OPS_NVRTC_CACHE_DIR=/tmp/cuecache CUEQUIVARIANCE_OPS_PARALLEL_COMPILE=1 \
    CUEQUIVARIANCE_OPS_PARALLEL_THREADS=16
ALGOS=${ALGOS-0}
[ -n "$ALGOS" ] && export CUEQUIVARIANCE_OPS_U1D_ALGOS=$ALGOS
TAG=${TAG:-train}
IMPLS=${IMPLS:-mace-cueq-bf16,ek-fp32,ek-bf16,mace-cueq-fp32}
( while sleep 30; do echo "[mon $(date +%T)] cache files $(ls /tmp/cuecache | wc -l)"; done ) &
MON=$!
PYTHONPATH=/tmp/e3nn044:$PYTHONPATH timeout -s ABRT ${LIMIT:-560} python -X faulthandler benchmarks/bench_train.py \
    --impls $IMPLS ${EXTRA:-} --no-cueq-ref --time-budget-s $(( ${LIMIT:-560} - 25 )) --out "$OUT/$TAG.json" 2>&1 | tee "$OUT/$TAG.log" \
    | grep -vE "^\s*$" | tail -40
kill $MON
echo "cache files $(ls /tmp/cuecache | wc -l), $(du -sh /tmp/cuecache | cut -f1)"
