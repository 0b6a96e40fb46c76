#!/usr/bin/env bash
# Prepared in session 30 (the device lent no machine that session): session 30's changes ran on the CPU only. This
# call runs every single-GPU test (the MoE clamp of a device num_valid_rows, the attention / GEMV / sampling refusals,
# the sampling kernels' non-finite rows: their GPU tests check the kernel bitwise against the reference), then the
# unmarked tests of test_moe.py (the clamp's test and the route / plan programs' post-review form), test_draft_sampling.py
# and test_rejection_sampling.py on the GPU (the `device` fixture takes it).
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
echo "== every single-GPU test (${SECONDS}s)"
gpu_tests_verbose 330
echo "== unmarked tests of test_moe / test_draft_sampling / test_rejection_sampling on the GPU (${SECONDS}s)"
timeout 200 python3 -m pytest -q -n 8 -p no:cacheprovider --timeout 150 -rf -m "not gpu" tests/unit/test_moe.py \
  tests/unit/test_draft_sampling.py tests/unit/test_rejection_sampling.py > "$OUT/unmarked.log" 2>&1
echo "pytest rc $?"
grep -E "FAILED|ERROR|[0-9]+ passed|[0-9]+ failed" "$OUT/unmarked.log" | cut -c1-300 | tail -12
echo "done at ${SECONDS}s"
