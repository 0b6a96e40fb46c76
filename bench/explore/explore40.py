"""Session 28: the held kernels' mma chains cut into more K slices (independent accumulators).

Each warp of `kernels/attn_prologue_held.py` (S = 4 slices of K / 4 columns, one a warp) accumulates its slice in
one dependent chain of K / 64 mma.sync (H 2048: 32 m16n8k16 a row block), and `kernels/residual_gemv_held.py` (S = 8
slices at 8 warps, K 4096) one of 32 as well. An mma's result feeds the next, so after the wait the chain costs about
32 mma latencies (~30 cycles each: ~0.5 us) whatever the bytes. With S = 8 / 16 / 32 slices (still one batch of the
batched mma_v2 a slice, so a warp holds S / Q independent accumulators, each K / S columns) the chains shorten to
K / 16 / S mma and ptxas can interleave them; the slices' partials are then added in slice order as before (more
of them). Different bits from production (another summation order), each variant row invariant as production is.
Hypothesis (explore37 / explore39 refuted residency and the release point): the 1-row time per kernel falls by up to
~0.3 us. Per kernel like `bench/bench_attn_prologue.py` / explore35 (CUDA graphs over rotated cold copies, PDL on),
A B C D D C B A, the outputs' largest relative difference from production printed (a broken variant shows).

    python bench/explore/explore40.py --out results.json
"""

from __future__ import annotations

import argparse

import torch

from _common import (LlamaPrologueCase, Qwen3OutProjCase, max_rel_diff, module_from_source,  # noqa: E402
                     time_alternated, times_line, write_results)
from lowlat.kernels import attn_prologue_held as aph
from lowlat.kernels import residual_gemv_held as rgh


def with_slices(mod, line: str, s: int, tag: str):
    """`mod` with its SLICES constant line replaced by SLICES = s (a module of its own)."""
    src = open(mod.__file__).read()
    assert src.count(line) == 1, f"{mod.__name__}: {line!r} changed"
    return module_from_source(f"{tag}_s{s}", src.replace(line, f"SLICES = {s}"))


def prologue(rows_list, results):
    mods = {"s4": aph, **{f"s{s}": with_slices(aph, "SLICES = 4 ", s, "aph") for s in (8, 16, 32)}}
    case = LlamaPrologueCase(torch.device("cuda"))
    cfg, lw, r = case.cfg, case.lw, case.r
    for m in rows_list:
        xs, pos, locs = case.rows(m)
        kc, vc = case.cache(m), case.cache(m)
        qs = {v: case.q_out(m) for v in mods}

        def fn(v):
            return lambda i: mods[v].attn_prologue_held(xs[i % r], case.ws[i % r], lw.attn_norm, pos, locs[i % r], m,
                                                        kc, vc, case.table, cfg=cfg, out_q=qs[v], use_pdl=True)
        fns = {v: fn(v) for v in mods}
        for v in mods:
            fns[v](0)
        torch.cuda.synchronize()
        diff = {v: max_rel_diff(qs[v], qs["s4"]) for v in mods}
        times = time_alternated(fns, max(r, 8))
        line = times_line(times)
        print(f"  prologue r{m:<3} us (min/max of 2) {line} | max rel diff vs s4 "
              + " ".join(f"{v} {x:.2g}" for v, x in diff.items()), flush=True)
        results.append(dict(kernel="attn_prologue_held", model=cfg.name, rows=m, us=times, max_rel_diff=diff))


def out_proj(rows_list, results):
    mods = {"s8": rgh, **{f"s{s}": with_slices(rgh, "SLICES = 8 ", s, "rgh") for s in (16, 32)}}
    compare_out_proj(mods, rows_list, results, "max rel diff vs s8", lambda outs, sss: {
        v: max(max_rel_diff(outs[v], outs["s8"]), max_rel_diff(sss[v], sss["s8"])) for v in mods})


def compare_out_proj(mods: dict, rows_list, results: list, what: str, check) -> None:
    """Time `mods` (held residual GEMV modules) on Qwen3-30B-A3B's out_proj with the sums (`Qwen3OutProjCase`) at each
    width A B .. B A after one launch each into NaN outputs; check(outs, sss) -> what is printed (as `what`) and
    recorded beside the times."""
    case = Qwen3OutProjCase(torch.device("cuda"))
    n, k, nc = case.n, case.k, case.nc
    for m in rows_list:
        a, x = case.rows(m)
        outs = {v: torch.full_like(x, float("nan")) for v in mods}
        sss = {v: torch.full((m, n // 16), float("nan"), device=x.device) for v in mods}

        def fn(v):
            return lambda i: mods[v].residual_gemv_held(a, case.ws[i % nc], x, out=outs[v], sum_sq_out=sss[v],
                                                        use_pdl=True)
        fns = {v: fn(v) for v in mods}
        for v in mods:
            fns[v](0)
        torch.cuda.synchronize()
        checked = check(outs, sss)
        times = time_alternated(fns, max(nc, 8))
        line = times_line(times)
        print(f"  out_proj r{m:<3} us (min/max of 2) {line} | {what} {checked}", flush=True)
        results.append(dict(kernel="residual_gemv_held", n=n, k=k, rows=m, us=times, check=checked))


def kernels_main(sections: dict) -> None:
    """--rows, --kernels (names among `sections`: {name: fn(rows, results)}), --out: run each, write the results."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1,6,16,48")
    ap.add_argument("--kernels", default=",".join(sections))
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    rows = [int(x) for x in args.rows.split(",")]
    results = []
    for name in args.kernels.split(","):
        sections[name](rows, results)
    write_results(args.out, results)


def main() -> None:
    kernels_main({"prologue": prologue, "out_proj": out_proj})


if __name__ == "__main__":
    main()
