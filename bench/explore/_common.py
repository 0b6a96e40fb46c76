"""Shared pieces of the exploration scripts: the results recorder, the greedy draft-sampling case (SmolLM2's LM
head, V 49152 x H 576, three rotating cold copies) with the production launch and the torch ops, a timer
of GEMV plans side by side (`time_gemv_plans`), and the check-then-time step of the explore16 / explore18 GEMVs
(`gemv_reference`, `check_and_time`)."""
from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from lowlat.bench import _Recorder  # noqa: E402
from lowlat.benchmarking import copy_bandwidth, time_launches, versions  # noqa: E402


def explore_parser():
    """The exploration scripts' shared options: --out, --budget-s, --reps, --rows, --smoke."""
    import argparse

    p = argparse.ArgumentParser()
    p.add_argument("--out", default=None)
    p.add_argument("--budget-s", type=float, default=240)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 6, 8])
    p.add_argument("--smoke", action="store_true")
    return p


def t_us(fn, n: int, iters: int = 41) -> float:
    """Median us per launch of fn(0..n-1) captured in one CUDA graph."""
    return round(time_launches(fn, n, iters=iters)["us_median"], 2)


class Recorder(_Recorder):
    """`lowlat.bench._Recorder` (the document rewritten after every entry, errors kept apart) with this
    run's provenance and copy bandwidth (`bw`, bytes/s); `rec(entry)` adds an entry, `rec.guard` records
    a failing variant as an error and goes on (one device call must give everything)."""

    def __init__(self, out: str | None):
        self.bw = copy_bandwidth()
        super().__init__(out, dict(versions(), copy_bandwidth_TBps=round(self.bw / 1e12, 3)))

    def __call__(self, entry: dict) -> None:
        self.add(**entry)

    def guard(self, label: str, fn, **base) -> None:
        try:
            fn()
        except Exception as exc:                                           # noqa: BLE001
            torch.cuda.synchronize()
            self.error("/".join([*(f"{k}={v}" for k, v in base.items()), label]), exc)


def gemv_reference(epi: str, x, g, res, w, eps: float = 1e-5):
    """The explore GEMVs' two epilogues in float64: "norm" y = rstd(x) ((x * g) W^T) (an RMSNorm folded into the
    GEMV), "res" y = res + x W^T. x [R, K], g [K], res [R, N], w [N, K]."""
    xd = x.double()
    if epi == "norm":
        return (xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + eps) * g.double()) @ w.double().T
    return res.double() + xd @ w.double().T


def check_and_time(rec, launch, out, want, n_copies: int, nbytes: int, entry: dict) -> None:
    """Poison `out`, run launch(0), compare with `want` (a bf16 output: one rounding of |y| <= max|want|, 2^-9
    relative, plus fp32 sums: 2^-7 of the largest value; NaN fails), time launch(0..n_copies-1) in one CUDA graph
    and record entry + us, pct_of_copy (nbytes over the run's copy bandwidth), max_err, ok."""
    out.fill_(float("nan"))
    launch(0)
    torch.cuda.synchronize()
    err = (out.double() - want).abs().max().item()
    ok = bool(err <= 2 ** -7 * want.abs().max().item()) and not out.isnan().any().item()
    us = t_us(launch, n_copies, 41)
    rec(dict(entry, us=us, pct_of_copy=round(100 * nbytes / rec.bw / (us * 1e-6), 1), max_err=round(err, 5), ok=ok))


