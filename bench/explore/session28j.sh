#!/usr/bin/env bash
# Session 28's twelfth call (about 120 s): after the read-through (the residual GEMV's early release through the
# shared PDL helpers; FusedModel's prologue release flag fixed at build), the GPU tests of early release, the held
# prologue and the residual GEMV, verbose.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
timeout 240 python3 -m pytest -v -n 8 -m "gpu and not real_model and not eval" -p no:cacheprovider --timeout 150 \
  -rf --tb=short tests/unit/test_out_proj.py tests/unit/test_attn_prologue.py tests/unit/test_fused_model.py \
  tests/unit/test_deferred_reduction.py -k "early or held or residual" > /tmp/gpu-tests.log 2>&1; echo "pytest rc $?"
grep -E "FAILED|ERROR|[0-9]+ passed|[0-9]+ failed" /tmp/gpu-tests.log | grep -v "^FAILED.*PASSED" | cut -c1-300 | tail -14
cp /tmp/gpu-tests.log "$OUT/gpu-tests.log"
echo "done at ${SECONDS}s"
