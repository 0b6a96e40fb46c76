#!/usr/bin/env bash
# Session-4 device call 8: the attention prologue with its whole weight slice loaded before the PDL wait (was one
# tile ahead in a loop): its GPU tests and the fused model's, the prologue bench (SmolLM2, Llama-3.2-1B, Qwen3-30B-A3B
# shapes, rows 1 and 6), the fused step of both dense models, and the Qwen3 layer (attention + MoE).
cd "$(dirname "$0")/../.."
source bench/device/common.sh
timeout 200 python3 -m pytest -q -n 8 -m "gpu and not real_model and not eval" -p no:cacheprovider --timeout 190 \
  tests/unit/test_attn_prologue.py tests/unit/test_fused_model.py tests/unit/test_moe.py 2>&1 \
  | tee "$OUT/gpu-tests-prologue.log" | tail -3
timeout 150 python3 bench/bench_attn_prologue.py --models SmolLM2-135M Llama-3.2-1B Qwen3-30B-A3B --rows 1 6 \
  --budget-s 60 --out "$OUT/attn_prologue_h200.json" > "$OUT/attn_prologue.log" 2>&1
python3 - "$OUT/attn_prologue_h200.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for e in d["results"]:
    print(e["model"], e["rows"], e["variant"], round(e["us_median"], 2), round(e["pct_of_floor"], 1))
PY
timeout 150 python3 -m lowlat.bench --sections copy,step --models SmolLM2-135M,Llama-3.2-1B --rows 1,6 --budget-s 130 \
  --out "$OUT/step_h200.json" > "$OUT/step.log" 2>&1
grep -E "decode_step +[16] " "$OUT/step.log" | head -8
timeout 150 python3 -m lowlat.bench --sections copy,moe --models Qwen3-30B-A3B --rows 1,6 --budget-s 130 \
  --out "$OUT/moe_layer_h200.json" > "$OUT/moe.log" 2>&1
grep -E "^Qwen3" "$OUT/moe.log" | head -12
