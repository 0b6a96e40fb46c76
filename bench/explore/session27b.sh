#!/usr/bin/env bash
# Session 27's second call (about 500 s): explore35 (the held GEMV's partial sums of squares: where they cost, four
# variants per kernel at Qwen3-30B-A3B's out_proj), then every single-GPU test on the tree whose MoE default is now
# moe_out_proj "auto" (held on the H200), verbose.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
echo "== explore35 (${SECONDS}s)"
timeout 120 python3 bench/explore/explore35.py --out "$OUT/explore35.json" 2>&1 | grep -v -i warn | tail -8
echo "== every single-GPU test (${SECONDS}s)"
gpu_tests_verbose 420
grep -c PASSED /tmp/gpu-tests.log
echo "done at ${SECONDS}s"
