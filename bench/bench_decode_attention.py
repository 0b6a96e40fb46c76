"""Benchmark: split-KV decode attention (lowlat/kernels/decode_attention.py) vs `paged_attention`.

For SmolLM2-135M and Llama-3.2-1B heads (lowlat.config.preset), contexts 512 and 4096, rows
1, 6, 8, 16, 48 (decode: each row is its own request with `ctx` cached tokens and sees ctx + 1):
  fused        one launch, CUDA graph, cold L2 (KV regions / q / out rotated over R copies)
  fused_pdl    the same with programmatic dependent launch (back-to-back calls overlap)
  fused_pdl_pre_kv  the same with out_cache_loc (each row's own slot, as the fused step passes it) and
               pre_kv=True: each program loads its first block's K / V before its PDL wait (session 14;
               the fused step does so only where the grid fits on the GPU at once)
  ref_eager    lowlat.reference.attention.paged_attention, eager, no graph: it reads
               positions.max() on the host (a sync), so it cannot be captured in a CUDA graph
  ref_compile  torch.compile(paged_attention, dynamic=True) (graph break at that sync), no graph
Bytes: the K and V rows each row attends to + q + out + page-table entries; floor = bytes / copy
bandwidth. Slots of a request are contiguous (a fresh allocation). JSON to --out.
--split-groups G ... (session 18): time the fused variants at each of these `split_groups` (programs per (row, KV
head); 0 = the default rule, `default_split_groups`); each result records the value launched. fused_pdl_pre_kv runs
one program per split (the early path's grid) and is skipped at any other value.
--kv-stages S ... (session 19): time the fused variants at each of these KV-loop pipeline depths (`kv_stages`;
0 = the default, `default_kv_stages`); each result records the value launched.
--block-n N (session 19): tokens per KV block of the workspace (default 64). The block size shapes the split
partition, so it changes the rounding (not the row invariance); recorded as block_n.

    python bench/bench_decode_attention.py --out bench/results/decode_attention_h200.json
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from lowlat.benchmarking import (Budget, copy_bandwidth, exit_on_sigterm, rotation_copies,  # noqa: E402
                                 time_variant, versions, write_json)
from lowlat.config import preset  # noqa: E402
from lowlat.kernels.decode_attention import (BLOCK_N, MAX_SPLITS, decode_attention, default_kv_stages,  # noqa: E402
                                             default_split_groups, make_decode_workspace)
from lowlat.reference.attention import paged_attention  # noqa: E402

MODELS = ("SmolLM2-135M", "Llama-3.2-1B")
ROWS = (1, 6, 8, 16, 48)
CTXS = (512, 4096)


def bytes_moved(hq: int, hkv: int, d: int, m: int, ctx: int) -> int:
    visible = ctx + 1
    return m * visible * (hkv * d * 2 * 2 + 4) + 2 * m * hq * d * 2 + m * (8 + 4)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--models", nargs="*", default=list(MODELS))
    ap.add_argument("--rows", nargs="*", type=int, default=list(ROWS))
    ap.add_argument("--ctxs", nargs="*", type=int, default=list(CTXS))
    ap.add_argument("--budget-s", type=float, default=600.0, help="skip reference variants past this")
    ap.add_argument("--variants", nargs="*", default=None,
                    help="run only these (fused, fused_pdl, fused_pdl_pre_kv, ref_eager, ref_compile)")
    ap.add_argument("--split-groups", nargs="*", type=int, default=[0],
                    help="the fused variants' split_groups (0: the default rule)")
    ap.add_argument("--kv-stages", nargs="*", type=int, default=[0],
                    help="the fused variants' kv_stages (0: the default)")
    ap.add_argument("--block-n", type=int, default=BLOCK_N,
                    help="tokens per KV block (a power of two >= 16; default %(default)s)")
    args = ap.parse_args()
    exit_on_sigterm()
    budget = Budget(args.budget_s)
    dev = torch.device("cuda")
    bw = copy_bandwidth()
    results, skipped = [], []
    payload = {"bench": "decode_attention", **versions(), "copy_bandwidth_GBps": bw / 1e9,
               "method": "CUDA graph of R back-to-back calls on R input copies (cold L2), median per call",
               "results": results, "skipped": skipped}
    compiled = torch.compile(paged_attention, dynamic=True)
    timed = set()          # fused launches already timed: (variant, model, ctx, rows, split_groups, kv_stages)
    configs = [(name, ctx, m, g, st) for name in args.models for ctx in args.ctxs for m in args.rows
               for g in args.split_groups for st in args.kv_stages]
    # phases: every fused measurement first, then the references while the budget lasts
    phases = [("fused", False), ("fused_pdl", False), ("fused_pdl_pre_kv", False), ("ref_eager", True),
              ("ref_compile", True)]
    if args.variants is not None:
        phases = [ph for ph in phases if ph[0] in args.variants]
    try:
        for variant, optional in phases:
            for name, ctx, m, groups, stages in configs:
                cfg = preset(name)
                hq, hkv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
                nbytes = bytes_moved(hq, hkv, d, m, ctx)
                base = {"model": name, "rows": m, "ctx": ctx, "bytes": nbytes, "floor_us": nbytes / bw * 1e6}
                if not variant.startswith("fused"):
                    if groups != args.split_groups[0] or stages != args.kv_stages[0]:
                        continue                     # the references once per (model, ctx, rows)
                elif variant == "fused_pdl_pre_kv":          # the early path runs one program per split
                    if groups not in (0, MAX_SPLITS):
                        skipped.append({**base, "variant": variant, "split_groups": groups, "kv_stages": stages,
                                        "why": "pre_kv needs one program per split"})
                        continue
                    base["split_groups"] = MAX_SPLITS
                else:
                    base["split_groups"] = groups or default_split_groups(m, hkv, head_dim=d)
                if variant.startswith("fused"):
                    pre = variant == "fused_pdl_pre_kv"
                    base["kv_stages"] = stages or default_kv_stages(base["split_groups"], MAX_SPLITS, head_dim=d,
                                                                    pre_kv=pre)
                    launch = (variant, name, ctx, m, base["split_groups"], base["kv_stages"])
                    if launch in timed:          # e.g. --kv-stages 0 5 where the default is 5: timed once
                        continue
                    timed.add(launch)
                if optional and budget.left() < 0:
                    skipped.append({**base, "variant": variant, "why": "time budget spent"})
                    continue
                r = rotation_copies(nbytes)
                L = ctx + 1
                kc = torch.randn(r * m * L + 1, hkv, d, device=dev).bfloat16()
                vc = torch.randn_like(kc)
                pts = [torch.arange(1 + i * m * L, 1 + (i + 1) * m * L, dtype=torch.int32, device=dev).view(m, L)
                       for i in range(r)]
                req = torch.arange(m, dtype=torch.int32, device=dev)
                pos = torch.full((m,), ctx, dtype=torch.int64, device=dev)
                qs = [torch.randn(m, hq, d, device=dev).bfloat16() for _ in range(r)]
                outs = [torch.empty_like(q) for q in qs]
                ws = make_decode_workspace(m, hq, hkv, d, dev, block_n=args.block_n)
                base.update(num_splits_max=ws.num_splits, block_n=ws.block_n)
                if variant.startswith("fused"):
                    pdl = variant.startswith("fused_pdl")
                    locs = [pt[:, ctx].contiguous() if variant == "fused_pdl_pre_kv" else None for pt in pts]
                    calls = [lambda i=i: decode_attention(qs[i], kc, vc, pts[i], req, pos, m, out=outs[i],
                                                          out_cache_loc=locs[i], pre_kv=locs[i] is not None,
                                                          workspace=ws, use_pdl=pdl,
                                                          split_groups=base["split_groups"],
                                                          kv_stages=base["kv_stages"])
                             for i in range(r)]
                else:
                    fn = paged_attention if variant == "ref_eager" else compiled
                    calls = [lambda i=i: fn(qs[i], kc, vc, pts[i], req, pos, m) for i in range(r)]
                graph = variant.startswith("fused")
                t = time_variant(calls, base, variant, results, skipped, graph=graph, iters=30 if graph else 10)
                if t is not None:
                    g, st = base.get("split_groups", "-"), base.get("kv_stages", "-")
                    print(f"{name:14s} ctx={ctx:5d} M={m:2d} g={g!s:>2} st={st} {variant:12s} "
                          f"{t['us_median']:9.2f} us "
                          f"{t['GBps']:8.1f} GB/s  floor {base['floor_us']:.2f} us", flush=True)
                del kc, vc, qs, outs, pts, calls
                torch.cuda.empty_cache()
    finally:
        write_json(args.out, payload)


if __name__ == "__main__":
    main()
