"""Session-3 exploration, round 2: where the GEMVs lose time against a pure read of the same bytes.
Variants without the cross-program reduction (greedy: EPI 0 / 2; down projection: no split-K finisher), the
draft GEMV reading W in row groups (contiguous loads in flight), and pure reads in the GEMV's tile pattern.

    python bench/explore/explore5b.py --out $OUT/explore5b.json
"""
from __future__ import annotations

import argparse

from _common import GreedyCase, Recorder, t_us

import torch
import triton
import triton.language as tl


@triton.jit
def _tile_read_kernel(w_ptr, stride_w, out, BN: tl.constexpr, BK: tl.constexpr, CPS: tl.constexpr,
                      NS: tl.constexpr):
    """Sum of W[n0:n0+BN, k0:k0+CPS*BK] read as CPS [BN, BK] tiles (the GEMV's access pattern), pipelined NS deep."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rn = pid_n * BN + tl.arange(0, BN)
    acc = tl.zeros([BN, BK], dtype=tl.float32)
    for c in tl.range(0, CPS, num_stages=NS):
        rk = pid_k * CPS * BK + c * BK + tl.arange(0, BK)
        acc += tl.load(w_ptr + rn[:, None] * stride_w + rk[None, :]).to(tl.float32)
    tl.store(out + pid_n * tl.num_programs(1) + pid_k, tl.sum(tl.sum(acc, axis=1), axis=0))


def tile_reads(rec, dev):
    for (n, k), tiles in (((49152, 576), ((128, 64, 1, 4, 4), (128, 64, 1, 4, 8), (16, 64, 1, 4, 4),
                                            (64, 64, 1, 4, 4), (256, 64, 1, 3, 8))),
                          ((2048, 8192), ((64, 128, 8, 4, 4), (64, 128, 8, 4, 8), (64, 128, 4, 4, 4),
                                          (16, 256, 2, 4, 4)))):
        rot = 3
        ws = [torch.randn(n, k, device=dev).to(torch.bfloat16) for _ in range(rot)]
        out = torch.empty(1 << 16, device=dev)
        for bn, bk, split, ns, nw in tiles:
            cps = k // (bk * split)
            if cps * bk * split != k:
                continue

            def run(i, bn=bn, bk=bk, split=split, ns=ns, nw=nw, cps=cps):
                _tile_read_kernel[(n // bn, split)](ws[i], ws[i].stride(0), out, BN=bn, BK=bk, CPS=cps, NS=ns,
                                                     num_warps=nw)
            label = f"tile_read_{n}x{k}_bn{bn}_bk{bk}_s{split}_ns{ns}_w{nw}"
            rec.guard(label, lambda run=run, label=label: rec(dict(
                op="read", variant=label, us=t_us(run, rot), copy_floor_us=round(n * k * 2 / rec.bw * 1e6, 2))))
        del ws


def greedy(rec):
    from explore.tma_gemv import RowGroupGreedy, TmaGreedy

    case = GreedyCase()
    v, hd, rot, dev = case.v, case.hd, case.rot, case.dev
    for r in (1, 8):
        base = dict(op="greedy", rows=r)
        prod, torch_ops, outs = case.launchers(r)
        t_torch = t_us(torch_ops, rot)
        rec(dict(base, variant="torch", us=t_torch))
        rec(dict(base, variant="production", us=t_us(prod, rot)))
        want = [outs[i].tokens.clone() for i in range(rot)]
        xo = [torch.empty(r, v, device=dev) for _ in range(rot)]
        to = [torch.empty(r, dtype=torch.int64, device=dev) for _ in range(rot)]
        for st in (3, 4):
            for epi in (0, 2, 1):
                tg = TmaGreedy(v, hd, block_v=128, block_h=64, stages=st)
                label = f"tma_bv128_st{st}_epi{epi}"
                rec.guard(label, lambda tg=tg, epi=epi, label=label: rec(dict(
                    base, variant=label,
                    us=t_us(lambda i: tg(case.hs[i][:r], case.ws[i], xo[i], to[i], epi=epi), rot))))
        for bv, rg, st, nw in ((128, 16, 3, 4), (128, 16, 4, 4), (128, 32, 3, 4), (256, 16, 3, 4), (128, 16, 2, 4),
                               (128, 16, 3, 8), (64, 16, 3, 4), (128, 32, 2, 4)):
            label = f"rowgroup_bv{bv}_rg{rg}_st{st}_w{nw}"

            def one(bv=bv, rg=rg, st=st, nw=nw, label=label):
                rgk = RowGroupGreedy(v, hd, block_v=bv, rg=rg, bh=64, stages=st, warps=nw)
                for i in range(rot):
                    rgk(case.hs[i][:r], case.ws[i], xo[i], to[i])
                same = all(torch.equal(to[i], want[i]) for i in range(rot))
                us = t_us(lambda i: rgk(case.hs[i][:r], case.ws[i], xo[i], to[i]), rot)
                us_pdl = t_us(lambda i: rgk(case.hs[i][:r], case.ws[i], xo[i], to[i], use_pdl=True), rot)
                rec(dict(base, variant=label, us=us, us_pdl=us_pdl, speedup=round(t_torch / us, 3), same_tokens=same))
            rec.guard(label, one, **base)


def down_finisher(rec, dev):
    from explore.tma_gemv import TmaResidual
    from lowlat.bench import _GemvCase
    from lowlat.kernels._gemv import plan_gemv

    n, k, r = 2048, 8192, 1
    case = _GemvCase("residual", n, k, 1e-5, dev)
    base = dict(op="down", rows=r)
    rec(dict(base, variant="default", us=t_us(lambda i: case.launch(plan_gemv(n, k), r, i), case.nc)))
    d = case.inputs(r)
    for split, st, fin in ((8, 4, 1), (8, 4, 0), (4, 4, 1), (4, 4, 0)):
        tk = TmaResidual(n, k, bn=64, bk=128, split=split, stages=st)
        label = f"tma_s{split}_st{st}_fin{fin}"
        rec.guard(label, lambda tk=tk, fin=fin, label=label: rec(dict(base, variant=label, us=t_us(
            lambda i: tk(d["x"], case.w[i % case.nc], d["res"], d["out"], fin=fin), case.nc))))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=None)
    a = p.parse_args()
    rec = Recorder(a.out)
    dev = torch.device("cuda")
    tile_reads(rec, dev)
    greedy(rec)
    down_finisher(rec, dev)


if __name__ == "__main__":
    main()
