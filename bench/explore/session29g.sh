#!/usr/bin/env bash
# Session 29's seventh call, after the review of the route / plan programs (the arrival ordered by a CTA barrier, not
# a data dependency; MoEWorkspace.reset_plan_sync; the tests' widths on one workspace): every test of test_moe.py on
# the GPU, then the plan's in-step cost at 24 / 48 rows once.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
timeout 200 python3 -m pytest -q -n 8 -p no:cacheprovider --timeout 150 -rf tests/unit/test_moe.py \
  > "$OUT/moe-tests.log" 2>&1; echo "pytest rc $?"
grep -E "FAILED|ERROR|[0-9]+ passed|[0-9]+ failed" "$OUT/moe-tests.log" | cut -c1-300 | tail -12
echo "== route/plan (${SECONDS}s)"
timeout 120 python3 -m lowlat.bench --sections moe,profile --models "" --rows 24,48 --budget-s 100 \
  --out "$OUT/plan_programs.json" > /tmp/plan.log 2>&1; echo "bench rc $?"
python3 bench/explore/plan_profile.py "$OUT/plan_programs.json"
echo "done at ${SECONDS}s"
