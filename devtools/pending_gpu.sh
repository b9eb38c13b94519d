#!/usr/bin/env bash
# Measurements left open at the end of session 5 (2026-11-24), in priority order; each block is
# sized for one device call (< 10 min). Usage on the GPU machine, from the repo root:
#   source .bundle/unpack-bundle.sh; export PYTHONPATH=$PWD:$PYTHONPATH EQUIKERNELS_CACHE_DIR=/tmp/ekcache
#   bash devtools/pending_gpu.sh BLOCK        (results under $OUT)
# Waiting on background jobs: use `wait`, never `pgrep -f` (it matches this shell's command line).
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
M=/tmp/e3nn044  # mace-torch needs e3nn 0.4.4 first on the path
case "${1:-}" in
tune)  # issue 6: the tuner table again with interleaved rounds (both calls: problems, then conv graphs)
    EQUIKERNELS_CACHE_DIR=$OUT/ekcache python benchmarks/bench_tune.py --atoms none --out "$OUT/tune" ;;
tuneconv)
    EQUIKERNELS_CACHE_DIR=$OUT/ekcache python benchmarks/bench_tune.py --problems none --out "$OUT/tuneconv" ;;
train) # issue 10: the training step with cuEquivariance under autocast (the last run's budget cut it)
    PYTHONPATH=$M:$PYTHONPATH python benchmarks/bench_train.py --impls ek-fp32,ek-bf16,mace-cueq-fp32,mace-cueq-bf16 \
        --no-cueq-ref --out "$OUT/train.json" ;;
conv)  # issue 5: conv side by side with the per-x-segment gradient loops (now the default)
    python benchmarks/bench_conv.py --atoms 10192 2916 --impls ek_det,cue_fused --check-atoms 256 --out "$OUT/conv.json" ;;
*) echo "usage: $0 tune|tuneconv|train|conv" >&2; exit 2 ;;
esac
