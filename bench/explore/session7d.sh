#!/usr/bin/env bash
# Session 7, call 4: explore18, smem_gemv version 3 only, boxes of 16 / 8 chunks, 1 row, three rounds; the
# production attention prologue and residual GEMV in the same run. Results: bench/results/session7/call4/.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
cd bench/explore && timeout 300 python3 explore18.py --out "$OUT/explore18.json" --budget-s 200 --reps 3 \
  --groups 16 8 --rows 1 --skip floor > "$OUT/explore18.log" 2>&1; echo "explore18 rc $?"
python3 - "$OUT/explore18.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for e in d["results"]:
    print(e.get("shape", e["op"]), e["rows"], e["rep"], "bn", e.get("bn"), "g", e.get("group"), e["us"], e["pct_of_copy"],
          e.get("ok"))
for e in d.get("errors", []):
    print("ERROR", str(e)[:300])
PY
cd ../.. && timeout 150 python3 bench/bench_attn_prologue.py --models Llama-3.2-1B Qwen3-30B-A3B --rows 1 \
  --budget-s 60 --out "$OUT/prologue.json" > "$OUT/prologue.log" 2>&1; echo "prologue rc $?"; tail -4 "$OUT/prologue.log"
