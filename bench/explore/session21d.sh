#!/usr/bin/env bash
# Session 21, call 4: the fused model's GPU deferral test, which call 3 stopped at a stale assertion on the default
# rule (before its NaN-filled replays ran), on the final rule (DEFER_DOWN_MAX_BYTES 3.5 MiB).
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
timeout 150 python3 -m pytest -q -n 4 -m "gpu and not real_model and not eval" -p no:cacheprovider --timeout 120 \
  tests/unit/test_fused_model.py tests/unit/test_deferred_prologue.py -k "deferred or default_down" \
  > /tmp/gpu-tests.log 2>&1; echo "pytest rc $?"
grep -E "passed|failed|FAILED|Error" /tmp/gpu-tests.log | cut -c1-300 | tail -12; cp /tmp/gpu-tests.log "$OUT/gpu-tests.log"
echo "done at ${SECONDS}s"
