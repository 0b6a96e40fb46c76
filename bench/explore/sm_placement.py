"""Session-12 tool (issue 3): on which SMs the launches of a CUDA graph of lowlat's fused kernels run.

Session 12 found (explore25.py with %smid, bench/results/session12/call10) that the SmolLM2 6-row step's slow out_proj
(7.9-8.35 us a layer instead of 2.2-2.5) is CTA packing. PDL launches out_proj while the 6-row attention's programs
still occupy the GPU; its 36 programs then land on 6 SMs, up to 7 on one (the shared-memory limit: 28 KB a
program + 1 KB reserved per block, of 228 KB), and they stay there after the wait. The GEMV phase then takes 5.4 us instead of 1.8. Where the launch is
not early (a torch kernel in between), the same 36 programs run on 36 SMs, one each.

This tool records, for every program of every instrumented launch in a graph replay, its SM (%smid), its start
time (%globaltimer) and which kernel it belongs to. It works on instrumented COPIES of the kernels: a source
rewrite, as explore25 does; the production kernels are untouched. With it the same question can be asked of
every launch of a step, and of the per-kernel benches, whose 1-row bandwidth (issue 3's 70% target) is what
is still missed.

    python bench/explore/sm_placement.py step --model SmolLM2-135M --order 1,6 [--attn-trigger after_kv|start|none]
        [--gate-up-trigger start|late] [--plan-o JSON] [--out F]
    python bench/explore/sm_placement.py gemv --kind residual --n 2048 --k 2048 --rows 1 [--plan JSON]
        [--chain 20] [--out F]

step: a FusedModel with random weights, the widths captured in --order. For each width it reports the
replay time and, per launch role, the median over layers of: programs, distinct SMs, most programs on one SM,
and the spread of program start times (ns).
gemv: one `lowlat.bench._GemvCase` launched --chain times back to back in a graph (PDL, rotating weight
copies, as the kernels section times it), after `_GemvCase.check` of the plan: the numerics policy at 48 rows
and row invariance, through the instrumented kernels. Reported: the time per launch and the same placement
numbers.

Read the numbers with care:
- Its times include the record in every kernel (explore25's one stamped kernel cost ~20 us a step), so compare
  them only within this tool, not with production numbers or the 70% target.
- "most programs on one SM" counts over a launch's lifetime (see `Placement.record`).
- Launches are ordered by their first start; a tie within the timer's 32 ns falls back to slot order.
- The instrumented copies are capped to the production kernels' residency where the record would lower it
  (`Placement.match_residency`; "resources" in the output says what each kernel compiled to).

Variants to try against packing (session 12's "early" / "late" are session 13's "start" / "after_kv"; lowlat's
attention kernel has both since session 13, "after_kv" its default):
- --attn-trigger none: the attention copy keeps its gdc_wait but never calls gdc_launch_dependents. out_proj then
  launches only as attention's programs exit.
- --attn-trigger start: the trigger right after the wait (lowlat's kernel until session 13); after_kv: after a
  working program's KV loop. Programs without work trigger by exiting early.
- --gate-up-trigger late: gate/up releases the down projection after its GEMV products, not at its wait
  (session 13: at 24-48 rows down's 54 programs landed on 12 SMs, the ones gate/up's 120 left free).
- --plan-o '{"warps": 16}': out_proj at 16 warps.
  - Compiled for sm_90 on the CPU (session 12), SmolLM2's out_proj takes 40 registers x 512 threads, so at most
    3 programs fit on one SM. At 4 warps it is 44 x 128 with 28 KB of shared memory: 7 on one SM.
  - At 8 and 16 warps that compile had no cp.async: the loop may lose its pipelining.
  - The plan's warps do not change the arithmetic (`_gemv.GemvPlan`), so the logits checksums should match.
"""
from __future__ import annotations

import argparse
import ast
import collections
import importlib
import importlib.util
import inspect
import json
import statistics
import sys
import tempfile
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

