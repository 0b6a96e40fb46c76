#!/usr/bin/env bash
# Session 29's second call: explore46 (Qwen3-30B-A3B's one-wave held prologue with QK-norm: the cluster launch, the
# exchange's barrier, its stores / loads and the norm's arithmetic, each removed in turn; per kernel, 1 / 6 rows),
# then the route / plan kernel's in-step cost (`lowlat bench --sections moe,profile`, one Qwen3-30B-A3B layer at 24 /
# 48 rows: row tiles 32 / 64) in three forms: the 16-row chunk loop (the tree), the whole tile at once (session 28's
# kernel, spilling 24 / 296 bytes), the chunks unrolled (static_range).
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
echo "== explore46 (${SECONDS}s)"
timeout 150 python3 bench/explore/explore46.py --rows "${ROWS46:-1,6}" --out "$OUT/explore46.json" 2>&1 \
  | grep -v -i warn | tail -6
cp lowlat/kernels/moe.py /tmp/moe.py.orig
plan_form() {   # plan_form TAG: lowlat/kernels/moe.py's route / plan kernel as TAG says (chunks / whole / unrolled)
  cp /tmp/moe.py.orig lowlat/kernels/moe.py
  python3 - "$1" <<'PY'
import sys
p = "lowlat/kernels/moe.py"
s = open(p).read()
a = s.index("def _route_plan_kernel("); b = s.index("@triton.jit", a)
body = s[a:b]
loop = "    for c in range(BM // PLAN_CHUNK):"
assert body.count(loop) == 1
if sys.argv[1] == "whole":
    body = body.replace("PLAN_CHUNK", "BM")
elif sys.argv[1] == "unrolled":
    body = body.replace(loop, "    for c in tl.static_range(BM // PLAN_CHUNK):")
open(p, "w").write(s[:a] + body + s[b:])
PY
}
for form in chunks whole unrolled chunks; do
  (( SECONDS > 420 )) && { echo "skip $form: ${SECONDS}s"; continue; }
  plan_form $form
  echo "== route/plan $form (${SECONDS}s)"
  timeout 150 python3 -m lowlat.bench --sections moe,profile --models "" --rows 24,48 --budget-s 140 \
    --out "$OUT/plan_$form.json" > /tmp/plan.log 2>&1; echo "bench rc $?"
  python3 - "$OUT/plan_$form.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for e in d["results"]:
    if e.get("section") == "profile" and "Qwen3" in str(e.get("model")) and e["op"] != "attn_prologue":
        print(f"  r{e['rows']} {e['op'][:44]:44} {e['us']:7.2f} us x{e['launches']:3d}")
    elif "Qwen3" in str(e.get("model")) and e.get("section") != "profile":
        print(f"  r{e.get('rows')} {e.get('op')} {e.get('variant')} {e.get('us')}")
[print("error", x["where"], str(x.get("error", x))[:300]) for x in d.get("errors", [])]
PY
done
cp /tmp/moe.py.orig lowlat/kernels/moe.py
echo "done at ${SECONDS}s"
