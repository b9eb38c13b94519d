#!/usr/bin/env bash
# The GPU test suite (-m gpu), split over parallel pytest processes so the cold Triton compiles
# (the bulk of the time) run concurrently; logs under $OUT. SKIP_BENZENE=1 leaves out the benzene
# problem (its kernels take minutes to compile cold). mace-torch tests need /tmp/e3nn044 first on
# PYTHONPATH (the GPU bundle).
# Logs go to /tmp/gpulogs; $OUT gets them as one tar and a summary (a device call returns 8 files at most).
export EQUIKERNELS_CACHE_DIR=${EQUIKERNELS_CACHE_DIR:-/tmp/ekc} PYTHONPATH=.:$PYTHONPATH
LOGS=/tmp/gpulogs; mkdir -p $LOGS
run() { timeout ${LIMIT:-540} python -m pytest -q -p no:cacheprovider -m gpu "$@" > "$LOGS/pytest_gpu_$(echo "$*" | tr -c 'a-zA-Z0-9' _ | cut -c1-60).log" 2>&1; }
[ "${SKIP_BENZENE:-0}" = 1 ] || run tests/codegen/test_tp_kernels.py -k "benzene" &
[ "${SKIP_BENZENE:-0}" = 1 ] || run tests/ops/test_tp.py -k "benzene" &
run tests/codegen/test_tp_kernels.py -k "mace-large or mace-medium" &
run tests/codegen/test_tp_kernels.py -k "mp-medium or lips" &
run tests/codegen/test_tp_kernels.py -k "water or diffdock or tetris" &
run tests/codegen/test_tp_kernels.py -k "random_problems_gpu or gradgradcheck_gpu or tl_dot_gpu" &
run tests/ops/test_tp.py -k "standard and not benzene" &
# the 40 random problems compile every kernel cold (one took 6 min on its own; four
# processes of 10 did 18 in 9 min): eight processes of 5
for part in 0 1 2 3 4 5 6 7; do
  run $(python -c "print(' '.join(f'tests/ops/test_tp.py::test_random_problem_cuda[{s}]' for s in range(25 * $part, 25 * ($part + 1), 5)))") &
done
run tests/ops/test_conv.py &
run tests/ops/test_mixed_precision.py -k "not standard_problems and not conv" &
run tests/ops/test_mixed_precision.py -k "conv or (standard_problems and not benzene)" &
run tests/models/test_graphed.py tests/calculators/test_calculator_gpu.py tests/models/test_mace_model.py &
run tests/nn/test_nn_modules.py tests/ops/test_tp_errors.py tests/ops/test_tp_autograd.py tests/ops/test_tp_compile.py tests/nn/test_convert.py &
run tests/codegen/test_launch.py tests/codegen/test_uvw_rows.py tests/codegen/test_conv_kernels.py tests/tune/test_tune.py &
run tests/ops/test_native.py &
run tests/experimental/test_radial_conv.py tests/experimental/test_radial_mlp.py tests/models/test_mace_mixed.py &
run tests/models/test_chunked.py &
[ "${SKIP_BENZENE:-0}" = 1 ] || run tests/ops/test_mixed_precision.py -k "standard_problems and benzene" &  # 2 tests, likewise
wait
for f in "$LOGS"/pytest_gpu_*.log; do echo "$(tail -1 "$f")   <- $(basename "$f")"; done | tee "$OUT/gpu_tests_summary.txt"
tar -czf "$OUT/gpu_tests_logs.tgz" -C "$LOGS" .
