#!/usr/bin/env bash
# Prepared in session 29 for session 30: the route / plan kernel's top-k on int32 keys (bench/explore/plan_keys32.py)
# against production, in the step (`lowlat bench --sections moe,profile`, one Qwen3-30B-A3B layer at 1 / 6 / 16 / 48
# rows), A B A; then every test of test_moe.py on the GPU with the int32 keys (the edit applied to the tree's
# kernels/moe.py, restored at the end).
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
cp lowlat/kernels/moe.py /tmp/moe.py.tree
for form in production keys32 production; do
  cp /tmp/moe.py.tree lowlat/kernels/moe.py
  [ $form = keys32 ] && python3 bench/explore/plan_keys32.py lowlat/kernels/moe.py
  echo "== route/plan $form (${SECONDS}s)"
  timeout 150 python3 -m lowlat.bench --sections moe,profile --models "" --rows 1,6,16,48 --budget-s 140 \
    --out "$OUT/plan_$form.json" > /tmp/plan.log 2>&1; echo "bench rc $?"
  python3 bench/explore/plan_profile.py "$OUT/plan_$form.json"
done
python3 bench/explore/plan_keys32.py lowlat/kernels/moe.py
echo "== test_moe.py with int32 keys (${SECONDS}s)"
timeout 200 python3 -m pytest -q -n 8 -p no:cacheprovider --timeout 150 -rf tests/unit/test_moe.py \
  > "$OUT/moe-tests-keys32.log" 2>&1; echo "pytest rc $?"
grep -E "FAILED|ERROR|[0-9]+ passed|[0-9]+ failed" "$OUT/moe-tests-keys32.log" | cut -c1-300 | tail -12
cp /tmp/moe.py.tree lowlat/kernels/moe.py
echo "done at ${SECONDS}s"
