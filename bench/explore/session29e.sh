#!/usr/bin/env bash
# Session 29's fifth call: every test of tests/unit/test_moe.py on the GPU (not only the gpu-marked ones: the
# route / plan programs' new test, 16 rounds there, and the hypothesis tests at up to 48 rows).
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
timeout 240 python3 -m pytest -q -n 8 -p no:cacheprovider --timeout 200 -rf tests/unit/test_moe.py \
  > "$OUT/moe-tests.log" 2>&1; echo "pytest rc $?"
grep -E "FAILED|ERROR|[0-9]+ passed|[0-9]+ failed" "$OUT/moe-tests.log" | cut -c1-300 | tail -12
echo "done at ${SECONDS}s"