class GreedyCase:
    """Greedy draft sampling at SmolLM2's LM-head shape over `rot` rotating weight / hidden-state copies."""

    def __init__(self, rot: int = 3, v: int = 49152, hd: int = 576):
        self.dev, self.v, self.hd, self.rot = torch.device("cuda"), v, hd, rot
        g = torch.Generator(device=self.dev).manual_seed(5)
        self.ws = [(torch.randn(v, hd, generator=g, device=self.dev) * hd ** -0.5).to(torch.bfloat16)
                   for _ in range(rot)]
        self.hs = [torch.randn(8, hd, generator=g, device=self.dev).to(torch.bfloat16) for _ in range(rot)]

    def launchers(self, r: int):
        """(production(i, **launch), torch_ops(i), outs): the draft sampler's greedy launch and the torch ops
        it replaces (bench_draft_sampling.torch_draft_step) at r rows, on copy i."""
        from bench_draft_sampling import torch_draft_step
        from lowlat.kernels import draft_sampling as ds

        dev, v = self.dev, self.v
        temp, topk = torch.zeros(r, device=dev), torch.zeros(r, dtype=torch.int32, device=dev)
        topp, seeds = torch.ones(r, device=dev), torch.arange(r, device=dev) + 1
        offs = torch.zeros(r, dtype=torch.int64, device=dev)
        outs = [ds.empty_draft_sample(r, v, dev) for _ in range(self.rot)]
        qd = [torch.empty(r, v, device=dev) for _ in range(self.rot)]

        def production(i, **launch):
            ds.draft_sample_into(self.hs[i][:r], self.ws[i], temp, topk, topp, seeds, offs, outs[i], k_cap=0,
                                 need_noise=False, **launch)

        def torch_ops(i):
            torch_draft_step(self.hs[i][:r], self.ws[i], 0.0, 0, 1.0, qd[i])
        return production, torch_ops, outs

    def baseline(self, rec, r: int, base: dict, iters: int = 61, pdl: bool = False):
        """Time the torch ops and the production launch at r rows (recorded); returns (t_torch, want: the
        production tokens per copy, xo / to: logits and token buffers per copy for the variants)."""
        prod, torch_ops, outs = self.launchers(r)
        t_torch = t_us(torch_ops, self.rot, iters)
        rec(dict(base, variant="torch", us=t_torch))
        t_p = t_us(prod, self.rot, iters)
        rec(dict(base, variant="production", us=t_p, speedup=round(t_torch / t_p, 3)))
        if pdl:
            rec(dict(base, variant="production_pdl", us=t_us(lambda i: prod(i, use_pdl=True), self.rot, iters)))
        want = [outs[i].tokens.clone() for i in range(self.rot)]
        xo = [torch.empty(r, self.v, device=self.dev) for _ in range(self.rot)]
        to = [torch.empty(r, dtype=torch.int64, device=self.dev) for _ in range(self.rot)]
        return t_torch, want, xo, to


def time_greedy_tails(rec, deadline: float, reps: int, rows, epis, checked, pdl: bool = False) -> None:
    """The TMA copy of the greedy launch (tma_gemv.TmaGreedy: 128 x 64 tiles, 3 stages) with each tail EPI in
    `epis`, at each row count, beside the torch ops and the production launch (`GreedyCase.baseline`; pdl:
    also the production launch with PDL); tokens compared with production's for the tails in `checked`
    (the others do not produce them)."""
    from explore.tma_gemv import TmaGreedy

    case = GreedyCase()
    tg = TmaGreedy(case.v, case.hd, block_v=128, block_h=64, stages=3)
    for rep in range(reps):
        for r in rows:
            base = dict(op="greedy", rows=r, rep=rep)
            t_torch, want, xo, to = case.baseline(rec, r, base, pdl=pdl)
            for epi in epis:
                if time.time() > deadline:
                    return

                def one(epi=epi):
                    for t in to:
                        t.fill_(-2)
                    us = t_us(lambda i: tg(case.hs[i][:r], case.ws[i], xo[i], to[i], epi=epi), case.rot, 61)
                    same = all(torch.equal(to[i], want[i]) for i in range(case.rot)) if epi in checked else None
                    rec(dict(base, variant=f"tma_st3_epi{epi}", us=us, speedup=round(t_torch / us, 3),
                             same_tokens=same))
                rec.guard(f"epi{epi}", one, **base)


