#!/usr/bin/env bash
# Session 26's fifth call (about 380 s): every single-GPU test on the final tree (FusedModel's held prologue now
# multiplies the norm weight in registers, fused_model.HELD_FOLD = "registers"), verbose.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
gpu_tests_verbose 400
echo "done at ${SECONDS}s"
