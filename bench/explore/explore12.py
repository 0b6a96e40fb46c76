"""Session-5 exploration: the attention prologue as a pair GEMV of `lowlat.kernels._gemv` (kind "qkv",
rotary halves paired like gate / up) against the kernel it replaced (bench/explore/prologue_v1.py, the
session-4 production kernel), PDL-chained launches on rotating cold copies (as bench/bench_attn_prologue.py
times them), for the candidate plans of `_gemv.candidate_plans("qkv", ...)` plus a few more, at 1 and 6 rows,
on Llama-3.2-1B (QKV 12.6 MB), Qwen3-30B-A3B (21 MB) and SmolLM2-135M (2.2 MB). Each variant's q is
checked against the old kernel's (max abs difference recorded; both are within the policy of the reference).

    python bench/explore/explore12.py --out $OUT/explore12.json [--budget-s 240] [--reps 2]
"""
from __future__ import annotations

import argparse
import time

from _common import Recorder, t_us

import torch

MODELS = ("Llama-3.2-1B", "Qwen3-30B-A3B", "SmolLM2-135M")
MAX_POS = 4096


def extra_plans(n: int, k: int) -> list[tuple[str, dict]]:
    out = []
    for split in (4, 8):
        for pf in (0, 128, 256):
            out.append((f"x_bn64_bk128_s{split}_st4_pf{pf}", dict(preload=False, bn=64, block_k=128, split=split,
                                                                  stages=4, pf_k=pf)))
    out += [("x_bn64_bk64_s8_st6_pf128", dict(preload=False, bn=64, block_k=64, split=8, stages=6, pf_k=128)),
            ("x_bn128_bk64_w8_s4_st4_pf128", dict(preload=False, bn=128, block_k=64, warps=8, split=4, stages=4,
                                                  pf_k=128)),
            ("x_preload_bn64_s8", dict(preload=True, bn=64, split=8)),
            ("x_preload_bn64_bk64_s8", dict(preload=True, bn=64, block_k=64, split=8))]
    return out


#: when set (explore13), the plans timed per model instead of candidate_plans + extra_plans
PLANS: dict[str, list[tuple[str, dict]]] | None = None
ROWS = {}
#: when set (explore14), {tag: module with attn_prologue / make_prologue_workspace} timed side by side
KERNELS: dict | None = None


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--budget-s", type=float, default=240.0)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--models", nargs="*", default=list(MODELS))
    args = ap.parse_args(argv)
    deadline = time.time() + args.budget_s

    import prologue_v1 as v1

    from lowlat.benchmarking import rotation_copies
    from lowlat.config import preset
    from lowlat.kernels import attn_prologue as ap2
    from lowlat.kernels._gemv import candidate_plans, plan_gemv
    from lowlat.weights import random_layer_weights

    rec = Recorder(args.out)
    dev = torch.device("cuda")
    for rep in range(args.reps):
        for name in args.models:
            cfg = preset(name)
            g = torch.Generator().manual_seed(0)
            lw = random_layer_weights(cfg.replace(intermediate_size=16, num_experts=0, top_k=0,
                                                  moe_intermediate_size=0), generator=g, device=dev)
            w0, b0 = ap2.pack_qkv(lw), ap2.pack_qkv_bias(lw)
            hq, hkv, d, h = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.hidden_size
            n, half = w0.shape[0], d // 2
            nbytes = w0.numel() * 2
            r = rotation_copies(nbytes)
            ws_ = [w0.clone() for _ in range(r)]
            table = ap2.rope_table(cfg, MAX_POS, dev)
            plans = [] if PLANS is not None else [(lbl, p) for lbl, p in candidate_plans("qkv", n // 2, h)
                                                  if p.bn >= half]
            for lbl, f in (PLANS[name] if PLANS is not None else extra_plans(n // 2, h)):
                try:
                    p = plan_gemv(n // 2, h, kind="qkv", **f)
                except Exception:                                            # noqa: BLE001
                    continue
                if p.bn >= half and all(p != q for _, q in plans):
                    plans.append((lbl, p))
            for m in ROWS.get(name, (1, 6)):
                xs = [torch.randn(m, h, device=dev).bfloat16() for _ in range(r)]
                kc = torch.zeros(r * m + 1, hkv, d, dtype=torch.bfloat16, device=dev)
                vc = torch.zeros_like(kc)
                locs = [torch.arange(1 + i * m, 1 + (i + 1) * m, dtype=torch.int32, device=dev) for i in range(r)]
                pos = torch.randint(0, MAX_POS, (m,), device=dev)
                qs = [torch.empty(m, hq, d, dtype=torch.bfloat16, device=dev) for _ in range(r)]
                common = (lw.attn_norm, lw.q_norm, lw.k_norm, pos)
                wsp1 = v1.make_prologue_workspace(w0, d, m)
                base = dict(model=name, rows=m, rep=rep, bytes=nbytes, floor_us=round(nbytes / rec.bw * 1e6, 3))

                def v1_call(i):
                    v1.attn_prologue(xs[i], ws_[i], b0, *common, locs[i], m, kc, vc, table, cfg=cfg, out_q=qs[i],
                                     workspace=wsp1, use_pdl=True)

                rec.guard("v1", lambda: rec(dict(base, variant="v1", us=t_us(v1_call, r))), **base)
                v1_call(0)
                want = qs[0].float().clone()
                for (tag, mod), (lbl0, p) in [(km, lp) for lp in plans for km in (KERNELS or {"": ap2}).items()]:
                    lbl = f"{tag}:{lbl0}" if tag else lbl0
                    if time.time() > deadline:
                        rec.skip(f"{name}/{m}/{lbl}", "budget")
                        continue
                    wsp = mod.make_prologue_workspace(w0, d, plan=p)

                    def call(i, wsp=wsp, mod=mod):
                        mod.attn_prologue(xs[i], ws_[i], b0, *common, locs[i], m, kc, vc, table, cfg=cfg,
                                          out_q=qs[i], workspace=wsp, use_pdl=True)

                    def one(lbl=lbl, p=p, call=call):
                        qs[0].fill_(float("nan"))
                        call(0)
                        diff = float((qs[0].float() - want).abs().max())
                        us = t_us(call, r)
                        rec(dict(base, variant=lbl, us=us, pct_of_copy=round(100 * base["floor_us"] / us, 1),
                                 max_abs_diff_vs_v1=diff, programs=p.n_tiles * p.split, plan=p.describe()))
                        print(f"{name:14s} M={m} {lbl:34s} {us:7.2f} us  diff {diff:.3g}", flush=True)

                    rec.guard(lbl, one, **base)
                del xs, kc, vc, qs
            del ws_
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