def time_gemv_plans(rec, deadline: float, kind: str, n: int, k: int, eps: float, variants, reps: int,
                    rows=(1, 6)) -> None:
    """Time `lowlat.kernels._gemv.plan_gemv(n, k, kind=kind, **fields)` for each (label, fields) in variants,
    as the fused step runs them (`lowlat.bench._GemvCase`: PDL-chained launches over rotating cold copies),
    after the tuner's correctness check; `reps` rounds over all plans interleaved, each at `rows`."""
    from lowlat.bench import MIN_LAUNCHES, _GemvCase, _nbytes
    from lowlat.kernels._gemv import plan_gemv

    case = _GemvCase(kind, n, k, eps, torch.device("cuda"))
    plans = []
    for label, fields in variants:
        try:
            plan = plan_gemv(n, k, kind=kind, **fields)
            case.check(plan)
            plans.append((label, plan))
        except Exception as exc:                                           # noqa: BLE001
            torch.cuda.synchronize()
            rec.error(f"{kind}/{label}", exc)
    for rep in range(reps):
        for label, plan in plans:
            if time.time() > deadline:
                return
            for r in rows:
                def one(label=label, plan=plan, r=r):
                    nbytes = case.wbytes + _nbytes(case.inputs(r)["x"], case.inputs(r)["out"])
                    us = t_us(lambda i: case.launch(plan, r, i), max(case.nc, MIN_LAUNCHES), 41)
                    rec(dict(op=kind, n=n, k=k, rows=r, rep=rep, variant=label, us=us,
                             pct_of_copy=round(100 * nbytes / rec.bw / (us * 1e-6), 1), plan=plan.describe()))
                rec.guard(label, one, op=kind, rows=r)


def time_production_residual(rec, deadline: float, reps: int, rows, shapes) -> None:
    """The production residual GEMV (its tuned / default plan) at each (label, N, K) of shapes, at `rows`, `reps`
    rounds (`time_gemv_plans`): the baseline the explore31 / explore32 GEMVs are timed beside in the same run."""
    for label, n, k in shapes:
        if time.time() < deadline:
            rec.guard(f"production/{label}",
                      lambda n=n, k=k: time_gemv_plans(rec, deadline, "residual", n, k, 1e-5, [("production", {})],
                                                       reps, rows=tuple(rows)), op="residual")


def explore_main(default_rows, sections) -> None:
    """Parse `explore_parser()`'s options (rows defaulting to default_rows, 2 rounds), make the Recorder, then run
    each (name, fn) of sections as fn(rec, deadline, reps, rows) under `rec.guard`."""
    p = explore_parser()
    p.set_defaults(rows=list(default_rows), reps=2)
    a = p.parse_args()
    deadline = time.time() + a.budget_s
    rec = Recorder(a.out)
    print(f"copy bandwidth {rec.bw / 1e12:.3f} TB/s", flush=True)
    for name, fn in sections:
        rec.guard(name, lambda fn=fn: fn(rec, deadline, a.reps, a.rows), op=name)


def module_from_source(name: str, src: str):
    """Import `src` (a kernel module's text with an experiment's edits) as module `name` from a file of its own, so
    that Triton / Gluon can read its kernels' source (explore35, explore36)."""
    import importlib.util
    import os
    import tempfile

    path = os.path.join(tempfile.mkdtemp(), f"{name}.py")
    with open(path, "w") as f:
        f.write(src)
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod                     # dataclasses (kernels/moe.py's) look their module up there
    spec.loader.exec_module(mod)
    return mod


def prologue_rows(m: int, hidden: int, r: int, dev):
    """A prologue explore's inputs at width m: (xs: r copies of x [m, hidden] bf16, positions [m] in 0..4095, locs:
    copy i's KV slots 1 + i m .. (i + 1) m, int32)."""
    xs = [torch.randn(m, hidden, device=dev).bfloat16() for _ in range(r)]
    locs = [torch.arange(1 + i * m, 1 + (i + 1) * m, dtype=torch.int32, device=dev) for i in range(r)]
    return xs, torch.randint(0, 4096, (m,), device=dev), locs


