#!/usr/bin/env bash
# Session 12 call 7: is the slow out_proj (GEMV phase 5-6 us instead of 1.5-1.8) instruction fetch? explore25
# --variant warm runs out_proj's residual + GEMV code twice in one rolled loop (iteration 0 before the wait, no
# activation loads), so the post-wait pass runs warm code. Slow configuration (widths 1,6) and widths 1..16.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
i=0
for spec in "warm 1,6" "stamps 1,6" "warm 1,2,4,6,8,12,16" "warm 1,6"; do
  set -- $spec; i=$((i + 1)); f="$OUT/e25w_$i"
  timeout 150 python3 bench/explore/explore25.py --variant $1 --order "$2" --reps 1 --out "$f.json" > "$f.log" 2>&1 \
    || { echo "$spec failed"; tail -4 "$f.log"; continue; }
  python3 - "$f.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print(d["variant"], "order", d["order"], "logits", d["logits_check"][:2], d["logits_check"][2][:3])
for r in d["order"]:
    s = d[f"stamps_r{r}"]["out_proj"]
    print(f"   r{r:<3} step {d[f'step_us_r{r}']:7.1f}  out_proj cost {d[f'roles_r{r}']['out_proj'][0]:5.2f}  gemv phase "
          f"{s['gemv']:6.0f} ns  finish {s['finish_max']:6.0f}  resident_to_wait {s['resident_to_wait']:6.0f}")
PY
done
