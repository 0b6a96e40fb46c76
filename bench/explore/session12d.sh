#!/usr/bin/env bash
# Session 12 call 4: the slow state's out_proj GEMV phase is 5.5 us against 1.8 (call 3: not gate/up's early
# launch: moving out_proj's trigger after its GEMV left it slow). Is it the weights not being in L2 (the
# prefetch lost)? SmolLM2 out_proj in both states with: its plan minus the L2 prefetch (pf_k 0), and plans that
# PRELOAD the weights into registers before the wait (real loads, not prefetch hints). Then Llama-3.2-1B's step
# in both states (does it have a slow state too?).
cd "$(dirname "$0")/../.."
source bench/device/common.sh
i=0
one() {  # model warm plan-json
  i=$((i + 1)); local f="$OUT/e25_${i}"
  timeout 120 python3 bench/explore/explore25.py --model "$1" --warm "$2" --plan-o "$3" --reps 1 --out "$f.json" > "$f.log" 2>&1 \
    || { echo "e25 $* failed"; tail -4 "$f.log"; return; }
  python3 - "$f.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
r = d["reps"][0]
print(d["model"][:6], d["warm"], d["plan_o"].replace("GemvPlan", "")[:150])
print("   step r1", d["step_us_r1"], "r6", d["step_us_r6"], "| r1 out_proj", d["roles_r1"]["out_proj"],
      "r6 out_proj", d["roles_r6"]["out_proj"], "r6 gate_up", d["roles_r6"].get("gate_up"),
      "| r6 stamps", {k: r["out_proj"][k] for k in ("resident_to_wait", "gemv", "finish_max")})
PY
}
S=SmolLM2-135M
for w in none capture1; do
  one $S $w '{}'
  one $S $w '{"pf_k": 0}'
  one $S $w '{"split": 3, "chunks_per_split": 3, "bn": 64, "preload": true, "stages": 1, "pf_k": 0}'
  one $S $w '{"split": 9, "chunks_per_split": 1, "bn": 64, "preload": true, "stages": 1, "pf_k": 0}'
  one $S $w '{"split": 3, "chunks_per_split": 3, "bn": 32, "preload": true, "stages": 1, "pf_k": 0}'
  one $S $w '{"split": 1, "chunks_per_split": 9, "bn": 16, "preload": true, "stages": 1, "pf_k": 0}'
done
for w in none capture1; do one Llama-3.2-1B $w '{}'; done
