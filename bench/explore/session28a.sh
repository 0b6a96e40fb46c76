#!/usr/bin/env bash
# Session 28's first call (about 200 s): explore37 (the held prologue per kernel with three programs an SM: folded
# weights under maxnreg=168, Llama-3.2-1B, A B C C B A); explore38 (a cluster of 8 CTAs exchanging partial sums
# through global memory and barrier.cluster: correctness and cost a round); Llama-3.2-1B's step (explore26, 16 layers,
# 1 and 6 rows) as FusedModel runs it against folded weights with and without maxnreg=168, A B C C B A.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
echo "== explore37 (${SECONDS}s)"
timeout 150 python3 bench/explore/explore37.py --out "$OUT/explore37.json" 2>&1 | grep -v -i warn | tail -8
echo "== explore38 (${SECONDS}s)"
timeout 90 python3 bench/explore/explore38.py --out "$OUT/explore38.json" 2>&1 | grep -v -i warn | tail -12
e26() {  # tag args
  local tag=$1; shift
  explore26_once 420 60 "$tag" --model Llama-3.2-1B --layers 16 --order 1,6 "$@"
}
e26 registers_1; e26 build_1 --held-fold build; e26 build_r168_1 --held-fold build --held-maxnreg 168
e26 build_r168_2 --held-fold build --held-maxnreg 168; e26 build_2 --held-fold build; e26 registers_2
echo "done at ${SECONDS}s"