#: the fused step's kernels: module -> kernel functions instrumented (every launch of them is recorded)
KERNELS = {
    "lowlat.kernels.attn_prologue": ["_attn_prologue_kernel"],
    "lowlat.kernels.decode_attention": ["_decode_attention_kernel"],
    "lowlat.kernels.out_proj": ["_residual_gemv_kernel"],
    "lowlat.kernels.mlp": ["_gate_up_kernel"],
    "lowlat.kernels.lm_head": ["_lm_head_kernel"],
    "lowlat.kernels.moe": ["_router_logits_kernel", "_route_plan_kernel", "_expert_gate_up_kernel",
                           "_expert_down_kernel", "_combine_kernel"],
}
SLOTS, MAX_PROGRAMS, FIELDS = 256, 16384, 3      # record per program: start ns, SM, kernel id + 1

HEADER = '''
import triton
import triton.language as tl
import {module} as _src
globals().update({{k: v for k, v in vars(_src).items() if not k.startswith("__")}})


@triton.jit
def _pl_now():
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)


@triton.jit
def _pl_smid():
    return tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=tl.int32, is_pure=False,
                                     pack=1).to(tl.int64)

'''

RECORD = """\
_pl_pid = tl.program_id(0) + tl.num_programs(0) * (tl.program_id(1) + tl.num_programs(1) * tl.program_id(2))
_pl_b = _pl_tr + _pl_pid.to(tl.int64) * {fields}
tl.store(_pl_b, _pl_now())
tl.store(_pl_b + 1, _pl_smid())
tl.store(_pl_b + 2, _pl_smid() * 0 + {kid})
"""


def import_source(src: str, module_name: str):
    """A module made from generated source (an instrumented kernel copy): written to a fresh temporary file, since
    @triton.jit reads its function's source from the file, and imported as `module_name`."""
    path = Path(tempfile.mkdtemp()) / f"{module_name}.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location(module_name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def instrumented_source(fn_src: str, name: str, kid: int, edits: list[tuple[str, str]] = ()) -> str:
    """The kernel's source (a @triton.jit function, decorator included) renamed `name`, with a last parameter
    `_pl_tr` (the launch's trace row) and, before its first statement after the docstring, a record of the
    program's start time, SM and `kid` (kernel id + 1). `edits`: exact (old, new) replacements applied first,
    each of which must occur once."""
    src = textwrap.dedent(fn_src)
    for old, new in edits:
        if src.count(old) != 1:
            raise ValueError(f"edit target found {src.count(old)} times: {old!r}")
        src = src.replace(old, new)
    tree = ast.parse(src)
    fn = tree.body[0]
    if not isinstance(fn, ast.FunctionDef):
        raise ValueError("expected one function definition")
    lines = src.splitlines(keepends=True)
    body = fn.body
    first = body[1] if (isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant)
                        and isinstance(body[0].value.value, str) and len(body) > 1) else body[0]
    indent = " " * first.col_offset
    record = "".join(indent + ln + "\n" for ln in RECORD.format(fields=FIELDS, kid=kid).splitlines())
    lines.insert(first.lineno - 1, record)
    # the new parameter, after the last one (end position of the last argument, annotation included)
    last = (fn.args.args + fn.args.kwonlyargs)[-1]
    row, col = last.end_lineno - 1, last.end_col_offset
    if fn.args.defaults and last in fn.args.args[-len(fn.args.defaults):]:
        default = fn.args.defaults[-1]
        row, col = default.end_lineno - 1, default.end_col_offset
    lines[row] = lines[row][:col] + ", _pl_tr=None" + lines[row][col:]
    out = "".join(lines)
    out = out.replace(f"def {fn.name}(", f"def {name}(", 1)
    return out


