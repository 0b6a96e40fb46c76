"""Issue 3, session 9 (kept only at the commit that adds it; the fold was then reverted): Qwen3-30B-A3B out_proj + MoE block, PDL, one CUDA graph
per variant, a 512 MB read flush before every replay, three interleaved rounds of 100 replays.
old: out_proj writing h + moe_forward(h, x); new: residual_gemv + moe_forward(None, x, norm_weight)
; each launch alone too.
    python3 bench/explore/moe_fold_timing.py     (on the H200, from the repo root)"""
import sys

import torch

sys.path.insert(0, ".")
from lowlat.bench import random_weights_on_device  # noqa: E402
from lowlat.benchmarking import capture_graph, event_times_us, read_flush, summarize_us  # noqa: E402
from lowlat.config import preset  # noqa: E402
from lowlat.kernels import moe as kmoe  # noqa: E402
from lowlat.kernels._gemv import GemvWorkspace, plan_gemv  # noqa: E402
from lowlat.kernels.out_proj import out_proj, residual_gemv  # noqa: E402


dev = "cuda"
cfg = preset("Qwen3-30B-A3B").replace(num_layers=1)
lw = random_weights_on_device(cfg, dev, seed=3).layers[0]
H, Q, eps = cfg.hidden_size, cfg.q_size, cfg.rms_eps
gws = GemvWorkspace.create(H, dev)
plan_o, plan_r = plan_gemv(H, Q, kind="out_proj"), plan_gemv(H, Q, kind="residual")
flush = read_flush(512 << 20, dev)
g = torch.Generator(device=dev).manual_seed(0)
for rows in (1, 6, 16, 48):
    attn = torch.randn(rows, Q, generator=g, device=dev).bfloat16()
    x0 = torch.randn(rows, H, generator=g, device=dev).bfloat16()
    x1o, x1n, h, outo, outb = (torch.empty_like(x0) for _ in range(5))
    rstd = torch.empty(rows, device=dev)
    wso, wsb = kmoe.MoEWorkspace.for_config(cfg, rows, dev), kmoe.MoEWorkspace.for_config(cfg, rows, dev)

    def op_norm(_):
        out_proj(attn, lw.wo, x0, lw.mlp_norm, eps, out=x1o, h_out=h, rstd_out=rstd, workspace=gws, plan=plan_o,
                 use_pdl=True)

    def op_res(_):
        residual_gemv(attn, lw.wo, x0, out=x1n, workspace=gws, plan=plan_r, use_pdl=True)

    def moe_old(_):
        kmoe.moe_forward(h, x1o, lw, cfg, rows, out=outo, workspace=wso, use_pdl=True)

    def moe_b(_):
        kmoe.moe_forward(None, x1n, lw, cfg, rows, norm_weight=lw.mlp_norm, eps=eps, out=outb, workspace=wsb,
                         use_pdl=True)

    variants = {
        "old": lambda i: (op_norm(i), moe_old(i)), "new": lambda i: (op_res(i), moe_b(i)),
        "out_proj_norm": op_norm, "residual": op_res, "moe_h_given": moe_old, "moe_normed": moe_b}
    graphs = {k: capture_graph(f, 1) for k, f in variants.items()}
    for k in ("old", "new"):
        graphs[k].replay()
    torch.cuda.synchronize()
    diff = dict(h=int((h != wsb.h[:rows]).sum()), out=int((outo != outb).sum()))
    act = int(wsb.bitmap[:rows].bool().any(0).sum())
    res = {k: [] for k in graphs}
    for _ in range(3):
        for k, gr in graphs.items():
            res[k] += event_times_us(gr.replay, iters=100, warmup=5, flush=flush, sync_each=False)
    line = " ".join(f"{k} {summarize_us(v)['us_median']:.2f}" for k, v in res.items())
    print(f"rows {rows:2d} active {act:3d}: {line} | elements differing from old: {diff}", flush=True)
