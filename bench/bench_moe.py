"""Benchmark: one Qwen3-30B-A3B MoE block (random weights) with the fused kernels (lowlat.kernels.moe).

For rows M in 1, 6, 8, 16, 48: `moe_forward` (router, top-8, the active experts' SwiGLU, combine,
residual) captured in a CUDA graph, without and with PDL, timed per replay with CUDA events after an
L2 flush, median of many replays. The flush reads 512 MB (`read_flush`: the L2 then holds clean lines,
as in a decode step, whose earlier kernels read weights and write little); "_write_flush" entries
flush by zeroing 512 MB instead (the method until session 8), which leaves ~50 MB of dirty lines that
the timed replay writes back to HBM while it reads its weights. The floor is the HBM time of the
bytes that must move: the router and the weights of the experts actually touched (counted from the
routing bitmap), plus the activations, over the measured device copy bandwidth (read + write, as
design.md states it). The bf16 reference (`x + lowlat.reference.moe.moe`, eager: it syncs on the
host to find each expert's rows, so it cannot be captured) is timed for context.

    python3 bench/bench_moe.py --out bench/results/moe_h200.json [--rows 1,6,8,16,48] [--sweep]

--sweep also times a small grid of block sizes / stages / warps per row count and reports the best,
to choose `MoEKernelConfig` defaults from measurements. --norm also times the block with the FFN's RMSNorm
in its router launch (`moe_forward(x, x, norm_weight=..., eps=...)`, "fused_graph_norm[_pdl]": x pre-norm,
the normed rows into the workspace, out a separate buffer so every replay sees the same x).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import types
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lowlat.benchmarking import (capture_graph, copy_bandwidth, event_times_us, read_flush,  # noqa: E402
                                 summarize_us, versions, write_json)
from lowlat.config import preset  # noqa: E402
from lowlat.kernels import moe as kmoe  # noqa: E402
from lowlat.reference.moe import moe as ref_moe  # noqa: E402
from lowlat.weights import LayerWeights  # noqa: E402

FLUSH_BYTES = 512 * 2**20


def moe_layer_weights(cfg, device, seed: int) -> LayerWeights:
    """Router and expert weights of one MoE layer, std 1/sqrt(fan_in), made on the GPU (the
    attention fields, unused by the MoE block, are empty)."""
    g = torch.Generator(device=device).manual_seed(seed)
    h, e, ie = cfg.hidden_size, cfg.num_experts, cfg.moe_intermediate_size

    def lin(*shape):
        return (torch.randn(*shape, generator=g, device=device) / shape[-1] ** 0.5).to(torch.bfloat16)

    empty = torch.empty(0, device=device, dtype=torch.bfloat16)
    return LayerWeights(attn_norm=empty, wq=empty, wk=empty, wv=empty, wo=empty, mlp_norm=empty,
                        router=lin(e, h), expert_gate=lin(e, ie, h), expert_up=lin(e, ie, h),
                        expert_down=lin(e, h, ie))


def time_replays(fn, flush, iters: int) -> dict:
    """Per-call µs (CUDA events), an L2 flush before each call when flush is given (a tensor to zero or a
    callable: `event_times_us`)."""
    t = summarize_us(event_times_us(fn, iters=iters, flush=flush, sync_each=False))
    return {"median_us": t["us_median"], "p10_us": t["us_p10"], "p90_us": t["us_p90"]}


def capture(h, x, lw, cfg, ws, out, use_pdl, config, norm_weight=None):
    """The block captured in a CUDA graph; with norm_weight h is taken as the pre-norm rows (RMSNorm in the
    router launch, eps = cfg.rms_eps)."""
    eps = cfg.rms_eps if norm_weight is not None else None
    return capture_graph(lambda _: kmoe.moe_forward(h, x, lw, cfg, h.shape[0], norm_weight=norm_weight, eps=eps,
                                                    out=out, workspace=ws, use_pdl=use_pdl, config=config), 1)


def block_case(cfg, lw, m: int, g: torch.Generator, bw: float):
    """Random rows h, x [m, H], a workspace and out for one MoE block, routed once; the experts the routing
    touches and the floor: router + touched experts' weights + activations over copy bandwidth bw (B/s)."""
    device = lw.router.device
    hidden, ie, e = cfg.hidden_size, cfg.moe_intermediate_size, cfg.num_experts
    h = torch.randn(m, hidden, generator=g, device=device).to(torch.bfloat16)
    x = torch.randn(m, hidden, generator=g, device=device).to(torch.bfloat16)
    ws = kmoe.MoEWorkspace.for_config(cfg, m, device)
    out = torch.empty_like(x)
    kmoe.moe_forward(h, x, lw, cfg, m, out=out, workspace=ws)
    torch.cuda.synchronize()
    active = int(ws.bitmap[:m].bool().any(0).sum())
    nbytes = active * 3 * ie * hidden * 2 + e * hidden * 2 + 3 * m * hidden * 2
    return types.SimpleNamespace(h=h, x=x, ws=ws, out=out, active=active, nbytes=nbytes, floor_us=nbytes / bw * 1e6)


