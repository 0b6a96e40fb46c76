#!/usr/bin/env bash
# Session-4 device call 4 (final): GPU tests of every kernel file touched this session (the experiments are
# reverted; the SmolLM2 LM-head plan is now pf 64) and of the exploration kernels (EPI 7 is GPU only);
# explore8.py (the greedy tail's cost split in the TMA copy; down-projection prefetch below pf 256); then the
# per-kernel and step sections for SmolLM2 with the committed plan table.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
timeout 200 python3 -m pytest -q -n 8 -m "gpu and not real_model and not eval" -p no:cacheprovider --timeout 190 \
  tests/unit/test_out_proj.py tests/unit/test_mlp_kernel.py tests/unit/test_lm_head.py tests/unit/test_fused_model.py \
  tests/unit/test_gemv_plans.py tests/unit/test_draft_sampling.py tests/unit/test_explore_kernels.py 2>&1 \
  | tee "$OUT/gpu-tests-final.log" | tail -3
(cd bench/explore && timeout 150 python3 explore8.py --out "$OUT/explore8_h200.json" --budget-s 125 2>&1 | tail -2)
python3 - "$OUT/explore8_h200.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for e in d["results"]:
    print(e.get("op"), e.get("rows"), e.get("rep"), e.get("variant"), e.get("us"), e.get("pct_of_copy", e.get("speedup")),
          e.get("same_tokens", ""))
for e in d.get("errors", []):
    print("ERROR", str(e)[:400])
PY
timeout 170 python3 -m lowlat.bench --sections copy,kernels,step --models SmolLM2-135M --rows 1,6 --budget-s 150 \
  --out "$OUT/smollm2_kernels_step_h200.json" 2>&1 | grep -E "^SmolLM2|lm_head|step" | head -30
