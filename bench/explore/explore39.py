"""Session 28: the held attention prologue releasing the next launch at its start (`attn_prologue_held(...,
early_release=True)`) against the production rule (released after its wait).

explore37 (session 28 call 1) showed that three programs an SM do not shorten the held prologue's 1-row time per
kernel (4.47 us under maxnreg=168 against 4.38-4.40): the next launch's programs are not short of room; they are not
yet released. Under the production rule launch i+1 starts only once every program of launch i has passed its wait,
so its 12.6 MB of weights load during launch i's post-wait chain at best. Released at its start (explore31, session
24: 3.93 against 4.65 us for an FMA QKV kernel), launch i+1's programs start as soon as launch i's are all resident.
Llama-3.2-1B per kernel like `bench/bench_attn_prologue.py` (a CUDA graph over rotated cold copies, PDL on, g
multiplied in registers as FusedModel runs it), A B B A, the q outputs compared (the same bits: only the release
point differs).

    python bench/explore/explore39.py --out results.json
"""

from __future__ import annotations

import argparse

import torch

from _common import LlamaPrologueCase, time_alternated, times_line, write_results  # noqa: E402 (repository first)
from lowlat.kernels.attn_prologue_held import attn_prologue_held


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1,6,16,48")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    case = LlamaPrologueCase(torch.device("cuda"))
    cfg, lw, r = case.cfg, case.lw, case.r
    variants = {"after_wait": False, "early": True}
    results = []
    for m in [int(x) for x in args.rows.split(",")]:
        xs, pos, locs = case.rows(m)
        kc, vc = case.cache(m), case.cache(m)
        qs = {v: [case.q_out(m) for _ in range(r)] for v in variants}

        def fn(v):
            return lambda i: attn_prologue_held(xs[i % r], case.ws[i % r], lw.attn_norm, pos, locs[i % r], m, kc, vc,
                                                case.table, cfg=cfg, out_q=qs[v][i % r], use_pdl=True,
                                                early_release=variants[v])

        times = time_alternated({v: fn(v) for v in variants}, max(r, 8))
        same = all(torch.equal(qs["after_wait"][i], qs["early"][i]) for i in range(r))
        line = times_line(times)
        print(f"  r{m:<3} us (min/max of 2) {line} | q bitwise equal, every copy: {same}", flush=True)
        results.append(dict(rows=m, us=times, q_bitwise_equal=same))
    write_results(args.out, results, model=cfg.name)


if __name__ == "__main__":
    main()
