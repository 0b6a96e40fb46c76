#!/usr/bin/env bash
# Device call 3 (carry .whl): re-run the sampling kernels' GPU tests after the Philox-reference device fix,
# and the whole-step benchmark at every row count with the tuned GEMV plans.
#   run(command="bash bench/device/stage3.sh", carry=[".whl"])
cd "$(dirname "$0")/../.."
source bench/device/common.sh
python3 -m pytest -q -n 4 -m gpu -p no:cacheprovider tests/unit/test_draft_sampling.py \
  tests/unit/test_rejection_sampling.py 2>&1 | tee "$OUT/sampling-gpu-tests.log" | tail -15
python3 -m lowlat.bench --sections copy,step,compiled --models SmolLM2-135M,Llama-3.2-1B --rows 1,6,8,16,48 \
  --budget-s 240 --out "$OUT/step_h200.json" 2>&1 | tail -45
