#!/usr/bin/env bash
# Session 12 call 3: (1) explore25 in both states (warm none = slow, capture1 = fast) with the stamped out_proj and
# with its gdc_launch_dependents moved after the GEMV ("late"), twice each, fresh processes; per-role CUPTI
# summaries say which launches are resident early in each state. (2) the GEMV tuner on Qwen3's out_proj with its
# norm epilogue (the untried tuning of NOTES "Left").
cd "$(dirname "$0")/../.."
source bench/device/common.sh
i=0
for spec in "none stamps" "capture1 stamps" "none late" "capture1 late" "none late" "capture1 late" "none stamps"; do
  set -- $spec; i=$((i + 1))
  f="$OUT/e25_${i}_$1_$2"
  timeout 90 python3 bench/explore/explore25.py --warm $1 --variant $2 --reps 2 --out "$f.json" > "$f.log" 2>&1 \
    || { echo "e25 $spec failed"; tail -5 "$f.log"; continue; }
  python3 - "$f.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print(d["warm"], d["variant"], "step r1", d["step_us_r1"], "r6", d["step_us_r6"])
for r in (1, 6):
    print(f"  roles r{r} [cost, start-prev_end, dur]:", {k: v for k, v in d[f"roles_r{r}"].items() if not k.startswith("other")})
for r in d["reps"]:
    print("  out_proj", {k: r["out_proj"][k] for k in ("resident_to_wait", "gemv", "finish_max", "prev_end_to_wait")},
          "down", {k: r["down"][k] for k in ("resident_to_wait", "gemv", "finish_max", "prev_end_to_wait")})
PY
done
timeout 280 python3 -m lowlat.bench --sections tune --models Qwen3-30B-A3B --tune-shapes out_proj:2048x4096 \
  --plans-out "$OUT/plans_qwen3_out_proj.json" --out "$OUT/tune_qwen3_out_proj.json" > "$OUT/tune.log" 2>&1
echo "tune rc $?"; tail -25 "$OUT/tune.log"
