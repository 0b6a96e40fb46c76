"""Session-3 exploration, round 4: tile-contiguous ("packed") weights vs row-major, TMA weight stream, for the
down projection [2048, 8192] (split-K finisher on / off) and the greedy draft GEMV [49152, 576] (no reduction /
relaxed-max tail); the production launches and torch in the same run, two repetitions.

    python bench/explore/explore5d.py --out $OUT/explore5d.json
"""
from __future__ import annotations

import argparse

from _common import GreedyCase, Recorder, t_us

import torch


def down(rec, dev):
    from explore.tma_gemv import TmaResidual, pack_tiles
    from lowlat.bench import _GemvCase
    from lowlat.kernels._gemv import plan_gemv

    n, k = 2048, 8192
    case = _GemvCase("residual", n, k, 1e-5, dev)
    nc = case.nc
    packed = {(bn, bk): [pack_tiles(w, bn, bk) for w in case.w] for bn, bk in ((64, 128), (64, 64))}
    for rep in range(2):
        for r in (1, 6):
            base = dict(op="down", rows=r, rep=rep)
            d = case.inputs(r)
            ref = case.launch(plan_gemv(n, k), r, 0).clone()
            rec(dict(base, variant="production", us=t_us(lambda i: case.launch(plan_gemv(n, k), r, i), nc)))
            for bn, bk, split, st in ((64, 128, 4, 4), (64, 128, 8, 4), (64, 64, 4, 8), (64, 64, 8, 6)):
                for pk in (False, True):
                    for fin in (1, 0):
                        label = f"tma_bn{bn}_bk{bk}_s{split}_st{st}_{'packed' if pk else 'rowmajor'}_fin{fin}"

                        def one(bn=bn, bk=bk, split=split, st=st, pk=pk, fin=fin, label=label):
                            tk = TmaResidual(n, k, bn=bn, bk=bk, split=split, stages=st)
                            ws = packed[(bn, bk)] if pk else case.w
                            out = torch.empty_like(d["out"])
                            tk(d["x"], ws[0], d["res"], out, packed=pk)
                            err = float((out.float() - ref.float()).abs().max())
                            us = t_us(lambda i: tk(d["x"], ws[i % nc], d["res"], d["out"], fin=fin, packed=pk), nc)
                            rec(dict(base, variant=label, us=us, max_abs_diff_vs_production=err if fin else None))
                        rec.guard(label, one, **base)


def greedy(rec):
    from explore.tma_gemv import TmaGreedy, pack_tiles

    case = GreedyCase()
    v, hd, rot = case.v, case.hd, case.rot
    wp = [pack_tiles(w, 128, 64) for w in case.ws]
    for rep in range(2):
        for r in (1, 8):
            base = dict(op="greedy", rows=r, rep=rep)
            t_torch, want, xo, to = case.baseline(rec, r, base)
            for st in (3, 4):
                for pk in (False, True):
                    for epi in (0, 3):
                        label = f"tma_st{st}_{'packed' if pk else 'rowmajor'}_epi{epi}"

                        def one(st=st, pk=pk, epi=epi, label=label):
                            tg = TmaGreedy(v, hd, block_v=128, block_h=64, stages=st)
                            wl = wp if pk else case.ws
                            for i in range(rot):
                                to[i].fill_(-5)
                                tg(case.hs[i][:r], wl[i], xo[i], to[i], epi=epi, packed=pk)
                            same = epi == 0 or all(torch.equal(to[i], want[i]) for i in range(rot))
                            us = t_us(lambda i: tg(case.hs[i][:r], wl[i], xo[i], to[i], epi=epi, packed=pk), rot, 61)
                            rec(dict(base, variant=label, us=us, speedup=round(t_torch / us, 3), same_tokens=same))
                        rec.guard(label, one, **base)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=None)
    a = p.parse_args()
    rec = Recorder(a.out)
    down(rec, torch.device("cuda"))
    greedy(rec)


if __name__ == "__main__":
    main()
