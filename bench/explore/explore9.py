"""Session-4 exploration, fourth round: the greedy draft launch's tail after the fixes found by explore8 (the logits
conversion and stores cost ~1-1.5 us of the tail; a fence-free arrival does not help). Times, with
`bench/bench_draft_sampling.py`'s method and correctness check (tokens / all outputs equal to the default
launch's), only these greedy launch variants:
  store_logits=False  the greedy launch writes tokens, lse and cut but no logits (q is one-hot: nothing needs them);
  vec_arrival=True    the arrival is a release-only add whose result is not broadcast at once, so the logits
                      conversion and stores overlap its round trip (the last program adds a fence.acq_rel).

    python bench/explore/explore9.py --out $OUT/explore9.json
"""
from __future__ import annotations

import sys

import _common  # noqa: F401  (puts the checkout and bench/ on sys.path)
import bench_draft_sampling as bds

VARIANTS = [dict(store_logits=False), dict(vec_arrival=True), dict(store_logits=False, vec_arrival=True),
            dict(store_logits=False, use_pdl=True), dict(vec_arrival=True, use_pdl=True), dict(use_pdl=True)]

if __name__ == "__main__":
    bds.SWEEP["greedy"] = VARIANTS
    out = sys.argv[sys.argv.index("--out") + 1]
    sys.exit(bds.main(["--out", out, "--rows", "1", "8", "1", "8", "4", "--sweep", "--sweep-configs", "greedy",
                       "--sweep-rows", "1", "8", "--no-pdl"]))
