"""Session 29: where the held attention prologue releases the next launch (Llama-3.2-1B), with two or three programs
an SM.

Session 28 measured the release points one at a time: three programs an SM (folded weights under maxnreg=168, explore37)
4.47 against 4.38-4.40 us at 1 row with the production release (after the wait), and the release at the program's
start (explore39) 5.26 with two programs an SM. Not measured: the two together, nor a release between them. Session
24's FMA kernels (explore31) passed 70% only when released before their wait. Here "landed" releases once the thread's
held weights are in its registers (`_common.landed_release_source`: one predicated griddepcontrol.launch_dependents a
weight register, so ptxas waits for the loads first): launch i+1's weights then stream while launch i waits and runs
its chain, but not while launch i's own weights are loading. Per kernel like `bench/bench_attn_prologue.py` (a CUDA
graph over rotated cold copies, PDL on), A B C .. C B A twice, q compared with production's (the same bits: only the
release point and the registers differ).

    registers             production (g multiplied in registers, released after the wait; two programs an SM)
    registers_landed      the same released when its weights have landed
    folded_r168           `fold_attn_norm`'s weights, maxnreg=168 (three programs an SM: 396 slots >= 2 x 192)
    folded_r168_landed    the same released when its weights have landed
    folded_r168_early     the same released at its start (`early_release=True`)

    python bench/explore/explore45.py --out results.json
"""

from __future__ import annotations

import argparse

import torch

from _common import (LlamaPrologueCase, landed_release_source, module_from_source, time_alternated,  # noqa: E402
                     times_line, write_results)
from explore37 import capped_source
from lowlat.kernels import attn_prologue_held as prod


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1,6,16,48")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    src = open(prod.__file__).read()
    landed = module_from_source("aph_landed", landed_release_source(src))
    capped = module_from_source("aph_r168", capped_source(src, 168))
    capped_landed = module_from_source("aph_r168_landed", landed_release_source(capped_source(src, 168)))
    case = LlamaPrologueCase(torch.device("cuda"))
    cfg, lw, r = case.cfg, case.lw, case.r
    wfs = [prod.fold_attn_norm(w, lw.attn_norm) for w in case.ws]
    variants = {"registers": (prod, case.ws, lw.attn_norm, False),
                "registers_landed": (landed, case.ws, lw.attn_norm, False),
                "folded_r168": (capped, wfs, None, False),
                "folded_r168_landed": (capped_landed, wfs, None, False),
                "folded_r168_early": (capped, wfs, None, True)}
    results = []
    for m in [int(x) for x in args.rows.split(",")]:
        fns, qs = case.launches(m, variants)
        for v in variants:
            fns[v](0)
        torch.cuda.synchronize()
        same = {v: torch.equal(qs["registers"][0], qs[v][0]) for v in variants}
        times = time_alternated(fns, max(r, 8), rounds=2)
        print(f"  r{m:<3} us (min/max of 4) {times_line(times)} | q bitwise equal to registers {same}", flush=True)
        results.append(dict(rows=m, us=times, q_bitwise_equal=same))
    write_results(args.out, results, model=cfg.name)


if __name__ == "__main__":
    main()