#: source edits of the attention copy per --attn-trigger. Since session 13 lowlat's kernel has both triggers
#: (constexpr TRIGGER_AFTER_KV, `decode_attention(pdl_trigger=...)`): "after_kv" (lowlat's default) and "start"
#: (session 12's "early") are the kernel's own, "start" set on each launch by the proxy (ATTN_TRIGGER_CONSTEXPRS);
#: "none" removes both calls (out_proj then launches as attention's programs exit).
ATTN_TRIGGER_EDITS = {
    "after_kv": [],
    "start": [],
    "none": [("        if not TRIGGER_AFTER_KV:\n            gdc_launch_dependents()\n", ""),
             ("            if not TRIGGER_AFTER_KV:\n                gdc_launch_dependents()\n", ""),
             ("            if USE_PDL and TRIGGER_AFTER_KV:   # programs without work release by exiting\n"
              "                gdc_launch_dependents()\n", "")],
}
#: constexprs the attention proxy sets on every launch per --attn-trigger
ATTN_TRIGGER_CONSTEXPRS = {"after_kv": {}, "start": {"TRIGGER_AFTER_KV": False}, "none": {}}
#: source edits of the gate/up copy per --gate-up-trigger: "late" releases the down projection after the
#: program's GEMV products, before its split-K partial stores / arrival (lowlat: right after gdc_wait)
GATE_UP_TRIGGER_EDITS = {
    "start": [],
    "late": [("        gdc_wait()\n        gdc_launch_dependents()\n", "        gdc_wait()\n"),
             ("    MP: tl.constexpr = 16 * NUM_MB\n",
              "    MP: tl.constexpr = 16 * NUM_MB\n    if USE_PDL:\n        gdc_launch_dependents()\n")],
}


class Placement:
    """Installs instrumented copies of the step's kernels (module attributes replaced by launch proxies) and
    reads back where their programs ran. attn_trigger: "after_kv" (lowlat's default), "start" or "none"
    (ATTN_TRIGGER_EDITS / ATTN_TRIGGER_CONSTEXPRS); gate_up_trigger: "start" (as lowlat) or "late"
    (GATE_UP_TRIGGER_EDITS)."""

    def __init__(self, device, *, attn_trigger: str = "after_kv", gate_up_trigger: str = "start") -> None:
        import torch

        self.trace = torch.zeros(SLOTS, MAX_PROGRAMS, FIELDS, dtype=torch.int64, device=device)
        self.names: list[str] = []
        self.resources: dict[str, dict] = {}
        self.calls = 0
        self._restore: list[tuple] = []
        edits = {"_decode_attention_kernel": ATTN_TRIGGER_EDITS[attn_trigger],
                 "_gate_up_kernel": GATE_UP_TRIGGER_EDITS[gate_up_trigger]}
        constexprs = {"_decode_attention_kernel": ATTN_TRIGGER_CONSTEXPRS[attn_trigger]}
        for mod_name, kernels in KERNELS.items():
            mod = importlib.import_module(mod_name)
            for kname in kernels:
                self._install(mod, kname, edits.get(kname, []), constexprs.get(kname, {}))

    def _install(self, mod, kname: str, edits, constexprs: dict) -> None:
        """Replace mod.kname by a proxy launching the instrumented copy (`edits` applied), with `constexprs`
        overriding what the wrapper passes."""
        real = getattr(mod, kname)
        kid = len(self.names)
        self.names.append(kname)
        new_name = f"{kname}_placed"
        gen = import_source(HEADER.format(module=mod.__name__) + instrumented_source(
            inspect.getsource(real.fn), new_name, kid + 1, edits), f"placed_{kname}")
        kernel, owner = getattr(gen, new_name), self

        class Launch:
            def __getitem__(self, grid):
                g = tuple(grid) + (1,) * (3 - len(grid))
                n = g[0] * g[1] * g[2]
                if n > MAX_PROGRAMS:
                    raise ValueError(f"{kname}: grid {grid} has {n} programs > {MAX_PROGRAMS}")

                def call(*args, **kw):
                    slot = owner.calls % SLOTS
                    owner.calls += 1
                    tr = owner.trace[slot]
                    kw = dict(kw, **constexprs)
                    kw.update(owner.match_residency(kname, real, kernel, grid, args, kw, tr))
                    return kernel[grid](*args, _pl_tr=tr, **kw)
                return call

            def __getattr__(self, attr):
                return getattr(real, attr)

        setattr(mod, kname, Launch())
        self._restore.append((mod, kname, real))

    def match_residency(self, kname, real, kernel, grid, args, kw, tr) -> dict:
        """Launch options that keep the instrumented copy's residency (programs one SM holds) equal to the
        production kernel's. The record costs a few registers: session 12's review compiled the attention copy
        at 83 registers against production's 80, which would let 5 programs share an SM instead of 6. When the
        copy holds fewer, it is capped at the production kernel's register count (maxnreg), which may spill
        a little. Both kernels are compiled without launching (Triton's `warmup`). The numbers are kept in
        `self.resources[kname]` (per specialization, last one wins). Returns {} when anything here fails:
        then nothing is capped, and the failure is recorded."""
        from lowlat.kernels.sm90_check import programs_per_sm

        if "maxnreg" in kw:
            return {}
        try:
            rc = real.warmup(*args, grid=grid, **kw)
            ic = kernel.warmup(*args, grid=grid, _pl_tr=tr, **kw)
            for c in (rc, ic):
                c._init_handles()
            real_per = programs_per_sm(rc.n_regs, rc.metadata.shared, rc.metadata.num_warps)
            inst_per = programs_per_sm(ic.n_regs, ic.metadata.shared, ic.metadata.num_warps)
            capped = inst_per < real_per
            self.resources[kname] = dict(real_regs=rc.n_regs, real_shared=rc.metadata.shared, real_per_sm=real_per,
                                         copy_regs=ic.n_regs, copy_shared=ic.metadata.shared, copy_per_sm=inst_per,
                                         capped_to_maxnreg=rc.n_regs if capped else None)
            return {"maxnreg": rc.n_regs} if capped else {}
        except Exception as e:                      # keep the run going: report, do not cap
            self.resources[kname] = dict(error=f"{type(e).__name__}: {e}"[:300])
            return {}

    def restore(self) -> None:
        for mod, kname, real in self._restore:
            setattr(mod, kname, real)

    def record(self, replay, *, times: int = 3) -> list[dict]:
        """Zero the trace, call replay() `times` times back to back (every replay rewrites the same slots, so the
        last, warm one is read: the first starts on an idle GPU), and return its launches in start order:
        kernel, programs, distinct SMs, most programs on one SM, spread of start times (ns) and first start
        (ns). "Most programs on one SM" counts over the launch's lifetime: co-residency only for grids of one
        wave (out_proj, the GEMVs); a grid of many short programs (decode attention, the LM head) can show
        large counts without packing."""
        import torch

        self.trace.zero_()
        torch.cuda.synchronize()
        for _ in range(times):
            replay()
        torch.cuda.synchronize()
        return launches_of(self.trace.cpu(), self.names)


