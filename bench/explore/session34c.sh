#!/usr/bin/env bash
# Session 34's third call (one GPU; ends by END, default 560 s; (a) leaves 70 s to (c) and (b)): (a) every test not marked gpu, as a GPU runner's plain
# `pytest -n 8` runs them, after the CPU-interpreter tests got the `interpreter` marker (skipped where the interpreter
# is off): each test named (-v) so a run cut by its timeout still names its failures; (b) the GPU tests of the
# modules the int32 route keys reach (kernels/moe.py: test_moe.py, test_fused_model.py) and tests/multi_gpu,
# tests/fault again (do_not_specialize + preload); (c) the preload test's mutation check on the GPU: the kernel with
# preload compiling without loading (`_launch`'s load_only without _init_handles) must fail
# test_gpu_preloaded_ranks_load_no_kernel_in_their_calls_and_refusals.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
END=${END:-560}

echo "== (a) tests not marked gpu (${SECONDS}s)"
timeout "$(cap $(( END - 70 > 300 ? 300 : END - 70 )))" python3 -m pytest -v -n 8 -m "not gpu" -p no:cacheprovider --timeout 120 -rfE --tb=short tests \
  > "$OUT/not_gpu_tests.log" 2>&1; echo "pytest rc $?"
grep -E "^(FAILED|ERROR)|[0-9]+ passed|[0-9]+ failed" "$OUT/not_gpu_tests.log" | grep -v "PASSED" | cut -c1-220 \
  | sort -u | tail -60
grep -cE " PASSED " "$OUT/not_gpu_tests.log"; grep -cE " (FAILED|ERROR) " "$OUT/not_gpu_tests.log"

echo "== (c) mutation: preload compiles but does not load (${SECONDS}s)"
cp lowlat/comm/ordered_reduce.py /tmp/or.py
sed -i '/            compiled._init_handles()/d' lowlat/comm/ordered_reduce.py
grep -c "_init_handles()" lowlat/comm/ordered_reduce.py
timeout "$(cap 90)" python3 -m pytest -q -p no:cacheprovider --timeout 80 -rf \
  tests/multi_gpu/test_peer_rank_agreement.py -k preloaded_ranks 2>&1 | grep -E "passed|failed|kernels loaded" | cut -c1-250
cp /tmp/or.py lowlat/comm/ordered_reduce.py
echo "== (b) GPU tests: test_moe.py, test_fused_model.py (${SECONDS}s)"
timeout "$(cap 240)" python3 -m pytest -v -n 8 -m "gpu and not real_model and not eval" -p no:cacheprovider \
  --timeout 200 -rf tests/unit/test_moe.py tests/unit/test_fused_model.py \
  > "$OUT/gpu_tests.log" 2>&1; echo "pytest rc $?"
grep -E "FAILED|ERROR|[0-9]+ passed|[0-9]+ failed" "$OUT/gpu_tests.log" | grep -v " PASSED " | cut -c1-300 | tail -12
grep -E "preloaded_ranks_load_no_kernel" "$OUT/gpu_tests.log" | cut -c1-200

echo "done at ${SECONDS}s"
