# session 7, cuetrain call 2: mace-cueq-bf16 (first: most time for its compile), ek-bf16, ek-fp32 in one process (issue 10), reusing call 1's NVRTC cache.
# Env (set by the caller): PYTHONPATH=/tmp/e3nn044:$PWD:..., EQUIKERNELS_CACHE_DIR=/tmp/ekc,
# CUEQUIVARIANCE_OPS_NVRTC_CACHE_DIR=/tmp/cuecache, CUEQUIVARIANCE_OPS_PARALLEL_COMPILE=1, CUEQUIVARIANCE_OPS_PARALLEL_THREADS=16
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" /tmp/cuecache /tmp/ekc
LOG=$OUT/call2.log
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nproc
  python -c "import torch,triton;print('torch',torch.__version__,'triton',triton.__version__,'cuda',torch.version.cuda)"
  python -c "import cuequivariance_ops_torch as c, mace;print('cuequivariance_ops_torch',c.__version__,'mace',getattr(mace,'__version__','?'))"
  env | grep -E '^CUEQUIVARIANCE|^EQUIKERNELS|^PYTHONPATH'; ls -la /tmp/cuecache | head -5; } > $LOG 2>&1
# monitor: cache size and the python process's CPU / threads every 30 s
( while sleep 30; do echo "[mon $(date -u +%T)] cache: $(ls /tmp/cuecache 2>/dev/null | wc -l) files, $(du -sh /tmp/cuecache 2>/dev/null | cut -f1); $(ps -o pid=,pcpu=,nlwp=,etime= -C python | head -3 | tr '\n' ';')"; done ) >> $LOG 2>&1 &
MON=$!
T0=$(date +%s)
set -o pipefail
timeout -s ABRT 550 python -X faulthandler benchmarks/bench_train.py --impls mace-cueq-bf16,ek-bf16,ek-fp32 --no-cueq-ref \
    --time-budget-s 530 --out "$OUT/train.json" 2>&1 | tee -a $LOG \
    | grep -v -E "Warning|warn|visitor|^\s*$|atomic_numbers|^  File|^Extension modules"
echo "rc=${PIPESTATUS[0]} wall=$(( $(date +%s) - T0 )) s" | tee -a $LOG
kill $MON
{ ls -la /tmp/cuecache | head -20; du -sh /tmp/cuecache; ls /tmp/cuecache | wc -l; } 2>&1 | tee -a $LOG
