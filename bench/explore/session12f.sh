#!/usr/bin/env bash
# Session 12 call 6 (lost: the machine was taken back mid-call) and call 7 (the same script again): are the slow
# out_proj's attn loads L2 misses? explore25 --variant probe times two dependent .cg loads of attn row M-1 (the
# program's 16 columns) right after the wait (first / second: miss vs hit), in the slow configuration (widths 1,6:
# r6 slow) and in widths 1..16 (r6 fast, r12 / r16 slow).
cd "$(dirname "$0")/../.."
source bench/device/common.sh
i=0
for spec in "1,6" "1,2,4,6,8,12,16" "1,6"; do
  i=$((i + 1)); f="$OUT/e25p_$i"
  timeout 150 python3 bench/explore/explore25.py --variant probe --order "$spec" --reps 1 --out "$f.json" > "$f.log" 2>&1 \
    || { echo "order $spec failed"; tail -4 "$f.log"; continue; }
  sed -n '/^{/,$p' "$f.log" | tail -n +2                  # explore25's summary lines (after its JSON line)
done
