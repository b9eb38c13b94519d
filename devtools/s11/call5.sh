#!/usr/bin/env bash
# Session 11, device call 5 (issue 10): the training step at 4,096 atoms on one machine, two processes:
# (A) cuEquivariance's default algorithms: ek bf16-mixed and cue fp32; (B) CUEQUIVARIANCE_OPS_U1D_ALGOS=0
# (cue's bf16 first pass does not finish in 10 min otherwise): cue fp32 and cue bf16 (autocast).
# A vs B on cue fp32 says what restricting cue to algorithm 0 costs it.
set -u
OUT=${OUT:-/tmp/out}
ALGOS= TAG=train4096_default IMPLS=ek-bf16,mace-cueq-fp32 LIMIT=${LIMIT_A:-290} EXTRA="--atoms-per-batch 4096 --steps 20" \
    bash devtools/s11/call2.sh 2>&1 | grep -E "^\| |  ok|error|skipped|cache files [0-9]+," | tail -8
ALGOS=0 TAG=train4096_algos0 IMPLS=mace-cueq-fp32,mace-cueq-bf16 LIMIT=${LIMIT_B:-275} EXTRA="--atoms-per-batch 4096 --steps 20" \
    bash devtools/s11/call2.sh 2>&1 | grep -E "^\| |  ok|error|skipped|cache files [0-9]+," | tail -8
