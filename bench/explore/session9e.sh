#!/usr/bin/env bash
# Session 9, call 5 (issue 5): the persistent greedy launch with an elementwise running max of the keys (one
# cross-warp reduction per program instead of one per tile) against without it (explore19 --runmax); GPU tests
# of the draft sampler with the running max in production; the issue's bench if time is left.
# Results: bench/results/session9/call5/.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
(cd bench/explore && timeout 60 python3 explore19.py --runmax --rows 1 2 4 8 --reps 2 --budget-s 45 \
  --out "$OUT/explore19.json" > "$OUT/explore19.log" 2>&1; echo "explore19 rc $?")
python3 - "$OUT/explore19.json" <<'PY'
import json, sys, collections
d = json.load(open(sys.argv[1]))
rows = collections.defaultdict(list)
for e in d["results"]:
    if "us" in e:
        rows[(e["variant"], e["rows"])].append(e["us"])
for (v, r), us in sorted(rows.items()):
    print(f"{v:56s} r{r} {' '.join(f'{u:6.2f}' for u in us)}")
[print("error", x["where"], x["error"][:300]) for x in d.get("errors", [])]
PY
timeout 80 python3 -m pytest -q -n 8 -m "gpu and not real_model and not eval" -p no:cacheprovider --timeout 75 \
  tests/unit/test_draft_sampling.py tests/unit/test_explore_kernels.py -k "not smem" > "$OUT/gpu-tests.log" 2>&1
echo "tests rc $?"; tail -3 "$OUT/gpu-tests.log"
timeout 70 python3 bench/bench_draft_sampling.py --rows 1 2 4 6 8 --no-pdl --out "$OUT/draft_sampling.json" \
  > "$OUT/draft_sampling.log" 2>&1; echo "draft bench rc $?"
grep '"config": "greedy"' "$OUT/draft_sampling.log" | cut -c1-330
