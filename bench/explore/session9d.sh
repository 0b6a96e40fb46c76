#!/usr/bin/env bash
# Session 9, call 4: GPU tests of the MoE block (the route/plan kernel's order-free sums, the gates' row
# invariance) and of the fused model (the Qwen3 MoE-layer graph == eager test) after the fold's revert.
# Results: bench/results/session9/call4/.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
timeout 250 python3 -m pytest -q -n 8 -m "gpu and not real_model and not eval" -p no:cacheprovider --timeout 240 \
  tests/unit/test_moe.py tests/unit/test_fused_model.py > "$OUT/gpu-tests.log" 2>&1
echo "tests rc $?"; tail -6 "$OUT/gpu-tests.log"
