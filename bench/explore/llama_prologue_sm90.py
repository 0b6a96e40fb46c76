"""Session 33 (CPU only): explore46's compile analysis (`--sm90`: registers, spills, shared memory, PTX registers held
across the PDL wait, SASS around it) applied to Llama-3.2-1B's held attention prologue, the production kernel
(`lowlat/kernels/attn_prologue_held.py`) and session 28's 16-K-slice form (explore40 / explore42's `s16`, built by
`explore40.with_slices`), plus the SASS of the chain after the wait (`chain_after_wait`).

Nothing runs on a GPU: each variant is compiled for sm_90 on this machine (Triton's bundled ptxas, TRITON_INTERPRET
unset) at each --rows, specialised as Triton's launcher specialises the launch's arguments (`launch_spec`: each int
argument's value through Triton's own `native_specialize_impl`, so an int equal to 1 (M, num_valid_rows at 1 row) is
a constant and one divisible by 16 (the strides, Hq, max_pos, M 16) is marked so; every pointer 16-byte aligned, as
torch's allocations and FusedModel's offset-0 views are). No maxnreg (neither launch passes one). Variants:

    prod        FusedModel's launch (`FusedModel._run`): g multiplied in registers (HELD_FOLD "registers", FOLD_G),
                num_valid_rows the device tensor nvalid (NVR_FROM_PTR; nvr_int 0), the RoPE table of
                min(max_position_embeddings, MAX_ROPE_POSITIONS) = 131072 positions, 4 K slices
    s4          the same kernel as the per-kernel timings launch it (`bench_attn_prologue.py`'s held_pdl, explore40 /
                explore42's s4, `_common.LlamaPrologueCase`): num_valid_rows the int M (a constant 1 at 1 row), a
                4096-position table; the 4.37-4.46 us at 1 row of NOTES are this launch's
    s4_build    s4 on `fold_attn_norm`'s weights (FOLD_G off, attn_norm None: explore42's s4_build)
    s16         explore40 / explore42's 16 K slices (g in registers), launched as s4
    s16_build   the same on folded weights (explore42's s16_build)

Columns: registers / spill bytes (ptxas -v), shared memory (bytes), PTX 32-bit registers and predicates held across
griddepcontrol.wait (`explore46.live_across_wait`), SASS spill stores before / after the wait, LDG.128 issued after
the first STL / STS before the wait (`explore46.sass_around_wait`), the first instruction before the wait that waits
on one of the program's own loads and the LDG.128 issued after it (`load_stalls`: any such wait, a spill store's
included; and the first on a 16-byte weight / g load), and `chain_after_wait`: SASS instructions before the wait,
LDG.128 before it, instructions after it up to the first STG of the outputs (the chain) and to the last STG, the
first HMMA, the HMMA and their longest data-dependent chain (`hmma_depth`), the same of FFMA (x's sum of squares),
HMUL2 (g multiplied into the weights), LDG (and those after the first STG) and BAR.SYNC after it.

    env -u TRITON_INTERPRET .venv/bin/python bench/explore/llama_prologue_sm90.py --rows 1,6,16 --out llama_sm90.json

--qwen3 VARIANTS reads explore46's Qwen3-30B-A3B variants the same way (compiled as `explore46.py --sm90` compiles
them: maxnreg 168, `explore46.sm90_spec`), to set the Llama rows beside the builds session 32 timed:

    env -u TRITON_INTERPRET .venv/bin/python bench/explore/llama_prologue_sm90.py --variants "" \
        --qwen3 plain,qk_own_nosum,nosum_const,nosum_rope_late,nosum_nobranch,nosum_lean
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
from pathlib import Path

from _common import module_from_source  # noqa: E402 (puts the repository on sys.path)
from explore40 import with_slices
from explore46 import live_across_wait, sass_around_wait, sm90_spec
from lowlat.config import preset
from lowlat.kernels import attn_prologue_held as aph

MODEL = "Llama-3.2-1B"
#: {variant: (K slices, FOLD_G, launch form)}: "fused" as FusedModel launches it, "timed" as the per-kernel benches do
VARIANTS = {"prod": (4, True, "fused"), "s4": (4, True, "timed"), "s4_build": (4, False, "timed"),
            "s16": (16, True, "timed"), "s16_build": (16, False, "timed")}
TIMED_TABLE = 4096          # `_common.LlamaPrologueCase` / bench_attn_prologue.py's RoPE table (positions)


def launch_ints(cfg, m: int, form: str) -> dict:
    """The runtime int arguments `attn_prologue_held` passes at width m: out_q [m, Hq, D] and the KV caches [S, Hkv,
    D] contiguous; num_valid_rows the int m ("timed") or a device tensor ("fused": NVR_FROM_PTR, nvr_int 0); max_pos
    the RoPE table's rows (FusedModel's `rope_table(cfg, min(max_position_embeddings, MAX_ROPE_POSITIONS))`)."""
    from lowlat.runtime.fused_model import MAX_ROPE_POSITIONS

    hq, hkv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    fused = form == "fused"
    return dict(nvr_int=0 if fused else m, stride_qm=hq * d, stride_qh=d, stride_kcs=hkv * d, stride_kch=d,
                stride_vcs=hkv * d, stride_vch=d, M=m, Hq=hq, Hkv=hkv,
                max_pos=min(cfg.max_position_embeddings, MAX_ROPE_POSITIONS) if fused else TIMED_TABLE)


def specialisation(value: int) -> str:
    """How Triton's launcher specialises an int argument: "constexpr" (== 1), "D" (divisible by 16) or ""; Triton's
    own `native_specialize_impl` where this version has it, else that rule."""
    try:
        from triton.backends.nvidia.compiler import CUDABackend
        from triton.runtime.jit import native_specialize_impl

        kind, attr = native_specialize_impl(CUDABackend, value, False, True, True)
        return "constexpr" if kind == "constexpr" else (attr or "")
    except ImportError:
        return "constexpr" if value == 1 else ("D" if value % 16 == 0 else "")


def launch_spec(cfg, m: int, slices: int, fold_g: bool, form: str) -> dict:
    """tests/unit/compile_sm90.py's spec of `_held_prologue_kernel` as the launch specialises it at width m:
    explore46's `sm90_spec` (pointer / scalar types, PDL, PTX) with Llama's constexprs, no maxnreg, and each runtime
    int constant or 16-divisible as `specialisation` says of its value (`launch_ints`)."""
    spec = sm90_spec(m, False)
    spec.pop("maxnreg")
    ints = launch_ints(cfg, m, form)
    const = {k: v for k, v in ints.items() if specialisation(v) == "constexpr"}
    spec["constexprs"] = dict(K=cfg.hidden_size, D=cfg.head_dim, NMB=-(-m // aph.ROW_BLOCK),
                              NVR_FROM_PTR=form == "fused", USE_PDL=True, FOLD_G=fold_g, Q=aph.WARPS, S=slices,
                              RB=aph.ROW_BLOCK, EARLY_RELEASE=False, **const)
    spec["divisible"] = [k for k, v in ints.items() if specialisation(v) == "D"]
    spec["num_warps"] = aph.WARPS
    return spec


def chain_after_wait(sass: str) -> dict:
    """The sm_90 SASS around the PDL wait (ACQBULK): instructions before it and its LDG.128 (weights, g), the
    instructions after it before the first / last STG (the outputs' stores: "chain" and "to_last_store"), and after it
    the HMMA, the longest chain of data-dependent HMMA (`hmma_depth`) and of FFMA, HMUL2 (g multiplied into the held
    weights: FOLD_G), global loads (and those issued after the first STG: a later row block's x behind the first block's
    chain), BAR.SYNC and spill loads."""
    lines = [ln for ln in sass.splitlines() if re.match(r"\s*/\*[0-9a-f]{4,}\*/", ln)]
    wait = next(i for i, ln in enumerate(lines) if "ACQBULK" in ln)
    head, tail = lines[:wait], lines[wait + 1:]
    stg = [i for i, ln in enumerate(tail) if re.search(r"\bSTG\b", ln)]
    hmma = [i for i, ln in enumerate(tail) if "HMMA" in ln]
    ldg = [i for i, ln in enumerate(tail) if re.search(r"\bLDG\b", ln)]
    return {"before_wait": len(head), "ldg128_before": sum("LDG.E.128" in ln for ln in head),
            "chain": stg[0] if stg else None, "to_last_store": stg[-1] if stg else None,
            "first_hmma": hmma[0] if hmma else None, "last_hmma": hmma[-1] if hmma else None,
            "hmma_after": len(hmma), "hmul2_after": sum("HMUL2" in ln for ln in tail),
            "hmma_depth": hmma_depth(tail), "ffma_depth": hmma_depth(tail, "FFMA"), "ldg_after": len(ldg),
            "ldg_after_store": sum(i > stg[0] for i in ldg) if stg else 0,
            "bar_after": sum("BAR.SYNC" in ln for ln in tail), "ldl_after": sum("LDL" in ln for ln in tail)}


MEMORY_LOADS = ("LDG", "LDL", "LDS", "LDSM")
STORES = ("STG", "STL", "STS", "ST", "RED", "ATOM", "ATOMG")


def _instruction(line: str):
    """(opcode, operands) of one SASS line (predicate dropped)."""
    body = re.sub(r"^\s*/\*[0-9a-f]+\*/\s*", "", line).split(";")[0].strip()
    if body.startswith("@"):
        body = body.split(None, 1)[1] if " " in body else ""
    op, _, rest = body.partition(" ")
    return op, [o.strip() for o in rest.split(",")] if rest.strip() else []


def _regs(operand: str, width: int = 1) -> list:
    """The R registers an operand names (a `.64` address pair both; `width` consecutive for a bare register)."""
    out = []
    for n, wide in re.findall(r"\bR(\d+)(\.64)?", operand):
        k = 2 if wide else (width if operand.lstrip("-|!~").startswith("R") else 1)
        out += [int(n) + i for i in range(k)]
    return out


def _width(op: str) -> int:
    return 4 if ".128" in op else 2 if (".64" in op or ".WIDE" in op or op.startswith("CS2R")) else 1


def load_stalls(sass: str) -> dict:
    """Where the program first waits on one of its own global / local / shared loads before the PDL wait (SASS issues
    in order: an instruction that reads, or overwrites, a register a load has not yet filled stalls the warp until the
    load lands, and every load after it issues that much later). `stall`: the first such instruction, as
    "CONSUMER<-PRODUCER"; `ldg128_behind_stall`: LDG.128 issued after it before the wait; `weight_stall` /
    `ldg128_behind_weight_stall`: the same for the first wait on a 16-byte load (the held weights / g, from HBM).
    A register-level reading of the listing (a load's destination width from its suffix; predication ignored)."""
    lines = [ln for ln in sass.splitlines() if re.match(r"\s*/\*[0-9a-f]{4,}\*/", ln)]
    wait = next(i for i, ln in enumerate(lines) if "ACQBULK" in ln)
    ins = [_instruction(ln) for ln in lines[:wait]]
    pending, events = {}, []
    for i, (op, ops) in enumerate(ins):
        base = op.split(".")[0]
        store = base in STORES
        dest = [] if store or not ops or not ops[0].startswith("R") else _regs(ops[0], _width(op))
        reads = [r for j, o in enumerate(ops) if j > 0 or store
                 for r in _regs(o, _width(op) if store and j == len(ops) - 1 else 1)]
        hit = sorted({pending[r] for r in reads + dest if r in pending})
        for p in hit:
            events.append((i, op, p, ins[p][0]))
            for r in [r for r, q in pending.items() if q == p]:
                del pending[r]
        if base in MEMORY_LOADS:
            pending.update({r: i for r in dest})
    behind = lambda i: sum("LDG.E.128" in op for op, _ in ins[i + 1:])                  # noqa: E731
    first = events[0] if events else None
    weight = next((e for e in events if e[3].startswith("LDG") and ".128" in e[3]), None)
    return {"stall": f"{first[1]}<-{first[3]}" if first else None,
            "ldg128_behind_stall": behind(first[0]) if first else 0,
            "weight_stall": f"{weight[1]}<-{weight[3]}" if weight else None,
            "ldg128_behind_weight_stall": behind(weight[0]) if weight else 0}


def hmma_depth(lines: list, opcode: str = "HMMA") -> int:
    """The longest chain of `opcode` instructions (HMMA by default; "FFMA": the sum of squares' chain) in `lines`
    (SASS, in order) each of which reads, through any instructions between (moves, conversions; shared memory breaks
    a chain), a register an earlier one of the chain wrote: the dependent latencies of that kind a warp pays in
    sequence. HMMA.16816.F32: D 4 registers, A 4, B 2, C 4; other instructions as `load_stalls` reads them."""
    depth, best = {}, 0
    for ln in lines:
        op, ops = _instruction(ln)
        if not ops:
            continue
        if op.startswith("HMMA"):
            dest, reads = _regs(ops[0], 4), _regs(ops[1], 4) + _regs(ops[2], 2) + _regs(ops[3], 4)
        else:
            store = op.split(".")[0] in STORES
            dest = [] if store or not ops[0].startswith("R") else _regs(ops[0], _width(op))
            reads = [r for j, o in enumerate(ops) if j > 0 or store for r in _regs(o)]
        d = max((depth.get(r, 0) for r in reads), default=0) + (op.split(".")[0] == opcode)
        best = max(best, d)
        for r in dest:
            depth[r] = d
    return best


def kernels() -> dict:
    """{slices: the held prologue kernel of that many K slices}: production's (4) and explore40's `with_slices`
    module (16: SLICES = 16, the constant the launcher passes as S)."""
    s16 = with_slices(aph, "SLICES = 4 ", 16, "aph_llama_sm90")
    assert s16.SLICES == 16 and aph.SLICES == 4
    return {4: aph._held_prologue_kernel, 16: s16._held_prologue_kernel}


def _compiler():
    if os.environ.get("TRITON_INTERPRET"):
        raise SystemExit("this compiles: run it with TRITON_INTERPRET unset (env -u TRITON_INTERPRET ...)")
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "unit"))
    from compile_sm90 import compile_for_sm90

    return compile_for_sm90


