"""Session-5 exploration: the greedy draft launch's logits stored straight from the wgmma accumulator layout
(`draft_sampling.LOGITS_DIRECT`: inline-asm st.global.f32 per element, no shared-memory layout change) against
`tl.store` (coalesced through shared memory), interleaved with the torch ops, at 1-8 rows, with and without PDL;
outputs (tokens, logits) checked equal.

    python bench/explore/explore15.py --out $OUT/explore15.json [--reps 3]
"""
from __future__ import annotations

import argparse

from _common import GreedyCase, Recorder, t_us

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    from lowlat.kernels import draft_sampling as ds

    rec = Recorder(args.out)
    case = GreedyCase()
    for rep in range(args.reps):
        for r in (1, 2, 4, 6, 8):
            prod, torch_ops, outs = case.launchers(r)
            base = dict(op="greedy", rows=r, rep=rep)
            t_torch = t_us(torch_ops, case.rot, 61)
            rec(dict(base, variant="torch", us=t_torch))
            got = {}
            for direct in (False, True):
                ds.LOGITS_DIRECT = direct
                name = "direct" if direct else "smem"
                for o in outs:
                    o.logits.fill_(float("nan"))
                    o.tokens.fill_(-2)
                t = t_us(prod, case.rot, 61)
                tp = t_us(lambda i: prod(i, use_pdl=True), case.rot, 61)
                got[name] = [(o.tokens.clone(), o.logits.clone()) for o in outs]
                rec(dict(base, variant=name, us=t, speedup=round(t_torch / t, 3), us_pdl=tp,
                         speedup_pdl=round(t_torch / tp, 3)))
                print(f"rows {r} rep {rep} {name:6s} {t:6.2f} us ({t_torch / t:.3f}x)  pdl {tp:6.2f} us "
                      f"({t_torch / tp:.3f}x)  torch {t_torch:.2f}", flush=True)
            same = all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(got["smem"], got["direct"]))
            rec(dict(base, variant="check", same_outputs=same, logits_written=not any(
                bool(x[1].isnan().any()) for x in got["direct"])))
            print(f"rows {r}: same outputs {same}", flush=True)
    ds.LOGITS_DIRECT = False


if __name__ == "__main__":
    main()