def launches_of(trace, names: list[str]) -> list[dict]:
    """The launches recorded in a trace [SLOTS, MAX_PROGRAMS, FIELDS] (kernel id 0 = no program there)."""
    out = []
    for s in range(trace.shape[0]):
        rows = trace[s][trace[s, :, 2] > 0]
        if rows.shape[0] == 0:
            continue
        start, sm = rows[:, 0], rows[:, 1].tolist()
        per_sm = collections.Counter(sm)
        out.append(dict(kernel=names[int(rows[0, 2]) - 1], programs=int(rows.shape[0]), sms=len(per_sm),
                        max_per_sm=max(per_sm.values()), spread_ns=int(start.max() - start.min()),
                        start_ns=int(start.min())))
    out.sort(key=lambda e: e["start_ns"])
    return out


def by_role(launches: list[dict]) -> dict[str, dict]:
    """Medians per launch role (`lowlat.bench.launch_roles` of the kernel names, in start order)."""
    from lowlat.bench import launch_roles

    roles = launch_roles([e["kernel"] for e in launches])
    acc: dict[str, list[dict]] = {}
    for r, e in zip(roles, launches):
        acc.setdefault(r, []).append(e)
    return {r: dict(n=len(v), **{k: statistics.median(e[k] for e in v)
                                 for k in ("programs", "sms", "max_per_sm", "spread_ns")})
            for r, v in acc.items()}


