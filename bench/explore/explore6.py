"""Session-4 exploration on the H200: L2 eviction priority of the early weight prefetch of the two GEMVs under target.

Rounds four and five found a deeper L2 prefetch before `gdc_wait` slower for the Llama-3.2-1B down projection
(pf 512: 12.2 us, pf 1024: 13.2 us, pf 256: 11.6 us at split 4), as if the next launch's prefetched lines
were pushed out of L2 by this launch's own stream before they were used. Here the prefetch is issued
evict-last and set back to evict-normal once read (GemvPlan.evict; the draft sampler's pf_h / pf_evict_last;
Triton's cp.async stream loads take no L2 policy, so the stream itself stays evict-normal), and each variant
is timed beside its plain twin, in the benches' timing method (CUDA graph of PDL-chained launches over
rotating cold copies), `--reps` times interleaved.

    python bench/explore/explore6.py --out $OUT/explore6.json [--budget-s 200] [--only down,lm_head,greedy]
"""
from __future__ import annotations

import argparse
import time

from _common import GreedyCase, Recorder, t_us

import torch

DOWN = [  # (label, plan_gemv fields): the committed plan first, then plain / evict pairs
    ("tuned", {}),
    ("s4_pf512", dict(split=4, block_k=128, bn=64, stages=4, pf_k=512, preload=False)),
    ("s4_pf1024", dict(split=4, block_k=128, bn=64, stages=4, pf_k=1024, preload=False)),
    ("s4_pf256_ev", dict(split=4, block_k=128, bn=64, stages=4, pf_k=256, preload=False, evict=True)),
    ("s4_pf512_ev", dict(split=4, block_k=128, bn=64, stages=4, pf_k=512, preload=False, evict=True)),
    ("s4_pf1024_ev", dict(split=4, block_k=128, bn=64, stages=4, pf_k=1024, preload=False, evict=True)),
    ("s4_pfall_ev", dict(split=4, block_k=128, bn=64, stages=4, pf_k=2048, preload=False, evict=True)),
    ("s8_pf512_ev", dict(split=8, block_k=128, bn=64, stages=4, pf_k=512, preload=False, evict=True)),
    ("s8_pfall_ev", dict(split=8, block_k=128, bn=64, stages=4, pf_k=1024, preload=False, evict=True)),
    ("s4_bk64_st8_pf512_ev", dict(split=4, block_k=64, bn=64, stages=8, pf_k=512, preload=False, evict=True)),
]
LM_HEAD = [
    ("tuned", {}),
    ("pf0_ev", dict(bn=128, block_k=64, warps=4, stages=4, pf_k=0, preload=False, evict=True)),
    ("pf64_ev", dict(bn=128, block_k=64, warps=4, stages=4, pf_k=64, preload=False, evict=True)),
    ("pf128_ev", dict(bn=128, block_k=64, warps=4, stages=4, pf_k=128, preload=False, evict=True)),
    ("pf128", dict(bn=128, block_k=64, warps=4, stages=4, pf_k=128, preload=False)),
]
GREEDY = [  # draft_sample_into launch options
    ("pdl", dict(use_pdl=True)),
    ("pdl_pf64", dict(use_pdl=True, pf_h=64, pf_evict_last=False)),
    ("pdl_pf128", dict(use_pdl=True, pf_h=128, pf_evict_last=False)),
    ("pdl_pf64_ev", dict(use_pdl=True, pf_h=64)),
    ("pdl_pf128_ev", dict(use_pdl=True, pf_h=128)),
    ("pdl_pf256_ev", dict(use_pdl=True, pf_h=256)),
    ("pdl_pfall_ev", dict(use_pdl=True, pf_h=1024)),
]


def gemv(rec, deadline, kind, n, k, eps, variants, reps):
    from lowlat.bench import _GemvCase
    from lowlat.kernels._gemv import plan_gemv

    case = _GemvCase(kind, n, k, eps, torch.device("cuda"))
    plans = []
    for label, fields in variants:
        try:
            plan = plan_gemv(n, k, kind=kind, **fields)
            case.check(plan)
            plans.append((label, plan))
        except Exception as exc:                                           # noqa: BLE001
            torch.cuda.synchronize()
            rec.error(f"{kind}/{label}", exc)
    for rep in range(reps):
        for label, plan in plans:
            if time.time() > deadline:
                return
            for r in (1, 6):
                def one(label=label, plan=plan, r=r):
                    nbytes = case.wbytes + sum(t.numel() * t.element_size() for t in
                                               (case.inputs(r)["x"], case.inputs(r)["out"]))
                    us = t_us(lambda i: case.launch(plan, r, i), max(case.nc, 8), 41)
                    rec(dict(op=kind, n=n, k=k, rows=r, rep=rep, variant=label, us=us,
                             pct_of_copy=round(100 * nbytes / rec.bw / (us * 1e-6), 1), plan=plan.describe()))
                rec.guard(label, one, op=kind, rows=r)


def greedy(rec, deadline, reps, variants=GREEDY):
    case = GreedyCase()
    for rep in range(reps):
        for r in (1, 8):
            base = dict(op="greedy", rows=r, rep=rep)
            t_torch, want, _, _ = case.baseline(rec, r, base, pdl=False)
            prod, _, outs = case.launchers(r)
            for label, launch in variants:
                if time.time() > deadline:
                    return

                def one(label=label, launch=launch):
                    for o in outs:
                        o.tokens.fill_(-2)
                    us = t_us(lambda i: prod(i, **launch), case.rot, 61)
                    same = all(torch.equal(outs[i].tokens, want[i]) for i in range(case.rot))
                    rec(dict(base, variant=label, us=us, speedup=round(t_torch / us, 3), same_tokens=same))
                rec.guard(label, one, **base)


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
             "greedy": lambda: greedy(rec, deadline, a.reps)}
    for part in a.only.split(","):
        rec.guard(part, parts[part], op=part)


if __name__ == "__main__":
    main()
