#!/usr/bin/env bash
# The GPU test suite (-m gpu), split over parallel pytest processes so the cold Triton compiles
# (the bulk of the time) run concurrently; logs under $OUT. SKIP_BENZENE=1 leaves out the benzene
# problem (its kernels take minutes to compile cold). mace-torch tests need /tmp/e3nn044 first on
# PYTHONPATH (the GPU bundle).
# Logs go to /tmp/gpulogs; $OUT gets them as one tar and a summary (a device call returns 8 files at most).
export EQUIKERNELS_CACHE_DIR=${EQUIKERNELS_CACHE_DIR:-/tmp/ekc} PYTHONPATH=.:$PYTHONPATH
LOGS=/tmp/gpulogs; mkdir -p $LOGS
run() { timeout ${LIMIT:-540} python -m pytest -q -p no:cacheprovider -m gpu "$@" > "$LOGS/pytest_gpu_$(echo "$*" | tr -c 'a-zA-Z0-9' _ | cut -c1-60).log" 2>&1; }
[ "${SKIP_BENZENE:-0}" = 1 ] || run tests/test_kernels.py -k "benzene" &
[ "${SKIP_BENZENE:-0}" = 1 ] || run tests/test_parity.py -k "benzene" &
run tests/test_kernels.py -k "mace-large or mace-medium" &
run tests/test_kernels.py -k "mp-medium or lips" &
run tests/test_kernels.py -k "water or diffdock or tetris" &
run tests/test_kernels.py -k "random_problems_gpu or gradgradcheck_gpu or tl_dot_gpu" &
run tests/test_parity.py -k "standard and not benzene" &
# the 40 random problems compile every kernel cold (one took 6 min on its own; four
# processes of 10 did 18 in 9 min): eight processes of 5
for part in 0 1 2 3 4 5 6 7; do
  run $(python -c "print(' '.join(f'tests/test_parity.py::test_random_problem_cuda[{s}]' for s in range(25 * $part, 25 * ($part + 1), 5)))") &
done
run tests/test_conv.py &
run tests/test_mixed_precision.py -k "not standard_problems and not conv" &
run tests/test_mixed_precision.py -k "conv or (standard_problems and not benzene)" &
run tests/test_graphed.py tests/test_calculator_gpu.py tests/test_mace_model.py &
run tests/test_nn_modules.py tests/test_errors.py tests/test_autograd.py tests/test_compile.py tests/test_convert.py &
run tests/test_fast_launch.py tests/test_uvw_rows.py tests/test_conv_loops.py tests/test_tune.py &
run tests/test_native_node.py &
run tests/test_radial_conv.py tests/test_radial_mlp.py tests/test_mace_mixed.py &
run tests/test_mace_chunked.py &
[ "${SKIP_BENZENE:-0}" = 1 ] || run tests/test_mixed_precision.py -k "standard_problems and benzene" &  # 2 tests, likewise
wait
for f in "$LOGS"/pytest_gpu_*.log; do echo "$(tail -1 "$f")   <- $(basename "$f")"; done | tee "$OUT/gpu_tests_summary.txt"
tar -czf "$OUT/gpu_tests_logs.tgz" -C "$LOGS" .