def compiled_row(kernel, spec: dict, dump: str, **fields) -> dict:
    """`kernel` compiled for sm_90 by tests/unit/compile_sm90.py under `spec` (files kept at `dump`.*): `fields`,
    then its registers, spills, shared memory, `live_across_wait`, `sass_around_wait`, `load_stalls` and
    `chain_after_wait`; printed on one line."""
    info = _compiler()(kernel, dict(spec, dump=dump))
    sass = open(dump + ".sass").read()
    row = dict(fields, registers=info["registers"], spill_bytes=info["spill_bytes"], shared=info["shared"],
               **live_across_wait(info["ptx"]), **sass_around_wait(sass), **load_stalls(sass),
               **chain_after_wait(sass))
    print("  " + " ".join(f"{k} {x}" for k, x in row.items() if k != "divisible"), flush=True)
    return row


def sm90_rows(variants: list, rows: list) -> list:
    """Each Llama variant (`VARIANTS`) compiled for sm_90 on this machine at each row count as `launch_spec` says
    (`compiled_row`), with the ints specialised to constants / as 16-divisible."""
    cfg = preset(MODEL)
    ks = kernels()
    tmp = tempfile.mkdtemp()
    out = []
    for v in variants:
        slices, fold_g, form = VARIANTS[v]
        for m in rows:
            spec = launch_spec(cfg, m, slices, fold_g, form)
            out.append(compiled_row(ks[slices], spec, os.path.join(tmp, f"{v}_{m}"), variant=v, rows=m,
                                    slices=slices, fold_g=fold_g, form=form,
                                    constants=sorted(k for k in ("M", "nvr_int") if k in spec["constexprs"]),
                                    divisible=spec["divisible"]))
    return out


