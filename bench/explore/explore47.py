"""Session 33: Llama-3.2-1B's held attention prologue with the first row block's RoPE inputs moved across the PDL
wait (explore46's `rope_late` edit, never tried for Llama).

`llama_prologue_sm90.py`'s `load_stalls` (CPU compile, bench/results/session33/llama_prologue_sm90.json) found that
production issues all 48 of a thread's 16-byte weight / g loads after an instruction that waits on the position load:
the first row block's RoPE inputs, loaded before the wait, range-check the position before the cos / sin table loads
(`_rope_inputs`), and ptxas places that check ahead of the weight loads, so the weights start one load latency late.
For Qwen3, explore46's rope_late edit removed the stall and gained 0.1-0.15 us at 1 row in one form. Variants, each
g multiplied in registers and launched as the per-kernel bench launches production (`bench_attn_prologue.py`'s
held_pdl, explore40 / explore42's s4: `_common.LlamaPrologueCase`, num_valid_rows the int M, a 4096-position table,
PDL on, the next launch released after the wait):

    prod        production (`kernels/attn_prologue_held.py` as is): NOTES' 4.37-4.46 us at 1 row
    rope_late   the first row block's positions, KV slots and cos / sin loaded after the wait, as the later blocks'
                are (explore46's ROPE_PRE / ROPE_SEL / ROPE_AFTER on the plain source)
    rope_split  the first row block's positions and KV slots loaded before the wait, the cos / sin table loads (and
                the positions' range check that masks them) after it (`SPLIT_HELPERS`, `SPLIT_PRE`, `SPLIT_SEL`)

The edits move loads, not arithmetic: each variant's q (every rotated copy) and K / V caches (every slot, NaN-filled
before) are checked bitwise equal to prod's before the timing (printed, not raised: a prototype's finding), and prod
is checked to have written every slot. Timed per kernel like explore42 (CUDA graphs over rotated cold copies), A B
C C B A, `--rounds` times (2: min / max of 4).

    python bench/explore/explore47.py --rows 1,6,16 --out e47.json

With --sm90 nothing runs: each variant is compiled for sm_90 on this machine (TRITON_INTERPRET unset) at each --rows
as the timed launch specialises it (`llama_prologue_sm90.launch_spec`, form "timed") and read by
`llama_prologue_sm90.compiled_row` (registers, spills, `load_stalls`, `chain_after_wait`, ...) and
`narrow_loads_after_wait` (where the RoPE inputs' 4- / 8-byte loads issue after the wait); a table is printed:

    env -u TRITON_INTERPRET .venv/bin/python bench/explore/explore47.py --sm90 --rows 1,6,16

CPU compile (Triton 3.6's ptxas, session 33), M 1 / 6 / 16: prod 242 / 242 / 255 registers, no spills, all 48
LDG.128 behind the positions' range check (ISETP <- LDG.E.64); rope_late 242 / 242 / 250, rope_split 244 / 244 / 255,
both no spills and no wait on a load before the PDL wait (48 LDG.128 before it). Their price, after the wait: ptxas
issues the first block's cos / sin loads late in the mma chain (~100 instructions before the last HMMA of block 0;
rope_late's position load ~270 instructions in, so two dependent round trips), and the chain to the first store grows
706 -> 735 (rope_late) / 722 (rope_split) instructions at 1 row. Not tried (`x_first`): after the wait ptxas issues
x's 16 loads in 5-7 batches between the HMMA (each batch behind an HMMA that waits on an earlier one), in prod and in
`fold_attn_norm`'s 172-register build alike (ptxas's choice, not the 255-register limit), and Gluon gives no cheap
handle on the order ptxas issues loads in.
"""

from __future__ import annotations

import argparse
import sys

import torch

from _common import (LlamaPrologueCase, max_rel_diff, module_from_source, time_alternated,  # noqa: E402
                     times_line, write_results)
from explore46 import ROPE_AFTER, ROPE_PRE, ROPE_SEL, edited
from lowlat.kernels import attn_prologue_held as aph

