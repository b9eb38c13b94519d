#!/usr/bin/env bash
# Session 14, device call 3. GPU clocks / power sampled every 100 ms through the whole call
# ($OUT/smi.csv) to line up with slow cells. Issue 4: bench_tp's nequip-water dbwd cells (ours, OEQ)
# in five processes. Issue 10: bench_mixed on the MACE products (ours, fp32 / bf16 / fp16) in three
# processes, and mace-medium's half backward over 16 allocations per dtype (time-stamped).
set -u
OUT=${OUT:-/tmp/out}; L="$OUT/call3.log"; mkdir -p "$OUT"
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s, $(date +%s)] $*" | tee -a "$L"; }
export TRITON_CACHE_DIR=/tmp/tcache EQUIKERNELS_CACHE_DIR=/tmp/ekc
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active \
  --format=csv,noheader -lms 100 > "$OUT/smi.csv" 2>&1 &
SMI=$!
timeout 200 python benchmarks/bench_mixed.py --problems mace-large,mace-mp-medium-L2,mace-medium --dtypes fp32,bf16,fp16 \
  --impls ek --rows 2000 --check-rows 500 --min-reps 1 --max-reps 2 --out /tmp/warm_mixed > /tmp/warm_mixed.log 2>&1 &
timeout 200 python benchmarks/bench_tp.py --problems nequip-water --directions dbwd --dtypes float32 \
  --impls equikernels_ir_mul,oeq --rows 2000 --dbwd-rows 2000 --out /tmp/warm_tp > /tmp/warm_tp.log 2>&1 &
wait -n; wait -n
stamp "warm done"
for rep in 1 2 3 4 5; do
  timeout 100 python benchmarks/bench_tp.py --problems nequip-water --directions dbwd --dtypes float32 \
    --impls equikernels_ir_mul,oeq --out "$OUT/bench_dbwd_$rep" > "$OUT/bench_dbwd_$rep.log" 2>&1
  grep -E "^nequip-water .*dbwd" "$OUT/bench_dbwd_$rep.log" | sed "s/^/rep $rep: /" | tee -a "$L"
done
stamp "tp done"
for rep in 1 2 3; do
  timeout 120 python benchmarks/bench_mixed.py --problems mace-large,mace-mp-medium-L2,mace-medium --dtypes fp32,bf16,fp16 \
    --impls ek --out "$OUT/mixed_$rep" > "$OUT/mixed_$rep.log" 2>&1
  grep -E "^\| mace.* \| (bwd|fwd)" "$OUT/mixed_$rep.log" | sed "s/^/rep $rep /" | tee -a "$L"
  stamp "mixed rep $rep"
done
TRIALS=16 timeout 120 python devtools/s13/alloc_probe.py mace-medium:bfloat16 mace-medium:float16 2>&1 | grep -v -i warn >> "$OUT/alloc.log"
grep medians "$OUT/alloc.log" | tee -a "$L"
stamp done
kill $SMI
awk -F', ' '{print $2}' "$OUT/smi.csv" | sort | uniq -c | sort -rn | head -8 | tee -a "$L"
