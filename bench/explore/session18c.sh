#!/usr/bin/env bash
# Session 18 call 3: the decode attention's split groups by the rule then committed as default (halved from 32
# while the grid exceeds 512 programs, at least 4 programs per (row, KV head); explore26 --attn-target 512
# --attn-min-groups 4 now). The default became WIDE_GRID / WIDE_SPLIT_GROUPS after this call.
# Every single-GPU test; then `lowlat bench --sections copy,step,profile` for
# Llama-3.2-1B and SmolLM2 at a server's widths; then SmolLM2's step with the default against one program per split
# (explore26 --attn-target 1000000), alternated twice.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
echo "== GPU tests (${SECONDS}s)"
gpu_tests 300
echo "== lowlat bench step (${SECONDS}s)"
timeout 150 python3 -m lowlat.bench --sections copy,step,profile --models Llama-3.2-1B,SmolLM2-135M \
  --rows 1,6,8,16,24,32,48 --out "$OUT/step_s18.json" 2>&1 | grep -v -i warn | grep -E 'decode_step|in_step' | cut -c1-100
e26() {  # model TARGET_PROGRAMS
  (( SECONDS > 540 )) && { echo "skip e26 $*: ${SECONDS}s used"; return; }
  echo "== e26 $1 attn_target $2 (${SECONDS}s)"
  if timeout 60 python3 bench/explore/explore26.py --model "$1" --order 1,6,16,24,32,48 \
      --attn-target "$2" --attn-min-groups 4 > /tmp/e26.log 2>&1; then grep -v -i warn /tmp/e26.log
  else echo "e26 $1 $2 failed"; tail -4 /tmp/e26.log; fi
}
e26 SmolLM2-135M 512; e26 SmolLM2-135M 1000000; e26 SmolLM2-135M 512; e26 SmolLM2-135M 1000000
echo "done at ${SECONDS}s"
