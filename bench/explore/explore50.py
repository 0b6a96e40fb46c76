"""Session 37: Llama-3.2-1B's held attention prologue with each warp's K slice cut into CH independent mma chains.

Production (`kernels/attn_prologue_held.py`) gives each warp one K slice of H / 4 = 512 columns: after the PDL wait
its mma is one chain of 32 dependent HMMA, and x's sum of squares (the RMSNorm statistic) one chain of 127
dependent FFMA (`llama_prologue_sm90.py`, session 33). Session 28's 16 K slices (4 slices a warp, 8 HMMA deep, their
partials summed through shared memory) were the only form below 4.27 us at 1 row (4.23-4.28 against 4.36-4.42) but
spilled and lost 0.1 / 0.4 us at 6 / 16 rows. Here the slices stay 4 (one a warp, the same shared-memory pass); each
warp instead runs CH chains over KQ / CH columns each and adds them in registers, in chain order, before that pass:

    prod  production as is
    ch2   2 chains of 16 HMMA a warp (x's statistic: 2 partial sums of 64 squares), added in chain order
    ch4   4 chains of 8 HMMA a warp (4 partial sums of 32 squares)

Same tiling and row blocks, so a row's arithmetic is still independent of M (row invariant); the bits differ from
production's (fp32 partial sums added in another order). Each variant's q / K / V on copy 0 is checked against the
float64 reference within the numerics policy (explore44's `accuracy_verdict`: `check_accuracy("attn_prologue",
...)`, what the GPU tests demand), and every output element written (NaN-filled before, explore47's `launches`),
before the timing: printed, not raised (a prototype's finding). Timed per kernel as explore47 (`LlamaPrologueCase`,
CUDA graphs over rotated cold copies, PDL), A B C C B A, `--rounds` times.

    python bench/explore/explore50.py --rows 1,6,16 --out e50.json
    env -u TRITON_INTERPRET .venv/bin/python bench/explore/explore50.py --sm90 --rows 1,6,16   # CPU: sm_90 compile

CPU compile (`--sm90`, Triton 3.6's ptxas; bench/results/session37/explore50_sm90.json), M 1 / 6 / 16: prod 242 /
242 / 255 registers, HMMA depth 32, FFMA depth 127; ch2 255, 16, 63-74; ch4 255, 8, 52-59 (5 weight loads queued
behind a MOV before the wait); no spills in any.

Measured (session 37 call 5, H100, `session37c.sh`; bench/results/session37/call5), us min-max of 4: every variant
within the policy and every element written; prod 5.10-5.25 / 5.42-5.46 / 7.27-7.28, ch2 5.03-5.24 / 5.44-5.47 /
7.53-7.66, ch4 6.32-6.68 / 6.79-6.80 / 6.98-7.23 at 1 / 6 / 16 rows. Not taken: halving the chains changes nothing at
1 row (paired differences -0.07 / -0.07 / -0.01 / +0.01) and costs 0.3 us at 16; the chains' depth is not what holds
the 1-row prologue above 70% of copy bandwidth.
"""

from __future__ import annotations

import argparse

import torch

from _common import (LlamaPrologueCase, max_rel_diff, module_from_source, run_checked, time_alternated,  # noqa: E402
                     times_line, write_results)
from explore44 import accuracy_verdict
from explore46 import edited
from explore47 import launches, sm90_rows, write_sm90_json
from lowlat.kernels import attn_prologue_held as aph

VARIANTS = ("prod", "ch2", "ch4")
CHAINS = {"ch2": 2, "ch4": 4}

KQ_LINE = "    KQ: gl.constexpr = K // S\n"
AK_LINE = "    ak = gl.arange(0, KQ, layout=gl.SliceLayout(0, gl.SliceLayout(1, LA)))\n"
BK_LINE = "    bk = gl.arange(0, KQ, layout=gl.SliceLayout(0, gl.SliceLayout(2, LB)))\n"
W_LOAD = """    w = gl.load(w_ptr + aoff)
    if FOLD_G:
        w = (w.to(gl.float32) * gl.load(g_ptr + acol + 0 * aoff).to(gl.float32)).to(gl.bfloat16)
"""
X_LOAD = "        xb = gl.load(x_ptr + b * RB * K + boff, mask=bmask, other=0.0)\n"
X_F32 = "        xf = xb.to(gl.float32)\n"
SS_MMA = """        ssw = gl.sum(xf * xf, axis=1)
        acc = mma_v2(w, xb, gl.zeros([S, 16, RB], gl.float32, MMA))
"""


