"""Session-12 diagnostic (issue 3): WHERE inside out_proj the slow state's extra ~5.7 us goes, and why.

Answer (session 12, bench/results/session12/call1-call10; NOTES "Measured -> session 12"): CTA packing. PDL makes
out_proj's programs resident ~7 us before attention ends. In the slow runs the scheduler put its 36 programs on
6 SMs, up to 7 on one SM, and there they stay after the wait: the GEMV phase takes 5.4 us instead of 1.8. Spread
over 36 SMs, one each, were the 1-row step's out_proj and the 6-row one with a torch kernel between attention and
out_proj (call10). The fast early-launch runs (--warm capture1, widths 1..48 at 6 rows) were NOT recorded with
%smid (no device time left); that they are spread is the expectation, not a measurement. The wait itself returns
on time in both states. Hypothesis, not measured: which SMs have room when out_proj launches depends on the
timing of the 6-row attention grid (32 x 3 x 6 = 576 programs, 162 of them with work by the code's split rule).
That would explain why the state changed with things that are not part of the kernel: FusedModel's widths
(buffer sizes), num_valid_rows, an earlier graph capture.
What the stamps ruled out along the way:
- gate/up's early launch: out_proj's trigger moved after its GEMV, still slow (call3);
- the weights missing in L2: the prefetch off, or the weights preloaded into registers, still slow (call4);
- instruction fetch: the code run once before the wait, still slow (call8);
- attention's freshly written lines: read without an early launch, fast (call9).

This script stamps %globaltimer inside every `_residual_gemv_kernel` program (out_proj and the dense MLP's down
projection both use it) at five points:

    t0 program start     t1 after gdc_wait / launch_dependents     t2 GEMV products in registers
    t3 split-K arrival atomic returned     t4 end (after the finisher's stores were issued)

and the program's SM (%smid). It does so by generating a copy of the kernel with those stamps (the production
kernel is untouched) and patching out_proj's launcher to call it with a trace buffer (one slot per launch call).
After the graphs are captured, the buffer is cleared and each graph replayed once; the slots a graph wrote are its
launches, in order. Per out_proj launch it prints (ns, medians over layers):
- t1 - t0: how long the program was resident before the wait returned;
- the spread of t1 across programs;
- t2 - t1, t3 - t2 and t4 - t3;
- from the previous down launch's last t4 to this launch's first t1: prologue + attention, a clock that does not
  involve out_proj;
- the distinct SMs of its programs and the most programs on one SM.
`bench/explore/sm_placement.py` generalises the SM record to every kernel of the step.

    python bench/explore/explore25.py --warm none|capture1 [--variant stamps|late|probe|warm] [--order 1,6]
        [--attn-feed direct|copy|barrier] [--plan-o JSON] [--model M] [--reps 3]

Each variant changes one thing:
- late: out_proj's launch_dependents comes after its GEMV;
- warm: its residual + GEMV code runs twice in one rolled loop, the first pass before the wait with no
  activation loads;
- probe: two timed loads of attn. Its loads were hoisted above the first stamp, so it measured nothing;
- --attn-feed copy / barrier: a torch kernel between attention and out_proj, with or without a copy of attn.
--order gives the widths in capture order. Each width's role costs are measured right after its capture; the
stamps are taken at the end, with the LAST width's num_valid_rows in the shared device scalar.
role_summary gives, per launch role and from CUPTI: [cost, start - previous end, duration] (us).
"""
from __future__ import annotations

import argparse
import collections
import inspect
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from sm_placement import HEADER as _PLACEMENT_HEADER  # noqa: E402  (_pl_now, _pl_smid)
from sm_placement import import_source  # noqa: E402

#: a %globaltimer read ordered after a value (explore25, explore29). The read is predicated on a comparison of the
#: value (an int32), so ptxas cannot issue it before the value is there; the value 0x7fc00001 gives 0 instead of a
#: time. Until session 19 the value was only named in an asm comment, which orders nothing: its review found the
#: read issued before the load it was meant to follow (explore25's session-12 stamps were taken that way).
NOW_AFTER = '''

@triton.jit
def _now_after(v):
    """%globaltimer read once the int32 v is available (the read is predicated on it)."""
    return tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.eq.u32 p, $1, 0x7fc00001; @p mov.u64 $0, 0; @!p mov.u64 $0, %globaltimer; }",
        "=l,r", [v], dtype=tl.int64, is_pure=False, pack=1)

'''
HEADER = _PLACEMENT_HEADER.format(module="lowlat.kernels.out_proj") + NOW_AFTER



