#!/usr/bin/env bash
# Session 35's first call (one GPU; ends by END, default 440 s): what session 34's call 3 could not reach.
# (a0) the tests session 35 moved from the `interpreter` marker to the `device` fixture (never run on a GPU before:
# lm_head's ties / NaN argmax, the fused model against the reference at tiny shapes, the kernels' in-place / padding /
# split-order tests, the GEMV tuner gate on every candidate plan): every unmarked test of their files, on the GPU;
# (b) the unmarked tests call 3 did not reach: test_peer_rank_agreement.py (its device-fixture tests on the GPU) and
# test_rank_agreement.py (gloo processes, device "cpu", on a GPU machine);
# (d) `lowlat signoff --quick -- -k rms_norm`: the GPU run, then the interpreter tests' second run (session 34, not
# yet run on a GPU machine). Every single-GPU test (test_moe.py / test_fused_model.py -m gpu with the int32 route /
# plan keys of 1fa63cb among them): session35b.sh, the next call.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
END=${END:-440}

echo "== (a0) session 35's GPU forms of interpreter-only tests: the unmarked tests of their files (${SECONDS}s)"
timeout "$(cap 170)" python3 -m pytest -v -n 8 -m "not gpu and not interpreter" -p no:cacheprovider --timeout 150 \
  -rfE --tb=short tests/unit/test_lm_head.py tests/unit/test_fused_model.py tests/unit/test_mlp_kernel.py \
  tests/unit/test_out_proj.py tests/unit/test_rms_norm_kernel.py tests/unit/test_attn_fold.py \
  tests/unit/test_deferred_reduction.py tests/unit/test_deferred_prologue.py tests/unit/test_gemv_plans.py \
  > "$OUT/converted.log" 2>&1
echo "pytest rc $?"
grep -E "FAILED|ERROR|[0-9]+ passed|[0-9]+ failed" "$OUT/converted.log" | grep -v " PASSED " | cut -c1-300 | tail -16

echo "== (b) unmarked: test_peer_rank_agreement.py, test_rank_agreement.py (${SECONDS}s)"
timeout "$(cap 150)" python3 -m pytest -v -n 8 -m "not gpu" -p no:cacheprovider --timeout 120 -rfE --tb=short \
  tests/multi_gpu/test_peer_rank_agreement.py tests/multi_gpu/test_rank_agreement.py > "$OUT/unmarked_rest.log" 2>&1
echo "pytest rc $?"
grep -E "FAILED|ERROR|[0-9]+ passed|[0-9]+ failed" "$OUT/unmarked_rest.log" | grep -v " PASSED " | cut -c1-300 | tail -12

echo "== (d) lowlat signoff's two runs on a GPU machine, narrowed to the RMSNorm tests (${SECONDS}s)"
timeout "$(cap 90)" python3 -m lowlat signoff --out "$OUT/signoff" --quick --workers 8 -- -k rms_norm \
  > /tmp/signoff.log 2>&1; echo "signoff rc $?"
grep -E "^\[signoff\]|second run|passed, " /tmp/signoff.log "$OUT/signoff/signoff.md" | cut -c1-250 | tail -8

echo "done at ${SECONDS}s"
