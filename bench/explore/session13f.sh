#!/usr/bin/env bash
# Session 13 call 6: SmolLM2's down projection packs at 24-48 rows (call 2: 36 SMs, 17 at 48 rows; its plan, preload
# bn 64 split 6, holds 5 programs an SM by 40 KB of shared memory). Production steps (explore26.py, after_kv) at a
# server's widths with down plans that hold fewer programs an SM: preload bn 128 (30 programs, 90 KB: 2 an SM),
# stream stages 4 (54 programs), stream bn 128 stages 4 (30). The logits checksum shows whether bn moved the
# arithmetic (split is unchanged).
cd "$(dirname "$0")/../.."
source bench/device/common.sh
e26() {  # trigger model order
  (( SECONDS > 240 )) && { echo "skip e26 $*: ${SECONDS}s used"; return; }
  timeout 120 python3 bench/explore/explore26.py --attn-trigger "$1" --model "$2" --order "$3" "${@:4}" > "$OUT/e26.log" 2>&1 \
    || { echo "e26 $* failed"; tail -4 "$OUT/e26.log"; return; }
  tail -1 "$OUT/e26.log" > "$OUT/e26.json"
  python3 - "$OUT/e26.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print(d["model"], d["attn_trigger"], d["plan_down"].replace("GemvPlan", ""), "logits", [round(x, 3) for x in d["logits_check"][:2]])
for w, v in d["widths"].items():
    r = v["roles"]
    rest = " ".join(f"{k} {x:.2f}" for k, x in r.items() if k not in ("out_proj", "out_proj_sum") and not k.startswith("other"))
    print(f"  r{w:<3} step {v['step_us']:7.1f} us | down {r['down']:.2f} gate_up {r['gate_up']:.2f} out_proj {r['out_proj']:.2f}")
PY
}
W=1,2,4,6,8,12,16,24,32,48
S=SmolLM2-135M
e26 after_kv $S $W
e26 after_kv $S $W --plan-d '{"bn": 128}'
e26 after_kv $S $W --plan-d '{"preload": false, "stages": 4, "pf_k": 256}'
e26 after_kv $S $W --plan-d '{"preload": false, "bn": 128, "stages": 4, "pf_k": 256}'
echo "done at ${SECONDS}s"
