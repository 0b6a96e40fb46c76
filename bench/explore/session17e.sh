#!/usr/bin/env bash
# Session 17 call 5. Llama-3.2-1B's step jumps from 1128 us at 16 rows to 1585 at 24 (call 2): per layer gate/up
# 21.6 -> 33.7 us, down 14.0 -> 20.0, out_proj 4.1 -> 7.5. Per kernel (explore28: the tuner's PDL-chained timing)
# at 1 / 16 / 24 / 48 rows, the committed plans against variants of their weight stream and tile (bn, warps,
# stages, pf_k, split), and whether the bn variants give the same bits (--bits: 48 rows against the committed plan).
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
e28() {  # kind n k plans...
  (( SECONDS > 420 )) && { echo "skip e28 $1: ${SECONDS}s used"; return; }
  echo "== e28 $1 $2x$3 (${SECONDS}s)"
  timeout 150 python3 bench/explore/explore28.py --kind $1 --n $2 --k $3 --rows 1 16 24 48 --bits --plans "${@:4}" \
    2>&1 | grep -v -i warn
}
e28 gate_up 8192 2048 'bn=64' 'bn=64,warps=4' 'bn=128,warps=4' 'stages=2' 'stages=6' 'pf_k=512' 'split=4'
e28 residual 2048 8192 'bn=32' 'bn=128' 'stages=2' 'stages=6' 'pf_k=1024'
e28 residual 2048 2048 'bn=16' 'bn=32' 'bn=128' 'preload=0,stages=4,pf_k=256' 'preload=0,stages=2,pf_k=1024'
echo "done at ${SECONDS}s"