class LlamaPrologueCase:
    """Llama-3.2-1B's attention prologue inputs as session 28's per-kernel explores (37, 39-43) time them, like
    `bench/bench_attn_prologue.py`: one layer's random weights (seed 0), the packed QKV weight `w0` and `r` rotated
    copies of it (`ws`: each launch reads its weights from HBM), the RoPE table of 4096 positions; `rows(m)` gives a
    width's inputs."""

    def __init__(self, dev):
        from lowlat.benchmarking import rotation_copies
        from lowlat.config import preset
        from lowlat.kernels.attn_prologue import pack_qkv, rope_table
        from lowlat.weights import random_layer_weights

        self.dev = dev
        self.cfg = cfg = preset("Llama-3.2-1B")
        self.lw = random_layer_weights(cfg.replace(intermediate_size=16), generator=torch.Generator().manual_seed(0),
                                       device=dev)
        self.w0 = pack_qkv(self.lw)
        self.table = rope_table(cfg, 4096, dev)
        self.r = rotation_copies(self.w0.numel() * 2)
        self.ws = [self.w0.clone() for _ in range(self.r)]

    def rows(self, m: int):
        """`prologue_rows` at this case's hidden size and r."""
        return prologue_rows(m, self.cfg.hidden_size, self.r, self.dev)

    def cache(self, m: int, fill: float = 0.0):
        """A K or V cache of r m + 1 slots (every copy's rows) filled with `fill`."""
        c = self.cfg
        return torch.full((self.r * m + 1, c.num_kv_heads, c.head_dim), fill, dtype=torch.bfloat16, device=self.dev)

    def q_out(self, m: int):
        """An output q [m, Hq, D] bf16 of NaN."""
        c = self.cfg
        return torch.full((m, c.num_heads, c.head_dim), float("nan"), dtype=torch.bfloat16, device=self.dev)

    def launches(self, m: int, variants: dict):
        """({variant: launch(i)}, {variant: its r q outputs}) at width m for `variants` {name: (module, weights (r
        copies), attn_norm or None, early_release)}: module's `attn_prologue_held` on copy i (shared KV caches)."""
        xs, pos, locs = self.rows(m)
        kc, vc = self.cache(m), self.cache(m)
        qs = {v: [self.q_out(m) for _ in range(self.r)] for v in variants}

        def fn(v):
            mod, wl, g, early = variants[v]
            r = self.r
            return lambda i: mod.attn_prologue_held(xs[i % r], wl[i % r], g, pos, locs[i % r], m, kc, vc, self.table,
                                                    cfg=self.cfg, out_q=qs[v][i % r], use_pdl=True,
                                                    early_release=early)

        return {v: fn(v) for v in variants}, qs


def run_checked(fns: dict, qs: dict, caches: dict, n: int, base: str | None = None) -> tuple[dict, dict | None]:
    """Run each variant's launches 0..n-1 once (`fns` {variant: launch(i)}, writing into NaN-filled q outputs `qs`
    {variant: [q, ...]} and K / V caches `caches` {variant: (k_cache, v_cache)}), then ({variant: every element
    written: no NaN in its q outputs nor in its caches' slots 1..}, with `base` {variant: its q outputs and caches
    bitwise base's}, else None)."""
    for v in fns:
        for i in range(n):
            fns[v](i)
    torch.cuda.synchronize()
    written = {v: not (bool(caches[v][0][1:].isnan().any()) or bool(caches[v][1][1:].isnan().any())
                       or any(bool(q.isnan().any()) for q in qs[v])) for v in fns}
    if base is None:
        return written, None
    same = {v: all(torch.equal(a, b) for a, b in zip(qs[v], qs[base]))
            and torch.equal(caches[v][0][1:], caches[base][0][1:])
            and torch.equal(caches[v][1][1:], caches[base][1][1:]) for v in fns}
    return written, same


def stamp_chain(launch, n: int, tr, summarize, label: str):
    """A stamped chain's summary: a CUDA graph of launch(0..n-1) replayed warm, the records `tr` [n, programs, 8]
    (int64; field 6 is 1 where a program wrote its record) zeroed, one more replay, then summarize(tr on the CPU), or
    "incomplete trace" where a program left its record unwritten; printed as "  stamps <label>: ..."."""
    from lowlat.benchmarking import capture_graph

    g = capture_graph(launch, n)
    for _ in range(3):
        g.replay()
    tr.zero_()
    g.replay()
    torch.cuda.synchronize()
    t = tr.cpu()
    res = summarize(t) if bool((t[:, :, 6] == 1).all()) else "incomplete trace"
    print(f"  stamps {label}: " + (res if isinstance(res, str) else " ".join(f"{k} {x:.0f}" for k, x in res.items())),
          flush=True)
    return res


