#!/usr/bin/env bash
# Session 10: the -m gpu tests that call 6's whole-suite run did not reach inside its time limit
# (random-problem CUDA parity seeds, two test_kernels tests), one process per pair of tests.
export EQUIKERNELS_CACHE_DIR=${EQUIKERNELS_CACHE_DIR:-/tmp/ekc} PYTHONPATH=.:$PYTHONPATH
OUT=${OUT:-/tmp/out}; LOGS=/tmp/gpulogs_rest; mkdir -p $LOGS "$OUT"
T=(tests/test_kernels.py::test_gradgradcheck_gpu tests/test_kernels.py::test_shared_weight_tl_dot_gpu)
for s in 5 10 15 20 25 30 35 40 45 65 70 75 80 85 90 95 125 130 135 140 145 195; do
    T+=("tests/test_parity.py::test_random_problem_cuda[$s]"); done
i=0
while [ $i -lt ${#T[@]} ]; do
    timeout ${LIMIT:-420} python -m pytest -q -p no:cacheprovider -m gpu -rA "${T[$i]}" "${T[$((i + 1))]}" \
        > "$LOGS/rest_$i.log" 2>&1 &
    i=$((i + 2))
done
wait
grep -hE "^(PASSED|FAILED|ERROR)" $LOGS/*.log | sort | uniq -c | sort -rn | head -40 | tee "$OUT/gpu_rest_summary.txt"
for f in $LOGS/*.log; do echo "$(tail -1 $f) <- $(basename $f)"; done | tee -a "$OUT/gpu_rest_summary.txt"
tar -czf "$OUT/gpu_rest_logs.tgz" -C $LOGS .
