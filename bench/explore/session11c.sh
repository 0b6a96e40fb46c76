#!/usr/bin/env bash
# Session 11, call 3 (issue 3): GPU tests of the norm kernels after rstd_of's EXACT flag (the GEMVs back on the
# approximate mean, rms_norm exact), then each bench twice, event-timed as the benches do (a sync before every
# timed call: "synced") and with the calls queued back to back ("b2b", explore23.py), to see how much of each
# per-kernel time is the host's graph launch. Results: bench/results/session11/call3/.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
timeout 150 python3 -m pytest -q -n 8 -m "gpu and not real_model and not eval" -p no:cacheprovider --timeout 140 \
  tests/unit/test_rms_norm_kernel.py tests/unit/test_mlp_kernel.py tests/unit/test_attn_prologue.py \
  tests/unit/test_lm_head.py tests/unit/test_gemv_plans.py > "$OUT/gpu-tests.log" 2>&1
echo "tests rc $?"; grep -E "passed|failed|FAILED|ERROR" "$OUT/gpu-tests.log" | tail -6
E=bench/explore/explore23.py
for mode in synced b2b; do
  timeout 100 python3 $E $mode lowlat.bench --sections kernels --models Llama-3.2-1B --rows 1,6 --budget-s 70 \
    --out "$OUT/kernels_$mode.json" > "$OUT/kernels_$mode.log" 2>&1; echo "kernels $mode rc $?"
  timeout 60 python3 $E $mode bench_attn_prologue --models Llama-3.2-1B Qwen3-30B-A3B --rows 1 6 --budget-s 5 \
    --out "$OUT/prologue_$mode.json" > "$OUT/prologue_$mode.log" 2>&1; echo "prologue $mode rc $?"
  timeout 45 python3 $E $mode lowlat.bench --sections step --models SmolLM2-135M --rows 1,6 --budget-s 35 \
    --out "$OUT/step_$mode.json" > "$OUT/step_$mode.log" 2>&1; echo "step $mode rc $?"
done
python3 - "$OUT" <<'PY'
import json, sys, os
root = sys.argv[1]
def load(name):
    try:
        return json.load(open(os.path.join(root, name)))
    except Exception as e:
        print("no", name, e); return None
for kind in ("kernels", "prologue", "step"):
    rows = {}
    for mode in ("synced", "b2b"):
        d = load(f"{kind}_{mode}.json")
        if not d:
            continue
        for e in d.get("results", []):
            us = e.get("us", e.get("us_median"))
            if us is None or not str(e.get("variant", "")).startswith(("fused", "production")):
                continue
            key = (e.get("model"), e.get("op"), e.get("rows", e.get("m")), e.get("variant"))
            rows.setdefault(key, {})[mode] = (us, e.get("floor_us"))
        [print("error", kind, mode, x.get("where"), str(x.get("error", x))[:200]) for x in d.get("errors", [])]
    for key, v in rows.items():
        s, b = v.get("synced", (None, None)), v.get("b2b", (None, None))
        fl = s[1] or b[1]
        pct = lambda t: f"{100 * fl / t:5.1f}%" if fl and t else "  -  "
        print(f"{kind:8} {str(key[0])[:14]:14} {str(key[1])[:16]:16} r{key[2]!s:3} {str(key[3])[:14]:14} "
              f"synced {s[0] or float('nan'):8.2f} {pct(s[0])}  b2b {b[0] or float('nan'):8.2f} {pct(b[0])}")
PY