def time_alternated(fns: dict, n: int, rounds: int = 1) -> dict:
    """{variant: [us, ...]}: each of `fns` (launch(i) callables) timed 2 x rounds times in the order A B .. B A
    (repeated), a CUDA graph of launches 0..n-1 each time (`graph_time_us`)."""
    from lowlat.benchmarking import graph_time_us

    names = list(fns)
    times = {v: [] for v in names}
    for v in (names + names[::-1]) * rounds:
        times[v].append(graph_time_us(fns[v], n))
    return times


def max_rel_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| / max(|b|, 1e-2), elementwise in fp32 (NaN where either is NaN)."""
    return float(((a.float() - b.float()).abs() / b.float().abs().clamp_min(1e-2)).max())


class Qwen3OutProjCase:
    """Qwen3-30B-A3B's output projection ([N 2048, K 4096] bf16, scaled 1 / sqrt(K)) as explore35 / 40 / 41 time the
    held residual GEMV: `nc` rotated weight copies (`lowlat.bench._copies`: read from HBM), a device generator (seed 1)
    for the rows; `rows(m)` gives a [m, K] input and a [m, N] residual."""

    def __init__(self, dev):
        from lowlat.bench import _copies

        self.dev, self.n, self.k = dev, 2048, 4096
        self.g = torch.Generator(device=dev).manual_seed(1)
        self.nc = _copies(self.n * self.k * 2)
        self.ws = [(torch.randn(self.n, self.k, generator=self.g, device=dev) * self.k ** -0.5).to(torch.bfloat16)
                   for _ in range(self.nc)]

    def rows(self, m: int):
        a = torch.randn(m, self.k, generator=self.g, device=self.dev).to(torch.bfloat16)
        return a, torch.randn(m, self.n, generator=self.g, device=self.dev).to(torch.bfloat16)


def times_line(times: dict) -> str:
    """'name min/max ...' of `time_alternated`'s {variant: [us, us]}."""
    return " ".join(f"{v} {min(t):.2f}/{max(t):.2f}" for v, t in times.items())


def write_results(out: str | None, results: list, **fields) -> None:
    """With `out`, write {device, torch, **fields, results} as JSON (the session-28 explores' record)."""
    import json

    if out:
        with open(out, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, **fields, results=results), f,
                      indent=1)


#: the held prologue's release line (`attn_prologue_held`), which `landed_release_source` precedes with its own
HELD_RELEASE = "    pdl_wait_then_release(USE_PDL, EARLY_RELEASE)\n"
LANDED_HELPER = '''

@gluon.jit
def _release_when_landed(w):
    """griddepcontrol.launch_dependents once this thread's held weights have landed: one predicated release an
    element (setp reads the register, so ptxas waits for its load first); returns an opaque int16 per element."""
    return gl.inline_asm_elementwise(
        "{ .reg .pred p; setp.ne.b16 p, $1, 0x7fff; @p griddepcontrol.launch_dependents; mov.b16 $0, 0; }",
        "=h,h", [w.to(gl.int16, bitcast=True)], dtype=gl.int16, is_pure=False, pack=1)


@gluon.jit
def _held_prologue_kernel('''


def landed_release_source(src: str) -> str:
    """The held prologue's source (`kernels/attn_prologue_held.py`, or an explore's edit of it) with the next launch
    released by each thread as soon as its held weights have landed, before the wait (session 29): between the
    production rule (after the wait) and `early_release` (at the start). The release after the wait stays (a no-op
    by then)."""
    head = "\n\n@gluon.jit\ndef _held_prologue_kernel("
    for old in (head, HELD_RELEASE):
        assert src.count(old) == 1, f"the held prologue's source changed: {old!r}"
    src = src.replace(head, LANDED_HELPER)
    return src.replace(HELD_RELEASE, "    if USE_PDL:\n        _release_when_landed(w)\n" + HELD_RELEASE)
