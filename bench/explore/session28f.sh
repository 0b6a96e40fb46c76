#!/usr/bin/env bash
# Session 28's sixth call (about 60 s): explore43 (the held prologue at 8 warps a program, 8 / 16 K slices, g in
# registers or folded at build; Llama-3.2-1B per kernel, A B C D D C B A), twice at 1 and 6 rows.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
echo "== explore43 (${SECONDS}s)"
timeout 200 python3 bench/explore/explore43.py --out "$OUT/explore43.json" 2>&1 | grep -v -i warn | tail -8
echo "== explore43 again, 1 and 6 rows (${SECONDS}s)"
timeout 100 python3 bench/explore/explore43.py --rows 1,6 --out "$OUT/explore43_repeat.json" 2>&1 | grep -v -i warn | tail -4
echo "done at ${SECONDS}s"
