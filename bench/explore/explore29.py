"""Session 19 (written at the end of the session, NOT yet run on a GPU): where the decode attention's time goes,
program by program, inside the fused step. At 1 row the attention costs 4.35 us a layer on SmolLM2-135M (24% of
its step) and 6.5 us on Llama-3.2-1B, for ~0.1-1 MB of KV; NOTES "Left" (session 19) asks which part of the chain
(PDL wait, page table -> K / V, the split partial and its arrival, the combine) that is.

A stamped copy of `_decode_attention_kernel` (the production kernel is untouched) records in every program, by
%globaltimer (ns):

    t0 program start
    t1 inputs ready: without the early first block, the PDL wait returned and num_valid_rows read; with it
       (`pre_kv`), the re-load of this step's own slots returned (so t1 - t0 includes the early K / V loads)
    t2 the KV loop's result in registers (programs with work)
    t3 the split counter's atomic returned (programs that arrive; else t2: with one group t3 = t2 and "combine" is
       t4 - t2)
    t4 the program's last statement (after the combine's stores were issued, for the combining program)

plus its SM and flags (1: has work, 2: combined the splits, 4: one split, stored directly). The copy is launched
in place of the kernel by a proxy (`Tracer`), at the production kernel's residency (registers capped the way
`sm_placement.Placement.match_residency` does: the copy takes 87-141 registers against the kernel's 80-116 in its
review's sm_90 compiles, so it is capped and may spill a few bytes; `resources` records both register counts). A
graph of the fused step at one width is captured, replayed warm, the trace zeroed, replayed once; per attention
launch (one per layer) it summarises, in ns, medians over the programs with work: t1 - t0, t2 - t1, t3 - t2, and
for the combining programs t4 - t3; the launch's span from its first t1 to its last t4; and the spread of t1.
Then medians over the layers, beside each launch role's in-step cost from CUPTI (`explore25.role_summary`).

    python bench/explore/explore29.py --model SmolLM2-135M --rows 1,6,48 [--ctx 512] [--layers N] [--out F]
"""
from __future__ import annotations

import argparse
import inspect
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from sm_placement import HEADER as _PLACEMENT_HEADER  # noqa: E402  (_pl_now, _pl_smid)
from sm_placement import Placement, import_source  # noqa: E402
from explore25 import NOW_AFTER  # noqa: E402  (_now_after)

HEADER = _PLACEMENT_HEADER.format(module="lowlat.kernels.decode_attention") + NOW_AFTER

#: int64 fields a program records: t0..t4, SM, flags, 1 (written)
FIELDS = 8
#: trace slots (attention launches of one captured width) and programs a slot holds (32 splits x 8 KV heads x 48)
SLOTS, MAX_PROGRAMS = 64, 12288
NAME = "_decode_attention_kernel_traced"