def traced_source(variant: str = "stamps") -> str:
    """The stamped copy of `_residual_gemv_kernel`; variant "late" also moves its gdc_launch_dependents from
    right after the wait to after the GEMV products (the next launch, gate/up, becomes resident only then)."""
    from lowlat.kernels import out_proj as op

    src = inspect.getsource(op._residual_gemv_kernel.fn)
    tail = "EARLY_RELEASE: tl.constexpr = False):"
    assert src.count(tail) == 1, "the kernel's last parameters changed: update traced_source"
    src = src.replace(tail, tail[:-2] + ", tr_ptr=None):")
    src = src.replace("def _residual_gemv_kernel(", "def _residual_gemv_kernel_traced(")
    edits = [
        ("    pid_k = tl.program_id(1)\n", "    pid_k = tl.program_id(1)\n    _t0 = _pl_now()\n"),
        ("    # the residual tile, in flight", "    _t1 = _pl_now()\n    # the residual tile, in flight"),
        ("    MP: tl.constexpr = 16 * NUM_MB\n",
         "    _t2 = _now_after(tl.sum(a0, axis=0).to(tl.int32, bitcast=True).sum())\n    _t3 = _t2\n"
         "    MP: tl.constexpr = 16 * NUM_MB\n"),
        ("        finished = arrived == SPLIT - 1\n",
         "        finished = arrived == SPLIT - 1\n        _t3 = _now_after(arrived)\n"),
    ]
    if variant == "probe":   # two loads of attn row M-1 (this program's 16 columns) right after the wait, by L2
        edits += [("    # the residual tile, in flight",
                   "    _pc = pid_n * 16 + tl.arange(0, 16)\n"
                   "    _pa = tl.load(a_ptr + (M - 1) * stride_am + _pc, mask=_pc < K, other=0.0, cache_modifier='.cg')\n"
                   "    _t6 = _now_after(tl.sum(_pa.to(tl.float32), axis=0).to(tl.int32, bitcast=True))\n"
                   "    _pb = tl.load(a_ptr + (M - 1) * stride_am + _pc + (_t6 == 0).to(tl.int32), mask=_pc < K, other=0.0,\n"
                   "                  cache_modifier='.cg')\n"
                   "    _t7 = _now_after(tl.sum(_pb.to(tl.float32), axis=0).to(tl.int32, bitcast=True))\n"
                   "    # the residual tile, in flight")]
    if variant == "late":
        edits += [("        gdc_wait()\n        if not EARLY_RELEASE:\n            gdc_launch_dependents()\n",
                   "        gdc_wait()\n"),
                  ("    _t3 = _t2\n", "    _t3 = _t2\n    if USE_PDL:\n        gdc_launch_dependents()\n")]
    for old, new in edits:
        assert src.count(old) == 1, old
        src = src.replace(old, new)
    if variant == "warm":    # stream plans, one row block: the residual + GEMV code runs twice in ONE rolled loop,
        # iteration 0 before the wait with M = 0 (no activation / residual loads: only the weight stream), so
        # iteration 1 (after the wait) runs instruction-cache-warm code (is the slow state instruction fetch?)
        old_mid = src[src.index("    if USE_PDL:\n        gdc_wait()"):src.index("    _t2 = _now_after(")]
        new_mid = (
            "    tl.static_assert(NUM_MB == 1 and not PRELOAD)\n"
            "    z = tl.zeros((16,), dtype=tl.float32)\n"
            "    zt = tl.zeros((BN, 16), dtype=tl.float32)\n"
            "    a0, a1, a2, b0, b1, b2, s0, s1, s2 = zt, zt, zt, zt, zt, zt, z, z, z\n"
            "    r0 = zt\n"
            "    _t1 = _t0\n"
            "    for _it in range(M * 0, 2):\n"
            "        _m = tl.where(_it == 1, M, 0)\n"
            "        if _it == 1:\n"
            "            if USE_PDL:\n"
            "                gdc_wait()\n"
            "                gdc_launch_dependents()\n"
            "            _t1 = _pl_now()\n"
            "        r0 = _load_res(res_ptr, stride_rm, 0, n0, _m, N, BN)\n"
            "        a0, a1, a2, b0, b1, b2, s0, s1, s2 = gemv_loop(\n"
            "            w_ptr, 0, stride_wn, a_ptr, stride_am, _m, N, n0, k_begin, K, nw_ptr, z, z, z,\n"
            "            BN, BK, CPS, NUM_MB, False, 0, EVEN_N, EVEN_K, UPCAST)\n"
            "    r1 = r0\n    r2 = r0\n")
        src = src.replace(old_mid, new_mid)
    src = src.rstrip("\n") + (
        "\n    _t4 = _pl_now()\n"
        "    _b = tr_ptr + (pid_n + pid_k * tl.num_programs(0)) * 8\n"
        "    tl.store(_b + 0, _t0)\n    tl.store(_b + 1, _t1)\n    tl.store(_b + 2, _t2)\n"
        "    tl.store(_b + 3, _t3)\n    tl.store(_b + 4, _t4)\n    tl.store(_b + 5, pid_n * 0 + 1)\n"
        + ("    tl.store(_b + 6, _t6 - _t1)\n    tl.store(_b + 7, _t7 - _t6)\n" if variant == "probe" else
           "    tl.store(_b + 6, _pl_smid())\n"))
    return HEADER + src


