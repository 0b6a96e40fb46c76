"""Session-9 exploration (issue 5): a PERSISTENT greedy draft launch in plain Triton, one flattened software-
pipelined loop over (vocabulary tile, H step) per program, the running best key per row in registers and ONE
arrival per program (P = 132 / 264 programs instead of 384), beside the torch ops, the production launch and
the production structure with no cross-program step at all (the stream alone).

Session 4's persistent launch (128 programs of 3 tiles, logits stored) ran 19.1-20.4 us, no better than the
per-tile launch then; it kept one program per SM and 3 stages (~32 KB in flight per SM). This one varies the
programs per SM (1 / 2), the stages (3-8) and the tile (64 / 128 rows of the vocabulary).

    python bench/explore/explore19.py --out $OUT/explore19.json [--budget-s 240] [--reps 2] [--rows 1 2 4 6 8]
    TRITON_INTERPRET=1 python bench/explore/explore19.py --smoke     # tiny shapes on the CPU: tokens vs torch
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

from lowlat.kernels._gemv import argmax_key, interpreting, key_id, mma  # noqa: E402

_KEY_MIN = tl.constexpr(-9_223_372_036_854_775_807)


@triton.jit
def _persistent_greedy_kernel(h_ptr, stride_h, w_desc, tok_ptr, gkeys_ptr, cnt_ptr, R, V, NUM_TILES,
                              NUM_PROGS, MAX_MINE: tl.constexpr, HIDDEN: tl.constexpr, BLOCK_V: tl.constexpr,
                              BLOCK_H: tl.constexpr,
                              STAGES: tl.constexpr, FLATTEN: tl.constexpr, TAIL: tl.constexpr,
                              UPCAST: tl.constexpr, RUNMAX: tl.constexpr = False):
    """Program pid takes vocabulary tiles pid, pid + P, ...; per tile acc [BLOCK_V, 16] over H by TMA weight
    tiles, its per-row best key folded into `best`. TAIL 1: one relaxed atomic_max per row, acq_rel arrival,
    the last program swaps the slots back and writes tokens (production's tail, once per program); TAIL 0:
    the program's best keys stored to its own slots (no cross-program step: the stream's cost)."""
    pid = tl.program_id(0)
    rows = tl.arange(0, 16)
    rmask = rows < R
    best = tl.full([16], _KEY_MIN, tl.int64)
    best2 = tl.full([BLOCK_V, 16], _KEY_MIN, tl.int64)
    for i in tl.range(0, MAX_MINE, num_stages=STAGES, flatten=FLATTEN):     # past NUM_TILES: TMA zero fill
        v0 = (pid + i * NUM_PROGS) * BLOCK_V
        acc = tl.zeros([BLOCK_V, 16], dtype=tl.float32)
        for h0 in range(0, HIDDEN, BLOCK_H):
            w = w_desc.load([v0, h0])
            hk = h0 + tl.arange(0, BLOCK_H)
            ht = tl.load(h_ptr + rows[None, :] * stride_h + hk[:, None],
                         mask=rmask[None, :] & (hk < HIDDEN)[:, None], other=0.0)
            if UPCAST:
                acc = mma(w.to(tl.float32), ht.to(tl.float32), acc, UPCAST)
            else:
                acc = mma(w, ht, acc, UPCAST)
        cols = v0 + tl.arange(0, BLOCK_V)
        key = tl.where((cols < V)[:, None], argmax_key(acc, cols[:, None]), _KEY_MIN)
        if RUNMAX:        # elementwise running max: no cross-warp reduction per tile, one after the loop
            best2 = tl.maximum(best2, key)
        else:
            best = tl.maximum(best, tl.max(key, axis=0))
    if RUNMAX:
        best = tl.max(best2, axis=0)
    if TAIL == 0:
        tl.store(gkeys_ptr + 16 + pid * 16 + rows, best, mask=rmask)
    else:
        tl.atomic_max(gkeys_ptr + rows, best, mask=rmask, sem="relaxed")
        tl.debug_barrier()
        old = tl.atomic_add(cnt_ptr, 1, sem="acq_rel")
        if old == NUM_PROGS - 1:
            b = tl.atomic_xchg(gkeys_ptr + rows, tl.full([16], _KEY_MIN, tl.int64), mask=rmask, sem="relaxed")
            tl.store(tok_ptr + rows, key_id(b).to(tl.int64), mask=rmask)
            tl.store(cnt_ptr, 0)


class PersistentGreedy:
    """Launcher: P programs, tiles BLOCK_V x BLOCK_H, `stages` deep, flattened loop nest (flatten)."""

    def __init__(self, v: int, hd: int, *, programs: int, block_v: int = 128, block_h: int = 64, stages: int = 4,
                 warps: int = 4, flatten: bool = True, device="cuda"):
        self.v, self.hd, self.p, self.bv, self.bh = v, hd, programs, block_v, block_h
        self.stages, self.warps, self.flatten = stages, warps, flatten
        self.tiles = triton.cdiv(v, block_v)
        self.gkeys = torch.full((16 + 16 * programs,), torch.iinfo(torch.int64).min, dtype=torch.int64,
                                device=device)
        self.cnt = torch.zeros(1, dtype=torch.int32, device=device)
        self.descs = {}

    def __call__(self, h, w, tok_out, tail: int = 1, runmax: bool = False):
        key = w.data_ptr()
        if key not in self.descs:
            self.descs[key] = TensorDescriptor(w, list(w.shape), list(w.stride()), [self.bv, self.bh])
        interp = interpreting()
        kw = {} if interp else dict(num_warps=self.warps)
        _persistent_greedy_kernel[(self.p,)](h, h.stride(0), self.descs[key], tok_out, self.gkeys, self.cnt,
                                             h.shape[0], self.v, self.tiles, self.p,
                                             MAX_MINE=triton.cdiv(self.tiles, self.p), HIDDEN=self.hd,
                                             BLOCK_V=self.bv, BLOCK_H=self.bh, STAGES=self.stages,
                                             FLATTEN=self.flatten, TAIL=tail, UPCAST=interp, RUNMAX=runmax,
                                             **kw)
        return tok_out


#: (programs, block_v, stages, flatten, warps); call1 (session9/call1) ran the first eight with 4 warps
CONFIGS_CALL1 = [(132, 128, 4, True, 4), (132, 128, 6, True, 4), (132, 128, 8, True, 4), (264, 128, 3, True, 4),
                 (264, 128, 4, True, 4), (264, 64, 6, True, 4), (132, 64, 8, True, 4), (264, 128, 4, False, 4)]
CONFIGS = [(132, 128, 5, True, 4), (132, 128, 6, True, 4), (132, 128, 7, True, 4), (132, 128, 6, True, 8),
           (132, 128, 5, True, 8), (132, 256, 3, True, 8), (132, 256, 4, True, 8), (264, 64, 6, True, 4),
           (264, 64, 8, True, 4), (396, 64, 4, True, 4)]


def smoke() -> int:
    """CPU interpreter, tiny shapes: tokens equal torch.argmax of fp32 logits (exact inputs)."""
    torch.manual_seed(0)
    v, hd = 1000, 96
    w = torch.randint(-4, 5, (v, hd)).to(torch.bfloat16)
    h = torch.randint(-2, 3, (5, hd)).to(torch.bfloat16)
    want = torch.argmax(h.float() @ w.float().T, dim=-1)
    for p, bv, st, fl in ((3, 64, 2, True), (7, 16, 3, False)):
        pg = PersistentGreedy(v, hd, programs=p, block_v=bv, block_h=32, stages=st, flatten=fl, device="cpu")
        for r in (1, 5):
            for rm in (False, True):
                tok = torch.full((r,), -2, dtype=torch.int64)
                pg(h[:r], w, tok, runmax=rm)
                assert torch.equal(tok, want[:r]), (p, bv, r, rm, tok, want[:r])
    print("smoke ok")
    return 0


def main():
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _common import explore_parser

    p = explore_parser()
    p.add_argument("--call1", action="store_true", help="the configurations of session 9's first call")
    p.add_argument("--runmax", action="store_true", help="P 132 / 128-row tiles / 6 stages with and without "
                   "an elementwise running max of the keys (one cross-warp reduction per program, not per tile)")
    a = p.parse_args()
    if a.smoke:
        return smoke()
    from _common import GreedyCase, Recorder, t_us
    from explore.tma_gemv import TmaGreedy

    deadline = time.time() + a.budget_s
    rec = Recorder(a.out)
    case = GreedyCase()
    stream = TmaGreedy(case.v, case.hd, block_v=128, block_h=64, stages=3)
    configs = [(132, 128, 6, True, 4)] if a.runmax else CONFIGS_CALL1 if a.call1 else CONFIGS
    pgs = {c: PersistentGreedy(case.v, case.hd, programs=c[0], block_v=c[1], stages=c[2], flatten=c[3], warps=c[4])
           for c in configs}
    for rep in range(a.reps):
        for r in a.rows:
            base = dict(op="greedy", rows=r, rep=rep)
            t_torch, want, xo, to = case.baseline(rec, r, base, pdl=False)

            def stream_only():
                us = t_us(lambda i: stream(case.hs[i][:r], case.ws[i], xo[i], to[i], epi=0), case.rot, 61)
                rec(dict(base, variant="per_tile_stream_only", us=us))
            rec.guard("stream", stream_only, **base)
            for c, pg in pgs.items():
                if time.time() > deadline:
                    return 0
                for tail in (1, 0):
                    for rm in ((False, True) if a.runmax else (False,)):
                        def one(pg=pg, c=c, tail=tail, rm=rm):
                            for t in to:
                                t.fill_(-2)
                            us = t_us(lambda i: pg(case.hs[i][:r], case.ws[i], to[i], tail=tail, runmax=rm),
                                      case.rot, 61)
                            same = all(torch.equal(to[i], want[i]) for i in range(case.rot)) if tail else None
                            rec(dict(base, variant="persistent_p{}_bv{}_st{}_fl{}_w{}".format(*c)
                                     + ("_runmax" if rm else "") + ("" if tail else "_stream_only"), us=us,
                                     speedup=round(t_torch / us, 3), same_tokens=same))
                        rec.guard(f"{c}/{tail}/{rm}", one, **base)
    return 0


if __name__ == "__main__":
    sys.exit(main())
