#!/usr/bin/env bash
# Session 26's third call (about 420 s): every single-GPU test on the final tree (the MoE router's norm pass now
# loads four x chunks at a time; the helper's final MoE tests), verbose; then Qwen3-30B-A3B's step (explore26, 4
# layers) with moe_out_proj held against norm_epilogue, alternated (A B B A), to decide FusedModel's default.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
gpu_tests_verbose 380
grep -c PASSED /tmp/gpu-tests.log
e26() {  # moe_out_proj tag
  explore26_once 500 60 "$1_$2" --model Qwen3-30B-A3B --layers 4 --order 1,6,16,48 --moe-out-proj "$1"
}
e26 held 1; e26 norm_epilogue 1; e26 norm_epilogue 2; e26 held 2
echo "done at ${SECONDS}s"
