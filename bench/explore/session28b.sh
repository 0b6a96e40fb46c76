#!/usr/bin/env bash
# Session 28's second call (about 300 s): explore39 (the held prologue releasing the next launch at its start against
# after its wait, Llama-3.2-1B per kernel, A B B A); Llama-3.2-1B's step (explore26, 16 layers) with the held prologue
# released early too against the default, A B B A; the GPU tests of the change (held prologue, FusedModel's early
# release / held / draft / early-exit tests), verbose.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
echo "== explore39 (${SECONDS}s)"
timeout 150 python3 bench/explore/explore39.py --out "$OUT/explore39.json" 2>&1 | grep -v -i warn | tail -8
e26() {  # tag args
  local tag=$1; shift
  explore26_once 300 60 "$tag" --model Llama-3.2-1B --layers 16 --order 1,6,16,48 "$@"
}
e26 auto_1; e26 early_1 --early-release out_proj,down,attn_prologue
e26 early_2 --early-release out_proj,down,attn_prologue; e26 auto_2
echo "== GPU tests (${SECONDS}s)"
timeout 240 python3 -m pytest -v -n 8 -m "gpu and not real_model and not eval" -p no:cacheprovider --timeout 150 \
  -rf --tb=short tests/unit/test_attn_prologue.py tests/unit/test_fused_model.py -k "held or early or draft" \
  > /tmp/gpu-tests.log 2>&1; echo "pytest rc $?"
grep -E "FAILED|ERROR|[0-9]+ passed|[0-9]+ failed" /tmp/gpu-tests.log | grep -v "^FAILED.*PASSED" | cut -c1-300 | tail -14
cp /tmp/gpu-tests.log "$OUT/gpu-tests.log"
echo "done at ${SECONDS}s"
