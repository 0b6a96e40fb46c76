#!/usr/bin/env bash
# Session 13 call 2: the decode attention's PDL trigger after its KV loop (lowlat's default since this session).
#  1. GPU tests of the changed kernel and of the fused model that launches it;
#  2. production step times, after_kv against start (explore26.py; fresh process each, alternated): SmolLM2 widths
#     1,6 twice, a server's widths 1..48, Llama-3.2-1B widths 1,6;
#  3. SM placement (instrumented) with after_kv at widths 1..48, and with gate/up's trigger late too (at 24-48 rows
#     the down projection's 54 programs landed on 12 SMs in call 1).
cd "$(dirname "$0")/../.."
source bench/device/common.sh
timeout 240 python3 -m pytest -q -n 8 -m "gpu and not real_model and not eval" -p no:cacheprovider --timeout 190 \
  tests/unit/test_decode_attention.py tests/unit/test_fused_model.py 2>&1 | tail -6
echo "tests done at ${SECONDS}s"
e26() {  # trigger model order [explore26 options]; explore26 prints the summary
  (( SECONDS > 470 )) && { echo "skip e26 $*: ${SECONDS}s used"; return; }
  if timeout 90 python3 bench/explore/explore26.py --attn-trigger "$1" --model "$2" --order "$3" "${@:4}" \
      --out "$OUT/e26.json" > "$OUT/e26.log" 2>&1; then cat "$OUT/e26.log"
  else echo "e26 $* failed"; tail -4 "$OUT/e26.log"; fi
}
S=SmolLM2-135M
for rep in 1 2; do
  e26 start $S 1,6
  e26 after_kv $S 1,6
done
e26 start $S 1,2,4,6,8,12,16,24,32,48
e26 after_kv $S 1,2,4,6,8,12,16,24,32,48
e26 start Llama-3.2-1B 1,6
e26 after_kv Llama-3.2-1B 1,6
pl() {
  (( SECONDS > 540 )) && { echo "skip placement $*: ${SECONDS}s used"; return; }
  timeout 60 python3 bench/explore/sm_placement.py step --model $S "$@" --out "$OUT/pl.json" > "$OUT/pl.log" 2>&1 \
    || { echo "placement $* failed"; tail -4 "$OUT/pl.log"; return; }
  python3 - "$OUT/pl.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print(d["model"], "order", d["order"], "attn", d["attn_trigger"], "gate_up", d["gate_up_trigger"],
      "logits", [round(x, 3) for x in d["logits_check"][:2]])
for w, v in d["widths"].items():
    print(f"  r{w:<3} step {v['step_us']:7.1f} us |", "  ".join(
        f"{r}: {int(x['programs'])}p/{int(x['sms'])}sm/max{int(x['max_per_sm'])}" for r, x in v["roles"].items()
        if r in ("out_proj", "gate_up", "down")))
PY
}
pl --order 1,2,4,6,8,12,16,24,32,48
pl --order 1,2,4,6,8,12,16,24,32,48 --gate-up-trigger late
pl --order 1,6 --gate-up-trigger late
echo "done at ${SECONDS}s"
