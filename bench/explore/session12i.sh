#!/usr/bin/env bash
# Session 12 call 9: where do the slow out_proj's programs run? explore25 stamps %smid per program: distinct SMs and
# the most programs on one SM, slow (widths 1,6: r6) against fast (r1; barrier).
cd "$(dirname "$0")/../.."
source bench/device/common.sh
for feed in direct barrier; do
  f="$OUT/e25s_$feed"
  timeout 60 python3 bench/explore/explore25.py --attn-feed $feed --order 1,6 --reps 1 --out "$f.json" > "$f.log" 2>&1 \
    || { echo "$feed failed"; tail -4 "$f.log"; continue; }
  python3 - "$f.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["order"]:
    s = d[f"stamps_r{r}"]
    print(d["attn_feed"], f"r{r}", "out_proj", {k: s["out_proj"][k] for k in ("gemv", "distinct_sms", "max_per_sm")},
          "down", {k: s["down"][k] for k in ("gemv", "distinct_sms", "max_per_sm")})
PY
done
