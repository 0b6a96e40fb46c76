#!/usr/bin/env bash
# Session 28's eighth, ninth and tenth calls (about 90 s each; call 8 launched the 6-row kernel unclustered, fixed for
# call 9; call 10: ROWS=1,6,16 with the folded maxnreg=168 variant added): explore44 (a held prologue with QK-norm
# for Qwen3-30B-A3B, the 8 programs of a head launched as one cluster
# exchanging their partial sums of squares; against the split-K prologue, per kernel, A B B A, both checked against
# the float64 reference at the numerics policy).
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
echo "== explore44 (${SECONDS}s)"
timeout 240 python3 bench/explore/explore44.py --rows "${ROWS:-1,6,16,48}" --out "$OUT/explore44.json" 2>&1 | grep -v -i warn | tail -12
echo "done at ${SECONDS}s"
