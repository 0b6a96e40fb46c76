#!/usr/bin/env bash
# Session 19 call 3: the decode attention's new defaults (split groups halved to a 512-program grid once one program
# per split exceeds 4608 programs; 5 pipeline stages where a program runs >= 16 splits' share of its row). (1) Every
# single-GPU test. (2) Per kernel (PDL-chained) at Llama-3.2-1B / Qwen3-30B-A3B heads where the rule groups, ctx 512 /
# 4096: the default against one program per split and session 18's 4 groups (3 stages). (3) Llama-3.2-1B's step
# (explore26, alternated twice): the default against session 18's rule (--attn-target 6144 --attn-min-groups 4
# --kv-stages 3 reproduces it). (4) `lowlat bench --sections copy,step,profile` for Llama-3.2-1B.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
echo "== every single-GPU test (${SECONDS}s)"
gpu_tests 300
echo "== per kernel (${SECONDS}s)"
timeout 100 python3 bench/bench_decode_attention.py --variants fused_pdl --models Llama-3.2-1B --rows 24 32 48 \
  --ctxs 512 4096 --split-groups 0 32 4 --out "$OUT/da_llama.json" 2>&1 | grep -v -i warn | cut -c1-100
timeout 60 python3 bench/bench_decode_attention.py --variants fused_pdl --models Qwen3-30B-A3B --rows 37 48 \
  --ctxs 512 4096 --split-groups 0 32 --out "$OUT/da_qwen3.json" 2>&1 | grep -v -i warn | cut -c1-100
e26() {  # label [explore26 options]
  (( SECONDS > 500 )) && { echo "skip e26 $*: ${SECONDS}s used"; return; }
  local label=$1; shift
  echo "== e26 Llama $label (${SECONDS}s)"
  if timeout 60 python3 bench/explore/explore26.py --model Llama-3.2-1B --order 1,6,16,24,32,48 "$@" > /tmp/e26.log 2>&1
  then grep -v -i warn /tmp/e26.log | grep -E 'r(1|6|16|24|32|48) |logits'; else echo "e26 $label failed"; tail -4 /tmp/e26.log; fi
}
for rep in 1 2; do
  e26 default; e26 session18 --attn-target 6144 --attn-min-groups 4 --kv-stages 3
done
echo "== lowlat bench step Llama (${SECONDS}s)"
timeout 120 python3 -m lowlat.bench --sections copy,step,profile --models Llama-3.2-1B --rows 1,6,8,16,24,32,48 \
  --out "$OUT/step_llama_s19.json" 2>&1 | grep -v -i warn | grep -E 'copy|decode_step|op=(decode_attention) ' \
  | cut -c1-110
echo "done at ${SECONDS}s"
