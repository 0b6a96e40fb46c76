#!/usr/bin/env bash
# Session 13 call 6: SmolLM2's down projection packs at 24-48 rows (call 2: 36 SMs, 17 at 48 rows; its plan, preload
# bn 64 split 6, holds 5 programs an SM by 40 KB of shared memory). Production steps (explore26.py, after_kv) at a
# server's widths with down plans that hold fewer programs an SM: preload bn 128 (30 programs, 90 KB: 2 an SM),
# stream stages 4 (54 programs), stream bn 128 stages 4 (30). The logits checksum shows whether bn moved the
# arithmetic (split is unchanged).
cd "$(dirname "$0")/../.."
source bench/device/common.sh
e26() {  # trigger model order [explore26 options]; explore26 prints the summary
  (( SECONDS > 240 )) && { echo "skip e26 $*: ${SECONDS}s used"; return; }
  if timeout 120 python3 bench/explore/explore26.py --attn-trigger "$1" --model "$2" --order "$3" "${@:4}" \
      --out "$OUT/e26.json" > "$OUT/e26.log" 2>&1; then cat "$OUT/e26.log"
  else echo "e26 $* failed"; tail -4 "$OUT/e26.log"; fi
}
W=1,2,4,6,8,12,16,24,32,48
S=SmolLM2-135M
e26 after_kv $S $W
e26 after_kv $S $W --plan-d '{"bn": 128}'
e26 after_kv $S $W --plan-d '{"preload": false, "stages": 4, "pf_k": 256}'
e26 after_kv $S $W --plan-d '{"preload": false, "bn": 128, "stages": 4, "pf_k": 256}'
echo "done at ${SECONDS}s"
