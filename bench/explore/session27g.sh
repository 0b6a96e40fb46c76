#!/usr/bin/env bash
# Session 27's seventh call (about 200 s): after the final read-through, the GPU tests of the held GEMV, the MoE norm
# and FusedModel's MoE forms on the tree, then two mutations the held GEMV's new GPU checks must catch: the sums'
# store mask dropped (rows past M written into the buffer), and the sums' row stride taken as N / 16.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
PYT=(python3 -m pytest -q -n 8 -m "gpu and not real_model and not eval" -p no:cacheprovider --timeout 150 -rf)
timeout 200 "${PYT[@]}" tests/unit/test_residual_gemv_held.py tests/unit/test_moe.py tests/unit/test_fused_model.py \
  -k "held or norm or moe_out_proj or qwen3_moe" > /tmp/gpu-tests.log 2>&1; echo "pytest rc $?"
grep -E "FAILED|ERROR|[0-9]+ passed|[0-9]+ failed" /tmp/gpu-tests.log | cut -c1-300 | tail -8
cp /tmp/gpu-tests.log "$OUT/gpu-tests.log"
K=lowlat/kernels/residual_gemv_held.py
mut() {  # tag old new: the held GEMV's GPU tests on the mutated kernel (they must fail)
  mutate $K "$2" "$3"
  timeout 100 "${PYT[@]}" tests/unit/test_residual_gemv_held.py -k "policy" > /tmp/mut.log 2>&1
  echo "mutation $1: pytest rc $? (must be 1)"; grep -E "[0-9]+ passed|[0-9]+ failed" /tmp/mut.log | tail -1; unmutate
}
mut sums_mask_dropped "gl.sum(yf * yf, axis=0), mask=yrow < M)" "gl.sum(yf * yf, axis=0))"
mut sums_stride "sum_sq_out.stride(0) if ss else 0" "n // BLOCK_N if ss else 0"
echo "done at ${SECONDS}s"
