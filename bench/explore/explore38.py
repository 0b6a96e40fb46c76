"""Session 28: can a Gluon kernel exchange per-program partial sums inside a thread-block cluster (sm_90)?

Qwen3's attention prologue normalises each q / k head over its D = 128 outputs (QK-norm) before RoPE. With weights
held in registers a program holds 16 output rows, so a head is 8 programs and each needs the other 7's partial sums of
squares. Triton 3.6 launches `num_ctas=8` as clusters of 8 CTAs (cuLaunchKernelEx, clusterDim 8): the hardware
schedules a cluster's CTAs together, so they may wait on each other without a deadlock. Gluon's layouts then need a
CGA layout; with zero bases (`cga_layout=[[0], [0], [0]]`) a tensor is "replicated" over the cluster, each CTA
computes its own values (program = cluster id x 8 + `%cluster_ctarank`, read by inline asm), loads run in every CTA,
but the compiler predicates STORES on CTA rank 0 (it believes the CTAs hold the same values), so stores here are
inline asm (`st.global`).

This probe checks on the device:
  exchange   each CTA stores its value, `barrier.cluster.arrive.release` / `wait.acquire`, loads its cluster's 8
             values (ld.global.cg) and stores their sum in rank order: compared with torch, every element
  cost       ITERS rounds of (store, cluster barrier, load) against ITERS rounds of (store, CTA barrier, load) in one
             launch: the exchange's latency a round, us

    python bench/explore/explore38.py --out results.json
"""

from __future__ import annotations

import argparse
import json

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from _common import Recorder  # noqa: F401,E402 (puts the repository on sys.path)

CLUSTER = 8


@gluon.jit
def _rank():
    return gl.inline_asm_elementwise("mov.u32 $0, %cluster_ctarank;", "=r", [], dtype=gl.int32, is_pure=True,
                                     pack=1)


@gluon.jit
def _st_f32(ptr, val):
    """st.global of one fp32 a thread-element, in every CTA (a Gluon store of a cluster-replicated tensor runs in
    rank 0 only)."""
    return gl.inline_asm_elementwise("st.global.cg.f32 [$1], $2; mov.u32 $0, 0;", "=r,l,r",
                                     [ptr.to(gl.int64, bitcast=True), val], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _cluster_sync(dep):
    """All threads of the cluster's CTAs: arrive (release) then wait (acquire); dep orders it after what made dep.
    Returns 0, opaque to the compiler: adding it to an address orders that load after the barrier."""
    return gl.inline_asm_elementwise(
        "barrier.cluster.arrive.release.aligned; barrier.cluster.wait.acquire.aligned; mov.u32 $0, 0;",
        "=r,r", [dep], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _cta_sync(dep):
    return gl.inline_asm_elementwise("bar.sync 0; mov.u32 $0, 0;", "=r,r", [dep], dtype=gl.int32, is_pure=False,
                                     pack=1)


@gluon.jit
def _exchange_kernel(x_ptr, scratch_ptr, out_ptr, ITERS: gl.constexpr, CLUSTER_SYNC: gl.constexpr):
    """Program p = cluster c x 8 + rank r, 128 threads, one value each: v = x[p, t]; each round stores v to
    scratch[c, r, t], syncs, and v = sum over r' in order of scratch[c, r', t] / 8 (+ r: each round changes v);
    out[p, t] = the last v."""
    L: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0], cga_layout=[[0], [0], [0]])
    c = gl.program_id(0)
    r = _rank()
    t = gl.arange(0, 128, layout=L)
    p = c * 8 + r
    v = gl.load(x_ptr + p * 128 + t)
    base = scratch_ptr + c * 8 * 128 + t
    for _ in range(ITERS):
        d = _st_f32(base + r * 128, v)
        if CLUSTER_SYNC:
            d = _cluster_sync(d)
        else:
            d = _cta_sync(d)
        s = gl.load(base + d, cache_modifier=".cg")
        for rr in gl.static_range(1, 8):
            s += gl.load(base + rr * 128 + d, cache_modifier=".cg")
        if CLUSTER_SYNC:
            d2 = _cluster_sync(s.to(gl.int32, bitcast=True))   # every read done before the next round's stores
        else:
            d2 = _cta_sync(s.to(gl.int32, bitcast=True))
        v = s * 0.125 + r.to(gl.float32) + d2.to(gl.float32)
    _st_f32(out_ptr + p * 128 + t, v)


def reference(x: torch.Tensor, iters: int) -> torch.Tensor:
    """The kernel's arithmetic in fp32 on the host (rank-order sums)."""
    v = x.view(-1, CLUSTER, 128).clone()
    r = torch.arange(CLUSTER, dtype=torch.float32, device=x.device).view(1, CLUSTER, 1)
    for _ in range(iters):
        s = v[:, 0:1].clone()
        for rr in range(1, CLUSTER):
            s = s + v[:, rr:rr + 1]
        v = s * 0.125 + r
    return v.reshape(-1, 128)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--clusters", type=int, default=40)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    dev = torch.device("cuda")
    nprog = args.clusters * CLUSTER
    x = torch.randn(nprog, 128, device=dev)
    scratch = torch.full((args.clusters, CLUSTER, 128), float("nan"), device=dev)
    rec = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, clusters=args.clusters, checks={},
               us={})
    for iters in (1, 3):
        out = torch.full_like(x, float("nan"))
        _exchange_kernel[(args.clusters,)](x, scratch, out, ITERS=iters, CLUSTER_SYNC=True, num_warps=4,
                                           num_ctas=CLUSTER)
        torch.cuda.synchronize()
        ref = reference(x, iters)
        ok = bool(torch.equal(out, ref))
        rec["checks"][f"iters{iters}"] = dict(bitwise=ok, nan=int(out.isnan().sum()),
                                              max_abs_diff=float((out - ref).abs().nan_to_num(1e30).max()))
        print(f"  exchange iters {iters}: bitwise {ok} nan {rec['checks'][f'iters{iters}']['nan']}", flush=True)
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
    for sync in (True, False):
        for iters in (1, 64):
            out = torch.empty_like(x)
            launch = lambda: _exchange_kernel[(args.clusters,)](x, scratch, out, ITERS=iters,  # noqa: E731
                                                                CLUSTER_SYNC=sync, num_warps=4, num_ctas=CLUSTER)
            for _ in range(3):
                launch()
            times = []
            for _ in range(20):
                ev[0].record()
                launch()
                ev[1].record()
                ev[1].synchronize()
                times.append(ev[0].elapsed_time(ev[1]) * 1e3)
            times.sort()
            key = f"{'cluster' if sync else 'cta'}_iters{iters}"
            rec["us"][key] = times[len(times) // 2]
            print(f"  {key}: {rec['us'][key]:.2f} us (median of 20, event-timed launch)", flush=True)
    for sync in ("cluster", "cta"):
        per = (rec["us"][f"{sync}_iters64"] - rec["us"][f"{sync}_iters1"]) / 63
        rec["us"][f"{sync}_per_round"] = per
        print(f"  {sync}: {per * 1e3:.0f} ns a round (store, 2 syncs, 8 loads)", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rec, f, indent=1)


if __name__ == "__main__":
    main()
