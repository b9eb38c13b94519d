#!/usr/bin/env bash
# Measurements left open at the end of session 6 (2026-11-24), in priority order; each block is
# sized for one device call (< 10 min). Usage on the GPU machine, from the repo root:
#   source .bundle/unpack-bundle.sh; export PYTHONPATH=$PWD:$PYTHONPATH EQUIKERNELS_CACHE_DIR=/tmp/ekcache
#   bash devtools/pending_gpu.sh BLOCK        (results under $OUT)
# Waiting on background jobs: use `wait`, never `pgrep -f` (it matches this shell's command line).
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
M=/tmp/e3nn044  # mace-torch needs e3nn 0.4.4 first on the path
case "${1:-}" in
cuetrain)  # issue 10: cuEquivariance's bf16 training step alone (its first pass JIT-compiles for > 6.5 min)
    PYTHONPATH=$M:$PYTHONPATH timeout -s ABRT 590 python -X faulthandler benchmarks/bench_train.py \
        --impls mace-cueq-bf16,ek-bf16 --no-cueq-ref --time-budget-s 560 --out "$OUT/train.json" ;;
benzene)  # issues 3/4/6: benzene side by side (cold compiles take minutes), then its tuner row
    timeout 590 python benchmarks/bench_tp.py --problems nequip-revmd17-benzene --dtypes float32 --dbwd-rows 50000 \
        --impls equikernels_ir_mul,cue_ir_mul,oeq --target-ms 100 --out "$OUT/tp" --tag benzene ;;
tunebenzene)
    timeout 590 python benchmarks/bench_tune.py --atoms none --problems nequip-revmd17-benzene --out "$OUT/tune" ;;
conv)  # issue 5: conv side by side (cuEquivariance, OpenEquivariance) with the current defaults
    python benchmarks/bench_conv.py --atoms 10192 2916 --impls ek_det,cue_fused,oeq_det --check-atoms 256 --out "$OUT/conv.json" ;;
*) echo "usage: $0 cuetrain|benzene|tunebenzene|conv" >&2; exit 2 ;;
esac
