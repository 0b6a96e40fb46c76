#!/usr/bin/env bash
# Session 11, call 4 (issue 3): the final code: GPU tests of what changed (FusedModel without the breakdown
# parts, back-to-back timing, rms_norm through rstd_of(EXACT)), then the issue's step comparison (fused vs the
# reference under CUDA graphs and under torch.compile + CUDA graphs, with the in-step profile) and the
# per-kernel numbers, all timed back to back (benchmarking's new default). Results: bench/results/session11/call4/.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
timeout 150 python3 -m pytest -q -n 8 -m "gpu and not real_model and not eval" -p no:cacheprovider --timeout 140 \
  tests/unit/test_fused_model.py tests/unit/test_benchmarking.py tests/unit/test_rms_norm_kernel.py \
  tests/unit/test_bench_torch_step.py > "$OUT/gpu-tests.log" 2>&1
echo "tests rc $?"; grep -E "passed|failed|FAILED|ERROR" "$OUT/gpu-tests.log" | tail -6
timeout 330 python3 -m lowlat.bench --sections step,compiled,profile,kernels --models SmolLM2-135M,Llama-3.2-1B \
  --rows 1,6 --budget-s 300 --out "$OUT/bench.json" > "$OUT/bench.log" 2>&1; echo "bench rc $?"
python3 - "$OUT/bench.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print("copy GB/s", d.get("copy_bandwidth_GBps"), d.get("method"))
for e in d["results"]:
    if e.get("section") == "profile":
        print(f"profile {e['model'][:14]:14} r{e['rows']} {e['op'][:18]:18} {e['us']:8.2f} us step {e['per_step_us']:8.2f} pct {e['pct_of_copy']}")
    else:
        fl = e.get("floor_us")
        print(e.get("section"), e.get("model"), e.get("op"), e.get("rows"), e.get("variant"), e.get("us"),
              f"{100 * fl / e['us']:.1f}%" if fl and e.get("us") else "")
[print("error", x["where"], str(x.get("error", x))[:300]) for x in d.get("errors", [])]
[print("skip", x) for x in d.get("skipped", [])[:10]]
PY
