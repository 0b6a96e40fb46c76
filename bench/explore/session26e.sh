#!/usr/bin/env bash
# Session 26's fifth call (about 380 s): every single-GPU test on the final tree (FusedModel's held prologue now
# multiplies the norm weight in registers, fused_model.HELD_FOLD = "registers"), verbose.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
timeout 400 python3 -m pytest -v -n 8 -m "gpu and not real_model and not eval" -p no:cacheprovider --timeout 200 -rf \
  --tb=short tests > /tmp/gpu-tests.log 2>&1; echo "pytest rc $?"
grep -E "FAILED|ERROR|[0-9]+ passed|[0-9]+ failed" /tmp/gpu-tests.log | grep -v "^FAILED.*PASSED" | cut -c1-300 | tail -14
cp /tmp/gpu-tests.log "$OUT/gpu-tests.log"
echo "done at ${SECONDS}s"
