#!/usr/bin/env bash
# Session 28's fifth call (about 60 s): explore42 (the held prologue with 4 / 16 K slices, the norm weight multiplied
# in registers or folded at build; Llama-3.2-1B per kernel, A B C D D C B A).
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
echo "== explore42 (${SECONDS}s)"
timeout 200 python3 bench/explore/explore42.py --out "$OUT/explore42.json" 2>&1 | grep -v -i warn | tail -8
echo "== explore42 again, 1 and 6 rows (${SECONDS}s)"
timeout 100 python3 bench/explore/explore42.py --rows 1,6 --out "$OUT/explore42_repeat.json" 2>&1 | grep -v -i warn | tail -4
echo "done at ${SECONDS}s"
