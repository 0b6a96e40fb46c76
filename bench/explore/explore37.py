"""Session 28: is the held prologue's 1-row time per kernel set by how many of its programs fit on an SM?

`kernels/attn_prologue_held.py` holds a program's 16 weight rows in registers (H 2048: 128 a thread at 4 warps). With
g multiplied in registers (FusedModel's form, `fused_model.HELD_FOLD` "registers") the sm_90 build takes 242-255
registers a thread, so two programs fit on an SM: Llama-3.2-1B's 192 programs fill 192 of 264 slots, and in a chain of
launches the next launch's programs find only 72 free slots until this launch's programs exit, so most of them load
their weights after it, not during its post-wait chain (x, the mma, the stores). Hypothesis: with three programs an SM
(at most 168 registers: 396 slots >= 2 x 192) the next launch is resident, its weights in flight, while this one
finishes. `fold_attn_norm`'s weights (FOLD_G off: g already multiplied in, the same bits) build with 172 registers at
NMB 1 (1-8 rows), 168 under maxnreg=168 without spills (8 / 88 bytes spilled at NMB 2 / 6).

Variants, Llama-3.2-1B per kernel like `bench/bench_attn_prologue.py` (a CUDA graph over rotated cold copies, PDL
on), A B C C B A, the q outputs compared (the same bits: only registers and where g is multiplied differ):
    registers     production (g passed, multiplied in registers)
    folded        `fold_attn_norm`'s weights, attn_norm None
    folded_r168   the same launched with maxnreg=168 (three programs an SM)

    python bench/explore/explore37.py --out results.json
"""

from __future__ import annotations

import argparse

import torch

from _common import (LlamaPrologueCase, module_from_source, time_alternated, times_line,  # noqa: E402
                     write_results)
from lowlat.kernels import attn_prologue_held as prod

LAUNCH = " num_warps=WARPS,\n"


def capped_source(src: str, cap: int) -> str:
    """The production source with its launch given maxnreg=cap."""
    assert src.count(LAUNCH) == 1, "the production launch changed"
    return src.replace(LAUNCH, f" num_warps=WARPS, maxnreg={cap},\n")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1,6,16")
    ap.add_argument("--cap", type=int, default=168)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    capped = module_from_source(f"aph_r{args.cap}", capped_source(open(prod.__file__).read(), args.cap))
    case = LlamaPrologueCase(torch.device("cuda"))
    cfg, lw, r = case.cfg, case.lw, case.r
    wfs = [prod.fold_attn_norm(w, lw.attn_norm) for w in case.ws]
    variants = {"registers": (prod, case.ws, lw.attn_norm), "folded": (prod, wfs, None),
                f"folded_r{args.cap}": (capped, wfs, None)}
    results = []
    for m in [int(x) for x in args.rows.split(",")]:
        xs, pos, locs = case.rows(m)
        kc, vc = case.cache(m), case.cache(m)
        qs = {v: [case.q_out(m) for _ in range(r)] for v in variants}

        def fn(v):
            mod, wl, g = variants[v]
            return lambda i: mod.attn_prologue_held(xs[i % r], wl[i % r], g, pos, locs[i % r], m, kc, vc, case.table,
                                                    cfg=cfg, out_q=qs[v][i % r], use_pdl=True)

        fns = {v: fn(v) for v in variants}
        for v in variants:
            fns[v](0)
        torch.cuda.synchronize()
        same = {v: torch.equal(qs["registers"][0], qs[v][0]) for v in variants}
        times = time_alternated(fns, max(r, 8))
        line = times_line(times)
        print(f"  r{m:<3} us (min/max of 2) {line} | q bitwise equal to registers {same}", flush=True)
        results.append(dict(rows=m, us=times, q_bitwise_equal=same))
    write_results(args.out, results, model=cfg.name, cap=args.cap)


if __name__ == "__main__":
    main()
