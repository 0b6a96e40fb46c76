#!/usr/bin/env bash
# Prepared in session 11 for the next device session (not run yet; ~4-5 min): the tensor-core shared-memory GEMV's
# version 2 (bench/explore/mma_smem_gemv.py::_mma_smem_gemv_v2_kernel: norm weight before the wait, all
# residuals at once, x double-buffered by cp.async, two accumulators): its GPU tests (both versions), then
# explore22 (versions 1 and 2, session 7's FMA kernel, production; 1 / 6 / 16 / 48 rows).
cd "$(dirname "$0")/../.."
source bench/device/common.sh
timeout 200 python3 -m pytest -q -n 8 -m gpu -p no:cacheprovider --timeout 180 tests/unit/test_explore_kernels.py \
  -k mma > "$OUT/gpu-tests.log" 2>&1
echo "tests rc $?"; grep -E "passed|failed|FAILED|ERROR" "$OUT/gpu-tests.log" | tail -8
(cd bench/explore && timeout 260 python3 explore22.py --budget-s 200 --out "$OUT/explore22.json" > "$OUT/explore22.log" 2>&1)
echo "explore22 rc $?"
python3 - "$OUT/explore22.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print("copy TB/s", d.get("copy_bandwidth_TBps"))
for e in d["results"]:
    if e["op"] == "row_invariance":
        print("rowinv", e["shape"], "v", e.get("version"), e["ok"], e["differing"][:6], e["max_err_48"], e["nan"])
    else:
        print(f"{e.get('shape', e.get('n'))!s:10} {e['op']:9} r{e['rows']:<3} {e.get('kernel', e.get('variant'))!s:10} "
              f"m{e.get('mode')} bn{e.get('bn')} {e['us']:8.2f} us {e.get('pct_of_copy')}% ok {e.get('ok')}")
[print("error", x["where"], str(x.get("error", x))[:400]) for x in d.get("errors", [])]
PY