VARIANTS = ("prod", "rope_late", "rope_split")
KERNEL_HEAD = "\n\n@gluon.jit\ndef _held_prologue_kernel("
#: rope_split's helpers: `_rope_inputs` cut in two, the same loads, masks and arithmetic (the same bits)
SPLIT_HELPERS = '''

@gluon.jit
def _rope_slots(pos_ptr, loc_ptr, erow, M, nvr):
    """`_rope_inputs`' first half: rows erow's positions (0 past M) and KV slots (int64; 0 past M or num_valid_rows),
    no instruction on either loaded value (their consumers come after the wait)."""
    emok = erow < M
    pos = gl.load(pos_ptr + erow, mask=emok, other=0)
    loc = gl.load(loc_ptr + erow, mask=emok & (erow < nvr), other=0)
    return pos, loc


@gluon.jit
def _rope_cos_sin(tab_ptr, pos, erow, M, max_pos, j, D: gl.constexpr, HALF: gl.constexpr):
    """`_rope_inputs`' second half: the cos / sin [8, RB] of rotary indices j at positions pos (0 past M or outside
    the table)."""
    ok = gl.expand_dims((erow < M) & (pos >= 0) & (pos < max_pos), 0) & gl.expand_dims(j >= 0, 1)
    tab = tab_ptr + gl.expand_dims(pos, 0) * D + gl.expand_dims(j, 1)
    return gl.load(tab, mask=ok, other=0.0), gl.load(tab + HALF, mask=ok, other=0.0)
'''
SPLIT_PRE = "    pos0, loc0 = _rope_slots(pos_ptr, loc_ptr, tm, M, nvr)\n"
SPLIT_SEL = '''        if b == 0:
            loc = loc0.to(gl.int64)
            cos, sin = _rope_cos_sin(tab_ptr, pos0, erow, M, max_pos, j0 + ti, D, HALF)
        else:
            loc, cos, sin = _rope_inputs(pos_ptr, loc_ptr, tab_ptr, erow, M, nvr, max_pos, j0 + ti, D, HALF)
'''


def variant_sources(src: str) -> dict:
    """{variant: kernel module source} from the production held prologue's source `src` (every edit asserted to
    apply once: explore46's `edited`)."""
    late = edited(edited(src, ROPE_PRE, ""), ROPE_SEL, ROPE_AFTER)
    split = edited(edited(edited(src, KERNEL_HEAD, SPLIT_HELPERS + KERNEL_HEAD), ROPE_PRE, SPLIT_PRE), ROPE_SEL,
                   SPLIT_SEL)
    return {"prod": src, "rope_late": late, "rope_split": split}


def modules(variants) -> dict:
    """{variant: held prologue module}: production's own for prod, else the edited source's (a module of its own)."""
    sources = variant_sources(open(aph.__file__).read())
    return {v: aph if v == "prod" else module_from_source(f"e47_{v}", sources[v]) for v in variants}


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """a and b bitwise identical (NaN equal to the same NaN: the caches' unwritten slot 0)."""
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a.view(torch.int16), b.view(torch.int16))


def launches(case: LlamaPrologueCase, m: int, mods: dict, rows=None):
    """({variant: launch(i)}, {variant: its r q outputs}, {variant: (K cache, V cache)}) at width m: each module's
    `attn_prologue_held` on copy i as the per-kernel bench launches it (g in registers, num_valid_rows the int m, PDL
    on), each variant with its own NaN-filled caches and q outputs (bitwise comparable). rows: the width's inputs
    (xs, positions, locs) as `case.rows(m)` gives them (drawn here when None)."""
    xs, pos, locs = rows if rows is not None else case.rows(m)
    cfg, lw, r = case.cfg, case.lw, case.r
    caches = {v: (case.cache(m, float("nan")), case.cache(m, float("nan"))) for v in mods}
    qs = {v: [case.q_out(m) for _ in range(r)] for v in mods}

    def fn(v):
        mod, (kc, vc) = mods[v], caches[v]
        return lambda i: mod.attn_prologue_held(xs[i % r], case.ws[i % r], lw.attn_norm, pos, locs[i % r], m, kc, vc,
                                                case.table, cfg=cfg, out_q=qs[v][i % r], use_pdl=True)
    return {v: fn(v) for v in mods}, qs, caches


def device_run(variants: list, rows: list, rounds: int, out: str | None) -> None:
    """Check each variant bitwise against prod (the first), then time them A B .. B A at each width."""
    assert variants[0] == "prod", "prod first: the baseline of the bitwise check"
    mods = modules(variants)
    case = LlamaPrologueCase(torch.device("cuda"))
    results = []
    for m in rows:
        fns, qs, caches = launches(case, m, mods)
        for v in fns:
            for i in range(case.r):
                fns[v](i)
        torch.cuda.synchronize()
        base_q, (base_k, base_v) = qs["prod"], caches["prod"]
        written = not (bool(base_k[1:].isnan().any()) or bool(base_v[1:].isnan().any())
                       or any(bool(q.isnan().any()) for q in base_q))
        bitwise = {v: all(bits_equal(a, b) for a, b in zip(qs[v], base_q)) and bits_equal(caches[v][0], base_k)
                   and bits_equal(caches[v][1], base_v) for v in fns}
        diff = {v: max(max_rel_diff(a, b) for a, b in zip(qs[v], base_q)) for v in fns}
        times = time_alternated(fns, max(case.r, 8), rounds=rounds)
        print(f"  r{m:<3} us (min/max of {2 * rounds}) {times_line(times)} | prod wrote every slot {written}, "
              "bitwise q/K/V vs prod " + " ".join(f"{v} {b}" for v, b in bitwise.items())
              + " | max rel diff q " + " ".join(f"{v} {x:.2g}" for v, x in diff.items()), flush=True)
        results.append(dict(rows=m, us=times, prod_wrote_every_slot=written, bitwise_vs_prod=bitwise,
                            max_rel_diff_q=diff))
    write_results(out, results, model=case.cfg.name, launch="per-kernel bench (LlamaPrologueCase, num_valid_rows int "
                  "M, 4096-position table, PDL on)", rounds=rounds)


