"""Session-4 exploration, second round: when the next PDL launch may start (`gdc_launch_dependents` right after
`gdc_wait`, as every kernel here did, or after the GEMV's main loop: GemvPlan.late_launch, the draft sampler's
late_launch), with L2 prefetch depths around it.

explore6 (evict-last prefetch) found a deeper prefetch slower whatever its L2 priority. A launch calls
`gdc_launch_dependents` right after its wait, so the next launch's prefetch is issued while this one starts
streaming (zero-sum, and the lines wait ~10 us in L2 while 34-57 MB pass through), not while this one runs
its split-K finisher / argmax tail, when HBM is idle. With a late launch the next programs start in that tail.
Same timing method and variants side by side as explore6.py.

    python bench/explore/explore7.py --out $OUT/explore7.json [--budget-s 200] [--only down,lm_head,greedy]
"""
from __future__ import annotations

import argparse
import time

from _common import Recorder
from explore6 import gemv, greedy

S4 = dict(split=4, block_k=128, bn=64, stages=4, preload=False)
DOWN = [("tuned", {})] + [(f"s4_late_pf{pf}", dict(S4, pf_k=pf, late_launch=True)) for pf in (0, 256, 512, 1024)] + [
    ("s8_late_pf256", dict(S4, split=8, pf_k=256, late_launch=True)),
    ("s8_late_pf512", dict(S4, split=8, pf_k=512, late_launch=True)),
    ("s4_st5_late_pf512", dict(S4, stages=5, pf_k=512, late_launch=True))]
LM = dict(bn=128, block_k=64, warps=4, stages=4, preload=False)
LM_HEAD = [("tuned", {}), ("pf64", dict(LM, pf_k=64)), ("pf128", dict(LM, pf_k=128))] + [
    (f"late_pf{pf}", dict(LM, pf_k=pf, late_launch=True)) for pf in (0, 64, 128, 256)]
GREEDY = [("pdl", dict(use_pdl=True)), ("pdl_pf64", dict(use_pdl=True, pf_h=64, pf_evict_last=False))] + [
    (f"late_pf{pf}", dict(use_pdl=True, late_launch=True, pf_h=pf, pf_evict_last=False)) for pf in (0, 64, 128, 256)]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=None)
    p.add_argument("--budget-s", type=float, default=200)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--only", default="down,lm_head,greedy")
    a = p.parse_args()
    deadline = time.time() + a.budget_s
    rec = Recorder(a.out)
    parts = {"down": lambda: gemv(rec, deadline, "residual", 2048, 8192, 1e-5, DOWN, a.reps),
             "lm_head": lambda: gemv(rec, deadline, "lm_head", 49152, 576, 1e-5, LM_HEAD, a.reps),
             "greedy": lambda: greedy(rec, deadline, a.reps, GREEDY)}
    for part in a.only.split(","):
        rec.guard(part, parts[part], op=part)


if __name__ == "__main__":
    main()
