#!/usr/bin/env bash
# Session 33's first call (one GPU, 600 s; this script ends by ~555 s): (a) test_draft_sampling.py's probs tests on
# the GPU (`test_probs_out_is_checked_before_any_write` failed in session 32 call 3 on a CPU tensor; it takes the
# `device` fixture now); (a2) tests/multi_gpu + tests/fault whole on the GPU: session 33 changed the all-reduce kernel,
# the TP layer's tags and abort words (a flag's tag carries the call's rows; a peer's other rows or its refusal end the
# wait with StepContractError: tests/multi_gpu/test_peer_rank_agreement.py, whose streams test runs only on a GPU);
# (b) explore46 at 1 / 6 rows: the QK-norm weights staged in shared memory before the PDL wait
# and read after the mma (nosum_smem; qk_smem and qk_smem_rope_late, the exchange form, checked against the float64
# reference) beside plain / qk_own_nosum / nosum_const / qk_cluster; (b2) explore47 at 1 / 6 / 16 rows: Llama-3.2-1B's
# held prologue with the first row block's RoPE inputs after the wait (rope_late) or its cos / sin only (rope_split),
# which on the CPU compile no longer issue the 48 weight / g loads behind the positions' range check (prod does),
# checked bitwise against prod (q / K / V); (c) session30b.sh trimmed: the route / plan
# kernel's top-k on int32 keys (bench/explore/plan_keys32.py) against production in the step, A B A at 1 / 6 / 48
# rows, then test_moe.py on the GPU with the int32 keys (kernels/moe.py restored at the end); (d) if time is left,
# explore46's cp.async form (nosum_cpasync, qk_cpasync), last: a new kernel form that must not cost (a)-(c);
# (e) if time is left, bench_allreduce.py for 55 s (the all-reduce kernel's wait changed in session 33).
# Seconds from session 29 / 32's logs (bench/results/session29, session32: all.log): start ~5; (a) <= 90 (4 tests;
# the whole file took 92 s of pytest in session 32 call 3); (b) ~25-40 (6 variants 10 s in session 32 call 2, 5 with
# 3 clustered and checked 17 s in session 29 call 2); (b2) ~15-30 (explore42's 4 Llama prologue variants at 4 widths
# 24 s, at 2 widths 6 s, in session 28 call 5; explore47 times 3 at 3 widths, 2 rounds); (a2) <= 150 (not timed
# before as one run); (c) ~20-37 a route / plan bench run (session 29 calls 2-3), x 3, test_moe.py ~50-65 (47 s of
# pytest in session 29 call 5);
# (d) ~15-25. Each part's timeout is cut to what is left before END.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
END=555
# cap LIMIT: LIMIT seconds or what is left before END, whichever is less (at least 1)
cap() { local left=$(( END - SECONDS )); (( left < $1 )) && echo $(( left > 1 ? left : 1 )) || echo "$1"; }
cp lowlat/kernels/moe.py /tmp/moe.py.tree
mkdir -p /tmp/plans
# files back (at most 8): all.log, comm_tests.log, e46.json, e47.json, plans.tgz, e46_cpasync.json, allreduce.json
trap 'cp /tmp/moe.py.tree lowlat/kernels/moe.py' EXIT

echo "== (a) test_draft_sampling.py -k probs (${SECONDS}s)"
timeout "$(cap 90)" python3 -m pytest -q -n 8 -p no:cacheprovider --timeout 150 -rf tests/unit/test_draft_sampling.py \
  -k probs > /tmp/draft_probs.log 2>&1; echo "pytest rc $?"
grep -E "FAILED|ERROR|^E |[0-9]+ passed|[0-9]+ failed" /tmp/draft_probs.log | cut -c1-300 | tail -20

echo "== (a2) tests/multi_gpu + tests/fault whole (${SECONDS}s)"
timeout "$(cap 150)" python3 -m pytest -q -n 8 -p no:cacheprovider --timeout 120 -rf tests/multi_gpu tests/fault \
  > "$OUT/comm_tests.log" 2>&1; echo "pytest rc $?"
grep -E "FAILED|ERROR|[0-9]+ passed|[0-9]+ failed" "$OUT/comm_tests.log" | cut -c1-300 | tail -12

echo "== (b) explore46 (${SECONDS}s)"
timeout "$(cap 200)" python3 bench/explore/explore46.py --rows 1,6 \
  --variants plain,qk_own_nosum,nosum_const,nosum_smem,qk_cluster,qk_smem,qk_smem_rope_late \
  --out "$OUT/e46.json" 2>&1 | grep -v -i warn | tail -6; echo "explore46 rc $?"

echo "== (b2) explore47: Llama's held prologue, the first block's RoPE inputs after the wait (${SECONDS}s)"
timeout "$(cap 90)" python3 bench/explore/explore47.py --rows 1,6,16 --out "$OUT/e47.json" 2>&1 | grep -v -i warn \
  | tail -5; echo "explore47 rc ${PIPESTATUS[0]}"

n=0
for form in production keys32 production; do
  n=$((n + 1))
  (( SECONDS > 380 )) && { echo "skip route/plan $form: ${SECONDS}s used"; continue; }
  cp /tmp/moe.py.tree lowlat/kernels/moe.py
  [ $form = keys32 ] && python3 bench/explore/plan_keys32.py lowlat/kernels/moe.py
  echo "== (c) route/plan $form (${SECONDS}s)"
  timeout "$(cap 80)" python3 -m lowlat.bench --sections moe,profile --models "" --rows 1,6,48 --budget-s 60 \
    --out "/tmp/plans/plan_${n}_$form.json" > /tmp/plan.log 2>&1; echo "bench rc $?"
  python3 bench/explore/plan_profile.py "/tmp/plans/plan_${n}_$form.json"
done
tar czf "$OUT/plans.tgz" -C /tmp plans     # one file: at most 8 come back
cp /tmp/moe.py.tree lowlat/kernels/moe.py
python3 bench/explore/plan_keys32.py lowlat/kernels/moe.py
echo "== (c) test_moe.py with int32 keys (${SECONDS}s)"
timeout "$(cap 150)" python3 -m pytest -q -n 8 -p no:cacheprovider --timeout 120 -rf tests/unit/test_moe.py \
  > /tmp/moe-tests-keys32.log 2>&1; echo "pytest rc $?"
grep -E "FAILED|ERROR|^E |[0-9]+ passed|[0-9]+ failed" /tmp/moe-tests-keys32.log | cut -c1-300 | tail -20
cp /tmp/moe.py.tree lowlat/kernels/moe.py

if (( SECONDS < 500 )); then
  echo "== (d) explore46 cp.async (${SECONDS}s)"
  timeout "$(cap 90)" python3 bench/explore/explore46.py --rows 1,6 --variants plain,nosum_cpasync,qk_cpasync \
    --out "$OUT/e46_cpasync.json" 2>&1 | grep -v -i warn | tail -6; echo "explore46 rc $?"
else
  echo "skip (d): ${SECONDS}s used"
fi
if (( SECONDS < 470 )); then
  echo "== (e) bench_allreduce.py (the rows-agreement kernel; compare bench/results/allreduce_h200.json) (${SECONDS}s)"
  timeout "$(cap 80)" python3 bench/bench_allreduce.py --budget-s 55 --out "$OUT/allreduce.json" 2>&1 | tail -4
  echo "bench rc $?"
else
  echo "skip (e): ${SECONDS}s used"
fi
echo "done at ${SECONDS}s"
