#!/usr/bin/env bash
# Session 39, call 4 (one GPU, no carry): explore57 (Qwen3's cluster prologue paced) and explore56's production form
# on folded weights with g = 1 (what 9-48 rows would run beside the paced 1-8-row form on folded weights).
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
END=${END:-300}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv,noheader
echo "== explore57 (${SECONDS}s)"
timeout "$(cap 150)" python3 bench/explore/explore57.py --rows 1,6 --rounds 2 --out "$OUT/explore57.json" 2>&1 \
  | grep -v -i warn | cut -c1-1500
echo "== explore56 (${SECONDS}s)"
timeout "$(cap 100)" python3 bench/explore/explore56.py --rows 1,16,48 --rounds 2 --out "$OUT/explore56.json" \
  --variants prod,prod_f1,prod_f,c8w2_early_x2 2>&1 | grep -v -i warn | cut -c1-1200
echo "done at ${SECONDS}s"
