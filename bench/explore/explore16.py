"""Session-6 exploration: GEMV launches of 8-21 MB (issue 3) with no split-K and no cross-program step at all.

Each program owns BN whole output rows (columns of y = x W^T): it loads its entire weight slice [BN, K] into
registers at once (before `gdc_wait` under PDL, MODE 2; after it, MODE 1; no PDL, MODE 0), then reads x,
and writes its outputs. The whole of a 12-21 MB weight fits in the H200's register files (132 x 256 KB), so
a grid of N / BN programs holds it in one wave. Two epilogues as the production launches need them:
  norm  y = rstd(x) * ((x * g) W^T)            (attention prologue's RMSNorm -> QKV GEMV, no RoPE here)
  res   y = res + x W^T                         (out_proj's residual GEMV; res loaded before the wait)
Timed as the fused step runs its launches (`lowlat.benchmarking.time_launches`: one CUDA graph of launches
over rotating cold copies, PDL-chained); with the pure read floor of the same bytes and copy bandwidth.

Also (issue 5): the TMA copy of the greedy draft launch with the production tail minus the logits stores
(tma_gemv EPI 8) beside EPI 3 (production tail), the production launch and the torch ops.

    python bench/explore/explore16.py --out $OUT/explore16.json [--budget-s 240]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from _common import Recorder, check_and_time, gemv_reference, t_us, time_greedy_tails

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait  # noqa: E402

from lowlat.benchmarking import rotation_copies  # noqa: E402
from lowlat.kernels._gemv import rstd_of  # noqa: E402

#: (label, N, K, epilogue): Llama-3.2-1B QKV 12.6 MB, Qwen3-30B-A3B QKV 21 MB, Qwen3 out_proj 16.8 MB,
#: Llama-3.2-1B out_proj 8.4 MB
SHAPES = [("llama_qkv", 3072, 2048, "norm"), ("qwen3_qkv", 5120, 2048, "norm"),
          ("qwen3_out", 2048, 4096, "res"), ("llama_out", 2048, 2048, "res")]
#: (BN, warps, KC) per K; registers at 1 row (ptxas, sm_90): K 2048: 69 / 64 / 72 / 72 / 128, K 4096: 80 / 94 /
#: 100 / 80 (no spills), so every grid of these holds its whole weight in one wave
CONFIGS = {2048: [(2, 2, 256), (4, 4, 512), (4, 4, 256), (8, 8, 256), (16, 8, 256)],
           4096: [(2, 2, 256), (4, 4, 512), (4, 4, 256), (8, 8, 256)]}


@triton.jit
def _narrow_kernel(x_ptr, g_ptr, w_ptr, res_ptr, out_ptr, N, eps, K: tl.constexpr, BN: tl.constexpr,
                   R: tl.constexpr, RP: tl.constexpr, MODE: tl.constexpr, RES: tl.constexpr, KC: tl.constexpr):
    """The weight slice is held as K / KC chunk tensors [BN, KC] (a tuple), so only one chunk is in fp32 at
    a time after the wait."""
    pid = tl.program_id(0)
    rn = pid * BN + tl.arange(0, BN)
    if MODE == 1:
        gdc_wait()
        gdc_launch_dependents()
    if MODE == 2:
        gdc_launch_dependents()
    wc = ()
    for c in tl.static_range(K // KC):
        rk = c * KC + tl.arange(0, KC)
        wc = wc + (tl.load(w_ptr + rn[:, None].to(tl.int64) * K + rk[None, :]),)     # the whole slice
    rr = tl.arange(0, RP)
    if RES:
        res = tl.load(res_ptr + rr[:, None] * N + rn[None, :], mask=(rr < R)[:, None], other=0.0).to(tl.float32)
    if MODE == 2:
        gdc_wait()
    for r in tl.static_range(R):
        y = tl.zeros([BN], dtype=tl.float32)
        ss = 0.0
        for c in tl.static_range(K // KC):
            rk = c * KC + tl.arange(0, KC)
            x = tl.load(x_ptr + r * K + rk).to(tl.float32)
            if RES:
                y += tl.sum(wc[c].to(tl.float32) * x[None, :], axis=1)
            else:
                ss += tl.sum(x * x, axis=0)
                g = tl.load(g_ptr + rk).to(tl.float32)
                y += tl.sum(wc[c].to(tl.float32) * (x * g)[None, :], axis=1)
        if RES:
            y = y + tl.sum(tl.where(rr[:, None] == r, res, 0.0), axis=0)
        else:
            y = y * rstd_of(ss, K, eps)
        tl.store(out_ptr + r * N + rn, y.to(tl.bfloat16))


def narrow(rec, deadline, reps: int):
    dev = torch.device("cuda")
    for label, n, k, epi in SHAPES:
        nbytes = n * k * 2
        nc = rotation_copies(nbytes)
        gen = torch.Generator(device=dev).manual_seed(16)
        ws = [(torch.randn(n, k, generator=gen, device=dev) * k ** -0.5).to(torch.bfloat16) for _ in range(nc)]
        g = (1 + 0.1 * torch.randn(k, generator=gen, device=dev)).to(torch.bfloat16)
        for r in (1, 6):
            x = torch.randn(r, k, generator=gen, device=dev).to(torch.bfloat16)
            res = torch.randn(r, n, generator=gen, device=dev).to(torch.bfloat16)
            out = torch.empty(r, n, device=dev, dtype=torch.bfloat16)
            want = gemv_reference(epi, x, g, res, ws[0])
            configs = CONFIGS[k]
            for rep in range(reps):
                for bn, nw, kc in configs:
                    for mode in ((2, 1) if r == 1 else (2,)):
                        if time.time() > deadline:
                            return

                        def launch(i, bn=bn, nw=nw, mode=mode, kc=kc):
                            _narrow_kernel[(n // bn,)](x, g, ws[i], res, out, n, 1e-5, K=k, BN=bn, R=r,
                                                       RP=triton.next_power_of_2(r), MODE=mode, KC=kc,
                                                       RES=epi == "res", num_warps=nw, launch_pdl=mode > 0)

                        def one(bn=bn, nw=nw, mode=mode, kc=kc, launch=launch):
                            check_and_time(rec, launch, out, want, nc, nbytes,
                                           dict(op="narrow", shape=label, n=n, k=k, rows=r, rep=rep, bn=bn, warps=nw,
                                                kc=kc, mode=mode))
                        rec.guard(f"{label}/bn{bn}/w{nw}/kc{kc}/m{mode}", one, op="narrow", rows=r)
        del ws
        torch.cuda.empty_cache()


def floors(rec, deadline):
    """Pure reads of each shape's bytes (bench_stream_floor's kernel), every load before / after the wait."""
    from bench_stream_floor import program_counts, read_launcher

    dev = torch.device("cuda")
    for label, n, k, _ in SHAPES:
        numel = n * k
        nc = rotation_copies(2 * numel)
        ws = [torch.randn(numel, device=dev).to(torch.bfloat16) for _ in range(nc)]
        out = torch.empty(numel // 8192 + 1, dtype=torch.float32, device=dev)
        for p in program_counts(numel):
            for mode in (2, 1):
                if time.time() > deadline:
                    return

                def one(p=p, mode=mode):
                    us = t_us(read_launcher(ws, out, p, mode), nc, 41)
                    rec(dict(op="read", shape=label, programs=p, mode=mode, us=us,
                             pct_of_copy=round(100 * 2 * numel / rec.bw / (us * 1e-6), 1)))
                rec.guard(f"read/{label}/{p}/{mode}", one, op="read")
        del ws
        torch.cuda.empty_cache()


def greedy_no_logits(rec, deadline, reps):
    """Tails EPI 3 and 8 (no logits) at 1-8 rows, production with PDL beside them."""
    time_greedy_tails(rec, deadline, reps, rows=(1, 2, 4, 6, 8), epis=(3, 8), checked=(3, 8), pdl=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=None)
    p.add_argument("--budget-s", type=float, default=240)
    p.add_argument("--reps", type=int, default=1)
    p.add_argument("--skip", nargs="*", default=[])
    a = p.parse_args()
    deadline = time.time() + a.budget_s
    rec = Recorder(a.out)
    print(f"copy bandwidth {rec.bw / 1e12:.3f} TB/s", flush=True)
    if "greedy" not in a.skip:
        rec.guard("greedy", lambda: greedy_no_logits(rec, deadline, 2), op="greedy")
    if "floor" not in a.skip:
        rec.guard("floor", lambda: floors(rec, deadline), op="read")
    if "narrow" not in a.skip:
        rec.guard("narrow", lambda: narrow(rec, deadline, a.reps), op="narrow")


if __name__ == "__main__":
    main()
