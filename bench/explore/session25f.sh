#!/usr/bin/env bash
# Session 25's sixth call (about 150 s): mutations of the production held prologue (lowlat/kernels/attn_prologue_held.py)
# that its GPU tests must catch: RoPE's sign, the KV write's valid-row mask, the first row block's pre-wait inputs
# used for every block, num_valid_rows ignored when it is a device tensor.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
K=lowlat/kernels/attn_prologue_held.py
T=tests/unit/test_attn_prologue.py
run() {  # OLD NEW PYTEST_K
  mutate $K "$1" "$2"
  timeout 90 python3 -m pytest -q -m gpu -p no:cacheprovider $T -k "$3" 2>&1 | tail -1 \
    | while read -r l; do echo "mutation '$2' ($3): $l"; done
  unmutate
}
run "lo * cos - hi * sin" "lo * cos + hi * sin" "llama_shapes and 1"
run "gl.expand_dims(erow < nvr, 0) & (hd >= Hq)" "(hd >= Hq)" "llama_shapes and 1"
run "        if b == 0:" "        if True:" "llama_shapes and 1"
run "        nvr = gl.load(nvr_ptr)" "        nvr = M" "held_prologue_bitwise"
echo "done at ${SECONDS}s"
