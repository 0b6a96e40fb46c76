#!/usr/bin/env bash
# Session 32, after session31a.sh's run (bench/results/session32/): (1) test_moe.py, test_rejection_sampling.py and
# test_kernel_devices.py whole (GPU-marked and unmarked) on the GPU: the route / plan kernel's arrival count is now
# taken back by an atomic add (a non-zero start stays visible), three rejection tests now take the `device` fixture;
# (2) session31b.sh (the draft sampler before / after session 30, A B A; explore46's QK-norm bisection).
# Run with carry [".stage/draft_sampling_before30.py"].
cd "$(dirname "$0")/../.."
source bench/device/common.sh
echo "== test_moe / test_rejection_sampling / test_kernel_devices, every test (${SECONDS}s)"
timeout 240 python3 -m pytest -q -n 8 -p no:cacheprovider --timeout 200 -rf tests/unit/test_moe.py \
  tests/unit/test_rejection_sampling.py tests/unit/test_kernel_devices.py > "$OUT/moe_rej.log" 2>&1
echo "pytest rc $?"
grep -E "FAILED|ERROR|[0-9]+ passed|[0-9]+ failed" "$OUT/moe_rej.log" | cut -c1-300 | tail -12
echo "== session31b.sh (${SECONDS}s)"
bash bench/explore/session31b.sh