SLOTS, PROGS = 1024, 256
CALLS: list[dict] = []


def install(trace: torch.Tensor, variant: str, q_size: int) -> None:
    """Generate the traced kernel(s) and make out_proj's launcher call them, one trace slot per call. With
    variant "late" only the out_proj launches (K = q_size) take the late-trigger copy; down keeps the stamped one."""
    from lowlat.kernels import out_proj as op

    mods = {v: import_source(traced_source(v), f"traced_out_proj_{v}") for v in {"stamps", variant}}
    real = op._residual_gemv_kernel

    class Launch:
        def __getitem__(self, grid):
            def call(*args, **kw):
                slot = len(CALLS) % SLOTS
                CALLS.append(dict(slot=slot, grid=list(grid), K=int(args[17]), M=int(args[15])))
                mod = mods[variant if int(args[17]) == q_size else "stamps"]
                return mod._residual_gemv_kernel_traced[grid](*args, tr_ptr=trace[slot], **kw)
            return call

        def __getattr__(self, name):
            return getattr(real, name)

    op._residual_gemv_kernel = Launch()


def summarize(trace: torch.Tensor, q_size: int) -> dict:
    t = trace.cpu()
    used = [s for s in range(SLOTS) if int(t[s, :, 5].sum()) > 0]
    launches = []
    for s in used:
        rows = t[s][t[s, :, 5] == 1]
        launches.append(dict(slot=s, t=rows[:, :5].double(), probe=rows[:, 6:8].double()))
    # launch order = order of first t0 (slots are in capture order too)
    launches.sort(key=lambda L: float(L["t"][:, 0].min()))
    calls = {c["slot"]: c for c in CALLS}
    per = []
    prev_end = None
    for L in launches:
        tt = L["t"]
        c = calls[L["slot"]]
        kind = "out_proj" if c["K"] == q_size else "down"
        t0 = tt[:, 0].min()
        e = dict(kind=kind, programs=int(tt.shape[0]),
                 resident_to_wait=float(tt[:, 1].min() - t0),
                 wait_spread=float(tt[:, 1].max() - tt[:, 1].min()),
                 t0_spread=float(tt[:, 0].max() - t0),
                 gemv=float((tt[:, 2] - tt[:, 1]).median()),
                 gemv_max_end=float(tt[:, 2].max() - tt[:, 1].min()),
                 arrive=float((tt[:, 3] - tt[:, 2]).median()),
                 finish_max=float(tt[:, 4].max() - tt[:, 1].min()),
                 prev_end_to_wait=float(tt[:, 1].min() - prev_end) if prev_end is not None else None,
                 probe_first=float(L["probe"][:, 0].median()), probe_second=float(L["probe"][:, 1].median()),
                 distinct_sms=len(set(L["probe"][:, 0].long().tolist())),
                 max_per_sm=max(collections.Counter(L["probe"][:, 0].long().tolist()).values()))
        prev_end = tt[:, 4].max()
        per.append(e)
    out = {}
    for kind in ("out_proj", "down"):
        rows = [e for e in per if e["kind"] == kind]
        out[kind] = {k: round(statistics.median(e[k] for e in rows if e[k] is not None), 0)
                     for k in rows[0] if k not in ("kind",) and any(e[k] is not None for e in rows)}
        out[kind]["n"] = len(rows)
    return out


def role_summary(g) -> dict:
    """Per launch role of one graph (CUPTI, 10 replays; medians over layers and replays, us): cost (end minus
    the previous launch's end), start minus the previous launch's end (negative: resident early, by PDL), dur."""
    from lowlat.bench import launch_roles
    from lowlat.benchmarking import kernel_trace

    trace = kernel_trace(g.replay, iters=10)
    n = len(trace) // 10
    roles = launch_roles([k[0] for k in trace[:n]])
    acc: dict[str, list[tuple[float, float, float]]] = {}
    for r in range(10):
        for i in range(1, n):
            cur, prev = trace[r * n + i], trace[r * n + i - 1]
            acc.setdefault(roles[i], []).append((cur[2] - prev[2], cur[1] - prev[2], cur[2] - cur[1]))
    return {k: [round(statistics.median(x[j] for x in v), 2) for j in range(3)] for k, v in acc.items()}