def sm90_rows(variants: list, rows: list, mods: dict | None = None) -> list:
    """Each variant compiled for sm_90 on this machine at each width as the timed launch specialises it
    (`llama_prologue_sm90.launch_spec(cfg, m, 4, True, "timed")`), read by `llama_prologue_sm90.compiled_row`.
    mods: {variant: held prologue module} (default: this explore's `modules`)."""
    import os
    import tempfile

    from llama_prologue_sm90 import MODEL, compiled_row, launch_spec
    from lowlat.config import preset

    cfg = preset(MODEL)
    mods = mods or modules(variants)
    tmp = tempfile.mkdtemp()
    out = []
    for v in variants:
        for m in rows:
            spec = launch_spec(cfg, m, aph.SLICES, True, "timed")
            dump = os.path.join(tmp, f"{v}_{m}")
            row = compiled_row(mods[v]._held_prologue_kernel, spec, dump, variant=v, rows=m,
                               constants=sorted(k for k in ("M", "nvr_int") if k in spec["constexprs"]),
                               divisible=spec["divisible"])
            out.append(dict(row, **narrow_loads_after_wait(open(dump + ".sass").read())))
    return out


def narrow_loads_after_wait(sass: str) -> dict:
    """Where the RoPE inputs' loads land in the sm_90 SASS after the PDL wait (ACQBULK): the positions of the 4- and
    8-byte global loads after it (positions, KV slots, cos / sin; x's are 16-byte), counted from the wait as
    `chain_after_wait` counts, beside the first BAR.SYNC (the slices' partials summed after it; cos / sin are first
    used after that)."""
    import re

    lines = [ln for ln in sass.splitlines() if re.match(r"\s*/\*[0-9a-f]{4,}\*/", ln)]
    wait = next(i for i, ln in enumerate(lines) if "ACQBULK" in ln)
    tail = lines[wait + 1:]
    bar = next((i for i, ln in enumerate(tail) if "BAR.SYNC" in ln), None)
    return {"narrow_ldg_after": [i for i, ln in enumerate(tail) if re.search(r"\bLDG\.E(\.64)? ", ln)],
            "first_bar": bar}


#: the --sm90 table's columns ((field, header) of `compiled_row`'s row)
SM90_COLUMNS = [("variant", "variant"), ("rows", "M"), ("registers", "regs"), ("spill_bytes", "spill"),
                ("regs32", "ptx32"), ("stall", "1st stall"), ("ldg128_behind_stall", "ldg>stall"),
                ("weight_stall", "1st weight stall"), ("ldg128_behind_weight_stall", "ldg>wstall"),
                ("before_wait", "pre"), ("ldg128_before", "ldg128<"), ("chain", "chain"),
                ("to_last_store", "to_last"), ("hmma_depth", "depth"), ("ffma_depth", "ffma"), ("ldg_after", "ldg>"),
                ("ldg_after_store", "ldg>stg"), ("narrow_ldg_after", "rope ldg>"), ("last_hmma", "hmma$"),
                ("first_bar", "bar")]


def sm90_table(rows: list) -> str:
    """`rows` (`sm90_rows`') as a markdown table of `SM90_COLUMNS`."""
    from llama_prologue_sm90 import table

    return table(rows, SM90_COLUMNS)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1,6,16")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="among " + ", ".join(VARIANTS) + " (prod first)")
    ap.add_argument("--rounds", type=int, default=2, help="A B .. B A rounds (2 timings each a round)")
    ap.add_argument("--sm90", action="store_true", help="no GPU: compile the variants for sm_90 and print their "
                    "registers, spills, load stalls and chain after the wait (`sm90_rows`)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    rows = [int(x) for x in args.rows.split(",")]
    variants = [v for v in args.variants.split(",") if v]
    if not args.sm90:
        device_run(variants, rows, args.rounds, args.out)
        return
    res = sm90_rows(variants, rows)
    print(sm90_table(res))
    write_sm90_json(args.out, res, SM90_COLUMNS)


def write_sm90_json(out: str | None, res: list, columns: list) -> None:
    """With `out`, the CPU compile's rows as JSON (provenance: no device, Triton's version, the command)."""
    if out:
        import json

        import triton
        with open(out, "w") as f:
            json.dump(dict(device="none: compiled for sm_90 on the CPU (bundled ptxas)", triton=triton.__version__,
                           model="Llama-3.2-1B", command=" ".join(sys.argv), columns=dict(columns),
                           results=res), f, indent=1)


if __name__ == "__main__":
    main()
