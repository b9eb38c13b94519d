#!/usr/bin/env bash
# Session 14, device call 2 (issue 4): the trimmed eager double-backward host path against the
# session-13 one (same graphs, --ab), OpenEquivariance and the floor, 15 interleaved rounds; then
# bench_tp's nequip-water dbwd cells in three separate processes (ours, OEQ; cue in the first).
set -u
OUT=${OUT:-/tmp/out}; L="$OUT/call2.log"; mkdir -p "$OUT" /tmp/w
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a "$L"; }
export TRITON_CACHE_DIR=/tmp/tcache EQUIKERNELS_CACHE_DIR=/tmp/ekc_h
timeout 250 python devtools/s14/host_probe.py --rows 64 --rounds 1 --calls 20 --ab > /tmp/w/warm_host.log 2>&1
stamp "warm done"; tail -n 4 /tmp/w/warm_host.log | tee -a "$L"
timeout 200 python devtools/s14/host_probe.py --rows 20000,64 --rounds 15 --calls 400 --ab > "$OUT/host_probe_ab.log" 2>&1
grep -E "median of rounds" "$OUT/host_probe_ab.log" | tee -a "$L"
stamp "probe done"
for rep in 1 2 3; do
  impls=equikernels_ir_mul,oeq; [ $rep = 1 ] && impls=equikernels_ir_mul,oeq,cue_ir_mul
  timeout 150 python benchmarks/bench_tp.py --problems nequip-water --directions dbwd --dtypes float32 \
    --impls $impls --out "$OUT/bench_dbwd_$rep" > "$OUT/bench_dbwd_$rep.log" 2>&1
  grep -E "nequip-water" "$OUT/bench_dbwd_$rep.log" | grep -E "dbwd" | head -8 | sed "s/^/rep $rep: /" | tee -a "$L"
  stamp "bench rep $rep"
done
