"""Session-10 exploration (issue 5): the persistent greedy draft launch under PDL, as the fused draft step runs
it (a PDL chain: the last layer's kernels, the final RMSNorm, then draft sampling), with the weights that do
not depend on the previous kernel prefetched into L2 BEFORE `gdc_wait`, and the early launch of the next
kernel (`gdc_launch_dependents`) either at the start (production) or after the weight stream (late: the next
launch's programs become resident, and prefetch, while this one does its arrival).

The kernel is production's `draft_sampling._greedy_tma_kernel` with two knobs: PF_K (columns of each row of
the program's first PF_TILES tiles prefetched into L2 before the wait, one `prefetch.global.L2` per 128-byte
line; 1024 = the whole 576-column row) and LATE (trigger after the loop).

Two chains, each over `rot` rotating cold copies in one CUDA graph:
  draft -> draft   launches back to back (bench_draft_sampling.py's fused_pdl);
  norm -> draft    a PDL RMSNorm kernel writing h (wait + trigger at its start, as the fused step's
                   kernels), then the draft launch on h; the draft's span = (norm -> draft) - (norm alone).
Tokens are compared with the production launch's.

    python bench/explore/explore20.py --out $OUT/explore20.json [--budget-s 240] [--reps 2] [--rows 1 2 4 6 8]
    TRITON_INTERPRET=1 python bench/explore/explore20.py --smoke     # tiny shapes on the CPU
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: E402

from lowlat.kernels._gemv import interpreting, prefetch_l2, rstd_of, to_bf16  # noqa: E402
from lowlat.kernels.draft_sampling import (_KEY_MIN, GREEDY_STAGES, _greedy_arrive, _greedy_finish,  # noqa: E402
                                           _tile_dot, _tile_keys)


@triton.jit
def _greedy_pf_kernel(h_ptr, w_desc, w_ptr, stride_w, temp_ptr, tok_ptr, lse_ptr, cutv_ptr, cuti_ptr, gkeys_ptr,
                      cnt_ptr, R, V, stride_h, NUM_PROGS, TILES_PER_PROG: tl.constexpr, HIDDEN: tl.constexpr,
                      BLOCK_V: tl.constexpr, BLOCK_H: tl.constexpr, UPCAST: tl.constexpr, USE_PDL: tl.constexpr,
                      PF_K: tl.constexpr, PF_TILES: tl.constexpr, LATE: tl.constexpr, ORDER: tl.constexpr = 0,
                      READ_ONLY: tl.constexpr = False):
    """Production's persistent greedy launch (one row block) + an L2 prefetch of the first PF_TILES tiles'
    first PF_K columns before `gdc_wait` (USE_PDL only), and the dependents' launch after the loop (LATE).
    ORDER 1: program pid takes the contiguous tiles pid * T .. pid * T + T - 1 (T = TILES_PER_PROG) instead of
    pid, pid + P, ...; READ_ONLY: the weight tiles only folded into an elementwise max (no h, no dot; the
    tokens are then wrong): what this loop structure streams at without the GEMV."""
    pid = tl.program_id(0)
    if USE_PDL:
        if PF_K > 0:
            for t in tl.static_range(PF_TILES):
                prefetch_l2(w_ptr, stride_w, (pid + t * NUM_PROGS) * BLOCK_V, V, 0, HIDDEN, BLOCK_V, PF_K)
        tl.extra.cuda.gdc_wait()
        if not LATE:
            tl.extra.cuda.gdc_launch_dependents()
    rows = tl.arange(0, 16)
    rmask = rows < R
    best = tl.full([BLOCK_V, 16], _KEY_MIN, tl.int64)
    wmax = tl.full([BLOCK_V, BLOCK_H], float("-inf"), tl.float32)
    for i in tl.range(0, TILES_PER_PROG, flatten=True):
        if ORDER == 0:
            v0 = (pid + i * NUM_PROGS) * BLOCK_V
        else:
            v0 = (pid * TILES_PER_PROG + i) * BLOCK_V
        acc = tl.zeros([BLOCK_V, 16], dtype=tl.float32)
        for h0 in range(0, HIDDEN, BLOCK_H):
            w = w_desc.load([v0, h0])
            if READ_ONLY:
                wmax = tl.maximum(wmax, w.to(tl.float32))
            else:
                hk = h0 + tl.arange(0, BLOCK_H)
                ht = tl.load(h_ptr + rows[None, :] * stride_h + hk[:, None],
                             mask=rmask[None, :] & (hk < HIDDEN)[:, None], other=0.0)
                acc = _tile_dot(w, ht, acc, UPCAST)
        cols = v0 + tl.arange(0, BLOCK_V)
        if READ_ONLY:
            acc += tl.max(wmax, axis=1)[:, None]
        best = tl.maximum(best, _tile_keys(acc, cols, cols < V))
    if USE_PDL and LATE:
        tl.extra.cuda.gdc_launch_dependents()
    old = _greedy_arrive(tl.max(best, axis=0), rows, rmask, cnt_ptr, gkeys_ptr)
    _greedy_finish(old, NUM_PROGS, rows, rmask, cnt_ptr, gkeys_ptr, temp_ptr, tok_ptr, lse_ptr, cutv_ptr, cuti_ptr)


@triton.jit
def _norm_kernel(x_ptr, g_ptr, h_ptr, H, eps, BLOCK: tl.constexpr, USE_PDL: tl.constexpr, UPCAST: tl.constexpr):
    """h[m] = g * bf16(x[m] * rstd) (reference rms_norm's rounding order), one program per row, PDL wait and
    trigger at the start (as the fused step's kernels)."""
    m = tl.program_id(0)
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    k = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + m * H + k, mask=k < H, other=0.0).to(tl.float32)
    rstd = rstd_of(tl.sum(x * x, axis=0), H, eps)
    g = tl.load(g_ptr + k, mask=k < H, other=0.0).to(tl.float32)
    y = to_bf16(g * to_bf16(x * rstd, UPCAST).to(tl.float32), UPCAST)
    tl.store(h_ptr + m * H + k, y, mask=k < H)


class PfGreedy:
    """Launcher of `_greedy_pf_kernel`: one program per SM (or `programs`), 128 x 64 tiles, GREEDY_STAGES."""

    def __init__(self, v: int, hd: int, *, programs: int, device="cuda"):
        self.v, self.hd, self.p, self.bv, self.bh = v, hd, programs, 128, 64
        self.tiles = triton.cdiv(v, self.bv)
        self.gkeys = torch.full((16,), torch.iinfo(torch.int64).min, dtype=torch.int64, device=device)
        self.cnt = torch.zeros(1, dtype=torch.int32, device=device)
        self.temp = torch.zeros(16, dtype=torch.float32, device=device)
        self.scratch = [torch.empty(16, dtype=torch.float32, device=device) for _ in range(2)] + [
            torch.empty(16, dtype=torch.int32, device=device)]
        self.descs = {}

    def __call__(self, h, w, tok_out, *, pdl: bool, pf_k: int = 0, pf_tiles: int = 1, late: bool = False,
                 order: int = 0, read_only: bool = False, programs: int | None = None):
        key = w.data_ptr()
        if key not in self.descs:
            self.descs[key] = TensorDescriptor(w, list(w.shape), list(w.stride()), [self.bv, self.bh])
        interp = interpreting()
        kw = {} if interp else dict(num_warps=4, num_stages=GREEDY_STAGES)
        if pdl and not interp:
            kw["launch_pdl"] = True
        lse, cutv, cuti = self.scratch
        p = programs or self.p
        _greedy_pf_kernel[(p,)](h, self.descs[key], w, w.stride(0), self.temp, tok_out, lse, cutv, cuti,
                                self.gkeys, self.cnt, h.shape[0], self.v, h.stride(0), p,
                                TILES_PER_PROG=triton.cdiv(self.tiles, p), HIDDEN=self.hd,
                                BLOCK_V=self.bv, BLOCK_H=self.bh, UPCAST=interp, USE_PDL=pdl and not interp,
                                PF_K=pf_k, PF_TILES=pf_tiles, LATE=late, ORDER=order, READ_ONLY=read_only, **kw)
        return tok_out


def norm(x, g, h, pdl: bool):
    interp = interpreting()
    kw = {} if interp else dict(num_warps=4)
    if pdl and not interp:
        kw["launch_pdl"] = True
    _norm_kernel[(x.shape[0],)](x, g, h, x.shape[1], 1e-5, BLOCK=triton.next_power_of_2(x.shape[1]),
                                USE_PDL=pdl and not interp, UPCAST=interp, **kw)
    return h


#: (label, pf_k, pf_tiles, late)
VARIANTS = [("pdl", 0, 1, False), ("pdl_late", 0, 1, True), ("pdl_pf512", 512, 1, False),
            ("pdl_pf1024", 1024, 1, False), ("pdl_late_pf512", 512, 1, True), ("pdl_late_pf1024", 1024, 1, True),
            ("pdl_late_pf1024x2", 1024, 2, True), ("pdl_late_pf256", 256, 1, True)]


#: --stream (label, launch kwargs): the loop's tile order, the program count, the GEMV left out (READ_ONLY)
STREAM_VARIANTS = [("base", {}), ("contig", dict(order=1)), ("p128", dict(programs=128)),
                   ("p128_contig", dict(programs=128, order=1)), ("read_only", dict(read_only=True)),
                   ("read_only_contig", dict(read_only=True, order=1))]


def smoke() -> int:
    """CPU interpreter, tiny shapes: tokens equal torch.argmax of fp32 logits; the norm kernel vs torch."""
    torch.manual_seed(0)
    v, hd = 1000, 96
    w = torch.randint(-4, 5, (v, hd)).to(torch.bfloat16)
    h = torch.randint(-2, 3, (5, hd)).to(torch.bfloat16)
    want = torch.argmax(h.float() @ w.float().T, dim=-1)
    pg = PfGreedy(v, hd, programs=3, device="cpu")
    pg.bv, pg.bh, pg.tiles = 64, 32, triton.cdiv(v, 64)
    for r in (1, 5):
        for kw in (dict(), dict(order=1), dict(programs=4, order=1)):
            tok = torch.full((r,), -2, dtype=torch.int64)
            pg(h[:r], w, tok, pdl=False, **kw)
            assert torch.equal(tok, want[:r]), (r, kw, tok, want[:r])
    x = torch.randn(3, hd).bfloat16()
    g = torch.randn(hd).bfloat16()
    from lowlat.reference.rms_norm import rms_norm
    got = norm(x, g, torch.empty_like(x), pdl=False)
    err = (got.float() - rms_norm(x, g, 1e-5).float()).abs().max().item()
    assert err <= 2 ** -7 * rms_norm(x, g, 1e-5).float().abs().max().item(), err
    print("smoke ok")
    return 0


def main():
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _common import explore_parser

    p = explore_parser()
    p.add_argument("--stream", action="store_true", help="time STREAM_VARIANTS (no PDL and PDL, back to back) "
                   "instead of the prefetch / trigger variants")
    a = p.parse_args()
    if a.smoke:
        return smoke()
    from _common import GreedyCase, Recorder, t_us

    deadline = time.time() + a.budget_s
    rec = Recorder(a.out)
    case = GreedyCase()
    dev = case.dev
    n_sm = torch.cuda.get_device_properties(dev).multi_processor_count
    pg = PfGreedy(case.v, case.hd, programs=n_sm)
    if a.stream:
        return stream_variants(a, rec, case, pg, deadline, t_us)
    gen = torch.Generator(device=dev).manual_seed(11)
    xs = [torch.randn(8, case.hd, generator=gen, device=dev).bfloat16() for _ in range(case.rot)]
    gn = (1 + 0.1 * torch.randn(case.hd, generator=gen, device=dev)).bfloat16()
    hn = [torch.empty(8, case.hd, dtype=torch.bfloat16, device=dev) for _ in range(case.rot)]
    for rep in range(a.reps):
        for r in a.rows:
            base = dict(op="greedy", rows=r, rep=rep)
            t_torch, want, xo, to = case.baseline(rec, r, base, pdl=True)
            prod, torch_ops, outs = case.launchers(r)
            # the norm -> X chains: norm alone, norm -> torch ops, norm -> production (PDL), norm -> variants
            t_norm = t_us(lambda i: norm(xs[i][:r], gn, hn[i][:r], pdl=True), case.rot, 61)
            rec(dict(base, variant="chain_norm_only", us=t_norm))
            t_nt = t_us(lambda i: (norm(xs[i][:r], gn, hn[i][:r], pdl=True),
                                   torch_ops_on(case, hn[i][:r], i)), case.rot, 61)
            rec(dict(base, variant="chain_norm_torch", us=t_nt, span_us=round(t_nt - t_norm, 2)))
            t_np = t_us(lambda i: (norm(xs[i][:r], gn, hn[i][:r], pdl=True),
                                   prod_on(case, hn[i][:r], i, outs, r)), case.rot, 61)
            rec(dict(base, variant="chain_norm_production_pdl", us=t_np, span_us=round(t_np - t_norm, 2),
                     speedup=round((t_nt - t_norm) / (t_np - t_norm), 3)))
            want_n = [torch.argmax(hn[i][:r].float() @ case.ws[i].float().T, dim=-1) for i in range(case.rot)]
            for label, pf_k, pf_tiles, late in VARIANTS:
                if time.time() > deadline:
                    return 0

                def one(label=label, pf_k=pf_k, pf_tiles=pf_tiles, late=late):
                    kw = dict(pdl=True, pf_k=pf_k, pf_tiles=pf_tiles, late=late)
                    for t in to:
                        t.fill_(-2)
                    us = t_us(lambda i: pg(case.hs[i][:r], case.ws[i], to[i], **kw), case.rot, 61)
                    same = all(torch.equal(to[i], want[i]) for i in range(case.rot))
                    rec(dict(base, variant=label, chain="draft", us=us, speedup=round(t_torch / us, 3),
                             same_tokens=same))
                    for t in to:
                        t.fill_(-2)
                    us2 = t_us(lambda i: (norm(xs[i][:r], gn, hn[i][:r], pdl=True),
                                          pg(hn[i][:r], case.ws[i], to[i], **kw)), case.rot, 61)
                    same2 = all(torch.equal(to[i], want_n[i]) for i in range(case.rot))
                    rec(dict(base, variant=label, chain="norm", us=us2, span_us=round(us2 - t_norm, 2),
                             speedup=round((t_nt - t_norm) / (us2 - t_norm), 3), same_tokens=same2))
                rec.guard(label, one, **base)
    return 0


def stream_variants(a, rec, case, pg, deadline, t_us) -> int:
    """--stream: every STREAM_VARIANTS launch back to back, without and with PDL, beside torch / production."""
    for rep in range(a.reps):
        for r in a.rows:
            base = dict(op="greedy", rows=r, rep=rep)
            t_torch, want, xo, to = case.baseline(rec, r, base, pdl=True)
            for label, kw in STREAM_VARIANTS:
                for pdl in (False, True):
                    if time.time() > deadline:
                        return 0

                    def one(label=label, kw=kw, pdl=pdl):
                        for t in to:
                            t.fill_(-2)
                        us = t_us(lambda i: pg(case.hs[i][:r], case.ws[i], to[i], pdl=pdl, **kw), case.rot, 61)
                        same = None if kw.get("read_only") else all(torch.equal(to[i], want[i])
                                                                    for i in range(case.rot))
                        rec(dict(base, variant=label + ("_pdl" if pdl else ""), us=us,
                                 speedup=round(t_torch / us, 3), same_tokens=same))
                    rec.guard(label, one, **base)
    return 0


def torch_ops_on(case, h, i):
    """bench_draft_sampling.torch_draft_step (greedy) on h and copy i's weights."""
    from bench_draft_sampling import torch_draft_step
    q = case.__dict__.setdefault("_q", {})
    key = (i, h.shape[0])
    if key not in q:
        q[key] = torch.empty(h.shape[0], case.v, device=case.dev)
    return torch_draft_step(h, case.ws[i], 0.0, 0, 1.0, q[key])


def prod_on(case, h, i, outs, r):
    """The production greedy launch (PDL) on h and copy i's weights."""
    from lowlat.kernels import draft_sampling as ds
    z = case.__dict__.setdefault("_z", {})
    if r not in z:
        dev = case.dev
        z[r] = (torch.zeros(r, device=dev), torch.zeros(r, dtype=torch.int32, device=dev), torch.ones(r, device=dev),
                torch.arange(r, device=dev) + 1, torch.zeros(r, dtype=torch.int64, device=dev))
    temp, topk, topp, seeds, offs = z[r]
    ds.draft_sample_into(h, case.ws[i], temp, topk, topp, seeds, offs, outs[i], k_cap=0, need_noise=False,
                         use_pdl=True)


if __name__ == "__main__":
    sys.exit(main())
