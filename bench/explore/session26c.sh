#!/usr/bin/env bash
# Session 26's third call (about 420 s): every single-GPU test on the final tree (the MoE router's norm pass now
# loads four x chunks at a time; the helper's final MoE tests), verbose; then Qwen3-30B-A3B's step (explore26, 4
# layers) with moe_out_proj held against norm_epilogue, alternated (A B B A), to decide FusedModel's default.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
timeout 380 python3 -m pytest -v -n 8 -m "gpu and not real_model and not eval" -p no:cacheprovider --timeout 200 -rf \
  --tb=short tests > /tmp/gpu-tests.log 2>&1; echo "pytest rc $?"
grep -E "FAILED|ERROR|[0-9]+ passed|[0-9]+ failed" /tmp/gpu-tests.log | grep -v "^FAILED.*PASSED" | cut -c1-300 | tail -14
grep -c PASSED /tmp/gpu-tests.log
cp /tmp/gpu-tests.log "$OUT/gpu-tests.log"
e26() {  # moe_out_proj tag
  (( SECONDS > 500 )) && { echo "skip e26 $*: ${SECONDS}s used"; return; }
  echo "== e26 Qwen3-30B-A3B moe_out_proj $1 (${SECONDS}s)"
  if timeout 60 python3 bench/explore/explore26.py --model Qwen3-30B-A3B --layers 4 --order 1,6,16,48 \
       --moe-out-proj $1 --out "$OUT/e26_$1_$2.json" > /tmp/e26.log 2>&1
  then grep -v -i warn /tmp/e26.log | grep -E '^  r[0-9]+ |logits' | cut -c1-420; else echo "e26 failed"; tail -4 /tmp/e26.log; fi
}
e26 held 1; e26 norm_epilogue 1; e26 norm_epilogue 2; e26 held 2
echo "done at ${SECONDS}s"
