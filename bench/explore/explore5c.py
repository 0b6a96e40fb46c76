"""Session-3 exploration, round 3: the greedy reduction tail. TMA greedy GEMV with EPI 0 (no reduction),
1 (acq_rel atomic_max + counter, the old production tail), 3 (relaxed max, logits after the arrival: the new
production tail), 4 (slots and counters spread over 16 groups + a root counter), 5 (per-program keys, group
+ root counters); the production launch and torch in the same run.

    python bench/explore/explore5c.py --out $OUT/explore5c.json
"""
from __future__ import annotations

import argparse

from _common import GreedyCase, Recorder, t_us

import torch


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=None)
    a = p.parse_args()
    from explore.tma_gemv import TmaGreedy

    rec = Recorder(a.out)
    case = GreedyCase()
    v, hd, rot = case.v, case.hd, case.rot
    for rep in range(2):
        for r in (1, 8):
            base = dict(op="greedy", rows=r, rep=rep)
            t_torch, want, xo, to = case.baseline(rec, r, base, pdl=True)
            for epi in (0, 1, 3, 4, 5):
                for st in (3, 4):
                    label = f"tma_st{st}_epi{epi}"

                    def one(epi=epi, st=st, label=label):
                        tg = TmaGreedy(v, hd, block_v=128, block_h=64, stages=st)
                        for i in range(rot):
                            to[i].fill_(-5)
                            tg(case.hs[i][:r], case.ws[i], xo[i], to[i], epi=epi)
                        same = epi == 0 or all(torch.equal(to[i], want[i]) for i in range(rot))
                        us = t_us(lambda i: tg(case.hs[i][:r], case.ws[i], xo[i], to[i], epi=epi), rot, 61)
                        rec(dict(base, variant=label, us=us, speedup=round(t_torch / us, 3), same_tokens=same))
                    rec.guard(label, one, **base)


if __name__ == "__main__":
    main()