def run_step(a) -> dict:
    import dataclasses

    import torch

    from lowlat.bench import _DecodeCase, random_kv, random_weights_on_device
    from lowlat.benchmarking import replay_time_us
    from lowlat.config import preset
    from lowlat.runtime.fused_model import FusedModel

    dev = torch.device("cuda")
    order = [int(x) for x in a.order.split(",")]
    pl = Placement(dev, attn_trigger=a.attn_trigger, gate_up_trigger=a.gate_up_trigger)
    cfg = preset(a.model)
    w = random_weights_on_device(cfg, dev)
    kv = random_kv(cfg, cfg.num_layers, max(order), 512, dev)
    fm = FusedModel(cfg, w, device=dev, widths=tuple(sorted(set(order))), validate=False)
    if a.plan_o:
        fm.plan_o = dataclasses.replace(fm.plan_o, **{"by_row_blocks": (), **json.loads(a.plan_o)})
    out = dict(mode="step", model=a.model, order=order, attn_trigger=a.attn_trigger,
               gate_up_trigger=a.gate_up_trigger, plan_o=str(fm.plan_o),
               widths={})
    for rows in order:
        before = pl.calls
        fm.forward(_DecodeCase(cfg, rows, 512, dev, kv).step, kv)
        if (pl.calls - before) // 2 > SLOTS:             # an eager run and the capture: one graph's launches
            raise ValueError(f"{(pl.calls - before) // 2} launches in the {rows}-row graph > SLOTS={SLOTS}: "
                             "slots would wrap inside it")
        g = fm._graphs[rows]
        t = replay_time_us(g, iters=20, warmup=3)
        out["widths"][rows] = dict(step_us=round(t, 1), roles=by_role(pl.record(g.replay)))
    out["resources"] = pl.resources
    logits = fm.forward(_DecodeCase(cfg, order[-1], 512, dev, kv).step, kv).double()
    out["logits_check"] = [logits.sum().item(), logits.abs().sum().item(), logits.argmax(-1).tolist()[:8]]
    return out


def run_gemv(a) -> dict:
    import dataclasses

    import torch

    from lowlat.bench import _GemvCase
    from lowlat.benchmarking import capture_graph, replay_time_us
    from lowlat.kernels._gemv import plan_gemv

    dev = torch.device("cuda")
    pl = Placement(dev)
    case = _GemvCase(a.kind, a.n, a.k, 1e-5, dev)
    plan = plan_gemv(a.n, a.k, kind=a.kind)
    if a.plan:
        plan = dataclasses.replace(plan, **{"by_row_blocks": (), **json.loads(a.plan)})
    case.check(plan)                              # the instrumented launches compute what the reference does
    chain = max(a.chain, case.nc)                 # at least every weight copy once (cold L2)
    g = capture_graph(lambda i: case.launch(plan, a.rows, i), chain)
    t = replay_time_us(g, iters=20, warmup=3) / chain
    launches = pl.record(g.replay)
    mid = launches[1:-1] or launches             # the first / last launch have no neighbour on one side
    return dict(mode="gemv", kind=a.kind, n=a.n, k=a.k, rows=a.rows, plan=str(plan), chain=chain,
                us_per_launch=round(t, 3), wbytes=case.wbytes, resources=pl.resources,
                placement={k: statistics.median(e[k] for e in mid)
                           for k in ("programs", "sms", "max_per_sm", "spread_ns")},
                launches=launches[:4])


def main() -> None:
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="mode", required=True)
    s = sub.add_parser("step")
    s.add_argument("--model", default="SmolLM2-135M")
    s.add_argument("--order", default="1,6")
    s.add_argument("--attn-trigger", default="after_kv", choices=sorted(ATTN_TRIGGER_EDITS))
    s.add_argument("--gate-up-trigger", default="start", choices=sorted(GATE_UP_TRIGGER_EDITS))
    s.add_argument("--plan-o", default=None)
    s.add_argument("--out", default=None)
    g = sub.add_parser("gemv")
    g.add_argument("--kind", default="residual", choices=["residual", "out_proj", "gate_up", "lm_head"])
    g.add_argument("--n", type=int, required=True)
    g.add_argument("--k", type=int, required=True)
    g.add_argument("--rows", type=int, default=1)
    g.add_argument("--plan", default=None)
    g.add_argument("--chain", type=int, default=20)
    g.add_argument("--out", default=None)
    a = p.parse_args()
    out = run_step(a) if a.mode == "step" else run_gemv(a)
    print(json.dumps(out))
    if a.out:
        Path(a.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
