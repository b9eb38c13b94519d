# session 5: GPU tests of this session's changes, then the largest MACE system under 80 GiB (edge chunking)
source .bundle/unpack-bundle.sh >/dev/null 2>&1
export PYTHONPATH=$PWD:$PYTHONPATH EQUIKERNELS_CACHE_DIR=/tmp/ekc PYTHONUNBUFFERED=1
F="Warning|warn|visitor|^\s*$|^\s+File|Traceback"
PYTHONPATH=/tmp/e3nn044:$PYTHONPATH timeout 250 python -m pytest -q -p no:cacheprovider -m gpu tests/test_mace_chunked.py \
  tests/test_radial_mlp.py tests/test_conv_loops.py tests/test_conv.py tests/test_mace_model.py 2>&1 | tee $OUT/gpu_tests.log | tail -6
PYTHONPATH=/tmp/e3nn044:$PYTHONPATH timeout 290 python benchmarks/bench_mace.py --out $OUT/scan.json --dtypes float32 \
  --systems cu-1008 --impls equikernels --scan --scan-start 31 --scan-step 6 --mem-cap-gib 80 --target-ms 100 2>&1 \
  | grep -v -E "Warning|warn|visitor|^\s*$" | tee $OUT/scan.log | grep -i -E "scan|E\+F"
