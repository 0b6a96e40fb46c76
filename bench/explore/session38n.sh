#!/usr/bin/env bash
# Session 38, call 16 (one GPU, no carry, ends by END, default 120 s): explore52 --probe, is tma1's bimodal 1-row time
# (calls 13-14: 4.14-4.19 in some timings, 4.52-4.59 in others) a property of a captured graph or of a replay? Eight
# fresh graphs each of prod and tma1, each replayed 40 times.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
END=${END:-120}
echo "== explore52 --probe (${SECONDS}s)"
timeout "$(cap 100)" python3 bench/explore/explore52.py --probe 8 --replays 40 --out "$OUT/explore52_probe.json" \
  2>&1 | grep -v -i warn; echo "rc $?"
echo "done at ${SECONDS}s"
