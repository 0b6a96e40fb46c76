#!/usr/bin/env bash
# Session 12 call 5: is the slow out_proj a property of 6 rows, or of the graph captured right after another step
# graph? explore25 with other capture orders (fresh process each): 6 then 1; 1,2,4,6,8,12,16,24,32,48 (a server's
# widths, captured in order); 6 alone; 2 then 6.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
i=0
for spec in "6,1" "6" "2,6" "1,2,4,6,8,12,16,24,32,48" "48,32,24,16,12,8,6,4,2,1" "1,6"; do
  i=$((i + 1)); f="$OUT/e25o_$i"
  timeout 150 python3 bench/explore/explore25.py --order "$spec" --reps 1 --out "$f.json" > "$f.log" 2>&1 \
    || { echo "order $spec failed"; tail -4 "$f.log"; continue; }
  sed -n '/^{/,$p' "$f.log" | tail -n +2                  # explore25's summary lines (after its JSON line)
done
