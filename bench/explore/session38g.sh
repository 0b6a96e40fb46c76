#!/usr/bin/env bash
# Session 38, call 7 (one GPU, no carry, ends by END, default 200 s): explore53, Qwen3-30B-A3B's prologue with its
# weights in shared memory by TMA and the QK-norm exchanged in clusters of 8, against the production split-K prologue
# and explore44's register-held cluster form, at 1 / 6 / 16 rows (accuracy, every element written, then timed).
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
END=${END:-200}
echo "== explore53 (${SECONDS}s)"
timeout "$(cap 180)" python3 bench/explore/explore53.py --rows 1,6,16 --rounds 2 --out "$OUT/explore53.json" \
  2>&1 | grep -v -i warn; echo "rc $?"
echo "done at ${SECONDS}s"
