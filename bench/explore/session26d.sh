#!/usr/bin/env bash
# Session 26's fourth call (about 200 s): the held prologue's norm weight folded at build (FusedModel's form until
# now) against multiplied in the kernel's registers (fused_model.HELD_FOLD; the same bits), after call 2 measured the
# registers form faster per kernel at 6 rows (4.67 against 5.58 us): the held-prologue step test with both forms
# compared bitwise, then Llama-3.2-1B's step (explore26, 16 layers, ctx 512) alternated A B B A.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
timeout 150 python3 -m pytest -v -m gpu -p no:cacheprovider --timeout 140 -rf --tb=short \
  "tests/unit/test_fused_model.py::test_gpu_held_prologue_step_within_policy_row_invariant_and_replayed" \
  > /tmp/t.log 2>&1; echo "pytest rc $?"; grep -E "PASSED|FAILED|passed|failed|Error" /tmp/t.log | cut -c1-300 | tail -6
cp /tmp/t.log "$OUT/held-fold-test.log"
e26() {  # held_fold tag
  explore26_once 330 70 "$1_$2" --model Llama-3.2-1B --order 1,6,16,48 --held-fold "$1"
}
e26 build 1; e26 registers 1; e26 registers 2; e26 build 2
echo "done at ${SECONDS}s"
