#!/usr/bin/env bash
# Session 11, call 1 (issue 3): GPU tests of the kernels the last commits changed without a GPU run (session 10's
# host checks, the L2 prefetch without its masked-address select) and of `_gemv.rstd_of` now correctly rounded
# (every norm-folding GEMV), plus the tensor-core shared-memory GEMV (explore22) and SmolLM2's step profile.
# Results: bench/results/session11/call1/.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
timeout 210 python3 -m pytest -q -n 8 -m "gpu and not real_model and not eval" -p no:cacheprovider --timeout 190 \
  tests/unit/test_out_proj.py tests/unit/test_lm_head.py tests/unit/test_mlp_kernel.py tests/unit/test_attn_prologue.py \
  tests/unit/test_gemv_plans.py tests/unit/test_fused_model.py tests/unit/test_draft_sampling.py \
  tests/unit/test_rms_norm_kernel.py tests/unit/test_explore_kernels.py > "$OUT/gpu-tests.log" 2>&1
echo "tests rc $?"; grep -E "passed|failed|FAILED|ERROR" "$OUT/gpu-tests.log" | tail -12
(cd bench/explore && timeout 230 python3 explore22.py --budget-s 150 --out "$OUT/explore22.json" > "$OUT/explore22.log" 2>&1)
echo "explore22 rc $?"
python3 - "$OUT/explore22.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print("copy TB/s", d.get("copy_bandwidth_TBps"))
for e in d["results"]:
    if e["op"] == "row_invariance":
        print("rowinv", e["shape"], e["ok"], e["differing"][:6], e["max_err_48"], e["nan"])
    else:
        print(f"{e.get('shape', e.get('n'))!s:10} {e['op']:9} r{e['rows']:<3} {e.get('kernel', e.get('variant'))!s:10} "
              f"m{e.get('mode')} bn{e.get('bn')} {e['us']:8.2f} us {e.get('pct_of_copy')}% ok {e.get('ok')}")
[print("error", x["where"], str(x.get("error", x))[:400]) for x in d.get("errors", [])]
PY
timeout 110 python3 -m lowlat.bench --sections step,profile --models SmolLM2-135M --rows 1,6 \
  --budget-s 80 --out "$OUT/step_profile.json" > "$OUT/step_profile.log" 2>&1; echo "bench rc $?"
python3 - "$OUT/step_profile.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for e in d["results"]:
    if e.get("section") == "profile":
        print(f"{e['model'][:14]:14} r{e['rows']} {e['op'][:18]:18} {e['us']:8.2f} us step {e['per_step_us']:8.2f} pct {e['pct_of_copy']}")
    else:
        print(e.get("model"), e.get("op"), e.get("rows"), e.get("variant"), e.get("us"))
[print("error", x["where"], str(x.get("error", x))[:300]) for x in d.get("errors", [])]
PY
