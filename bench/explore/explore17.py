"""Session-6 exploration, second call (issue 5): tile / pipeline configs of the TMA greedy launch without logits
stores (tma_gemv EPI 8; explore16 measured its default config at 1.96-2.07x the torch ops), beside the torch ops
and the production launch, rows 1 / 2 / 8, `--reps` interleaved rounds.

    python bench/explore/explore17.py --out $OUT/explore17.json [--budget-s 200] [--reps 2]
"""
from __future__ import annotations

import argparse
import time

from _common import GreedyCase, Recorder, t_us

import torch

#: (block_v, block_h, stages, warps)
CONFIGS = [(128, 64, 3, 4), (128, 64, 4, 4), (128, 64, 2, 4), (128, 32, 4, 4), (128, 32, 6, 4), (256, 64, 3, 8),
           (256, 64, 2, 8), (256, 64, 3, 4), (64, 64, 4, 4), (128, 64, 3, 8)]


def main():
    from explore.tma_gemv import TmaGreedy

    p = argparse.ArgumentParser()
    p.add_argument("--out", default=None)
    p.add_argument("--budget-s", type=float, default=200)
    p.add_argument("--reps", type=int, default=2)
    a = p.parse_args()
    deadline = time.time() + a.budget_s
    rec = Recorder(a.out)
    case = GreedyCase()
    tgs = {c: TmaGreedy(case.v, case.hd, block_v=c[0], block_h=c[1], stages=c[2], warps=c[3]) for c in CONFIGS}
    for rep in range(a.reps):
        for r in (1, 2, 8):
            base = dict(op="greedy", rows=r, rep=rep)
            t_torch, want, xo, to = case.baseline(rec, r, base, pdl=False)
            for c, tg in tgs.items():
                if time.time() > deadline:
                    return

                def one(tg=tg, c=c):
                    for t in to:
                        t.fill_(-2)
                    us = t_us(lambda i: tg(case.hs[i][:r], case.ws[i], xo[i], to[i], epi=8), case.rot, 61)
                    same = all(torch.equal(to[i], want[i]) for i in range(case.rot))
                    rec(dict(base, variant="tma_epi8_bv{}_bh{}_st{}_w{}".format(*c), us=us,
                             speedup=round(t_torch / us, 3), same_tokens=same))
                rec.guard(str(c), one, **base)


if __name__ == "__main__":
    main()