#: exact (old, new) edits of the kernel's source; each old text occurs once
EDITS = [
    ("def _decode_attention_kernel(", f"def {NAME}("),
    ("        INTERP: tl.constexpr, FOLD: tl.constexpr = False):\n",
     "        INTERP: tl.constexpr, FOLD: tl.constexpr = False, _pl_tr=None):\n"),
    ("    row = tl.program_id(2)\n",
     "    row = tl.program_id(2)\n    _t0 = _pl_now()\n    _t1 = _t0\n    _t2 = _t0\n    _t3 = _t0\n"
     "    _fl = _t0 * 0\n"),
    ("        nvr = nvr_int\n", "        nvr = nvr_int\n    _t1 = _now_after(nvr)\n"),
    ("                     other=v0)\n",
     "                     other=v0)\n"
     "        _t1 = _now_after(tl.sum(tl.sum(v0.to(tl.float32), axis=1), axis=0).to(tl.int32, bitcast=True))\n"),
    ("            if USE_PDL and TRIGGER_AFTER_KV:   # programs without work release by exiting\n",
     "            _t2 = _now_after(tl.sum(l_i, axis=0).to(tl.int32, bitcast=True))\n            _t3 = _t2\n"
     "            _fl = _fl | 1\n"
     "            if USE_PDL and TRIGGER_AFTER_KV:   # programs without work release by exiting\n"),
    ("            elif nsplits == 1:\n", "            elif nsplits == 1:\n                _fl = _fl | 4\n"),
    ("                if GROUPS == 1:   # every split is this program's: its own stores, visible after the barrier\n",
     "                if GROUPS == 1:   # every split is this program's: its own stores, visible after the barrier\n"
     "                    _fl = _fl | 2\n"),
    ('                    cnt = tl.atomic_add(cnt_ptr + row.to(tl.int64) * Hkv + j, 1, sem="acq_rel", scope="gpu")\n',
     '                    cnt = tl.atomic_add(cnt_ptr + row.to(tl.int64) * Hkv + j, 1, sem="acq_rel", scope="gpu")\n'
     "                    _t3 = _now_after(cnt)\n"),
    ("                    if cnt == arrivals - 1:\n",
     "                    if cnt == arrivals - 1:\n                        _fl = _fl | 2\n"),
]
RECORD = """\
    _t4 = _pl_now()
    _pid = gi + tl.num_programs(0) * (j + tl.num_programs(1) * row)
    _b = _pl_tr + _pid.to(tl.int64) * 8
    tl.store(_b, _t0)
    tl.store(_b + 1, _t1)
    tl.store(_b + 2, _t2)
    tl.store(_b + 3, _t3)
    tl.store(_b + 4, _t4)
    tl.store(_b + 5, _pl_smid())
    tl.store(_b + 6, _fl)
    tl.store(_b + 7, _t0 * 0 + 1)
"""


def traced_source() -> str:
    """The stamped copy of `_decode_attention_kernel` as a module's source (HEADER + the kernel, renamed NAME,
    with a last parameter `_pl_tr`: the launch's trace slot [MAX_PROGRAMS, FIELDS] int64)."""
    from lowlat.kernels import decode_attention as da

    src = inspect.getsource(da._decode_attention_kernel.fn)
    for old, new in EDITS:
        if src.count(old) != 1:
            raise ValueError(f"edit target found {src.count(old)} times: {old!r}")
        src = src.replace(old, new)
    return HEADER + src.rstrip("\n") + "\n" + RECORD


class Tracer:
    """Replaces `decode_attention._decode_attention_kernel` by a proxy that launches the stamped copy, one trace
    slot per call (calls counted in `self.calls`), at the production kernel's residency. `restore()` puts the
    kernel back."""

    match_residency = Placement.match_residency      # uses self.resources only

    def __init__(self, device) -> None:
        import torch

        from lowlat.kernels import decode_attention as da

        self.trace = torch.zeros(SLOTS, MAX_PROGRAMS, FIELDS, dtype=torch.int64, device=device)
        self.resources: dict[str, dict] = {}
        self.calls: list[tuple] = []
        gen = import_source(traced_source(), "traced_decode_attention")
        kernel, real, owner = getattr(gen, NAME), da._decode_attention_kernel, self
        self._real, self._mod = real, da

        class Launch:
            def __getitem__(self, grid):
                n = grid[0] * grid[1] * grid[2]
                if n > MAX_PROGRAMS:
                    raise ValueError(f"decode attention grid {grid} has {n} programs > {MAX_PROGRAMS}")

                def call(*args, **kw):
                    slot = len(owner.calls) % SLOTS
                    owner.calls.append(tuple(grid))
                    tr = owner.trace[slot]
                    kw = dict(kw, **owner.match_residency("att", real, kernel, grid, args, kw, tr))
                    return kernel[grid](*args, _pl_tr=tr, **kw)
                return call

            def __getattr__(self, attr):
                return getattr(real, attr)

        da._decode_attention_kernel = Launch()

    def restore(self) -> None:
        self._mod._decode_attention_kernel = self._real


