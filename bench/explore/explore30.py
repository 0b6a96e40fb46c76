"""Session 20: what the hand-off between two dependent launches costs, PDL's `gdc_wait` against a ready counter.

At 1 row every launch of the fused step costs 2.2-4.4 us (SmolLM2) for 0.1-2 MB of weights: after its wait a
launch pays a chain of round trips, and the wait itself returns only once the whole previous grid has completed
and flushed. A ready counter (the producer's programs add 1 with release semantics after their stores; the
consumer's programs spin on it with acquire loads) hands data over without waiting for the grid's completion.
This measures both on a chain of L dependent launches ("links") captured in one CUDA graph:

    link k (k = 0..L-1), grid P programs:   [load W_ELEMS bf16 of "weights" per program]  (before the wait)
        wait for link k-1 (MODE), then read all P outputs of link k-1: out_k+1[pid] = max(out_k) + 1
        (+ the weights' sum times 0, so they are loaded), [add 1 to counter k+1, release]

    MODE 0  no PDL: stream order
    MODE 1  PDL: gdc_wait, dependents released right after it (as the fused step's launches do)
    MODE 2  PDL: spin until counter k >= epoch * P (acquire), dependents released after it; no gdc_wait
            (the chain's last link waits with gdc_wait at its end, so the next replay starts after it)
    MODE 3  as 2, and every link also calls gdc_wait at its end (each link's completion still implies its
            predecessor's, as the step's later launches assume)

A plain launch before the chain bumps the epoch (one per replay) and writes out_0 = epoch * 1000 and counter 0;
every replay is checked: out_L must be epoch * 1000 + L in every program (a link that read a stale predecessor
output from the previous replay would be a replay behind). Stamps (%globaltimer, ns) per program: start, after
the wait, end: hand-off = a link's median "after the wait" minus its predecessor's last "end".

    python bench/explore/explore30.py [--programs 1 66 132 264] [--links 64] [--w-elems 0 8192] [--out F]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from lowlat.kernels._attn_common import gdc_launch_dependents, gdc_wait  # noqa: E402

MODES = {0: "stream", 1: "gdc_wait", 2: "counter", 3: "counter+gdc_wait_at_exit"}


@triton.jit
def _now():
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)


@triton.jit
def _bump_kernel(epoch_ptr, out0_ptr, cnt_ptr, P, BLOCK: tl.constexpr):
    e = tl.load(epoch_ptr) + 1
    tl.store(epoch_ptr, e)
    offs = tl.arange(0, BLOCK)
    tl.store(out0_ptr + offs, (e * 1000).to(tl.int32) + offs * 0, mask=offs < P)
    tl.atomic_add(cnt_ptr, P, sem="release", scope="gpu")


@triton.jit
def _link_kernel(src_ptr, dst_ptr, cnt_ptr, epoch_ptr, w_ptr, stamp_ptr, P, link,
                 MODE: tl.constexpr, LAST: tl.constexpr, BLOCK: tl.constexpr, W_ELEMS: tl.constexpr,
                 STAMP: tl.constexpr):
    pid = tl.program_id(0)
    t0 = _now()
    wsum = tl.full([], 0.0, tl.float32)
    if W_ELEMS > 0:   # this program's "weights", loaded before the wait (they depend on nothing)
        w = tl.load(w_ptr + pid.to(tl.int64) * W_ELEMS + tl.arange(0, W_ELEMS))
        wsum = tl.sum(w.to(tl.float32), axis=0)
    if MODE == 1:
        gdc_wait()
        gdc_launch_dependents()
    if MODE >= 2:
        target = tl.load(epoch_ptr) * P
        c = tl.atomic_add(cnt_ptr + link, 0, sem="acquire", scope="gpu")
        while c < target:
            c = tl.atomic_add(cnt_ptr + link, 0, sem="acquire", scope="gpu")
        gdc_launch_dependents()
    t1 = _now()
    offs = tl.arange(0, BLOCK)
    x = tl.load(src_ptr + offs, mask=offs < P, other=-2147483647, cache_modifier=".cg")
    v = tl.max(x, axis=0) + 1 + (wsum * 0.0).to(tl.int32)
    tl.store(dst_ptr + pid, v)
    if MODE >= 2:
        tl.debug_barrier()   # every thread's store before the release below
        tl.atomic_add(cnt_ptr + link + 1, 1, sem="release", scope="gpu")
        if (MODE == 3) or LAST:
            gdc_wait()
    t2 = _now()
    if STAMP:
        b = stamp_ptr + (link * P + pid).to(tl.int64) * 3
        tl.store(b, t0)
        tl.store(b + 1, t1)
        tl.store(b + 2, t2)


class Chain:
    def __init__(self, programs: int, links: int, mode: int, w_elems: int, device) -> None:
        self.P, self.L, self.mode, self.w_elems = programs, links, mode, w_elems
        self.block = triton.next_power_of_2(max(programs, 16))
        self.out = torch.zeros(links + 1, programs, dtype=torch.int32, device=device)
        self.cnt = torch.zeros(links + 1, dtype=torch.int32, device=device)
        self.epoch = torch.zeros(1, dtype=torch.int32, device=device)
        self.stamps = torch.zeros(links, programs, 3, dtype=torch.int64, device=device)
        # rotating weight copies (cold in the L2 at every link)
        self.w = [torch.randn(max(programs * w_elems, 1), device=device).to(torch.bfloat16) for _ in range(4)]

    def launch(self, stamp: bool) -> None:
        _bump_kernel[(1,)](self.epoch, self.out[0], self.cnt, self.P, BLOCK=self.block)
        pdl = self.mode >= 1
        for k in range(self.L):
            _link_kernel[(self.P,)](self.out[k], self.out[k + 1], self.cnt, self.epoch, self.w[k % 4],
                                    self.stamps, self.P, k, MODE=self.mode, LAST=k == self.L - 1,
                                    BLOCK=self.block, W_ELEMS=self.w_elems, STAMP=stamp, launch_pdl=pdl)

    def check(self) -> None:
        e = int(self.epoch.item())
        want = e * 1000 + self.L
        got = self.out[self.L]
        if not bool((got == want).all()):
            raise AssertionError(f"mode {self.mode} P {self.P}: out_L {got.unique().tolist()[:8]} != {want}")


def run(programs: int, links: int, mode: int, w_elems: int, device, iters: int = 30) -> dict:
    ch = Chain(programs, links, mode, w_elems, device)
    res = {"programs": programs, "links": links, "mode": MODES[mode], "w_bytes_per_program": 2 * w_elems}
    for stamp in (False, True):
        ch.launch(stamp)          # compile, warm
        torch.cuda.synchronize()
        ch.check()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            ch.launch(stamp)
        for _ in range(3):
            g.replay()
        torch.cuda.synchronize()
        ch.check()
        times = []
        for _ in range(iters):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            g.replay()
            b.record()
            b.synchronize()
            ch.check()
            times.append(a.elapsed_time(b) * 1e3)
        key = "stamped" if stamp else "plain"
        res[f"us_per_link_{key}"] = round(statistics.median(times) / links, 3)
    st = ch.stamps.cpu().to(torch.int64)          # from the last stamped replay
    hand, ready_spread, after_wait_to_end = [], [], []
    for k in range(1, links):
        prev_end = int(st[k - 1, :, 2].max())
        t1 = st[k, :, 1]
        hand.append(int(t1.median()) - prev_end)
        ready_spread.append(int(t1.max() - t1.min()))
        after_wait_to_end.append(int((st[k, :, 2] - st[k, :, 1]).median()))
    res["handoff_ns_median"] = statistics.median(hand)
    res["ready_spread_ns_median"] = statistics.median(ready_spread)
    res["after_wait_to_end_ns_median"] = statistics.median(after_wait_to_end)
    return res


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--programs", type=int, nargs="+", default=[1, 66, 132, 264])
    ap.add_argument("--links", type=int, default=64)
    ap.add_argument("--w-elems", type=int, nargs="+", default=[0, 8192])
    ap.add_argument("--modes", type=int, nargs="+", default=[0, 1, 2, 3])
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    dev = torch.device("cuda")
    results = []
    for w in a.w_elems:
        for p in a.programs:
            for m in a.modes:
                try:
                    r = run(p, a.links, m, w, dev)
                except Exception as e:  # noqa: BLE001 - recorded, the sweep goes on
                    r = {"programs": p, "mode": MODES[m], "w_bytes_per_program": 2 * w, "error": repr(e)[:300]}
                results.append(r)
                print(json.dumps(r), flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                           "triton": triton.__version__, "results": results}, indent=1))


if __name__ == "__main__":
    main()
