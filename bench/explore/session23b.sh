#!/usr/bin/env bash
# Session 23, call 3: explore32 (explore31's no-split-K, weights-held design with tensor cores: a batched tl.dot over K
# slices inside the program, mma.sync), Llama out_proj at 1 / 6 / 16 / 48 rows beside the production residual GEMV,
# each width's row 0 checked bit for bit against the 1-row launch; its GPU tests first.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider -rf tests/unit/test_explore_kernels.py -k held 2>&1 | tail -4
timeout 330 python3 bench/explore/explore32.py --budget-s 240 --rows 1 6 16 48 --reps 2 --out "$OUT/explore32.json" \
  > /tmp/e32.log 2>&1; echo "explore32 rc $?"
python3 - "$OUT/explore32.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for e in d.get("results", []):
    if e.get("op") == "residual":
        print("production", e["n"], e["k"], e["rows"], e["rep"], e["us"], e["pct_of_copy"])
bits = {}
for e in d.get("results", []):
    if e.get("op") == "held_mma_bits":
        bits.setdefault(e["row0_equal_to_1_row"], 0)
        bits[e["row0_equal_to_1_row"]] += 1
print("row 0 equal to the 1-row launch (count by answer):", bits)
for e in d.get("results", []):
    if e.get("op") == "held_mma":
        print(e["shape"], "r", e["rows"], "rep", e["rep"], "bn", e["bn"], "s", e["s"], "w", e["warps"], "mode",
              e["mode"], "early", e["early"], e["us"], "us", e["pct_of_copy"], "%", "ok" if e["ok"] else "WRONG")
for e in d.get("errors", []):
    print("ERROR", str(e)[:300])
PY
tail -3 /tmp/e32.log
echo "done at ${SECONDS}s"