def stamped_replay(g, trace: torch.Tensor, q_size: int) -> dict:
    """Three warm replays of graph g, then one with the trace cleared: its stamps, summarised."""
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    trace.zero_()
    g.replay()
    torch.cuda.synchronize()
    return summarize(trace, q_size)


def print_summary(d: dict) -> None:
    """One line per width: step time, out_proj's in-step cost, and its stamps (ns; the probe and SM fields when
    recorded)."""
    print(d["variant"], d.get("attn_feed"), "order", d["order"], "logits", d["logits_check"][:2])
    for r in d["order"]:
        s = d[f"stamps_r{r}"]["out_proj"]
        extra = {k: s[k] for k in ("probe_first", "probe_second", "distinct_sms", "max_per_sm") if k in s}
        print(f"   r{r:<3} step {d[f'step_us_r{r}']:7.1f}  out_proj cost {d[f'roles_r{r}']['out_proj'][0]:5.2f}  "
              f"gemv phase {s['gemv']:6.0f} ns  finish {s['finish_max']:6.0f}  {extra}")


def main() -> None:
    from explore24 import old_breakdown
    from lowlat.bench import _DecodeCase, random_kv, random_weights_on_device
    from lowlat.benchmarking import replay_time_us
    from lowlat.config import preset
    from lowlat.runtime.fused_model import FusedModel

    p = argparse.ArgumentParser()
    p.add_argument("--warm", default="none", choices=["none", "capture1"])
    p.add_argument("--rows", type=int, default=6)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--variant", default="stamps", choices=["stamps", "late", "probe", "warm"])
    p.add_argument("--model", default="SmolLM2-135M")
    p.add_argument("--plan-o", default=None, help='out_proj plan fields to replace, JSON: {"pf_k": 0}')
    p.add_argument("--order", default=None, help="widths in capture order, e.g. 6,1 (default: 1,ROWS)")
    p.add_argument("--attn-feed", default="direct", choices=["direct", "copy", "barrier"],
                   help="copy: out_proj reads a copy of attn made by a torch copy kernel between attention and "
                        "out_proj (lines written by another kernel, PDL chain broken there); barrier: the same "
                        "torch kernel in between without the copy (PDL chain broken, attention's lines read)")
    p.add_argument("--out", default=None)
    a = p.parse_args()
    order = [int(x) for x in a.order.split(",")] if a.order else [1, a.rows]
    dev = torch.device("cuda")
    trace = torch.zeros(SLOTS, PROGS, 8, dtype=torch.int64, device=dev)
    cfg = preset(a.model)
    install(trace, a.variant, cfg.q_size)
    w = random_weights_on_device(cfg, dev)
    kv = random_kv(cfg, cfg.num_layers, max(order), 512, dev)
    fm = FusedModel(cfg, w, device=dev, widths=tuple(sorted(set(order))), validate=False)
    if a.attn_feed != "direct":
        spare = torch.empty_like(fm._full["attn"])
        real_ffn = fm._ffn

        def ffn(L, bufs, attn, *rest, how=a.attn_feed):
            w = bufs.width
            if how == "copy":
                spare[:w].copy_(attn)
                attn = spare[:w]
            else:
                spare[:1].zero_()
            return real_ffn(L, bufs, attn, *rest)
        fm._ffn = ffn
    if a.plan_o:
        import dataclasses
        fm.plan_o = dataclasses.replace(fm.plan_o, **{"by_row_blocks": (), **json.loads(a.plan_o)})
    out = dict(attn_feed=a.attn_feed, model=a.model, warm=a.warm, rows=a.rows, variant=a.variant, plan_o=str(fm.plan_o))
    out["order"] = order
    for j, rows in enumerate(order):
        fm.forward(_DecodeCase(cfg, rows, 512, dev, kv).step, kv)
        out[f"step_us_r{rows}"] = round(replay_time_us(fm._graphs[rows], iters=20, warmup=3), 1)
        out[f"roles_r{rows}"] = role_summary(fm._graphs[rows])
        if j == 0 and a.warm == "capture1":
            old_breakdown(fm, kv, ("torch_op",))
    for rows in order:                                  # every graph's stamps, one replay each
        out[f"stamps_r{rows}"] = stamped_replay(fm._graphs[rows], trace, cfg.q_size)
    out["reps"] = [stamped_replay(fm._graphs[a.rows], trace, cfg.q_size) for _ in range(a.reps)]
    logits = fm.forward(_DecodeCase(cfg, a.rows, 512, dev, kv).step, kv).double()
    out["logits_check"] = [logits.sum().item(), logits.abs().sum().item(), logits.argmax(-1).tolist()]
    print(json.dumps(out))
    print_summary(out)
    if a.out:
        Path(a.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
