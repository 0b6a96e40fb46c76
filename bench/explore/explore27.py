"""Session-17 measurements (issue 3) on the attention prologue and the residual GEMV.

Two parts, each optional:

--bits: whether plans that differ only in bn (the tile height, which picks the MMA instruction: mma.sync for
    bn 16 / 32, wgmma for bn 64 / 128 in the "swap AB" form) give the SAME BITS. For each shape, random inputs
    (three seeds) at 1, 6, 17 and 48 rows are run through every plan of the list, and each output is compared
    bitwise with the first plan's (the prologue: q and the K / V rows written; the residual GEMV: its output).
    Same block_k / split / chunks, so the only arithmetic difference is the instruction. If they are equal,
    a plan could choose bn by row-block count (`GemvPlan.by_row_blocks`) without breaking row invariance.
--chain: the prologue per kernel (PDL-chained launches over rotating cold copies, as bench_attn_prologue.py's
    fused_pdl) for plans x register caps (`maxnreg`, a launch option: fewer registers a program let more of the
    next launch's programs be resident while this one runs its chain). Prints us and % of the floor.

    python bench/explore/explore27.py --bits --chain [--rows 1 6 48] [--caps 0 96 80 64]

Prints one line per measurement; no JSON (the device scripts keep the printed output).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

PROLOGUE_PLANS = {                      # Llama-3.2-1B's QKV: (N/2 = 1536 rotary pairs, K = 2048)
    "bn32": dict(bn=32, split=8, block_k=128, preload=True, stages=1, pf_k=0),
    "bn64": dict(bn=64, split=8, block_k=128, preload=True, stages=1, pf_k=0),
    "bn128": dict(bn=128, split=8, block_k=128, preload=True, stages=1, pf_k=0),
    "bn32_stream": dict(bn=32, split=8, block_k=128, preload=False, stages=2, pf_k=256),
    "bn64_stream": dict(bn=64, split=8, block_k=128, preload=False, stages=2, pf_k=256),
}
RESIDUAL_SHAPES = {                     # (N, K): Llama out_proj and down
    (2048, 2048): [dict(bn=b, split=4, block_k=128, preload=False, stages=4, pf_k=128) for b in (16, 32, 64, 128)],
    (2048, 8192): [dict(bn=b, split=4, block_k=128, preload=False, stages=4, pf_k=128) for b in (32, 64, 128)],
}


def capped(kernel, cap: int):
    """A stand-in for a @triton.jit kernel whose launches add maxnreg=cap (0: the kernel itself)."""
    if not cap:
        return kernel

    class Capped:
        def __getitem__(self, grid):
            launch = kernel[grid]
            return lambda *a, **kw: launch(*a, maxnreg=cap, **kw)
    return Capped()


def prologue_case(cfg, m: int, seed: int, dev):
    import torch

    from lowlat.kernels.attn_prologue import pack_qkv, pack_qkv_bias, rope_table
    from lowlat.weights import random_layer_weights

    g = torch.Generator().manual_seed(seed)
    lw = random_layer_weights(cfg.replace(intermediate_size=16, num_experts=0, top_k=0, moe_intermediate_size=0),
                              generator=g, device=dev)
    gd = torch.Generator(device=dev).manual_seed(seed)
    x = torch.randn(m, cfg.hidden_size, generator=gd, device=dev).bfloat16()
    pos = torch.randint(0, 4096, (m,), generator=gd, device=dev)
    return lw, pack_qkv(lw), pack_qkv_bias(lw), x, pos, rope_table(cfg, 4096, dev)


def bits(rows, model: str, device: str, seeds=(1, 2, 3)) -> None:
    import torch

    from lowlat.config import preset
    from lowlat.kernels.attn_prologue import attn_prologue, make_prologue_workspace
    from lowlat.kernels.out_proj import residual_gemv
    from lowlat.kernels._gemv import GemvWorkspace, plan_gemv

    dev = torch.device(device)
    cfg = preset(model)
    d, hkv = cfg.head_dim, cfg.num_kv_heads
    for seed in seeds:
        for m in rows:
            lw, w, b, x, pos, table = prologue_case(cfg, m, seed, dev)
            loc = torch.arange(1, m + 1, dtype=torch.int32, device=dev)
            outs = {}
            for name, fields in PROLOGUE_PLANS.items():
                ws = make_prologue_workspace(w, d, **fields)
                kc = torch.full((m + 1, hkv, d), float("nan"), dtype=torch.bfloat16, device=dev)
                vc = torch.full_like(kc, float("nan"))
                q = attn_prologue(x, w, b, lw.attn_norm, lw.q_norm, lw.k_norm, pos, loc, m, kc, vc, table, cfg=cfg,
                                  workspace=ws, use_pdl=True)
                outs[name] = torch.cat([q.flatten(), kc[1:].flatten(), vc[1:].flatten()]).float()
            ref = outs["bn32"]
            for name, o in outs.items():
                same = torch.equal(o.view(torch.int32), ref.view(torch.int32))
                nan = int(torch.isnan(o).sum())
                diff = (o - ref).abs().max().item()
                print(f"bits prologue seed {seed} rows {m:2d} {name:12s} vs bn32: equal {same} "
                      f"max|diff| {diff:.3g} nan {nan}", flush=True)
    ws = GemvWorkspace.create(2048, dev)
    shapes = RESIDUAL_SHAPES if dev.type == "cuda" else {      # CPU smoke run: a tiny shape
        (64, 512): [dict(bn=b, split=2, block_k=64, preload=False, stages=2, pf_k=0) for b in (16, 64)]}
    for (n, k), plans in shapes.items():
        for seed in seeds:
            g = torch.Generator(device=dev).manual_seed(seed)
            wr = (k ** -0.5 * torch.randn(n, k, generator=g, device=dev)).bfloat16()
            for m in rows:
                a = torch.randn(m, k, generator=g, device=dev).bfloat16()
                res = torch.randn(m, n, generator=g, device=dev).bfloat16()
                outs = []
                for f in plans:
                    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device=dev)
                    residual_gemv(a, wr, res, out=out, workspace=ws, plan=plan_gemv(n, k, **f), use_pdl=True)
                    outs.append((f["bn"], out.float()))
                for bn, o in outs:
                    same = torch.equal(o, outs[0][1]) and not torch.isnan(o).any()
                    print(f"bits residual {n}x{k} seed {seed} rows {m:2d} bn {bn:3d} vs bn {outs[0][0]}: "
                          f"equal {same} max|diff| {(o - outs[0][1]).abs().max().item():.3g}", flush=True)


def chain(rows, caps, plans) -> None:
    import torch

    from lowlat.benchmarking import copy_bandwidth, rotation_copies, time_launches
    from lowlat.config import preset
    from lowlat.kernels import attn_prologue as ap
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from bench_attn_prologue import bytes_moved

    dev = torch.device("cuda")
    bw = copy_bandwidth()
    print(f"copy bandwidth {bw / 1e9:.0f} GB/s", flush=True)
    cfg = preset("Llama-3.2-1B")
    kernel = ap._attn_prologue_kernel
    d, hkv, hq = cfg.head_dim, cfg.num_kv_heads, cfg.num_heads
    for m in rows:
        nbytes = bytes_moved(cfg, m)
        floor = nbytes / bw * 1e6
        lw, w0, b0, _, pos, table = prologue_case(cfg, m, 0, dev)
        r = rotation_copies(nbytes)
        ws_ = [w0.clone() for _ in range(r)]
        xs = [torch.randn(m, cfg.hidden_size, device=dev).bfloat16() for _ in range(r)]
        kc = torch.zeros(r * m + 1, hkv, d, dtype=torch.bfloat16, device=dev)
        vc = torch.zeros_like(kc)
        locs = [torch.arange(1 + i * m, 1 + (i + 1) * m, dtype=torch.int32, device=dev) for i in range(r)]
        qs = [torch.empty(m, hq, d, dtype=torch.bfloat16, device=dev) for _ in range(r)]
        for rep in range(2):
            for name in plans:
                wsp = ap.make_prologue_workspace(w0, d, **PROLOGUE_PLANS[name])
                for cap in caps:
                    ap._attn_prologue_kernel = capped(kernel, cap)
                    try:
                        t = time_launches(lambda i: ap.attn_prologue(
                            xs[i], ws_[i], b0, lw.attn_norm, lw.q_norm, lw.k_norm, pos, locs[i], m, kc, vc, table,
                            cfg=cfg, out_q=qs[i], workspace=wsp, use_pdl=True), r, iters=30)["us_median"]
                        print(f"chain rep {rep} rows {m:2d} {name:12s} maxnreg {cap or '-':>3} {t:7.2f} us "
                              f"{100 * floor / t:5.1f}% of floor ({floor:.2f} us)", flush=True)
                    except Exception as e:                                  # noqa: BLE001 - a cap may not compile
                        print(f"chain rows {m} {name} maxnreg {cap}: {type(e).__name__}: {str(e)[:200]}", flush=True)
                    finally:
                        ap._attn_prologue_kernel = kernel
        del ws_, xs, kc, vc, qs
        torch.cuda.empty_cache()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--bits", action="store_true")
    p.add_argument("--chain", action="store_true")
    p.add_argument("--rows", type=int, nargs="*", default=[1, 6, 17, 48])
    p.add_argument("--chain-rows", type=int, nargs="*", default=[1, 6, 48])
    p.add_argument("--caps", type=int, nargs="*", default=[0, 96, 80, 64])
    p.add_argument("--plans", nargs="*", default=["bn32", "bn64"])
    p.add_argument("--model", default="Llama-3.2-1B", help="--bits: the prologue's model (CPU smoke runs: SmolLM2-135M)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--seeds", type=int, nargs="*", default=[1, 2, 3])
    a = p.parse_args()
    if a.bits:
        bits(a.rows, a.model, a.device, a.seeds)
    if a.chain:
        chain(a.chain_rows, a.caps, a.plans)


if __name__ == "__main__":
    main()
