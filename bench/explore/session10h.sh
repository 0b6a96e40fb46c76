#!/usr/bin/env bash
# Session 10, call 8 (issue 3): the L2 prefetch predicated off outside the weight (`_gemv.prefetch_l2`): GPU tests
# of every kernel that prefetches; SmolLM2 / Llama steps profiled in the step (`lowlat bench --sections profile`)
# and explore21's default variant. Results: bench/results/session10/call8/.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
timeout 200 python3 -m pytest -q -n 8 -m "gpu and not real_model and not eval" -p no:cacheprovider --timeout 180 \
  tests/unit/test_out_proj.py tests/unit/test_lm_head.py tests/unit/test_mlp_kernel.py tests/unit/test_attn_prologue.py \
  tests/unit/test_gemv_plans.py tests/unit/test_fused_model.py > "$OUT/gpu-tests.log" 2>&1
echo "tests rc $?"; grep -E "passed|failed|FAILED|ERROR" "$OUT/gpu-tests.log" | tail -8
timeout 150 python3 -m lowlat.bench --sections step,profile --models SmolLM2-135M,Llama-3.2-1B --rows 1,6 \
  --budget-s 130 --out "$OUT/step_profile.json" > "$OUT/step_profile.log" 2>&1; echo "bench rc $?"
python3 - "$OUT/step_profile.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print("copy GB/s", d.get("copy_bandwidth_GBps"))
for e in d["results"]:
    if e.get("section") == "profile":
        print(f"{e['model'][:14]:14} r{e['rows']} {e['op'][:18]:18} {e['us']:8.2f} us step {e['per_step_us']:8.2f} pct {e['pct_of_copy']}")
    else:
        print(e.get("model"), e.get("op"), e.get("rows"), e.get("variant"), e.get("us"))
[print("error", x["where"], str(x.get("error", x))[:300]) for x in d.get("errors", [])]
PY
