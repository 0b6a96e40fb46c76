#!/usr/bin/env bash
# Session 12 call 8: does the slow out_proj need attention's freshly written lines, or only the PDL early start?
# explore25 --attn-feed copy (a torch copy of attn between attention and out_proj: other lines, PDL broken there),
# barrier (a torch kernel in between, attention's own lines read, PDL broken there), direct; widths 1,6 (slow).
cd "$(dirname "$0")/../.."
source bench/device/common.sh
i=0
for feed in copy barrier direct; do
  i=$((i + 1)); f="$OUT/e25f_$i"
  timeout 150 python3 bench/explore/explore25.py --attn-feed $feed --order 1,6 --reps 1 --out "$f.json" > "$f.log" 2>&1 \
    || { echo "$feed failed"; tail -4 "$f.log"; continue; }
  python3 - "$f.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print(d["attn_feed"], "order", d["order"], "logits", d["logits_check"][:2])
for r in d["order"]:
    s = d[f"stamps_r{r}"]["out_proj"]
    print(f"   r{r:<3} step {d[f'step_us_r{r}']:7.1f}  out_proj [cost, start-prev_end, dur] {d[f'roles_r{r}']['out_proj']}  gemv phase "
          f"{s['gemv']:6.0f} ns  finish {s['finish_max']:6.0f}  resident_to_wait {s['resident_to_wait']:6.0f}")
PY
done
