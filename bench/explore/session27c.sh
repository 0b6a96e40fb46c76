#!/usr/bin/env bash
# Session 27's third call (about 300 s), on the final kernels (the held GEMV's sums in the mma layout, its row-block
# loop not unrolled): the GPU tests of what changed, verbose; two mutations of the held GEMV that its GPU tests must
# catch (session 26 left them unchecked on the GPU); explore35 (per kernel, four variants); Qwen3-30B-A3B's step
# (explore26, 4 layers) with moe_out_proj held against norm_epilogue, alternated (A B B A).
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
PYT=(python3 -m pytest -q -n 8 -m "gpu and not real_model and not eval" -p no:cacheprovider --timeout 150 -rf)
timeout 200 "${PYT[@]}" -v --tb=short tests/unit/test_residual_gemv_held.py tests/unit/test_moe.py \
  tests/unit/test_fused_model.py -k "held or moe or qwen3" > /tmp/gpu-tests.log 2>&1; echo "pytest rc $?"
grep -E "FAILED|ERROR|[0-9]+ passed|[0-9]+ failed" /tmp/gpu-tests.log | grep -v "^FAILED.*PASSED" | cut -c1-300 | tail -14
cp /tmp/gpu-tests.log "$OUT/gpu-tests.log"
K=lowlat/kernels/residual_gemv_held.py
mut() {  # tag old new: the held GEMV's GPU tests on the mutated kernel (they must fail)
  mutate $K "$2" "$3"
  timeout 100 "${PYT[@]}" tests/unit/test_residual_gemv_held.py > /tmp/mut.log 2>&1; echo "mutation $1: pytest rc $? (must be 1)"
  grep -E "[0-9]+ passed|[0-9]+ failed" /tmp/mut.log | tail -1; unmutate
}
mut sums_before_rounding "yf = y.to(gl.bfloat16).to(gl.float32)" "yf = y"
mut residual_in_every_slice "cq == 0, 1), 2)" "cq >= 0, 1), 2)"
echo "== explore35 (${SECONDS}s)"
timeout 120 python3 bench/explore/explore35.py --out "$OUT/explore35.json" 2>&1 | grep -v -i warn | tail -8
e26() {  # moe_out_proj tag
  explore26_once 500 60 "$1_$2" --model Qwen3-30B-A3B --layers 4 --order 1,6,16,48 --moe-out-proj "$1"
}
e26 held 1; e26 norm_epilogue 1; e26 norm_epilogue 2; e26 held 2
echo "done at ${SECONDS}s"
