#!/usr/bin/env bash
# Session 38, call 17 (one GPU, no carry, ends by END, default 120 s): explore52 --probe again (call 16, H100: tma1's
# first three graphs at prod's time, the next five 0.3-0.4 us slower, each stable over its replays) with the SM clock,
# power and temperature sampled every 50 ms beside it (nvidia-smi, $OUT/smi.csv), to see whether the slow mode follows
# the clock.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
END=${END:-120}
PROBE=${PROBE:-10}   # fresh graphs of each variant (session38p.sh: 8)
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active \
  --format=csv,nounits -lms 50 > "$OUT/smi.csv" 2>&1 &
SMI=$!
echo "== explore52 --probe (${SECONDS}s) unix $(date +%s.%N)"
timeout "$(cap 100)" python3 bench/explore/explore52.py --probe "$PROBE" --replays 200 \
  --out "$OUT/explore52_probe.json" 2>&1 | grep -v -i warn; echo "rc $?"
kill $SMI
echo "done at ${SECONDS}s"
