#!/usr/bin/env bash
# Session 13 call 5: every single-GPU test (not the real-model / eval ones, which need the carried wheels) on the
# final code of the session, with the decode attention's after_kv release as the default.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
timeout 560 python3 -m pytest -q -n 8 -m "gpu and not real_model and not eval" -p no:cacheprovider --timeout 190 \
  tests > "$OUT/gpu-tests.log" 2>&1
echo "rc $? at ${SECONDS}s"
grep -E "passed|failed|error|FAILED|ERROR" "$OUT/gpu-tests.log" | tail -30
