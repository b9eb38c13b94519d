#!/usr/bin/env bash
# Session 11, device call 3 (issue 10): (a) is CUEQUIVARIANCE_OPS_U1D_ALGOS=0 fair to cuEquivariance?
# Its fp32 training step with every algorithm (default) against call 2's ALGOS=0 figure (111.2 ms);
# (b) the training step at 4,096 atoms (less host-bound than 2,048): ek fp32 / bf16, cue bf16 (ALGOS=0).
set -u
OUT=${OUT:-/tmp/out}
ALGOS= TAG=train_cuefp32_default IMPLS=mace-cueq-fp32 LIMIT=${LIMIT_A:-230} bash devtools/s11/call2.sh 2>&1 | grep -E "^\| |ok|error|skipped|cache" | tail -8
ALGOS=0 TAG=train_4096 IMPLS=ek-fp32,ek-bf16,mace-cueq-bf16 LIMIT=${LIMIT_B:-330} EXTRA="--atoms-per-batch 4096" \
    bash devtools/s11/call2.sh 2>&1 | grep -E "^\| |ok|error|skipped|cache" | tail -10
