"""Session 38: what bounds a PDL chain of launches that hold their weights across the wait, apart from the held
prologue's own work (issue 3's two H200 1-row misses: Llama-3.2-1B's prologue 4.37-4.46 us against 4.27 needed).

Every tweak of the held prologue's work after the wait (mma chains, x warm, RoPE inputs, release point, 16 K
slices) moved its 1-row time by 0.1 us at most, so NOTES' model puts the bound in the chain's structure: launch
i + 2 is released only after launch i + 1's wait (when launch i has finished), and the held weights of at most ~1.4
launches fit in the register file. This script measures the structure with a stand-in kernel that does almost nothing
but hold a [N, K] bf16 weight matrix across the wait: program p holds rows 16 p .. 16 p + 15, its first KR columns
in mma.sync A-operand registers (the held prologue's layout, 4 warps, one K quarter a warp) and the other K - KR
by TMA in shared memory (boxes [16, 64], one mbarrier, all issued before the wait). After the wait the register
part goes through one mma chain against a ones operand, the shared part is read and summed, and one float a
program is stored. Variants (N K = Llama's packed QKV, 3072 x 2048, unless named):

    noop      no weights: the wait, the release, one store (the chain's fixed cost a launch)
    reg2      KR = K: every weight in registers, 96 KB of shared memory taken so that 2 programs fit an SM (the
              production held prologue's 242-255 registers give it 2: room for 1.38 launches' programs)
    reg       the same without: 146 registers, 3 an SM (2.06 launches)
    tma       KR = 0: every weight in shared memory (64 KB a program: 3 an SM)
    hyb4      KR = K / 4, the rest (48 KB) in shared memory: 4 an SM (2.75 launches)
    hyb       KR = K / 2, 32 KB in shared memory, 79 registers: 6 an SM (4.1 launches)
    pf        nothing held: the slice prefetched to L2 (cp.async.bulk.prefetch) before the wait, copied to shared
              memory by TMA after it
    *_early   the next launch released at the program's start instead of right after the wait
    prod      the production held prologue at 1 row (`attn_prologue_held`, g in registers), the same harness

Each is timed per launch as the bench times a kernel (a CUDA graph of PDL-chained launches over rotated cold
copies, A B .. B A). Then a stamped run of each weight variant records in every program, by %globaltimer: t0 start,
t1 the wait returned, tw its register weights landed (a per-thread sum of the held bits, stamped after the wait: a
stamp before it would hold the release back until the weights land, session 29's slower "landed" rule),
t2 its shared-memory weights landed (after the wait: the mbarrier), t3 its store issued; and its SM. The stamped builds
take more registers than the timed ones (hyb 94 against 79: 5 programs an SM instead of 6), so their stamps describe
that residency. Per launch j of
the chain (medians over the middle launches), in ns: the period (last t3 of j minus last t3 of j - 1); how long
after launch j - 1's last store launch j's first wait returned (lag); when launch j's first / last program started
relative to launch j - 1's end (negative: before it); each program's weights landing relative to its wait return
(positive: the weights were the wait's bottleneck); the post-wait span (t3 - t1); SMs used, most programs an SM.

Measured (session 38, bench/results/session38): TMA-held and released at the start, 95-98% of the copy floor (H100
Llama 4.33 us against 4.24, H200 3.11-3.15 against 3.02; Qwen3 7.43 / 5.30-5.39); registers-held released after the
wait (production's structure) 5.13-5.57 / 4.40-4.77; an empty chain ~1.1 us a launch.

    python bench/explore/explore51.py --out e51.json
    env -u TRITON_INTERPRET .venv/bin/python bench/explore/explore51.py --sm90     # CPU: sm_90 compile of each form
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gluon_asm import _smid, _stamp  # noqa: E402

BN, Q, BK, FIELDS = 16, 4, 64, 8
SHAPES = {"llama": (3072, 2048), "qwen3": (5120, 2048)}
#: form -> (the fraction of K held in registers (None: no weights), the program's slice prefetched to L2 before the
#: wait and copied by TMA after it instead of held, shared memory taken only to limit the programs an SM (KB)).
#: Programs an SM (sm_90 build, --sm90): reg2 2 (the production held prologue's 242-255 registers give 2), reg 3
#: (146 registers), tma / pf 3 (64 KB), hyb4 4 (48 KB, 77 registers), hyb 6 (32 KB, 79 registers).
FORMS = {"noop": (None, False, 0), "reg2": (1.0, False, 96), "reg": (1.0, False, 0), "tma": (0.0, False, 0),
         "hyb4": (0.25, False, 0), "hyb": (0.5, False, 0), "pf": (0.0, True, 0)}
FIELDS_C = gl.constexpr(FIELDS)


@gluon.jit
def _prefetch_l2(ptr, pred):
    """cp.async.bulk.prefetch.L2 of ROW_BYTES (one weight row of K 2048) at each element's address where pred
    (returns a dummy int32)."""
    return gl.inline_asm_elementwise(
        "{ .reg .pred p; setp.ne.b32 p, $2, 0; @p cp.async.bulk.prefetch.L2.global [$1], 4096; mov.b32 $0, 0; }",
        "=r,l,r", [ptr, pred.to(gl.int32)], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _held_stream_kernel(w_ptr, w_desc, out_ptr, tr_ptr, K: gl.constexpr, KR: gl.constexpr, NT: gl.constexpr,
                        HOLD: gl.constexpr, USE_PDL: gl.constexpr, EARLY: gl.constexpr, TRACE: gl.constexpr,
                        PF: gl.constexpr = False, PAD_KB: gl.constexpr = 0, Q: gl.constexpr = 4):
    """See the module docstring. Grid N / 16 programs of Q warps; KR columns in registers, NT boxes of 64 columns
    (from column KR) in shared memory; HOLD False: no weights at all (noop). PAD_KB: that much shared memory
    written at the start and read at the end (only to limit the programs an SM). PF: the NT boxes prefetched to L2
    before the wait and copied to shared memory after it (nothing held)."""
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[Q, 1, 1], instr_shape=[1, 16, 8])
    LA: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=8)
    LB: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=MMA, k_width=8)
    LT: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [Q, 1], [1, 0])          # a [16, 64] box: 8 a thread
    L1: gl.constexpr = gl.BlockedLayout([1], [32], [Q], [0])
    pid = gl.program_id(0)
    lane = gl.arange(0, 32 * Q, layout=L1)
    if TRACE:
        t0 = _stamp(lane + pid)
    if USE_PDL and EARLY:
        gdc_launch_dependents()
    n0 = pid * 16
    if PAD_KB > 0:            # 64 + 32 KB (shapes must be powers of two)
        gl.static_assert(PAD_KB == 96, "PAD_KB: 0 or 96")
        pad = gl.allocate_shared_memory(gl.int32, [16384], gl.SwizzledSharedLayout(1, 1, 1, [0]))
        pad2 = gl.allocate_shared_memory(gl.int32, [8192], gl.SwizzledSharedLayout(1, 1, 1, [0]))
        pad.slice(0, 32 * Q).store(lane)
        pad2.slice(0, 32 * Q).store(lane)
    if HOLD and NT > 0:
        smem = gl.allocate_shared_memory(gl.bfloat16, [NT, 16, 64], w_desc.layout)
        bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        mbarrier.init(bar, count=1)
        if PF:
            # the slice's 16 rows (K columns each, contiguous) to L2: one bulk prefetch a row, by 16 threads
            rr = gl.arange(0, 32 * Q, layout=L1)
            _prefetch_l2(w_ptr + (n0 + rr % 16).to(gl.int64) * K, rr < 16)
        else:
            mbarrier.expect(bar, NT * 16 * 64 * 2)
            for i in gl.static_range(NT):
                tma.async_copy_global_to_shared(w_desc, [n0, KR + i * 64], bar, smem.index(i))
    if HOLD and KR > 0:
        KQ: gl.constexpr = KR // Q
        aq = gl.arange(0, Q, layout=gl.SliceLayout(1, gl.SliceLayout(2, LA)))
        at = gl.arange(0, 16, layout=gl.SliceLayout(0, gl.SliceLayout(2, LA)))
        ak = gl.arange(0, KQ, layout=gl.SliceLayout(0, gl.SliceLayout(1, LA)))
        acol = gl.expand_dims(gl.expand_dims(aq, 1), 2) * KQ + gl.expand_dims(gl.expand_dims(ak, 0), 1)
        aoff = gl.expand_dims(gl.expand_dims(n0 + at, 0), 2) * K + acol
        w = gl.load(w_ptr + aoff)
    if USE_PDL:
        gdc_wait()
        if not EARLY:
            gdc_launch_dependents()
    if TRACE:
        t1 = _stamp(lane + pid)
        t2 = t1
        if HOLD and KR > 0:   # stamped after the wait, so the release is not held back for the weights
            tw = _stamp(gl.sum(w.to(gl.int16, bitcast=True).to(gl.int32), axis=2))     # [Q, 16], per thread
    res = pid.to(gl.float32) * 0.0
    if HOLD and KR > 0:
        ones = gl.full([Q, KQ, 8], 1.0, gl.bfloat16, LB)                            # one mma chain a warp
        acc = mma_v2(w, ones, gl.zeros([Q, 16, 8], gl.float32, MMA))
        res += gl.sum(gl.sum(gl.sum(acc, axis=2), axis=1), axis=0) / 8
    if HOLD and NT > 0:
        if PF:
            mbarrier.expect(bar, NT * 16 * 64 * 2)
            for i in gl.static_range(NT):
                tma.async_copy_global_to_shared(w_desc, [n0, KR + i * 64], bar, smem.index(i))
        mbarrier.wait(bar, 0)
        if TRACE:
            t2 = _stamp(lane + pid)
        v = gl.zeros([16, 64], gl.float32, LT)
        for i in gl.static_range(NT):
            v += smem.index(i).load(LT).to(gl.float32)
        res += gl.sum(gl.sum(v, axis=1), axis=0)
        mbarrier.invalidate(bar)
    if PAD_KB > 0:
        res += gl.sum((pad.slice(0, 32 * Q).load(L1) - pad2.slice(0, 32 * Q).load(L1)), axis=0).to(gl.float32)
    gl.store(out_ptr + pid, res)
    if TRACE:
        t3 = _stamp(lane + res.to(gl.int32, bitcast=True))
        # the record as `gluon_asm._store_record` lays it out, written here as the measured build wrote it (the
        # helper's form compiles differently here: 44 bytes spilled in the stamped hyb4 build)
        f = gl.arange(0, FIELDS_C, layout=L1)
        sm = gl.max(_smid(lane), axis=0).to(gl.int64)
        tw_last = gl.max(t0, axis=0)
        if HOLD and KR > 0:
            tw_last = gl.max(gl.max(tw, axis=1), axis=0)
        rec = gl.where(f == 0, gl.min(t0, axis=0),
                       gl.where(f == 1, tw_last,
                                gl.where(f == 2, gl.min(t1, axis=0),
                                         gl.where(f == 3, gl.max(t2, axis=0),
                                                  gl.where(f == 4, gl.max(t3, axis=0),
                                                           gl.where(f == 5, sm, 1))))))
        gl.store(tr_ptr + pid.to(gl.int64) * FIELDS_C + f, rec, mask=f < FIELDS_C)



def form_constexprs(form: str, k: int) -> dict:
    """The kernel's constexprs K, KR, NT, HOLD, PF, PAD_KB for a form of FORMS at K = k."""
    frac, pf, pad = FORMS[form]
    if pf and k != 2048:
        raise ValueError(f"the pf form prefetches 4096-byte rows (K 2048), not K {k}")
    kr = 0 if frac is None else int(k * frac)
    return dict(K=k, KR=kr, NT=(k - kr) // BK if frac is not None else 0, HOLD=frac is not None, PF=pf, PAD_KB=pad)


class Chain:
    """r rotated cold copies of one [N, K] bf16 weight (seed 0; `rotation_copies`: each launch reads HBM), their TMA
    descriptors (boxes [16, 64]), an output and a trace buffer [r, N / 16, FIELDS] int64; `launch(form, early,
    trace)` gives launch(i) on copy i."""

    def __init__(self, n: int, k: int, dev) -> None:
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

        from lowlat.benchmarking import rotation_copies

        self.n, self.k = n, k
        self.r = max(rotation_copies(n * k * 2), 8)
        g = torch.Generator(device=dev).manual_seed(0)
        self.ws = [(torch.randn(n, k, generator=g, device=dev) * k ** -0.5).to(torch.bfloat16)
                   for _ in range(self.r)]
        layout = gl.NVMMASharedLayout.get_default_for([BN, BK], gl.bfloat16)
        self.descs = [TensorDescriptor.from_tensor(w, [BN, BK], layout) for w in self.ws]
        self.out = torch.empty(self.r, n // BN, dtype=torch.float32, device=dev)
        self.trace = torch.zeros(self.r, n // BN, FIELDS, dtype=torch.int64, device=dev)

    def launch(self, form: str, early: bool, trace: bool = False):
        kw = dict(form_constexprs(form, self.k), USE_PDL=True, EARLY=early, TRACE=trace, Q=Q, num_warps=Q,
                  launch_pdl=True)

        def fn(i):
            i %= self.r
            _held_stream_kernel[(self.n // BN,)](self.ws[i], self.descs[i], self.out[i], self.trace[i], **kw)
        return fn

    def expected(self, form: str) -> torch.Tensor | None:
        """What every program must store for copy 0, in float64 (None for noop): the sum of its 16 rows' weights."""
        if FORMS[form][0] is None:
            return None
        return self.ws[0].double().view(self.n // BN, -1).sum(1)


def summarize_trace(tr: torch.Tensor, register_part: bool = True) -> dict:
    """A stamped chain's record [launches, programs, FIELDS] (CPU int64) -> ns medians over launches 2 .. L - 2 of
    the per-launch quantities in the module docstring. register_part False (a form holding nothing in registers: its
    record's second field is the program's start, not a landing): weights_after_wait(_max) and stream are left out."""
    t0, tw, t1, t2, t3, sm = (tr[:, :, i] for i in range(6))
    end = t3.max(1).values
    rows = []
    for j in range(2, tr.shape[0] - 1):
        # int64 differences first: %globaltimer is ~1.8e18 ns, where a double steps by 256 ns
        per = lambda x: float(x.double().median())                    # noqa: E731
        counts = torch.bincount(sm[j]).max()
        rows.append(dict(
            period=float(end[j] - end[j - 1]), lag=float(t1[j].min() - end[j - 1]),
            first_start=float(t0[j].min() - end[j - 1]), last_start=float(t0[j].max() - end[j - 1]),
            last_start_vs_j2=float(t0[j].max() - end[j - 2]),
            weights_after_wait=per(tw[j] - t1[j]), weights_after_wait_max=float((tw[j] - t1[j]).max()),
            smem_after_wait=per(t2[j] - t1[j]), stream=per(tw[j] - t0[j]), post_wait=per(t3[j] - t1[j]),
            post_wait_max=float((t3[j] - t1[j]).max()), wait_spread=float(t1[j].max() - t1[j].min()),
            sms=len(set(sm[j].tolist())), most_an_sm=int(counts)))
    drop = () if register_part else ("weights_after_wait", "weights_after_wait_max", "stream")
    return {k: statistics.median(r[k] for r in rows) for k in rows[0] if k not in drop}


def device_run(shapes: list, rounds: int, out: str | None) -> None:
    from _common import LlamaPrologueCase, stamp_chain, time_alternated, times_line
    from explore47 import launches
    from lowlat.benchmarking import copy_bandwidth, versions
    from lowlat.kernels import attn_prologue_held as aph

    dev = torch.device("cuda")
    bw = copy_bandwidth()
    result = dict(versions(), copy_bandwidth_TBps=round(bw / 1e12, 3), shapes={})
    print(f"{torch.cuda.get_device_name()} copy bandwidth {bw / 1e12:.3f} TB/s", flush=True)
    for shape in shapes:
        n, k = SHAPES[shape]
        ch = Chain(n, k, dev)
        floor = n * k * 2 / bw * 1e6
        fns, checks = {}, {}
        for form in FORMS:
            for early in (False, True):
                name = form + ("_early" if early else "")
                fns[name] = ch.launch(form, early)
        for name, fn in fns.items():                                   # correctness of what each form holds
            ch.out.fill_(float("nan"))
            fn(0)
            torch.cuda.synchronize()
            want = ch.expected(name.split("_")[0])
            got = ch.out[0].double()
            checks[name] = "no weights" if want is None else (
                "ok" if bool(torch.isfinite(got).all()) and bool(((got - want).abs() <= 1e-3 * want.abs().clamp_min(1)
                                                                 + 0.05).all()) else
                f"WRONG: max diff {float((got - want).abs().max())}")
        if shape == "llama":
            case = LlamaPrologueCase(dev)
            pfns, _, _ = launches(case, 1, {"prod": aph})
            fns["prod"] = pfns["prod"]
        times = time_alternated(fns, ch.r, rounds=rounds)
        print(f"[{shape}] N {n} K {k}: {n * k * 2 / 1e6:.1f} MB, floor {floor:.2f} us, 70% needs "
              f"{floor / 0.7:.2f}; {ch.r} copies", flush=True)
        print("  checks: " + " ".join(f"{v}={c}" for v, c in checks.items()), flush=True)
        print("  us: " + times_line(times), flush=True)
        stamps = {}
        for form in FORMS:
            for early in (False, True):
                name = form + ("_early" if early else "")
                stamps[name] = stamp_chain(ch.launch(form, early, trace=True), ch.r, ch.trace,
                                           lambda t, form=form: summarize_trace(t, bool(FORMS[form][0])), name)
        result["shapes"][shape] = dict(n=n, k=k, floor_us=floor, copies=ch.r, checks=checks, us=times,
                                       stamps=stamps)
        del ch
        torch.cuda.empty_cache()
    if out:
        Path(out).write_text(json.dumps(result, indent=1))


def sm90_spec(form: str, early: bool = False, trace: bool = False) -> dict:
    """tests/unit/compile_sm90.py's spec of a form at K 2048 as `Chain.launch` launches it (pointers aligned)."""
    desc = ("tensordesc<bf16[16, 64],NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2, "
            "transposed=False, fp4_padded=False, cga_layout=[])>")
    return dict(constexprs=dict(form_constexprs(form, 2048), USE_PDL=True, EARLY=early, TRACE=trace, Q=Q),
                pointers=dict(w_ptr="*bf16", w_desc=desc, out_ptr="*fp32", tr_ptr="*i64"), num_warps=Q,
                launch_pdl=True, divisible=[])


def sm90_report() -> list:
    """Each form's sm_90 build (CPU: Triton 3.6's front end and ptxas): registers, spills, shared memory."""
    from compile_sm90 import compile_for_sm90

    rows = []
    for form in FORMS:
        for trace in (False, True):
            r = compile_for_sm90(_held_stream_kernel, sm90_spec(form, trace=trace))
            rows.append(dict(form=form, trace=trace, registers=r["registers"], spill_bytes=r["spill_bytes"],
                             shared=r["shared"]))
            print(rows[-1], flush=True)
    return rows


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shapes", nargs="+", default=["llama", "qwen3"], choices=list(SHAPES))
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--out", default=None)
    p.add_argument("--sm90", action="store_true", help="CPU: compile each form for sm_90 and report")
    a = p.parse_args()
    if a.sm90:
        sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "unit"))
        sm90_report()
        return
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    device_run(a.shapes, a.rounds, a.out)


if __name__ == "__main__":
    main()
