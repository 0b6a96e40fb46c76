#!/usr/bin/env bash
# Session-4 device call 1: the GPU tests of the kernels changed since the last GPU run (greedy draft's relaxed
# slot exchange, the shared argmax-key helpers, the GEMV plans' evict-last prefetch), the draft-sampling bench
# with the committed defaults, then explore6.py (evict-last L2 prefetch variants of the down projection, the
# SmolLM2 LM head and the greedy draft launch, each beside its plain twin).
cd "$(dirname "$0")/../.."
source bench/device/common.sh
timeout 220 python3 -m pytest -q -n 8 -m "gpu and not real_model and not eval" -p no:cacheprovider --timeout 200 \
  tests/unit/test_out_proj.py tests/unit/test_mlp_kernel.py tests/unit/test_lm_head.py tests/unit/test_fused_model.py \
  tests/unit/test_gemv_plans.py tests/unit/test_draft_sampling.py 2>&1 | tee "$OUT/gpu-tests.log" | tail -4
timeout 100 python3 bench/bench_draft_sampling.py --out "$OUT/draft_sampling_h200.json" --rows 1 2 4 6 8 2>&1 \
  | python3 -c "import sys, json
for l in sys.stdin:
    if l.startswith('{'):
        d = json.loads(l); print(d['config'], d['rows'], d['fused_us'], d.get('fused_pdl_us'), d['torch_us'], d['speedup'])"
cd bench/explore && timeout 240 python3 explore6.py --out "$OUT/explore6_h200.json" --budget-s 220 2>&1 | tail -3
python3 - "$OUT/explore6_h200.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for e in d["results"]:
    print(e.get("op"), e.get("rows"), e.get("rep"), e.get("variant"), e.get("us"), e.get("pct_of_copy", e.get("speedup")),
          e.get("same_tokens", ""))
for e in d.get("errors", []):
    print("ERROR", str(e)[:300])
PY
