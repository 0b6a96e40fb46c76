#!/usr/bin/env bash
# Session 24, call 3: early_release="auto" (launches over 8 MB of weights release the next one at their start) is
# FusedModel's default now. (1) Every single-GPU test on that tree. (2) `lowlat bench` copy + kernels, Llama-3.2-1B
# and Qwen2.5-0.5B (the two models the rule changes) at 1 / 6 / 16 / 48 rows: the fused variants' time and share of
# copy bandwidth as the bench now runs them (out_proj / down released early where the rule says). (3) explore33 (a
# residual GEMV on tensor cores, weights held in registers across the wait, Gluon) at 1 / 6 / 16 / 48 rows beside the
# production residual GEMV, in the time left (its GPU tests ran in (1)).
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
gpu_tests 330
for m in Llama-3.2-1B Qwen2.5-0.5B; do
  echo "== lowlat bench kernels, $m (${SECONDS}s)"
  timeout 100 python3 -m lowlat.bench --sections copy,kernels --models $m --rows 1,6,16,48 --budget-s 80 \
    --out "$OUT/kernels_$m.json" > /tmp/k.log 2>&1; echo "bench rc $?"
  python3 - "$OUT/kernels_$m.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["results"]:
    if r.get("section") == "kernels" and r["variant"].startswith("fused"):
        print(r["op"], r["variant"], "rows", r["rows"], round(r["us"], 2), "us", round(100 * r["floor_us"] / r["us"], 1), "%")
for e in d.get("errors", []):
    print("ERROR", str(e)[:300])
PY
done
left=$(( 520 - SECONDS )); echo "== explore33, budget ${left}s (${SECONDS}s)"
if (( left > 40 )); then
  timeout $(( left + 30 )) python3 bench/explore/explore33.py --out "$OUT/explore33.json" --budget-s $(( left - 20 )) \
    --rows 1 6 16 48 > /tmp/e33.log 2>&1; echo "explore33 rc $?"; grep -v -i warn /tmp/e33.log | tail -3
  python3 - "$OUT/explore33.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["results"]:
    print({k: r.get(k) for k in ("op", "variant", "shape", "n", "k", "rows", "rep", "warps", "mode", "early", "us",
                                 "pct_of_copy", "ok") if k in r})
for e in d.get("errors", []):
    print("ERROR", str(e)[:300])
PY
fi
echo "done at ${SECONDS}s"
