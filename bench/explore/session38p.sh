#!/usr/bin/env bash
# Session 38, call 18 (one GPU, no carry, ends by END, default 120 s): explore52 --probe with the first graphs kept and
# timed again at the end (call 17: tma1 fast in the first three fresh graphs, slow from the fourth, SM clock 1980 MHz
# throughout): is the slow mode a graph's own or the process's state? nvidia-smi sampled beside it.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
END=${END:-120}
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active \
  --format=csv,nounits -lms 50 > "$OUT/smi.csv" 2>&1 &
SMI=$!
echo "== explore52 --probe (${SECONDS}s) unix $(date +%s.%N)"
timeout "$(cap 100)" python3 bench/explore/explore52.py --probe 8 --replays 200 --out "$OUT/explore52_probe.json" \
  2>&1 | grep -v -i warn; echo "rc $?"
kill $SMI
echo "done at ${SECONDS}s"
