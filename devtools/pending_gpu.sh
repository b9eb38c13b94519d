#!/usr/bin/env bash
# Measurements left open at the end of session 4 (2026-11-23), in priority order; each block is
# sized for one device call (< 10 min). Usage on the GPU machine, from the repo root:
#   source .bundle/unpack-bundle.sh; export PYTHONPATH=$PWD:$PYTHONPATH EQUIKERNELS_CACHE_DIR=/tmp/ekcache
#   bash devtools/pending_gpu.sh BLOCK        (results under $OUT)
# Waiting on background jobs: use `wait`, never `pgrep -f` (it matches this shell's command line).
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
M=/tmp/e3nn044  # mace-torch needs e3nn 0.4.4 first on the path
case "${1:-}" in
conv)  # gradient kernels with one edge loop per x segment (no spills offline) vs the default
    python devtools/warm_conv.py mace-mp-medium-L2 deterministic dbwd float32 ir_mul > "$OUT/w0.log" 2>&1 &
    EQUIKERNELS_CONV_GRAD_LOOPS=in1 python devtools/warm_conv.py mace-mp-medium-L2 deterministic dbwd float32 ir_mul \
        > "$OUT/w1.log" 2>&1 &
    wait
    python devtools/conv_diag.py mace-mp-medium-L2 10192 > "$OUT/conv_default.json"
    EQUIKERNELS_CONV_GRAD_LOOPS=in1 python devtools/conv_diag.py mace-mp-medium-L2 10192 > "$OUT/conv_loops_in1.json"
    python benchmarks/bench_conv.py --atoms 10192 --impls ek_det,cue_fused --check-atoms 256 --out "$OUT/conv.json" ;;
tune)  # issue 6: tuned vs default table, first-use tuning time
    EQUIKERNELS_CACHE_DIR=$OUT/ekcache TRITON_CACHE_DIR=$OUT/tcache python benchmarks/bench_tune.py --out "$OUT/tune" ;;
mace)  # issue 7: E+F / E+F+S at 1k and 10k atoms side by side, fp32 and fp64, largest system
    PYTHONPATH=$M:$PYTHONPATH python benchmarks/bench_mace.py --out "$OUT/mace.json" --dtypes float32,float64 \
        --impls equikernels,mace-cueq --scan ;;
md)    # issue 8: MD with CUDA graphs (now the default below 5,000 atoms) vs eager
    PYTHONPATH=$M:$PYTHONPATH python benchmarks/bench_md.py --sizes 1000,10000 \
        --impls equikernels,equikernels_graph,mace_cueq --steps 100 --warmup 10 --out "$OUT" ;;
mixed) # issue 10: mixed-precision MACE on the GPU (tests; speed needs a precision option in bench_mace)
    PYTHONPATH=$M:$PYTHONPATH python -m pytest -q -p no:cacheprovider -m gpu tests/test_mace_mixed.py ;;
*) echo "usage: $0 conv|tune|mace|md|mixed" >&2; exit 2 ;;
esac
