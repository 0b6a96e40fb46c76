"""Benchmark: fused attention prologue (lowlat/kernels/attn_prologue.py) vs its reference.

For SmolLM2-135M, Llama-3.2-1B and Qwen3-30B-A3B shapes (lowlat.config.preset) at rows 1, 6, 8, 16, 48:
  fused            one launch, CUDA graph, cold L2 (weights / x / outputs rotated over R copies)
  fused_pdl        the same launched with programmatic dependent launch (back-to-back calls overlap)
  held_pdl         lowlat/kernels/attn_prologue_held.py (weights held in registers across the PDL wait) with PDL,
                   where `held_prologue_supported` allows (Llama-3.2-1B here; skipped with the reason elsewhere), the
                   norm weight multiplied into the weights in registers
  held_folded_pdl  the same on weights folded once (`fold_attn_norm`, as FusedModel stores them): same bits
  held_paced_pdl   the same folded weights with pace=True and early_release=True (the paced form at 1 row, the next
                   launch released at the start; g = 1 and the release after the wait at 2+ rows:
                   `attn_prologue_held`'s pace): same bits
  cluster_pdl      lowlat/kernels/attn_prologue_cluster.py (QK-norm models, Qwen3 here: the held prologue with a
                   head's programs one thread-block cluster, folded weights in paced 32-column chunks) with PDL,
                   where `cluster_prologue_supported` allows
  ref_graph        lowlat.reference.attn_prologue under a CUDA graph (bf16, eager kernels)
  ref_compile_graph  the same through torch.compile(dynamic=True), then a CUDA graph
Bytes: fused QKV weight + norms (+ bias) + x + q + the K/V rows written + cos/sin rows + int inputs.
Floor = bytes / measured copy bandwidth. Writes JSON to --out (lowlat/benchmarking.py has the method).
--warm-x: every copy reads one x (still counted in the bytes), so x comes from L2 as in the decode step, where the
launch before the prologue has just written it; weights and outputs stay rotated (cold). Without it x is cold too.

    python bench/bench_attn_prologue.py --out bench/results/attn_prologue_h200.json
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
from lowlat.kernels.attn_prologue import (attn_prologue, make_prologue_workspace, pack_qkv,  # noqa: E402
                                          pack_qkv_bias, rope_table)
from lowlat.kernels.attn_prologue_cluster import attn_prologue_cluster, cluster_prologue_supported  # noqa: E402
from lowlat.kernels.attn_prologue_held import (attn_prologue_held, fold_attn_norm,  # noqa: E402
                                               held_prologue_supported)
from lowlat.reference.attn_prologue import attn_prologue as ref_attn_prologue  # noqa: E402
from lowlat.reference.rope import rope_inv_freq  # noqa: E402
from lowlat.weights import random_layer_weights  # noqa: E402

MODELS = ("SmolLM2-135M", "Llama-3.2-1B", "Qwen3-30B-A3B")
ROWS = (1, 6, 8, 16, 48)
MAX_POS = 4096


def bytes_moved(cfg, m: int) -> int:
    h, d, hq, hkv = cfg.hidden_size, cfg.head_dim, cfg.num_heads, cfg.num_kv_heads
    n = (hq + 2 * hkv) * d
    weights = n * h * 2 + h * 2 + (n * 2 if cfg.qkv_bias else 0) + (2 * d * 2 if cfg.qk_norm else 0)
    acts = m * h * 2 + m * hq * d * 2 + 2 * m * hkv * d * 2 + m * d * 4 + m * (8 + 4)
    return weights + acts


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--models", nargs="*", default=list(MODELS))
    ap.add_argument("--rows", nargs="*", type=int, default=list(ROWS))
    ap.add_argument("--budget-s", type=float, default=600.0, help="skip reference variants past this")
    ap.add_argument("--warm-x", action="store_true", help="one x for every copy (in L2, as in the step)")
    args = ap.parse_args()
    exit_on_sigterm()
    budget = Budget(args.budget_s)
    dev = torch.device("cuda")
    bw = copy_bandwidth()
    results, skipped = [], []
    payload = {"bench": "attn_prologue", **versions(), "copy_bandwidth_GBps": bw / 1e9,
               "method": "CUDA graph of R back-to-back calls on R input copies (cold L2), median per call"
                         + ("; x one copy (warm in L2), weights and outputs rotated" if args.warm_x else ""),
               "warm_x": args.warm_x,
               "results": results, "skipped": skipped}
    compiled = torch.compile(ref_attn_prologue, dynamic=True)
    configs = [(name, m) for name in args.models for m in args.rows]
    # phases: every fused measurement first, then the references while the budget lasts
    phases = [("fused", False), ("fused_pdl", False), ("held_pdl", False), ("held_folded_pdl", False),
              ("held_paced_pdl", False), ("cluster_pdl", False),
              ("ref_graph", True), ("ref_compile_graph", True)]
    try:
        for variant, optional in phases:
            for name, m in configs:
                cfg = preset(name)
                nbytes = bytes_moved(cfg, m)
                base = {"model": name, "rows": m, "bytes": nbytes, "floor_us": nbytes / bw * 1e6, "warm_x": args.warm_x}
                if optional and budget.left() < 0:
                    skipped.append({**base, "variant": variant, "why": "time budget spent"})
                    continue
                held = variant.startswith("held")
                cluster = variant == "cluster_pdl"
                why = (held_prologue_supported(cfg, dev) if held else
                       cluster_prologue_supported(cfg, dev) if cluster else None)
                if why is not None:
                    skipped.append({**base, "variant": variant, "why": why})
                    continue
                g = torch.Generator().manual_seed(0)
                # attention weights only: a dense config with a tiny MLP (experts would only cost time here)
                lw = random_layer_weights(cfg.replace(intermediate_size=16, num_experts=0, top_k=0,
                                                      moe_intermediate_size=0), generator=g, device=dev)
                w0, b0 = pack_qkv(lw), pack_qkv_bias(lw)
                table = rope_table(cfg, MAX_POS, dev)
                inv = rope_inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling).to(dev)
                hq, hkv, d, h = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.hidden_size
                r = rotation_copies(nbytes)
                ws_ = [w0.clone() for _ in range(r)]
                xs = [torch.randn(m, h, device=dev).bfloat16() for _ in range(1 if args.warm_x else r)]
                xs = xs * (r // len(xs))                                    # --warm-x: one x, r references
                kc = torch.zeros(r * m + 1, hkv, d, dtype=torch.bfloat16, device=dev)
                vc = torch.zeros_like(kc)
                locs = [torch.arange(1 + i * m, 1 + (i + 1) * m, dtype=torch.int32, device=dev) for i in range(r)]
                pos = torch.randint(0, MAX_POS, (m,), device=dev)
                qs = [torch.empty(m, hq, d, dtype=torch.bfloat16, device=dev) for _ in range(r)]
                wsp = make_prologue_workspace(w0, d)
                base.update(plan=wsp.plan.describe(), early_inputs=wsp.early_inputs)
                if held or cluster:
                    base.update(plan="attn_prologue_held (4 warps, 4 K slices, 8-row blocks)"
                                + (", clusters of D / 16 programs, 32-column chunks" if cluster else ""),
                                early_inputs=True)
                if cluster:
                    ws_ = [fold_attn_norm(t, lw.attn_norm) for t in ws_]
                    calls = [lambda i=i: attn_prologue_cluster(xs[i], ws_[i], lw.q_norm, lw.k_norm, pos, locs[i], m, kc,
                                                               vc, table, cfg=cfg, out_q=qs[i], use_pdl=True)
                             for i in range(r)]
                elif held:
                    folded = variant in ("held_folded_pdl", "held_paced_pdl")
                    paced = variant == "held_paced_pdl"
                    if folded:
                        ws_ = [fold_attn_norm(t, lw.attn_norm) for t in ws_]
                    g = None if folded else lw.attn_norm
                    calls = [lambda i=i: attn_prologue_held(xs[i], ws_[i], g, pos, locs[i], m, kc, vc, table, cfg=cfg,
                                                            out_q=qs[i], use_pdl=True, early_release=paced,
                                                            pace=paced) for i in range(r)]
                elif variant.startswith("fused"):
                    pdl = variant == "fused_pdl"
                    calls = [lambda i=i: attn_prologue(xs[i], ws_[i], b0, lw.attn_norm, lw.q_norm, lw.k_norm, pos,
                                                       locs[i], m, kc, vc, table, cfg=cfg, out_q=qs[i], workspace=wsp,
                                                       use_pdl=pdl) for i in range(r)]
                else:
                    fn = ref_attn_prologue if variant == "ref_graph" else compiled
                    calls = [lambda i=i: fn(xs[i], ws_[i], b0, lw.attn_norm, lw.q_norm, lw.k_norm, pos, locs[i], m,
                                            kc, vc, inv, eps=cfg.rms_eps) for i in range(r)]
                t = time_variant(calls, base, variant, results, skipped, graph=True)
                if t is not None:
                    print(f"{name:14s} M={m:2d} {variant + ('+warm_x' if args.warm_x else ''):25s} "
                          f"{t['us_median']:8.2f} us  "
                          f"{t['GBps']:7.1f} GB/s  floor {base['floor_us']:.2f} us", flush=True)
                del ws_, xs, kc, vc, qs, calls
                torch.cuda.empty_cache()
    finally:
        write_json(args.out, payload)


if __name__ == "__main__":
    main()
