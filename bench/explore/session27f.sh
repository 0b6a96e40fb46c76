#!/usr/bin/env bash
# Session 27's sixth call (about 150 s): after the review (a helper's), the GPU tests it changed or touched: the held
# GEMV's (sums written into a strided view of a NaN buffer, nothing outside it; the sums' bits without PDL), the MoE's
# norm tests, FusedModel's moe_out_proj forms (the build-time rule on the router's MAX_SUM_SQ_PARTS), verbose.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
timeout 240 python3 -m pytest -v -n 8 -m "gpu and not real_model and not eval" -p no:cacheprovider --timeout 150 \
  -rf --tb=short tests/unit/test_residual_gemv_held.py tests/unit/test_moe.py tests/unit/test_fused_model.py \
  -k "held or norm or moe_out_proj or qwen3_moe" > /tmp/gpu-tests.log 2>&1; echo "pytest rc $?"
grep -E "FAILED|ERROR|[0-9]+ passed|[0-9]+ failed" /tmp/gpu-tests.log | grep -v "^FAILED.*PASSED" | cut -c1-300 | tail -14
cp /tmp/gpu-tests.log "$OUT/gpu-tests.log"
echo "done at ${SECONDS}s"
