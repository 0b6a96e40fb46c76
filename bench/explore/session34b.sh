#!/usr/bin/env bash
# Session 34's second call (one GPU, 600 s; ends by ~560 s). The first call (bench/results/session34/all.log) found
# (i) two of session 33's GPU tests timing out in their warm-up: ranks sharing a process loaded kernel variants while a
# peer's launch spun (rank_base was specialized: rank 0 / 1 / 2 each compiled their own variant; a refusal's variant
# loads on first use); fixed by do_not_specialize + PeerRank.preload; (ii) 12 unmarked CPU-interpreter tests failing
# on a GPU runner (plain `pytest` there runs them without the interpreter); (iii) the route / plan bench refused
# `--models ""`. This call: (a) bench/explore/lazy_load_deadlock.py, each arm in a fresh process (no_preload,
# preload, no_preload under CUDA_MODULE_LOADING=EAGER); (b) tests/multi_gpu + tests/fault -m gpu; (c) every test not
# marked gpu, as a GPU runner's plain `pytest -n 8` runs them (the list of those that need the interpreter);
# (d) the route / plan keys A B A (int32 top-k keys, session 30) if time is left.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
END=560
cp lowlat/kernels/moe.py /tmp/moe.py.tree
trap 'cp /tmp/moe.py.tree lowlat/kernels/moe.py' EXIT
mkdir -p /tmp/plans

echo "== (a) lazy loading (${SECONDS}s)"
for arm in no_preload preload; do
  timeout "$(cap 40)" python3 bench/explore/lazy_load_deadlock.py --arm $arm --out "$OUT/lazy_$arm.json" 2>&1 \
    | grep -v -i warn | tail -2
done
CUDA_MODULE_LOADING=EAGER timeout "$(cap 40)" python3 bench/explore/lazy_load_deadlock.py --arm no_preload \
  --out "$OUT/lazy_no_preload_eager.json" 2>&1 | grep -v -i warn | tail -2

echo "== (b) tests/multi_gpu + tests/fault -m gpu (${SECONDS}s)"
timeout "$(cap 150)" python3 -m pytest -q -n 8 -m gpu -p no:cacheprovider --timeout 120 -rf tests/multi_gpu tests/fault \
  > "$OUT/comm_gpu_tests.log" 2>&1; echo "pytest rc $?"
grep -E "FAILED|ERROR|[0-9]+ passed|[0-9]+ failed" "$OUT/comm_gpu_tests.log" | cut -c1-300 | tail -12

echo "== (c) every test not marked gpu, as plain pytest on a GPU runner (${SECONDS}s)"
timeout "$(cap 230)" python3 -m pytest -q -n 8 -m "not gpu" -p no:cacheprovider --timeout 120 -rfE --tb=line tests \
  > "$OUT/not_gpu_tests.log" 2>&1; echo "pytest rc $?"
grep -E "^(FAILED|ERROR)|[0-9]+ passed|[0-9]+ failed" "$OUT/not_gpu_tests.log" | cut -c1-200 | tail -60

n=0
for form in production keys32 production; do
  n=$((n + 1))
  (( SECONDS > END - 45 )) && { echo "skip route/plan $form: ${SECONDS}s used"; continue; }
  cp /tmp/moe.py.tree lowlat/kernels/moe.py
  [ $form = keys32 ] && python3 bench/explore/plan_keys32.py lowlat/kernels/moe.py
  echo "== (d) route/plan $form (${SECONDS}s)"
  timeout "$(cap 45)" python3 -m lowlat.bench --sections moe,profile --models "" --rows 1,6,48 --budget-s 35 \
    --out "/tmp/plans/plan_${n}_$form.json" > /tmp/plan.log 2>&1; echo "bench rc $?"; tail -3 /tmp/plan.log
  [ -f "/tmp/plans/plan_${n}_$form.json" ] && python3 bench/explore/plan_profile.py "/tmp/plans/plan_${n}_$form.json"
done
tar czf "$OUT/plans.tgz" -C /tmp plans
echo "done at ${SECONDS}s"
