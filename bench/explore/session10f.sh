#!/usr/bin/env bash
# Session 10, call 6 (issue 3): where the fused step's time goes launch by launch, IN the step (CUPTI end times
# inside the CUDA-graph replay: `lowlat bench --sections profile`), for SmolLM2-135M and Llama-3.2-1B at 1 and 6
# rows and the Qwen3-30B-A3B layer; then GPU tests of the trace helpers. Results: bench/results/session10/call6/.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
timeout 330 python3 -m lowlat.bench --sections profile,moe --models SmolLM2-135M,Llama-3.2-1B --rows 1,6 \
  --budget-s 300 --out "$OUT/step_profile.json" > "$OUT/step_profile.log" 2>&1; echo "bench rc $?"
python3 - "$OUT/step_profile.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print("copy GB/s", d.get("copy_bandwidth_GBps"))
for e in d["results"]:
    if e.get("section") == "profile":
        print(f"{e['model'][:22]:22} r{e['rows']} {e['op'][:40]:40} {e['us']:8.2f} us x{e['launches']:4d} "
              f"step {e['per_step_us']:8.2f} bytes {e['bytes']} pct {e['pct_of_copy']}")
    else:
        print(e.get("model"), e.get("op"), e.get("rows"), e.get("variant"), e.get("us"))
[print("error", x["where"], str(x.get("error", x))[:400]) for x in d.get("errors", [])]
PY
timeout 120 python3 -m pytest -q -n 4 -m "gpu and not real_model and not eval" -p no:cacheprovider --timeout 100 \
  tests/unit/test_benchmarking.py > "$OUT/gpu-tests.log" 2>&1; echo "tests rc $?"; tail -2 "$OUT/gpu-tests.log"