def chained_source(src: str, ch: int) -> str:
    """Production's source with each warp's K slice cut into `ch` chains of KC = KQ / ch columns (chain c: columns
    c KC .. (c + 1) KC of the slice): ch weight tensors held, ch x loads, ch mma chains and ch partial sums of x's
    squares, each set added in chain order (every edit asserted to apply once)."""
    c_range = range(ch)
    w_load = "".join(f"""    w{c} = gl.load(w_ptr + aoff + {c} * KC)
    if FOLD_G:
        w{c} = (w{c}.to(gl.float32) * gl.load(g_ptr + acol + {c} * KC + 0 * aoff).to(gl.float32)).to(gl.bfloat16)
""" for c in c_range)
    x_load = "".join(f"        xb{c} = gl.load(x_ptr + b * RB * K + boff + {c} * KC, mask=bmask, other=0.0)\n"
                     for c in c_range)
    x_f32 = "".join(f"        xf{c} = xb{c}.to(gl.float32)\n" for c in c_range)
    ss_mma = "        ssw = gl.sum(xf0 * xf0, axis=1)\n" + "".join(
        f"        ssw += gl.sum(xf{c} * xf{c}, axis=1)\n" for c in c_range[1:])
    ss_mma += "".join(f"        acc{c} = mma_v2(w{c}, xb{c}, gl.zeros([S, 16, RB], gl.float32, MMA))\n"
                      for c in c_range)
    ss_mma += "        acc = acc0\n" + "".join(f"        acc += acc{c}\n" for c in c_range[1:])
    out = edited(src, KQ_LINE, KQ_LINE + f"    KC: gl.constexpr = KQ // {ch}\n")
    out = edited(out, AK_LINE, AK_LINE.replace("arange(0, KQ,", "arange(0, KC,"))
    out = edited(out, BK_LINE, BK_LINE.replace("arange(0, KQ,", "arange(0, KC,"))
    for old, new in ((W_LOAD, w_load), (X_LOAD, x_load), (X_F32, x_f32), (SS_MMA, ss_mma)):
        out = edited(out, old, new)
    return out


def modules(variants) -> dict:
    """{variant: held prologue module}: production's own for prod, else the edited source's (a module of its own)."""
    src = open(aph.__file__).read()
    return {v: aph if v == "prod" else module_from_source(f"e50_{v}", chained_source(src, CHAINS[v]))
            for v in variants}


def device_run(variants: list, rows: list, rounds: int, out: str | None) -> None:
    """Check each variant (accuracy, every element written) and time them A B .. B A at each width."""
    from lowlat.reference.rope import rope_inv_freq

    mods = modules(variants)
    case = LlamaPrologueCase(torch.device("cuda"))
    cfg, r = case.cfg, case.r
    inv = rope_inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling, torch.float64).to(case.dev)
    results = []
    for m in rows:
        xs, pos, locs = inputs = case.rows(m)
        fns, qs, caches = launches(case, m, mods, inputs)
        written, _ = run_checked(fns, qs, caches, r)
        loc = locs[0].long()
        verdict = {v: accuracy_verdict((qs[v][0], caches[v][0][loc], caches[v][1][loc]), xs[0], case.w0, case.lw,
                                       pos, inv, cfg) for v in fns}
        diff = {v: max(max_rel_diff(a, b) for a, b in zip(qs[v], qs[variants[0]])) for v in fns}
        times = time_alternated(fns, max(r, 8), rounds=rounds)
        print(f"  r{m:<3} us (min/max of {2 * rounds}) {times_line(times)} | every element written "
              + " ".join(f"{v} {w}" for v, w in written.items()) + " | " + "; ".join(
                  f"{v} {x}" for v, x in verdict.items()) + " | max rel diff q vs " + variants[0] + " "
              + " ".join(f"{v} {x:.2g}" for v, x in diff.items()), flush=True)
        results.append(dict(rows=m, us=times, every_element_written=written, accuracy=verdict,
                            max_rel_diff_q_vs_first=diff))
        torch.cuda.empty_cache()
    write_results(out, results, explore="explore50", model=cfg.name,
                  launch="per-kernel bench (LlamaPrologueCase, num_valid_rows int M, 4096-position table, PDL on)",
                  rounds=rounds)


SM90_COLUMNS = [("variant", "variant"), ("rows", "M"), ("registers", "regs"), ("spill_bytes", "spill"),
                ("regs32", "ptx32"), ("before_wait", "pre"), ("ldg128_before", "ldg128<"), ("chain", "chain"),
                ("to_last_store", "to_last"), ("hmma_depth", "hmma depth"), ("ffma_depth", "ffma depth"),
                ("ldg_after", "ldg>")]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1,6,16")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="among " + ", ".join(VARIANTS))
    ap.add_argument("--rounds", type=int, default=2, help="A B .. B A rounds (2 timings each a round)")
    ap.add_argument("--sm90", action="store_true", help="no GPU: compile the variants for sm_90 and print their "
                    "registers, spills and chains after the wait (`sm90_rows`)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    rows = [int(x) for x in args.rows.split(",")]
    variants = [v for v in args.variants.split(",") if v]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        ap.error(f"unknown variants {unknown}; choose among {VARIANTS}")
    if not args.sm90:
        device_run(variants, rows, args.rounds, args.out)
        return
    from llama_prologue_sm90 import table

    res = sm90_rows(variants, rows, modules(variants))
    print(table(res, SM90_COLUMNS))
    write_sm90_json(args.out, res, SM90_COLUMNS)


if __name__ == "__main__":
    main()
