# session 5, device call 2: MACE side by side (issue 7) + largest system under an 80 GiB cap
source .bundle/unpack-bundle.sh
export PYTHONPATH=/tmp/e3nn044:$PWD:$PYTHONPATH EQUIKERNELS_CACHE_DIR=/tmp/ekc
set -o pipefail
timeout 560 python benchmarks/bench_mace.py --out $OUT/mace.json --dtypes float32,float64 --systems cu-1008,cu-10192,mixed-1008 \
  --impls equikernels,mace-cueq,mace-e3nn --scan --scan-start 24 --scan-step 4 --mem-cap-gib 80 --target-ms 200 2>&1 \
  | grep -v -E "Warning|warn|visitor|^\s*$" | tee $OUT/mace.log | tail -40
