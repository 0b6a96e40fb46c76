#!/usr/bin/env bash
# Prepared in session 11 for the next device session (not run yet; ~4-5 min): which earlier graph puts the
# SmolLM2 step's 6-row out_proj into its fast state (2.2 us a layer instead of 7.9), and whether its PDL launch
# or its L2 prefetch is what the slow state costs. Every line a fresh process (bench/explore/explore24.py):
#   warm none / layers1 / attn1 / ffn1 / capture1 / breakdown with the default out_proj;
#   warm none with out_proj launched without PDL, and with its plan minus the L2 prefetch;
#   warm none / breakdown with the 6-row step graph written as DOT (are its PDL edges the same in both states?).
# Results: $OUT/explore24_<i>_<warm>_<out_proj>.json; one summary line each.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
i=0
run() {  # warm out_proj [extra args]
  i=$((i + 1)); local f="$OUT/explore24_${i}_$1_$2"
  timeout 60 python3 bench/explore/explore24.py --warm "$1" --out-proj "$2" --out "$f.json" "${@:3}" > "$f.log" 2>&1 \
    || { echo "$1 $2 failed"; tail -3 "$f.log"; }
}
for spec in "none default" "layers1 default" "attn1 default" "ffn1 default" "capture1 default" "breakdown default" \
            "none nopdl" "none pf0" "breakdown nopdl" "none default"; do
  run $spec
done
# (session 12 call1 also ran `none` and `breakdown` with explore24 --dot; it wrote no file and was removed after)
python3 - "$OUT" <<'PY'
import glob, json, sys
for f in sorted(glob.glob(f"{sys.argv[1]}/explore24_*.json"), key=lambda p: int(p.split("_")[-3])):
    d = json.load(open(f))
    print(f"{d['warm']:10} {d['out_proj']:8} out_proj {d['out_proj_median']:5.2f} us  step r1 {d['step_us_r1']:7.1f} "
          f"r6 {d['step_us_r6']:7.1f}  tokens {d['logits_check'][3]}")
    L = d["layers"]
    med = lambda k: sorted(l[k] for l in L)[len(L) // 2]
    print(f"   out_proj start-prev_end {med('start_minus_prev_end')} dur {med('dur')}  roles {d['role_cost_sum_us']}")
PY
