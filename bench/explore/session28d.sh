#!/usr/bin/env bash
# Session 28's fourth call (about 60 s): explore41 (the held kernels' activation rows copied to shared memory with
# cp.async, every load of a row block in one round trip, against production; Llama-3.2-1B's held prologue and
# Qwen3-30B-A3B's held out_proj per kernel, A B B A, outputs compared bitwise).
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
echo "== explore41 (${SECONDS}s)"
timeout 200 python3 bench/explore/explore41.py --out "$OUT/explore41.json" 2>&1 | grep -v -i warn | tail -12
echo "done at ${SECONDS}s"
