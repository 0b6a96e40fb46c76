#!/usr/bin/env bash
# Session 29's third call: the route / plan kernel as one program a 16-row chunk (the last to arrive writes the
# plan) against session 28's one program (`.stage/moe_head.py`, carried: `git show 8741561:lowlat/kernels/moe.py`),
# in the step (`lowlat bench --sections moe,profile`, one Qwen3-30B-A3B layer at 16 / 24 / 48 rows), A B A; then the
# GPU tests of the MoE block and FusedModel.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
cp lowlat/kernels/moe.py /tmp/moe.py.tree
for form in programs head programs; do
  if [ $form = head ]; then cp .stage/moe_head.py lowlat/kernels/moe.py; else cp /tmp/moe.py.tree lowlat/kernels/moe.py; fi
  echo "== route/plan $form (${SECONDS}s)"
  timeout 150 python3 -m lowlat.bench --sections moe,profile --models "" --rows 16,24,48 --budget-s 140 \
    --out "$OUT/plan_$form.json" > /tmp/plan.log 2>&1; echo "bench rc $?"
  python3 - "$OUT/plan_$form.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for e in d["results"]:
    if e.get("section") == "profile" and e["op"] in ("moe_router", "moe_route_plan", "moe_gate_up", "moe_down"):
        print(f"  r{e['rows']} {e['op'][:44]:44} {e['us']:7.2f} us x{e['launches']:3d}")
    elif e.get("section") != "profile":
        print(f"  r{e.get('rows')} {e.get('op')} {e.get('variant')} {e.get('us')}")
[print("error", x["where"], str(x.get("error", x))[:300]) for x in d.get("errors", [])]
PY
done
cp /tmp/moe.py.tree lowlat/kernels/moe.py
echo "== GPU tests: MoE block, FusedModel (${SECONDS}s)"
timeout 300 python3 -m pytest -q -n 8 -m "gpu and not real_model and not eval" -p no:cacheprovider --timeout 200 -rf \
  tests/unit/test_moe.py tests/unit/test_fused_model.py > "$OUT/gpu-tests.log" 2>&1; echo "pytest rc $?"
grep -E "FAILED|ERROR|[0-9]+ passed|[0-9]+ failed" "$OUT/gpu-tests.log" | cut -c1-300 | tail -12
echo "done at ${SECONDS}s"
