#!/usr/bin/env bash
# Session 28's third call (about 150 s): explore40 (the held prologue, Llama-3.2-1B, with 4 / 8 / 16 / 32 K slices and
# the held residual GEMV, Qwen3-30B-A3B's out_proj with the sums, with 8 / 16 / 32: shorter mma chains a warp, per
# kernel, A B C D D C B A).
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
echo "== explore40 (${SECONDS}s)"
timeout 300 python3 bench/explore/explore40.py --out "$OUT/explore40.json" 2>&1 | grep -v -i warn | tail -12
echo "done at ${SECONDS}s"
