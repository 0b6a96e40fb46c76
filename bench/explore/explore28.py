"""Session-17 measurement (issue 3): Llama-3.2-1B's gate/up GEMV (8192 x 2048 pairs, 67 MB) costs 21.6 us a layer in
the step at 1-16 rows and 33.7 us at 24-32 (call 2's profile): one extra row block takes half as long again as the
whole weight stream. This times the GEMV per kernel (`lowlat.bench._GemvCase`: PDL-chained launches over rotating
weight copies, as the tuner does) for the committed plan and variants, at the given rows, and checks whether
variants that differ in bn (with the same block_k / split / warps) give a row the same bits (a gate/up plan may not
change bn with the width unless they do: `_gemv.BN_BY_ROW_BLOCKS_KINDS`).

    python bench/explore/explore28.py --rows 1 24 48 --plans 'bn=64' 'stages=6' ...

Each --plans spec is FIELD=VALUE,... replacing fields of the committed plan (`plan_gemv` with every field forced:
the variant has no `by_row_blocks`, one weight stream and bn at every width, where the committed plan keeps its own).
Prints one line per (plan, rows); --bits compares each plan's 48-row output with the committed plan's, bitwise.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

FIELDS = ("block_k", "split", "bn", "preload", "warps", "stages", "pf_k")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--kind", default="gate_up")
    p.add_argument("--n", type=int, default=8192)
    p.add_argument("--k", type=int, default=2048)
    p.add_argument("--rows", type=int, nargs="*", default=[1, 24, 48])
    p.add_argument("--plans", nargs="*", default=[])
    p.add_argument("--bits", action="store_true")
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--device", default="cuda", help="cpu: a smoke run of --bits under the interpreter (--reps 0)")
    a = p.parse_args()

    import torch

    from lowlat.bench import MIN_LAUNCHES, _GemvCase
    from lowlat.benchmarking import graph_time_us
    from lowlat.kernels._gemv import plan_gemv

    base = plan_gemv(a.n, a.k, kind=a.kind)
    plans = {"committed": base}
    for spec in a.plans:
        fields = {f: getattr(base, f) for f in FIELDS}
        for item in spec.split(","):
            f, _, v = item.partition("=")
            fields[f] = bool(int(v)) if f == "preload" else int(v)
        plans[spec] = plan_gemv(a.n, a.k, kind=a.kind, **fields)
    case = _GemvCase(a.kind, a.n, a.k, 1e-5, torch.device(a.device))
    for name, plan in plans.items():
        print(f"plan {name}: {plan}", flush=True)
    if a.bits:
        ref = case.launch(base, 48, 0).clone()
        for name, plan in plans.items():
            case.check(plan)                       # policy at 48 rows, 6 / 20 rows bitwise against 48
            out = case.launch(plan, 48, 0).clone()
            print(f"bits {name}: equal to committed {torch.equal(out, ref)} "
                  f"max|diff| {(out.float() - ref.float()).abs().max().item():.3g}", flush=True)
    for rep in range(a.reps):
        for name, plan in plans.items():
            for r in a.rows:
                us = graph_time_us(lambda i, r=r: case.launch(plan, r, i), max(case.nc, MIN_LAUNCHES), iters=15)
                print(f"time rep {rep} {name:28s} rows {r:2d} {us:8.2f} us "
                      f"{100 * case.wbytes / (us * 1e-6) / 4.18e12:5.1f}% of 4.18 TB/s", flush=True)


if __name__ == "__main__":
    main()
