# session 5, device call 3: MACE fp64 at 10k side by side, then the largest fp32 system under 80 GiB
source .bundle/unpack-bundle.sh
export PYTHONPATH=/tmp/e3nn044:$PWD:$PYTHONPATH EQUIKERNELS_CACHE_DIR=/tmp/ekc
set -o pipefail
F="Warning|warn|visitor|^\s*$|^\s+|Traceback|File "
timeout 250 python benchmarks/bench_mace.py --out $OUT/mace64.json --dtypes float64 --systems cu-10192 \
  --impls equikernels,mace-cueq --mem-cap-gib 80 --target-ms 200 2>&1 | grep -v -E "$F" | tee $OUT/mace64.log | tail -8
timeout 300 python benchmarks/bench_mace.py --out $OUT/scan.json --dtypes float32 --systems cu-1008 \
  --impls equikernels --scan --scan-start 24 --scan-step 4 --mem-cap-gib 80 --target-ms 200 2>&1 | grep -v -E "$F" | tee $OUT/scan.log | tail -12