def sweep_configs(base: kmoe.MoEKernelConfig):
    for bn in (16, 32, 64):
        for bnh in (32, 64, 128):
            for stages in (3, 4):
                for warps in (4, 8):
                    yield dataclasses.replace(base, BN=bn, BNH=bnh, num_stages=stages, num_warps=warps)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="JSON file to write")
    ap.add_argument("--rows", default="1,6,8,16,48")
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sweep", action="store_true", help="also time a grid of kernel configs")
    ap.add_argument("--norm", action="store_true", help="also time the block with the RMSNorm in its router launch")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_moe needs a CUDA GPU", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    cfg = preset("Qwen3-30B-A3B")
    lw = moe_layer_weights(cfg, device, args.seed)
    hidden, ie, e = cfg.hidden_size, cfg.moe_intermediate_size, cfg.num_experts
    bw = copy_bandwidth(device)
    flush = read_flush(FLUSH_BYTES, device)
    write_flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device=device)
    base_cfg = kmoe.MoEKernelConfig.for_shapes(hidden, e, ie)
    g = torch.Generator(device=device).manual_seed(args.seed + 1)
    gn = torch.Generator(device=device).manual_seed(args.seed + 2)     # its own: h and x stay the same
    norm_weight = (1.0 + 0.1 * torch.randn(hidden, generator=gn, device=device)).to(torch.bfloat16)
    results = []
    for m in (int(r) for r in args.rows.split(",")):
        case = block_case(cfg, lw, m, g, bw)
        h, x, ws, out, active, nbytes, floor_us = (case.h, case.x, case.ws, case.out, case.active, case.nbytes,
                                                    case.floor_us)
        row = {"rows": m, "active_experts": active, "bytes": nbytes, "floor_us": floor_us}
        for use_pdl in (False, True):
            key = "fused_graph_pdl" if use_pdl else "fused_graph"
            try:
                graph = capture(h, x, lw, cfg, ws, out, use_pdl, None)
            except Exception as exc:  # e.g. a driver without PDL in graphs: record it, keep measuring
                row[key] = {"error": repr(exc)[:300]}
                continue
            row[key] = time_replays(graph.replay, flush, args.iters)
            row[key + "_write_flush"] = time_replays(graph.replay, write_flush, args.iters)
            row[key + "_warm_l2"] = time_replays(graph.replay, None, args.iters)
            t = row[key]["median_us"]
            row[key].update(gbps=nbytes / (t * 1e-6) / 1e9, pct_of_floor=100.0 * floor_us / t)
            tw = row[key + "_write_flush"]["median_us"]
            row[key + "_write_flush"].update(gbps=nbytes / (tw * 1e-6) / 1e9, pct_of_floor=100.0 * floor_us / tw)
            if args.norm:
                nkey = "fused_graph_norm_pdl" if use_pdl else "fused_graph_norm"
                try:       # x as the pre-norm rows and the residual (its routing, so its bytes, differ from h's)
                    graph = capture(x, x, lw, cfg, ws, out, use_pdl, None, norm_weight=norm_weight)
                except Exception as exc:
                    row[nkey] = {"error": repr(exc)[:300]}
                    continue
                row[nkey] = time_replays(graph.replay, flush, args.iters)
        row["reference_eager_bf16"] = time_replays(
            lambda: x + ref_moe(h, lw.router, lw.expert_gate, lw.expert_up, lw.expert_down, cfg.top_k,
                                cfg.norm_topk_prob, m), flush, max(20, args.iters // 10))
        if args.sweep:
            sweep = []
            pdl = "median_us" in row["fused_graph_pdl"]
            for c in sweep_configs(base_cfg):
                try:
                    graph = capture(h, x, lw, cfg, ws, out, pdl, c)
                    t = time_replays(graph.replay, flush, max(50, args.iters // 4))["median_us"]
                except Exception as exc:  # a config that does not build or fit is reported, not fatal
                    sweep.append({"config": dataclasses.asdict(c), "error": repr(exc)[:200]})
                    continue
                sweep.append({"config": dataclasses.asdict(c), "use_pdl": pdl, "median_us": t})
            ok = [s for s in sweep if "median_us" in s]
            row["sweep"] = sorted(ok, key=lambda s: s["median_us"]) + [s for s in sweep if "error" in s]
        results.append(row)
        def us(key):
            return f"{row[key]['median_us']:7.1f} us" if "median_us" in row.get(key, {}) else "  error"
        print(f"M={m:3d} experts={active:3d} floor {floor_us:7.1f} us | graph {us('fused_graph')} | graph+PDL "
              f"{us('fused_graph_pdl')} | write flush: graph {us('fused_graph_write_flush')} | graph+PDL "
              f"{us('fused_graph_pdl_write_flush')} | reference eager {us('reference_eager_bf16')}"
              + (f" | norm: graph {us('fused_graph_norm')} | graph+PDL {us('fused_graph_norm_pdl')}"
                 if args.norm else ""), flush=True)
    report = {
        "bench": "moe", "model": cfg.name,
        "shape": {"hidden": hidden, "experts": e, "top_k": cfg.top_k, "moe_intermediate": ie},
        **versions(),
        "copy_bandwidth_tbps": bw / 1e12,
        "kernel_config": dataclasses.asdict(base_cfg),
        "timing": f"median of {args.iters} CUDA-graph replays, each after a {FLUSH_BYTES >> 20} MB L2 flush "
                  "(a read; *_write_flush: a zeroing write)",
        "results": results,
    }
    write_json(args.out, report)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
