#!/usr/bin/env bash
# Session 11, call 6 (issue 3): what flips the SmolLM2 step's 6-row out_proj between 2.2 and 7.9 us a layer:
# explore24.py in fresh processes with nothing before the 6-row capture, with the old 1-row breakdown graphs
# (as the step section ran them until session 11), with two eager 6-row steps; the Triton specializations of
# the residual GEMV and its launch args in each. Results: bench/results/session11/call6/.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
for warm in none breakdown eager6 breakdown none; do
  timeout 50 python3 bench/explore/explore24.py --warm $warm --out "$OUT/explore24_$warm.$RANDOM.json" 2>&1 | tail -2
done