def summarize_slot(t) -> dict | None:
    """One launch's record (a [MAX_PROGRAMS, FIELDS] int64 CPU tensor) -> ns medians (see the module docstring);
    None when no program wrote it."""
    rows = t[t[:, 7] == 1]
    if rows.shape[0] == 0:
        return None
    work = rows[(rows[:, 6] & 1) == 1]
    comb = rows[(rows[:, 6] & 2) == 2]
    # differences in int64 first: %globaltimer is ~1.8e18 ns, where a double steps by 256 ns
    med = (lambda x: float(x.double().median())) if work.shape[0] else (lambda x: None)
    return dict(programs=int(rows.shape[0]), with_work=int(work.shape[0]), combiners=int(comb.shape[0]),
                start_to_ready=med(work[:, 1] - work[:, 0]), kv_loop=med(work[:, 2] - work[:, 1]),
                arrival=med(work[:, 3] - work[:, 2]),
                combine=float((comb[:, 4] - comb[:, 3]).double().median()) if comb.shape[0] else None,
                span=float(rows[:, 4].max() - rows[:, 1].min()),
                ready_spread=float(rows[:, 1].max() - rows[:, 1].min()),
                first_start=int(rows[:, 0].min()), sms=len(set(rows[:, 5].tolist())))


def summarize(trace, used: int) -> dict:
    """Medians over the launches (layers) of `summarize_slot`, plus the number of launches."""
    per = [s for s in (summarize_slot(trace[i].cpu()) for i in range(min(used, SLOTS))) if s is not None]
    per.sort(key=lambda s: s["first_start"])
    keys = [k for k in per[0] if k != "first_start"] if per else []
    out = {k: statistics.median(s[k] for s in per if s[k] is not None) for k in keys
           if any(s[k] is not None for s in per)}
    out["launches"] = len(per)
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="SmolLM2-135M")
    p.add_argument("--rows", default="1,6,48", help="widths, each captured and stamped in its own FusedModel")
    p.add_argument("--ctx", type=int, default=512)
    p.add_argument("--layers", type=int, default=None, help="the preset with this many layers (default: all)")
    p.add_argument("--out", default=None)
    a = p.parse_args()

    import torch

    from explore25 import role_summary
    from lowlat.bench import _DecodeCase, random_kv, random_weights_on_device
    from lowlat.config import preset
    from lowlat.runtime.fused_model import FusedModel

    dev = torch.device("cuda")
    cfg = preset(a.model)
    if a.layers:
        cfg = cfg.replace(num_layers=a.layers)
    w = random_weights_on_device(cfg, dev)
    result = dict(model=a.model, layers=cfg.num_layers, ctx=a.ctx, widths={})
    for rows in [int(x) for x in a.rows.split(",")]:
        kv = random_kv(cfg, cfg.num_layers, rows, a.ctx, dev)
        tracer = Tracer(dev)
        try:
            fm = FusedModel(cfg, w, device=dev, widths=(rows,), validate=False)
            fm.forward(_DecodeCase(cfg, rows, a.ctx, dev, kv).step, kv)
            g = fm._graphs[rows]
            roles = role_summary(g)
            for _ in range(3):
                g.replay()
            torch.cuda.synchronize()
            tracer.trace.zero_()
            g.replay()
            torch.cuda.synchronize()
            stamps = summarize(tracer.trace, len(tracer.calls))
        finally:
            tracer.restore()
        result["widths"][rows] = dict(roles=roles, stamps=stamps, resources=tracer.resources.get("att"))
        att = roles.get("decode_attention", [None])[0]
        print(f"r{rows:<3} attention in-step cost {att} us | " + " ".join(
            f"{k} {v:.0f}" if isinstance(v, float) else f"{k} {v}" for k, v in stamps.items()), flush=True)
        del fm, g, kv
        torch.cuda.empty_cache()
    print("resources (production vs stamped copy):", {r: v["resources"] for r, v in result["widths"].items()})
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
