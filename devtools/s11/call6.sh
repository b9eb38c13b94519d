#!/usr/bin/env bash
# Session 11, device call 6: (issue 10) bf16 / fp16 against fp32 on the MACE uvu problems with today's
# kernels, cuEquivariance's half path in the same run; (issue 4) the host-bound 20k double backward of
# nequip-water and lips, three more same-process samples of ours and both baselines.
set -u
OUT=${OUT:-/tmp/out}; L="$OUT/call6.log"; mkdir -p "$OUT" /tmp/tcache
export TRITON_CACHE_DIR=/tmp/tcache
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a "$L"; }
timeout 330 python benchmarks/bench_mixed.py --problems mace-large,mace-medium --dtypes fp32,bf16,fp16 --impls ek,cue \
    --out "$OUT" >> "$L" 2>&1
stamp "bench_mixed rc=$?"
for rep in 1 2 3; do
timeout 75 python benchmarks/bench_tp.py --problems nequip-water,nequip-lips --dtypes float32 --directions dbwd \
    --dbwd-rows 20000 --impls equikernels_ir_mul,cue_ir_mul,oeq --check-rows 1040 --target-ms 100 \
    --out /tmp/w$rep --tag w$rep > /tmp/w$rep.log 2>&1
stamp "rep $rep rc=$? $(grep -hE '^\[[0-9]/' /tmp/w$rep.log | sed -E 's/.*(nequip-[a-z]+) f32 dbwd 20000 ([a-z_]+): ([0-9.]+ ms \(min [0-9.]+).*/\1 \2 \3)/' | tr '\n' ';')"
done
tail -30 "$OUT"/mixed_*.md 2>/dev/null
