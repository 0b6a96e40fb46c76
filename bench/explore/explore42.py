"""Session 28: the held prologue with 16 K slices (explore40's only gain at 1 row) with the norm weight multiplied in
registers (FusedModel's HELD_FOLD "registers") or folded into the weights at build (`fold_attn_norm`, HELD_FOLD
"build": 70-80 registers fewer, no spills at 16 slices where "registers" spills 8-16 bytes at 1-2 row blocks).

explore40 (session 28 call 3): 16 slices 4.25 us at 1 row against 4.38-4.41 for 4 (70.4% of copy bandwidth), but
+0.1 / +0.4 us at 6 / 16 rows; its sm_90 build spills there. Variants, Llama-3.2-1B per kernel as explore40, A B C D
D C B A: s4 (production), s4_build, s16, s16_build; the outputs' largest relative difference from production printed
(s4_build is production's bits, the s16 pair share theirs).

    python bench/explore/explore42.py --out results.json
"""

from __future__ import annotations

import argparse

import torch

from _common import (LlamaPrologueCase, max_rel_diff, time_alternated, times_line,  # noqa: E402
                     write_results)
from explore40 import with_slices
from lowlat.kernels import attn_prologue_held as aph


def compare(case: LlamaPrologueCase, variants: dict, rows, out: str | None) -> None:
    """Time `variants` ({name: (held prologue module, its r weight copies, g or None)}, the first the baseline) at each
    width of `rows` A B .. B A, print and (out) write them with each q's largest relative difference from the
    first's."""
    cfg, lw, r = case.cfg, case.lw, case.r
    base = next(iter(variants))
    results = []
    for m in rows:
        xs, pos, locs = case.rows(m)
        kc, vc = case.cache(m), case.cache(m)
        qs = {v: case.q_out(m) for v in variants}

        def fn(v):
            mod, wl, g = variants[v]
            return lambda i: mod.attn_prologue_held(xs[i % r], wl[i % r], g, pos, locs[i % r], m, kc, vc, case.table,
                                                    cfg=cfg, out_q=qs[v], use_pdl=True)
        fns = {v: fn(v) for v in variants}
        for v in variants:
            fns[v](0)
        torch.cuda.synchronize()
        diff = {v: max_rel_diff(qs[v], qs[base]) for v in variants}
        times = time_alternated(fns, max(r, 8))
        line = times_line(times)
        print(f"  r{m:<3} us (min/max of 2) {line} | max rel diff vs {base} "
              + " ".join(f"{v} {x:.2g}" for v, x in diff.items()), flush=True)
        results.append(dict(rows=m, us=times, max_rel_diff=diff))
    write_results(out, results, model=cfg.name)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1,6,16,48")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    s16 = with_slices(aph, "SLICES = 4 ", 16, "aph")
    case = LlamaPrologueCase(torch.device("cuda"))
    g = case.lw.attn_norm
    wfs = [aph.fold_attn_norm(w, g) for w in case.ws]
    compare(case, {"s4": (aph, case.ws, g), "s4_build": (aph, wfs, None), "s16": (s16, case.ws, g),
                   "s16_build": (s16, wfs, None)}, [int(x) for x in args.rows.split(",")], args.out)


if __name__ == "__main__":
    main()