def qwen3_rows(variants: list, rows: list) -> list:
    """explore46's Qwen3-30B-A3B variants (`explore46.variant_sources`) compiled as `explore46.py --sm90` compiles
    them (maxnreg 168, `explore46.sm90_spec`), read by `compiled_row`."""
    from explore37 import capped_source
    from explore46 import variant_sources

    sources = variant_sources(open(aph.__file__).read())
    tmp = tempfile.mkdtemp()
    out = []
    for v in variants:
        src, _, qk = sources[v]
        kernel = module_from_source(f"llama_sm90_q3_{v}", capped_source(src, 168))._held_prologue_kernel
        for m in rows:
            out.append(compiled_row(kernel, sm90_spec(m, qk), os.path.join(tmp, f"{v}_{m}"), variant=f"qwen3:{v}",
                                    rows=m, slices=4, fold_g=False, form="explore46"))
    return out


COLUMNS = [("variant", "variant"), ("rows", "M"), ("registers", "regs"), ("spill_bytes", "spill"),
           ("shared", "smem"), ("regs32", "ptx32"), ("preds", "pred"), ("stl_before", "stl<"), ("stl_after", "stl>"),
           ("ldg128_after_store", "ldg>st"), ("stall", "1st stall"), ("ldg128_behind_stall", "ldg>stall"),
           ("weight_stall", "1st weight stall"), ("ldg128_behind_weight_stall", "ldg>wstall"),
           ("before_wait", "pre"), ("ldg128_before", "ldg128<"), ("chain", "chain"), ("to_last_store", "to_last"),
           ("first_hmma", "hmma1"), ("hmma_after", "hmma"), ("hmma_depth", "depth"), ("ffma_depth", "ffma"),
           ("hmul2_after", "hmul2"), ("ldg_after", "ldg>"), ("ldg_after_store", "ldg>stg"), ("bar_after", "bar>")]


