"""Session-3 exploration on the H200: the two GEMVs that miss their targets, production vs TMA weight
streams vs new tile plans, in the benches' timing method (CUDA graph of launches over rotating cold copies).

    python bench/explore/explore5.py --out $OUT/explore5.json [--budget-s 200]
"""
from __future__ import annotations

import argparse
import time

from _common import GreedyCase, Recorder, t_us

import torch


def down_proj(rec, deadline):
    from explore.tma_gemv import TmaResidual
    from lowlat.bench import _GemvCase
    from lowlat.kernels._gemv import plan_gemv

    n, k = 2048, 8192
    case = _GemvCase("residual", n, k, 1e-5, torch.device("cuda"))
    floor = case.wbytes / rec.bw * 1e6
    plans = [("default", plan_gemv(n, k))]
    for bn, split, bk, st, pf, w in ((16, 1, 256, 6, 256, 4), (16, 1, 256, 8, 256, 4), (16, 1, 512, 4, 512, 4),
                                     (16, 1, 128, 8, 256, 4), (16, 2, 256, 6, 256, 4), (16, 2, 128, 8, 256, 4),
                                     (32, 2, 256, 4, 256, 4), (32, 2, 128, 6, 256, 4), (32, 1, 256, 6, 256, 4),
                                     (64, 4, 128, 6, 256, 4), (64, 8, 128, 4, 128, 4), (16, 1, 256, 6, 0, 4),
                                     (16, 1, 256, 6, 1024, 4), (32, 2, 256, 4, 1024, 4)):
        try:
            plans.append((f"bn{bn}_s{split}_bk{bk}_st{st}_pf{pf}_w{w}",
                          plan_gemv(n, k, bn=bn, split=split, block_k=bk, stages=st, pf_k=pf, warps=w, preload=False)))
        except Exception as exc:                                           # noqa: BLE001
            rec.error(f"down/bn{bn}_s{split}_bk{bk}", exc)
    for label, plan in plans:
        if time.time() > deadline:
            break

        def one(label=label, plan=plan):
            case.check(plan)
            us = {r: t_us(lambda i, r=r: case.launch(plan, r, i), case.nc, 21) for r in (1, 6)}
            rec(dict(op="down", variant=label, us1=us[1], us6=us[6], pct1=round(100 * floor / us[1], 1),
                     plan=plan.describe()))
        rec.guard(label, one, op="down")
    # TMA weight stream, same shape, same copies; output compared with the production kernel's
    ref = {r: case.launch(plans[0][1], r, 0).clone() for r in (1, 6)}
    for bn, bk, split, st, w in ((64, 128, 8, 4, 4), (64, 64, 8, 6, 4), (64, 128, 8, 3, 4), (128, 64, 8, 4, 4),
                                 (64, 128, 4, 4, 4), (64, 64, 8, 8, 4), (128, 128, 8, 3, 8), (32, 128, 8, 6, 4),
                                 (64, 256, 8, 2, 4), (64, 128, 8, 5, 4)):
        if time.time() > deadline:
            break
        label = f"tma_bn{bn}_bk{bk}_s{split}_st{st}_w{w}"

        def one(bn=bn, bk=bk, split=split, st=st, w=w, label=label):
            tk = TmaResidual(n, k, bn=bn, bk=bk, split=split, stages=st, warps=w)
            errs = {}
            for r in (1, 6):
                d = case.inputs(r)
                got = tk(d["x"], case.w[0], d["res"], torch.empty_like(d["out"]))
                errs[r] = float((got.float() - ref[r].float()).abs().max())
            us = {r: t_us(lambda i, r=r: tk(case.inputs(r)["x"], case.w[i % case.nc], case.inputs(r)["res"],
                                           case.inputs(r)["out"]), case.nc, 21) for r in (1, 6)}
            rec(dict(op="down", variant=label, us1=us[1], us6=us[6], pct1=round(100 * floor / us[1], 1),
                     max_abs_diff_vs_default=errs))
        rec.guard(label, one, op="down")


def greedy(rec, deadline):
    from explore.tma_gemv import TmaGreedy

    case = GreedyCase()
    v, hd, rot, dev = case.v, case.hd, case.rot, case.dev
    floor = v * hd * 2 / rec.bw * 1e6
    for r in (1, 8):
        prod, torch_ops, outs = case.launchers(r)
        base = dict(op="greedy", rows=r)
        t_torch = t_us(torch_ops, rot)
        rec(dict(base, variant="torch", us=t_torch))
        t_prod = t_us(prod, rot)
        rec(dict(base, variant="production", us=t_prod, speedup=round(t_torch / t_prod, 3),
                 pct=round(100 * floor / t_prod, 1)))
        rec(dict(base, variant="production_pdl", us=t_us(lambda i: prod(i, use_pdl=True), rot)))
        want = [outs[i].tokens.clone() for i in range(rot)]
        for bv, bh, st, w in ((128, 64, 4, 4), (128, 64, 3, 4), (128, 64, 5, 4), (256, 64, 3, 4), (256, 64, 3, 8),
                              (64, 64, 6, 4), (128, 64, 6, 4), (128, 32, 8, 4), (512, 64, 2, 8), (128, 64, 4, 8)):
            if time.time() > deadline:
                break
            label = f"tma_bv{bv}_bh{bh}_st{st}_w{w}"

            def one(bv=bv, bh=bh, st=st, w=w, label=label):
                tg = TmaGreedy(v, hd, block_v=bv, block_h=bh, stages=st, warps=w)
                xo = [torch.empty(r, v, device=dev) for _ in range(rot)]
                to = [torch.empty(r, dtype=torch.int64, device=dev) for _ in range(rot)]
                for i in range(rot):
                    tg(case.hs[i][:r], case.ws[i], xo[i], to[i])
                same = all(torch.equal(to[i], want[i]) for i in range(rot))
                us = t_us(lambda i: tg(case.hs[i][:r], case.ws[i], xo[i], to[i]), rot)
                us_pdl = t_us(lambda i: tg(case.hs[i][:r], case.ws[i], xo[i], to[i], use_pdl=True), rot)
                rec(dict(base, variant=label, us=us, us_pdl=us_pdl, speedup=round(t_torch / us, 3),
                         pct=round(100 * floor / us, 1), same_tokens=same))
            rec.guard(label, one, **base)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=None)
    p.add_argument("--budget-s", type=float, default=200)
    p.add_argument("--only", default="down,greedy")
    a = p.parse_args()
    deadline = time.time() + a.budget_s
    rec = Recorder(a.out)
    for part in a.only.split(","):
        rec.guard(part, lambda part=part: {"down": down_proj, "greedy": greedy}[part](rec, deadline), op=part)


if __name__ == "__main__":
    main()
