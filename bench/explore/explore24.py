"""Session-11 diagnostic (issue 3): the SmolLM2 step's out_proj at 6 rows costs 7.9 us a layer in some processes
(session 10 call6, session 11 call4) and 2.2 us in others (every run of session 11's bisect, call1), same code.
Each invocation builds the step as `lowlat bench --sections step,profile` does (random weights, FusedModel of
widths (1, 6), ctx 512), after allocating --pad-mb of unused memory first (shifts every address), and prints
each layer's out_proj cost in the step (end minus the previous launch's end, median of 10 replays) with the
addresses of its weight, the attention output and x, so a slow layer can be matched to an address pattern.

    python bench/explore/explore24.py --pad-mb 0 [--rows 6] [--warm WARM] [--out-proj default|nopdl|pf0]
        [--out FILE]

--warm breakdown first does what the old step-section breakdown did at 1 row (graphs of the layers alone, of
their attention launches only and of their FFN launches only, captured by `benchmarking.capture_graph` and
replayed); layers1 / attn1 / ffn1 only one of those graphs; capture1 a graph of one torch op at width 1 (does
any other graph flip it?); eager6 runs the 6-row step eagerly twice before its capture. --out-proj nopdl
launches every out_proj without PDL (a plain stream dependency), pf0 with the same plan minus its L2
prefetch (pf_k 0); both apply to the step graphs and eager6's eager steps, not to the warm-up graphs.
(Until session 12, --dot PREFIX was to write the 6-row step graph as DOT via torch's debug_dump; under torch
2.11 no file was ever written, with debug mode alone or with keep_graph=True (session 12 calls 1-2), so it was
removed; the question it asked was answered by the SM placement instead: explore25.) Printed too: the specializations
Triton compiled for `_residual_gemv_kernel` and, from the CUPTI trace, the out_proj launches' grid / block /
registers / shared memory.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from lowlat.bench import _DecodeCase, launch_roles, random_kv, random_weights_on_device  # noqa: E402
from lowlat.benchmarking import capture_graph, kernel_trace, replay_time_us  # noqa: E402
from lowlat.config import preset  # noqa: E402
from lowlat.runtime.fused_model import FusedModel  # noqa: E402


def variant_out_proj(fm, how: str) -> None:
    """Launch FusedModel's out_proj as asked from now on: "default", "nopdl" (use_pdl False for the out_proj
    GEMV only: FusedModel calls the module-level `residual_gemv` for out_proj and down; out_proj's weight is
    the one with K = q_size) or "pf0" (its plan without the L2 prefetch)."""
    import dataclasses

    from lowlat.kernels import out_proj as op_mod
    from lowlat.runtime import fused_model as fm_mod

    if not hasattr(fm, "_plan_o_default"):
        fm._plan_o_default = fm.plan_o
    fm.plan_o = dataclasses.replace(fm._plan_o_default, pf_k=0) if how == "pf0" else fm._plan_o_default
    q = fm.cfg.q_size

    def residual_gemv(a, w, residual, *, use_pdl=False, **kw):
        if how == "nopdl" and w.shape[1] == q:
            use_pdl = False
        return op_mod.residual_gemv(a, w, residual, use_pdl=use_pdl, **kw)
    fm_mod.residual_gemv = residual_gemv


def old_breakdown(fm, kv, graphs=("layers", "attn", "ffn")) -> None:
    """The step section's breakdown before session 11, at width 1: graphs (`capture_graph`) of every layer's
    launches ("layers"), of only their attention launches ("attn"), of only their FFN launches ("ffn": the
    FFN fed `bufs.attn`), or of one torch op ("torch_op"), 22 replays each."""
    from lowlat.kernels.attn_prologue import attn_prologue
    from lowlat.kernels.decode_attention import decode_attention

    bufs = fm._bufs[1]
    cfg, pdl = fm.cfg, fm.use_pdl
    kc, vc = kv.k_caches, kv.v_caches

    def run(parts):
        x = bufs.x
        torch.index_select(fm.embed, 0, bufs.input_ids, out=x)
        for i, L in enumerate(fm.layers):
            if "attention" not in parts:
                fm._ffn(L, bufs, bufs.attn)
                continue
            q = attn_prologue(x, L.qkv, L.qkv_bias, L.attn_norm, L.q_norm, L.k_norm, bufs.positions,
                              bufs.out_cache_loc, bufs.nvalid, kc[i], vc[i], fm.rope, cfg=cfg, out_q=bufs.q,
                              workspace=fm.pro_ws, use_pdl=pdl)
            attn = decode_attention(q, kc[i], vc[i], fm._page_table[:1], bufs.req_indices, bufs.positions,
                                    bufs.nvalid, out=bufs.attn, workspace=fm.dec_ws, use_pdl=pdl)
            if "ffn" in parts:
                fm._ffn(L, bufs, attn)

    table = {"layers": ("attention", "ffn"), "attn": ("attention",), "ffn": ("ffn",)}
    for name in graphs:
        if name == "torch_op":
            g = capture_graph(lambda _: bufs.x.add_(0), 1)
        else:
            g = capture_graph(lambda _, p=table[name]: run(p), 1)
        for _ in range(22):
            g.replay()
    torch.cuda.synchronize()


def workspace_ptrs(fm) -> dict[str, str]:
    """Addresses of FusedModel's workspaces and 6-row buffers (tensors among their attributes), to compare
    between processes."""
    out = {}
    for name in ("gemv_ws", "pro_ws", "dec_ws", "moe_ws"):
        obj = getattr(fm, name, None)
        items = obj.items() if isinstance(obj, dict) else (vars(obj).items() if hasattr(obj, "__dict__") else [])
        for k, v in items:
            if isinstance(v, torch.Tensor):
                out[f"{name}.{k}"] = hex(v.data_ptr())
    for k, v in vars(fm._bufs[6]).items():
        if isinstance(v, torch.Tensor):
            out[f"bufs6.{k}"] = hex(v.data_ptr())
    return out


def launch_args(prefix: str, run) -> list[dict]:
    """grid / block / registers / shared memory of the distinct launches of kernels named prefix* in one traced
    call of run() (torch.profiler's chrome trace args)."""
    import tempfile

    from torch.profiler import ProfilerActivity, profile

    run()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        trace = json.loads(Path(f.name).read_text())
    seen = []
    for e in trace["traceEvents"]:
        if e.get("cat") == "kernel" and e["name"].startswith(prefix):
            args = {k: v for k, v in e.get("args", {}).items() if k in ("grid", "block", "registers per thread",
                                                                      "shared memory", "blocks per SM",
                                                                      "est. achieved occupancy %")}
            if args not in seen:
                seen.append(args)
    return seen


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--pad-mb", type=float, default=0.0)
    p.add_argument("--rows", type=int, default=6)
    p.add_argument("--out", default=None)
    p.add_argument("--warm", default="none", choices=["none", "breakdown", "layers1", "attn1", "ffn1", "capture1",
                                                      "eager6"])
    p.add_argument("--out-proj", default="default", choices=["default", "nopdl", "pf0"])
    a = p.parse_args()
    dev = torch.device("cuda")
    pad = torch.empty(int(a.pad_mb * 2 ** 20), dtype=torch.uint8, device=dev) if a.pad_mb else None
    cfg = preset("SmolLM2-135M")
    w = random_weights_on_device(cfg, dev)
    kv = random_kv(cfg, cfg.num_layers, 6, 512, dev)
    fm = FusedModel(cfg, w, device=dev, widths=(1, 6), validate=False)
    out = {"pad_mb": a.pad_mb, "rows": a.rows, "warm": a.warm, "out_proj": a.out_proj}
    variant_out_proj(fm, a.out_proj)
    for rows in (1, a.rows):
        case = _DecodeCase(cfg, rows, 512, dev, kv)
        if rows == a.rows and a.warm == "eager6":
            for _ in range(2):
                b6, _, kc, vc = fm._prepare(case.step, kv)
                fm._run(b6, kc, vc)
            torch.cuda.synchronize()
        fm.forward(case.step, kv)
        g = fm._graphs[rows]
        out[f"step_us_r{rows}"] = round(replay_time_us(g, iters=20, warmup=3), 1)
        if rows == 1 and a.warm != "none" and a.warm != "eager6":
            variant_out_proj(fm, "default")
            old_breakdown(fm, kv, {"breakdown": ("layers", "attn", "ffn"), "layers1": ("layers",), "attn1": ("attn",),
                                   "ffn1": ("ffn",), "capture1": ("torch_op",)}[a.warm])
            variant_out_proj(fm, a.out_proj)
    trace = kernel_trace(g.replay, iters=10)
    n = len(trace) // 10
    roles = launch_roles([k[0] for k in trace[:n]])
    costs = [[trace[r * n + i][2] - trace[r * n + i - 1][2] for r in range(10)] for i in range(1, n)]
    idx = [i for i in range(1, n) if roles[i] == "out_proj"]
    bufs = fm._bufs[a.rows]
    layers = []
    for j, i in enumerate(idx):
        wo = fm.layers[j].wo
        layers.append(dict(layer=j, us=round(statistics.median(costs[i - 1]), 2), wo=hex(wo.data_ptr()),
                           wo_mod_2m=wo.data_ptr() % 2 ** 21, prev_us=round(statistics.median(costs[i - 2]), 2),
                           start_minus_prev_end=round(statistics.median(
                               trace[r * n + i][1] - trace[r * n + i - 1][2] for r in range(10)), 2),
                           dur=round(statistics.median(trace[r * n + i][2] - trace[r * n + i][1]
                                                       for r in range(10)), 2)))
    by_role: dict[str, list[float]] = {}
    for i in range(1, n):
        by_role.setdefault(roles[i], []).append(statistics.median(costs[i - 1]))
    out["role_cost_sum_us"] = {k: round(sum(v), 1) for k, v in by_role.items()}
    out["role_cost_median_us"] = {k: round(statistics.median(v), 2) for k, v in by_role.items()}
    out.update(attn=hex(bufs.attn.data_ptr()), x=hex(bufs.x.data_ptr()), layers=layers,
               out_proj_median=statistics.median(l["us"] for l in layers))
    from lowlat.kernels.out_proj import _residual_gemv_kernel
    out["residual_gemv_specializations"] = [str(k)[:400] for c in _residual_gemv_kernel.device_caches.values()
                                            for k in c[0]]
    out["out_proj_launch_args"] = launch_args("_residual_gemv_kernel", g.replay)
    out["workspace_ptrs"] = workspace_ptrs(fm)
    logits = fm.forward(_DecodeCase(cfg, a.rows, 512, dev, kv).step, kv).double()
    out["logits_check"] = [logits.sum().item(), logits.abs().sum().item(), bool(logits.isfinite().all().item()),
                           logits.argmax(-1).tolist()]
    print(json.dumps({k: v for k, v in out.items() if k != "layers"}))
    print(" ".join(f"{l['layer']}:{l['us']}" for l in layers))
    if a.out:
        Path(a.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