def table(rows: list, columns: list | None = None) -> str:
    """The rows as a markdown table of `columns` ([(key, short name)]; default `COLUMNS`)."""
    columns = COLUMNS if columns is None else columns
    head = "| " + " | ".join(h for _, h in columns) + " |"
    sep = "|" + "|".join(" --- " for _ in columns) + "|"
    return "\n".join([head, sep] + ["| " + " | ".join(str(r[k]) for k, _ in columns) + " |" for r in rows])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1,6,16")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="among " + ", ".join(VARIANTS))
    ap.add_argument("--qwen3", default="", help="explore46 variants to read the same way (none by default)")
    ap.add_argument("--qwen3-rows", default="1,6", help="their rows (session 32 timed 1 and 6; explore46's "
                    "sm90_spec makes M a constant at 1 and marks no other M 16-divisible)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    rows = [int(x) for x in args.rows.split(",")]
    res = sm90_rows([v for v in args.variants.split(",") if v], rows)
    res += qwen3_rows([v for v in args.qwen3.split(",") if v], [int(x) for x in args.qwen3_rows.split(",")])
    print(table(res))
    if args.out:
        import triton

        with open(args.out, "w") as f:
            json.dump(dict(device="none: compiled for sm_90 on the CPU (bundled ptxas)", triton=triton.__version__,
                           model=MODEL, command=" ".join(sys.argv), variants={k: dict(slices=s, fold_g=g, form=f)
                                                                             for k, (s, g, f) in VARIANTS.items()},
                           columns=dict(COLUMNS), results=res), f, indent=1)


if __name__ == "__main__":
    main()
