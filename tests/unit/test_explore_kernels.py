"""The session-3 exploration kernels (bench/explore/tma_gemv.py, bench/bench_stream_floor.py) still compute what
their timings claim to time: the TMA residual GEMV (row-major and tile-packed weights) and the TMA greedy
GEMV + argmax (every reduction tail variant, packed weights) against float64 references, and the read kernel's
sums, at tiny shapes under the Triton interpreter (CPU) or on the GPU. The numbers in
bench/results/session3/ were taken with these kernels; a kernel that skipped work would time faster."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

from bench_stream_floor import BLOCK, read_launcher  # noqa: E402
from explore import explore19, explore20, tma_gemv  # noqa: E402

from lowlat.numerics import poison  # noqa: E402


def _bf16(*shape, scale=1.0, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(torch.bfloat16).to(device)


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("split", [1, 4])
def test_tma_residual_matches_reference(device, packed, split):
    n, k, m = 128, 512, 3
    w = _bf16(n, k, scale=k ** -0.5, seed=1, device=device)
    tr = tma_gemv.TmaResidual(n, k, bn=64, bk=64, split=split, device=device)
    wl = tma_gemv.pack_tiles(w, 64, 64) if packed else w
    for seed in (2, 3):                                 # the arrival counters reset between launches
        a, res = _bf16(m, k, seed=seed, device=device), _bf16(m, n, seed=seed + 10, device=device)
        out = poison(torch.empty(m, n, dtype=torch.bfloat16, device=device))
        tr(a, wl, res, out, use_pdl=False, packed=packed)
        want = res.double() + a.double() @ w.double().T
        err = (out.double() - want).abs().max().item()
        # one bf16 rounding of the output (<= 2^-9 relative) with margin; a skipped split or chunk is off by the
        # size of the values themselves
        assert err <= 2 ** -7 * want.abs().max().item() + 1e-3, f"max error {err}"
        assert int(tr.cnt.abs().sum()) == 0, "arrival counters left non-zero"


@pytest.mark.parametrize("epi", [1, 3, 4, 5, pytest.param(7, marks=pytest.mark.gpu), 8])   # 7: inline asm, GPU only
@pytest.mark.parametrize("packed", [False, True])
def test_tma_greedy_matches_argmax(device, epi, packed):
    # 18 programs: the 16 groups of EPI 4 / 5 get one or two programs each and all arrive at the root
    v, hd, r = 2304, 128, 3
    w = _bf16(v, hd, scale=hd ** -0.5, seed=4, device=device)
    tg = tma_gemv.TmaGreedy(v, hd, block_v=128, block_h=64, device=device)
    wl = tma_gemv.pack_tiles(w, 128, 64) if packed else w
    # slots and counters left ready for the next launch: the second launch's logits are 8x smaller, so a
    # slot left holding the first launch's maximum would win its argmax
    for seed, scale in ((5, 1.0), (6, 0.125)):
        h = _bf16(r, hd, scale=scale, seed=seed, device=device)
        x = poison(torch.empty(r, v, device=device))
        tok = torch.full((r,), -5, dtype=torch.int64, device=device)
        tg(h, wl, x, tok, epi=epi, packed=packed)
        logits = h.double() @ w.double().T
        if epi == 8:      # no logits stored: the token is the argmax of the exact logits (no ties at these seeds)
            assert bool(x.isnan().all()), "EPI 8 stored logits"
            assert torch.equal(tok, logits.argmax(-1)), (tok, logits.argmax(-1))
        else:
            assert (x.double() - logits).abs().max().item() < 1e-4
            assert torch.equal(tok, x.argmax(-1)), (tok, x.argmax(-1))
        assert int(tg.cnt.abs().sum()) == 0, "counters left non-zero"


@pytest.mark.parametrize("runmax", [False, True])
@pytest.mark.parametrize("programs,block_v,flatten", [(3, 64, True), (7, 16, False), (5, 128, True)])
def test_persistent_greedy_matches_argmax(device, programs, block_v, flatten, runmax):
    """explore19's persistent greedy launch (session 9): tokens = the argmax of the exact logits with the arrival
    (TAIL 1; twice, the slots and counter left ready), and the programs' own best keys (TAIL 0, the stream-only
    timing) hold the same argmax; V 1000 over programs of several tiles and steps past the last tile."""
    v, hd, r = 1000, 96, 5
    w = _bf16(v, hd, scale=hd ** -0.5, seed=8, device=device)
    pg = explore19.PersistentGreedy(v, hd, programs=programs, block_v=block_v, block_h=32, stages=2,
                                    flatten=flatten, device=device)
    for seed, scale in ((9, 1.0), (10, 0.125)):
        h = _bf16(r, hd, scale=scale, seed=seed, device=device)
        want = (h.double() @ w.double().T).argmax(-1)
        tok = torch.full((r,), -5, dtype=torch.int64, device=device)
        pg(h, w, tok, tail=1, runmax=runmax)
        assert torch.equal(tok, want), (tok, want)
        assert int(pg.cnt.abs().sum()) == 0, "counter left non-zero"
    pg.gkeys[16:] = torch.iinfo(torch.int64).min
    pg(h, w, tok, tail=0, runmax=runmax)
    best = pg.gkeys[16:].view(programs, 16)[:, :r].max(0).values
    assert torch.equal(((best & 0xFFFFFFFF) ^ 0xFFFFFFFF), want), "per-program keys do not hold the argmax"


@pytest.mark.parametrize("launch", [dict(), dict(order=1), dict(programs=5, order=1), dict(pf_k=512, late=True),
                                    dict(pf_k=1024, pf_tiles=2), dict(late=True, programs=4)])
def test_prefetch_greedy_matches_argmax(device, launch):
    """explore20's greedy launch (session 10): every timed variant (tile order, program count, and on the GPU the
    PDL launch with its L2 prefetch before the wait and the late trigger) gives the argmax of the exact logits,
    twice (slots and counter left ready), over programs of several tiles and steps past the last tile; and its
    norm kernel is the reference RMSNorm within one bf16 rounding."""
    from lowlat.reference.rms_norm import rms_norm

    v, hd, r = 1000, 96, 5
    w = _bf16(v, hd, scale=hd ** -0.5, seed=8, device=device)
    pg = explore20.PfGreedy(v, hd, programs=3, device=device)
    pg.bv, pg.bh, pg.tiles = 64, 32, -(-v // 64)
    gpu = torch.device(device).type == "cuda"
    for seed, scale in ((9, 1.0), (10, 0.125)):
        h = _bf16(r, hd, scale=scale, seed=seed, device=device)
        want = (h.double() @ w.double().T).argmax(-1)
        tok = torch.full((r,), -5, dtype=torch.int64, device=device)
        pg(h, w, tok, pdl=gpu, **launch)
        assert torch.equal(tok, want), (tok, want)
        assert int(pg.cnt.abs().sum()) == 0, "counter left non-zero"
    x = _bf16(3, hd, seed=11, device=device)
    g = _bf16(hd, seed=12, device=device)
    got = explore20.norm(x, g, poison(torch.empty_like(x)), pdl=gpu).float()
    ref = rms_norm(x, g, 1e-5).float()
    assert not got.isnan().any() and (got - ref).abs().max() <= 2 ** -7 * ref.abs().max()


def test_read_kernel_sums_every_element(device):
    ws = [_bf16(4 * BLOCK, seed=7, device=device)]
    out = poison(torch.empty(8, device=device))
    read_launcher(ws, out, 2, 0)(0)                      # two programs, two loop steps each
    want = ws[0].double().view(2, 2 * BLOCK).sum(-1)
    assert torch.allclose(out[:2].double(), want, rtol=1e-5, atol=1e-3)
    with pytest.raises(ValueError, match="do not split into 3 programs"):
        read_launcher(ws, out, 3, 0)


def test_row_group_greedy_matches_argmax(device):
    v, hd, r = 512, 128, 3
    w = _bf16(v, hd, scale=hd ** -0.5, seed=8, device=device)
    rg = tma_gemv.RowGroupGreedy(v, hd, block_v=128, rg=16, bh=64, device=device)
    for seed, scale in ((9, 1.0), (10, 0.125)):
        h = _bf16(r, hd, scale=scale, seed=seed, device=device)
        x = poison(torch.empty(r, v, device=device))
        tok = torch.full((r,), -5, dtype=torch.int64, device=device)
        rg(h, w, x, tok)
        assert (x.double() - h.double() @ w.double().T).abs().max().item() < 1e-4
        assert torch.equal(tok, x.argmax(-1)), (tok, x.argmax(-1))


def _gemv_want(x, w, g, res, res_epi):
    """The explore GEMVs' two epilogues in float64: res + x W^T, or rms_norm(x) * g W^T (eps 1e-5)."""
    xd = x.double()
    if res_epi:
        return res.double() + xd @ w.double().T
    return (xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-5) * g.double()) @ w.double().T


def _assert_gemv_close(out, want, what: str) -> None:
    """One bf16 rounding of the output (<= 2^-9 relative) with margin: 2^-7 of the largest value; a skipped row, row
    block, column, slice or box is off by the size of the values; NaN (the poison) fails the comparison."""
    err = (out.double() - want).abs().max().item()
    assert err <= 2 ** -7 * want.abs().max().item(), f"max error {err} ({what})"


@pytest.mark.parametrize("kernel", [pytest.param("gluon", marks=pytest.mark.gpu), "triton"])
@pytest.mark.parametrize("bn", [4, 8, 16])
@pytest.mark.parametrize("mode", [0, 1, 2])
@pytest.mark.parametrize("res_epi", [False, True])
def test_smem_gemv_matches_reference(device, kernel, bn, mode, res_epi):
    """bench/explore/smem_gemv.py (session 7; the Gluon kernel on the GPU only, the Triton one under the interpreter
    too, PDL modes on the GPU only): every output row of both epilogues, 1 and 3 rows, two weight copies (one
    descriptor each), two boxes of 2 chunks."""
    from explore.smem_gemv import SmemGemv

    if mode and device.type != "cuda":
        pytest.skip("PDL (griddepcontrol) runs on the GPU only")

    n, k = 64, 256
    ws = [_bf16(n, k, scale=k ** -0.5, seed=20 + i, device=device) for i in range(2)]
    g = (1 + 0.1 * _bf16(k, seed=22)).to(device)
    sg = SmemGemv(ws, bn)
    for r in (1, 3):
        x, res = _bf16(r, k, seed=23 + r, device=device), _bf16(r, n, seed=25 + r, device=device)
        for i in range(2):
            out = poison(torch.empty(r, n, dtype=torch.bfloat16, device=device))
            sg(i, x, g, res, out, mode=mode, res_epi=res_epi, group=2, triton_kernel=kernel == "triton")
            _assert_gemv_close(out, _gemv_want(x, ws[i], g, res, res_epi), f"r {r}, copy {i}")


@pytest.mark.gpu
@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("k", [1024, 2048, 4096])
@pytest.mark.parametrize("mode", [0, 1, 2])
@pytest.mark.parametrize("res_epi", [False, True])
def test_gpu_mma_smem_gemv_matches_reference_and_is_row_invariant(device, version, k, mode, res_epi):
    """bench/explore/mma_smem_gemv.py (session 11; Gluon, GPU only; version 2 not yet run on a GPU when this
    test was written): both epilogues at 1 / 3 / 9 / 48 rows (one to six row blocks; x with a padded row
    stride), two weight copies (one TMA descriptor each), K 1024 (one staging chunk per quarter), 2048 (two;
    version 2 double-buffers x) and 4096 (four; one x buffer); every row of 17 computed alone is bitwise the
    row computed among 17. Tolerance: one bf16 rounding of the output (<= 2^-9 relative) with margin, 2^-7 of
    the largest value; a skipped box, quarter, row block or copy is off by the size of the values; NaN (the
    poison) fails."""
    from explore.mma_smem_gemv import MmaSmemGemv

    n = 64
    ws = [_bf16(n, k, scale=k ** -0.5, seed=40 + i, device=device) for i in range(2)]
    g = (1 + 0.1 * _bf16(k, seed=42)).to(device)
    mg = MmaSmemGemv(ws)
    for r in (1, 3, 9, 48):
        xp, res = _bf16(r, k + 64, seed=43 + r, device=device), _bf16(r, n, seed=45 + r, device=device)
        x = xp[:, :k]
        for i in range(2):
            out = poison(torch.empty(r, n, dtype=torch.bfloat16, device=device))
            mg(i, x, g, res, out, mode=mode, res_epi=res_epi, version=version)
            _assert_gemv_close(out, _gemv_want(x, ws[i], g, res, res_epi), f"r {r}, copy {i}")
    x, res = _bf16(17, k, seed=50, device=device), _bf16(17, n, seed=51, device=device)
    full = poison(torch.empty(17, n, dtype=torch.bfloat16, device=device))
    mg(0, x, g, res, full, mode=mode, res_epi=res_epi, version=version)
    for j in range(17):
        one = poison(torch.empty(1, n, dtype=torch.bfloat16, device=device))
        mg(0, x[j:j + 1], g, res[j:j + 1], one, mode=mode, res_epi=res_epi, version=version)
        assert torch.equal(one.view(torch.int16), full[j:j + 1].view(torch.int16)), f"row {j} alone differs"


@pytest.mark.parametrize("version", [1, 2])
def test_mma_smem_gemv_compiles_for_sm90_with_weights_before_the_wait(monkeypatch, version):
    """The Gluon kernels as explore22 launches them (K 2048 / 4096, 1 and 6 row blocks, both epilogues), compiled
    for sm_90 on the CPU: no register spills, shared memory within the H200's 227 KB, every weight TMA load
    issued before the PDL wait (MODE 2), the products on mma.sync; version 2 stages x by cp.async (none before
    the wait) and reads the norm weight before the wait."""
    from sampling_stats import compile_sm90
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    from triton.runtime.jit import mangle_type

    from explore import mma_smem_gemv as mod

    monkeypatch.setenv("PYTHONPATH", str(BENCH))
    box = [mod.Q, mod.BN, mod.BK]
    desc = TensorDescriptor(torch.zeros(2048, 2048, dtype=torch.bfloat16), [mod.Q, 2048, 512], [512, 2048, 1], box,
                            gl.NVMMASharedLayout.get_default_for(box, gl.bfloat16))
    cases = [(2048, 1, True), (2048, 6, False), (4096, 1, False), (4096, 6, True)]
    specs = [{"constexprs": dict({"K": k, "NMB": nmb, "MODE": 2, "RES": res, "KC": 256},
                                 **({"NBUF": mod.x_buffers(k)} if version == 2 else {})),
              "pointers": {"w_desc": mangle_type(desc), "x_ptr": "*bf16", "g_ptr": "*bf16", "res_ptr": "*bf16",
                           "out_ptr": "*bf16"},
              "scalars": {"eps": "fp32"}, "divisible": ["N", "stride_x"], "num_warps": mod.Q, "launch_pdl": True,
              "ptx": True} for k, nmb, res in cases]
    name = {1: "_mma_smem_gemv_kernel", 2: "_mma_smem_gemv_v2_kernel"}[version]
    for (k, nmb, res), info in zip(cases, compile_sm90(f"explore.mma_smem_gemv:{name}", specs)):
        ptx = info.pop("ptx")
        assert info["spill_bytes"] == 0 and info["shared"] <= 227 << 10, (k, nmb, res, info)
        boxes = k // (mod.Q * mod.BK)
        wait = ptx.find("griddepcontrol.wait")
        assert ptx[:wait].count("cp.async.bulk.tensor") == boxes and ptx.count("cp.async.bulk.tensor") == boxes, k
        assert ptx.count("mma.sync") == nmb * boxes * mod.BK // 16, (k, nmb, ptx.count("mma.sync"))
        if version == 2:
            copies = ptx.count("cp.async.ca") + ptx.count("cp.async.cg")
            assert copies > 0 and "cp.async.c" not in ptx[:wait], (k, nmb, copies)
            assert (ptx[:wait].count("ld.global") > 0) == (not res), (k, res, "norm weight before the wait")


@pytest.mark.parametrize("mode,early", [(0, 0), pytest.param(1, 0, marks=pytest.mark.gpu),
                                        pytest.param(2, 0, marks=pytest.mark.gpu),
                                        pytest.param(2, 1, marks=pytest.mark.gpu)])
@pytest.mark.parametrize("bn,warps", [(4, 4), (8, 2)])
@pytest.mark.parametrize("res_epi", [False, True])
def test_held_gemv_matches_reference(device, mode, early, bn, warps, res_epi):
    """bench/explore/explore31.py (session 23; PDL modes on the GPU only): both epilogues at 1 / 3 / 6 rows, row
    groups of 1, 2 and 4 (6 rows in groups of 4: the last group short), against float64."""
    from explore.explore31 import launch_held

    if mode and device.type != "cuda":
        pytest.skip("PDL (griddepcontrol) runs on the GPU only")
    n, k = 32, 256
    w = _bf16(n, k, scale=k ** -0.5, seed=31, device=device)
    g = (1 + 0.1 * _bf16(k, seed=32)).to(device)
    for r, rb in ((1, 1), (3, 2), (6, 4)):
        x, res = _bf16(r, k, seed=33 + r, device=device), _bf16(r, n, seed=40 + r, device=device)
        out = poison(torch.empty(r, n, dtype=torch.bfloat16, device=device))
        launch_held(x, g, w, res, out, bn=bn, warps=warps, rb=rb, mode=mode, early=early, res_epi=res_epi)
        _assert_gemv_close(out, _gemv_want(x, w, g, res, res_epi), f"r {r}")


@pytest.mark.parametrize("mode,early", [(0, 0), pytest.param(1, 0, marks=pytest.mark.gpu),
                                        pytest.param(2, 1, marks=pytest.mark.gpu)])
@pytest.mark.parametrize("bn,s,warps", [(16, 4, 4), (32, 2, 2)])
def test_held_mma_gemv_matches_reference(device, mode, early, bn, s, warps):
    """bench/explore/explore32.py (session 23; PDL modes on the GPU only): 1 / 5 / 16 / 17 / 40 rows (one to three
    row blocks, the last short) against float64; on the GPU each row also bit for bit the 1-row launch's."""
    from explore.explore32 import launch_held_mma

    if mode and device.type != "cuda":
        pytest.skip("PDL (griddepcontrol) runs on the GPU only")
    n, k = 64, 256
    w = _bf16(n, k, scale=k ** -0.5, seed=51, device=device)
    x_all, res_all = _bf16(40, k, seed=52, device=device), _bf16(40, n, seed=53, device=device)
    first = None
    for r in (1, 5, 16, 17, 40):
        x, res = x_all[:r].contiguous(), res_all[:r].contiguous()
        out = poison(torch.empty(r, n, dtype=torch.bfloat16, device=device))
        launch_held_mma(x, w, res, out, bn=bn, s=s, warps=warps, mode=mode, early=early)
        _assert_gemv_close(out, _gemv_want(x, w, None, res, True), f"r {r}")
        first = out[:1].clone() if first is None else first
        if device.type == "cuda":
            assert torch.equal(out[:1], first), f"row 0 at {r} rows differs from the 1-row launch"


@pytest.mark.gpu
@pytest.mark.parametrize("mode,early", [(0, 0), (1, 0), (2, 0), (2, 1)])
@pytest.mark.parametrize("warps,slices,rb,k_width,prod", [(4, 0, 8, 8, False), (8, 0, 8, 8, False),
                                                         (4, 8, 16, 8, False), (8, 16, 8, 8, False),
                                                         (4, 8, 8, 2, True), (8, 8, 16, 2, True)])
def test_register_mma_gemv_matches_reference(device, mode, early, warps, slices, rb, k_width, prod):
    """bench/explore/explore33.py (session 24; Gluon, GPU only): 1 / 5 / 8 / 9 / 17 / 40 / 48 rows (one to six row
    blocks, the last short or full) against float64, the output poisoned first; each row also bit for bit
    what a 1-row launch with 8-row blocks gives for it (row invariance: rows 0, 4 and the last). Also k_width 2 with
    production's summation order (the last two tilings; not yet run on a GPU)."""
    from explore.explore33 import launch_held_mma

    n, k = 64, 1024
    w = _bf16(n, k, scale=k ** -0.5, seed=61, device=device)
    x_all, res_all = _bf16(48, k, seed=62, device=device), _bf16(48, n, seed=63, device=device)
    alone = {}
    for r in (1, 5, 8, 9, 17, 40, 48):
        x, res = x_all[:r].contiguous(), res_all[:r].contiguous()
        out = poison(torch.empty(r, n, dtype=torch.bfloat16, device=device))
        launch_held_mma(x, w, res, out, warps=warps, mode=mode, early=early, slices=slices, rb=rb, k_width=k_width,
                        prod=prod)
        torch.cuda.synchronize()
        _assert_gemv_close(out, _gemv_want(x, w, None, res, True), f"r {r}")
        for i in sorted({0, min(4, r - 1), r - 1}):
            if i not in alone:
                one = poison(torch.empty(1, n, dtype=torch.bfloat16, device=device))
                launch_held_mma(x_all[i:i + 1].contiguous(), w, res_all[i:i + 1].contiguous(), one, warps=warps,
                                mode=mode, early=early, slices=slices, k_width=k_width, prod=prod)
                alone[i] = one
            assert torch.equal(out[i:i + 1], alone[i]), f"row {i} at {r} rows differs from its 1-row launch"


def test_register_mma_gemv_refuses_shapes():
    """launch_held_mma refuses, before any launch and with a message naming the value, every input its kernel cannot
    take (checked on the CPU: the refusals come before the launch)."""
    from explore.explore33 import launch_held_mma

    bf = torch.bfloat16

    def t(*shape):
        return torch.zeros(*shape, dtype=bf)

    x, w, res, out = t(3, 256), t(32, 256), t(3, 32), t(3, 32)
    ok = dict(warps=4, mode=0, early=0)
    cases = [
        ("M 0 must lie", (t(0, 256), w, t(0, 32), t(0, 32)), ok),
        ("M 49 must lie", (t(49, 256), w, t(49, 32), t(49, 32)), ok),
        ("warps 3 must be a power of two", (x, w, res, out), dict(ok, warps=3)),
        ("slices 6 must be a power of two", (x, w, res, out), dict(ok, slices=6)),
        ("slices 2 must be a power of two and a multiple of 4", (x, w, res, out), dict(ok, slices=2)),
        ("N 24 must divide by 16", (x, t(24, 256), t(3, 24), t(3, 24)), ok),
        ("K 384 must be 4 slices of a power of two", (t(3, 384), t(32, 384), res, out), ok),
        ("K 256 must be 32 slices", (x, w, res, out), dict(ok, slices=32)),
        ("rb 32 must be 8 or 16", (x, w, res, out), dict(ok, rb=32)),
        ("k_width 4 must be 2 or 8", (x, w, res, out), dict(ok, k_width=4)),
        ("mode 3 must be", (x, w, res, out), dict(ok, mode=3)),
        ("early 2 0 / 1", (x, w, res, out), dict(ok, early=2)),
        (r"x \(3, 128\)", (t(3, 128), w, res, out), ok),
        (r"res \(3, 16\)", (x, w, t(3, 16), out), ok),
        (r"out \(3, 32\) torch.float32", (x, w, res, torch.zeros(3, 32)), ok),
        (r"x \(3, 256\) torch.bfloat16 on cpu must be a contiguous", (t(256, 3).T, w, res, out), ok),
    ]
    for match, args, kw in cases:
        with pytest.raises(ValueError, match=match):
            launch_held_mma(*args, **kw)


def test_register_mma_gemv_compiles_for_sm90_with_weights_held_in_registers(monkeypatch):
    """explore33's kernel compiled for sm_90 on the CPU (Llama-3.2-1B / Qwen3-30B-A3B out_proj, 1 / 3 / 6 row blocks,
    k_width 8 and, with production's summation order, 2): no spills, no shared memory but the cross-slice sum's
    (<= 8 KB: no staging of the weights), and with MODE 2 every weight load (ld.global.v4 at k_width 8, ld.global.b32
    at 2) issued before the PDL wait (griddepcontrol.wait), then the expected number of mma.sync."""
    from sampling_stats import compile_sm90

    monkeypatch.setenv("PYTHONPATH", str(BENCH))
    cases = [(2048, 8, 0, 8, 1, 8), (2048, 8, 0, 8, 6, 8), (4096, 16, 0, 8, 1, 8), (4096, 16, 0, 8, 6, 8),
             (2048, 8, 16, 16, 3, 8), (4096, 8, 8, 16, 3, 8), (2048, 4, 8, 8, 1, 2), (2048, 4, 8, 8, 6, 2)]
    specs = [{"constexprs": {"K": k, "Q": q, "S": sl, "RB": rb, "NMB": nmb, "KW": kw, "PROD": kw == 2, "MODE": 2,
                             "EARLY": 0},
              "pointers": {p: "*bf16" for p in ("x_ptr", "w_ptr", "res_ptr", "out_ptr")}, "divisible": ["N"],
              "num_warps": q, "launch_pdl": True, "ptx": True} for k, q, sl, rb, nmb, kw in cases]
    for case, info in zip(cases, compile_sm90("explore.explore33:_held_mma_kernel", specs)):
        k, q, sl, rb, nmb, kw = case
        assert info["spill_bytes"] == 0 and info["shared"] <= 8192, (case, info)
        ptx = info["ptx"]
        wait = ptx.index("griddepcontrol.wait")
        w_bytes = 16 * k // q * 2 // 32                 # [16, K / Q] bf16 a warp: bytes a thread, 16 or 4 a load
        assert ptx[:wait].count("ld.global.v4" if kw == 8 else "ld.global.b32") == w_bytes // (16 if kw == 8 else 4), \
            case
        assert ptx.count("mma.sync.aligned.m16n8k16") == k // 16 // q * rb // 8 * nmb, case


def _prologue_case(d: int, device):
    """A small Llama-family prologue (H 256, D 64: Hq 4, Hkv 2; D 128: Hq 2, Hkv 1; llama3 RoPE scaling), weights
    packed as `pack_qkv`, a random RMSNorm weight, the `rope_table` of 512 positions."""
    from lowlat.config import preset
    from lowlat.kernels.attn_prologue import rope_table

    cfg = preset("Llama-3.2-1B").replace(hidden_size=256, num_heads=256 // d, num_kv_heads=128 // d, head_dim=d)
    n = (cfg.num_heads + 2 * cfg.num_kv_heads) * d
    w = _bf16(n, 256, scale=256 ** -0.5, seed=70 + d, device=device)
    g = (1 + 0.1 * _bf16(256, seed=71 + d)).to(device)
    return cfg, w, g, rope_table(cfg, 512, device)


@pytest.mark.gpu
@pytest.mark.parametrize("mode,early", [(0, 0), (1, 0), (2, 0), (2, 1)])
@pytest.mark.parametrize("d,warps,slices,rb,fold,inp,epi", [(64, 4, 4, 8, 1, 0, 0), (64, 4, 8, 8, 0, 1, 1),
                                                            (128, 2, 4, 16, 1, 1, 0), (128, 4, 8, 16, 0, 0, 1)])
def test_register_mma_prologue_matches_reference(device, mode, early, d, warps, slices, rb, fold, inp, epi):
    """bench/explore/explore34.py (session 25; Gluon, GPU only): 1 / 5 / 8 / 9 / 17 / 40 / 48 rows, the last row
    padding from 5 rows on, against the float64 reference prologue (q of every row, the k / v cache rows of the valid
    ones; explore's bound: one bf16 rounding plus fp32 sums, 2^-7 of the largest value). q and both caches are
    poisoned first: every q element is written, no slot but the valid rows' changes. Each of rows 0, 4 and the last
    also gives bit for bit what a 1-row launch gives it (row invariance)."""
    from explore.explore34 import close, launch_held_prologue, oracle

    cfg, w, g, table = _prologue_case(d, device)
    hq, hkv, slots = cfg.num_heads, cfg.num_kv_heads, 64
    x_all = _bf16(48, 256, seed=72, device=device)
    pos_all = torch.randint(0, 512, (48,), generator=torch.Generator().manual_seed(73)).to(device)
    loc_all = (torch.randperm(slots - 1, generator=torch.Generator().manual_seed(74))[:48] + 1).to(torch.int32)
    loc_all = loc_all.to(device)
    kw = dict(eps=cfg.rms_eps, warps=warps, slices=slices, rb=rb, fold=fold, inp=inp, epi=epi, mode=mode, early=early)
    alone = {}
    for r in (1, 5, 8, 9, 17, 40, 48):
        nvr = r if r < 5 else r - 1
        x, pos, loc = x_all[:r].contiguous(), pos_all[:r].contiguous(), loc_all[:r].contiguous()
        q = poison(torch.empty(r, hq, d, dtype=torch.bfloat16, device=device))
        kc = poison(torch.empty(slots, hkv, d, dtype=torch.bfloat16, device=device))
        vc = poison(torch.empty(slots, hkv, d, dtype=torch.bfloat16, device=device))
        launch_held_prologue(x, w, g, table, pos, loc, nvr, q, kc, vc, **kw)
        torch.cuda.synchronize()
        wq, wk, wv = oracle(x, w, g, pos, loc, nvr, hkv, d, slots, cfg)
        valid = loc[:nvr].long()
        for what, got, want in (("q", q, wq), ("k", kc[valid], wk[valid]), ("v", vc[valid], wv[valid])):
            err, ok = close(got, want)
            assert ok, f"{what}: max error {err} at {r} rows"
        untouched = torch.ones(slots, dtype=torch.bool, device=device)
        untouched[valid] = False
        assert kc[untouched].isnan().all() and vc[untouched].isnan().all(), f"a slot not of a valid row written ({r})"
        for i in sorted({0, min(4, r - 1), r - 1}):
            if i not in alone:
                q1 = poison(torch.empty(1, hq, d, dtype=torch.bfloat16, device=device))
                kc1, vc1 = poison(torch.empty_like(kc)), poison(torch.empty_like(vc))
                launch_held_prologue(x_all[i:i + 1].contiguous(), w, g, table, pos_all[i:i + 1].contiguous(),
                                     loc_all[i:i + 1].contiguous(), 1, q1, kc1, vc1, **dict(kw, rb=8))
                alone[i] = (q1, kc1[loc_all[i].long()], vc1[loc_all[i].long()])
            assert torch.equal(q[i:i + 1], alone[i][0]), f"q of row {i} at {r} rows differs from its 1-row launch"
            if i < nvr:
                assert torch.equal(kc[loc[i].long()], alone[i][1]) and torch.equal(vc[loc[i].long()], alone[i][2]), \
                    f"k / v of row {i} at {r} rows differ from its 1-row launch"


def test_register_mma_prologue_refuses_inputs():
    """launch_held_prologue refuses, before any launch and with a message naming the value, every input its kernel
    cannot take (on the CPU: the refusals come before the launch)."""
    from explore.explore34 import launch_held_prologue

    bf = torch.bfloat16
    cfg, w, g, table = _prologue_case(64, "cpu")
    x, pos, loc = torch.zeros(3, 256, dtype=bf), torch.zeros(3, dtype=torch.int64), torch.zeros(3, dtype=torch.int32)
    q, kc, vc = torch.zeros(3, 4, 64, dtype=bf), torch.zeros(8, 2, 64, dtype=bf), torch.zeros(8, 2, 64, dtype=bf)
    args = dict(x=x, w=w, g=g, table=table, positions=pos, out_cache_loc=loc, num_valid_rows=3, q=q, k_cache=kc,
                v_cache=vc)
    ok = dict(eps=1e-5, warps=4, slices=4)
    cases = [
        ("M 0 must lie", dict(x=x[:0], positions=pos[:0], out_cache_loc=loc[:0], q=q[:0], num_valid_rows=0), ok),
        ("M 49 must lie", dict(x=torch.zeros(49, 256, dtype=bf), positions=torch.zeros(49, dtype=torch.int64),
                               out_cache_loc=torch.zeros(49, dtype=torch.int32), q=torch.zeros(49, 4, 64, dtype=bf)),
         ok),
        ("warps 3 must be a power of two", {}, dict(ok, warps=3)),
        ("slices 2 must be a power of two and a multiple of 4", {}, dict(ok, slices=2)),
        ("H 256 must be 32 slices", {}, dict(ok, slices=32)),
        ("head_dim 48 must be a power of two", dict(q=torch.zeros(3, 4, 48, dtype=bf),
                                                    k_cache=torch.zeros(8, 2, 48, dtype=bf),
                                                    v_cache=torch.zeros(8, 2, 48, dtype=bf)), ok),
        (r"N 512 must be \(Hq 3 \+ 2 Hkv 2\)", dict(q=torch.zeros(3, 3, 64, dtype=bf)), ok),
        ("rb 4 must be 8 or 16", {}, dict(ok, rb=4)),
        ("fold 2, inp 0, epi 0 must be 0 or 1", {}, dict(ok, fold=2)),
        ("fold 1, inp 2, epi 0 must be 0 or 1", {}, dict(ok, inp=2)),
        ("fold 1, inp 0, epi 3 must be 0 or 1", {}, dict(ok, epi=3)),
        ("mode 3 must be", {}, dict(ok, mode=3)),
        ("early 2 0 / 1", {}, dict(ok, early=2)),
        ("num_valid_rows 4 must lie in 0..3", dict(num_valid_rows=4), ok),
        ("num_valid_rows -1 must lie", dict(num_valid_rows=-1), ok),
        (r"g \(128,\)", dict(g=g[:128]), ok),
        (r"table \(512, 64\) torch.float64", dict(table=table.double()), ok),
        (r"positions \(3,\) torch.int32", dict(positions=pos.int()), ok),
        (r"out_cache_loc \(3,\) torch.int64", dict(out_cache_loc=loc.long()), ok),
        (r"v_cache \(9, 2, 64\)", dict(v_cache=torch.zeros(9, 2, 64, dtype=bf)), ok),
        (r"x \(3, 256\) torch.bfloat16 on cpu must be a contiguous", dict(x=torch.zeros(256, 3, dtype=bf).T), ok),
    ]
    for match, change, kw in cases:
        with pytest.raises(ValueError, match=match):
            launch_held_prologue(**dict(args, **change), **kw)


def test_register_mma_prologue_compiles_for_sm90_with_weights_held_in_registers(monkeypatch):
    """explore34's kernel compiled for sm_90 on the CPU at Llama-3.2-1B's prologue (H 2048, D 64; 1 / 3 / 6 row
    blocks; g folded into the weights or applied to x; the epilogue's inputs before the wait or after; both
    epilogues): no spills, no shared memory but the cross-slice sum's and the RoPE halves' (<= 4.5 KB), every weight
    load (and, folding, the norm weight's; with INP the first row block's positions, slots and cos / sin, four more
    loads) issued before the PDL wait, no mma before it, then the expected number of mma.sync; EPI 1 has fewer
    barriers than EPI 0."""
    from sampling_stats import compile_sm90

    monkeypatch.setenv("PYTHONPATH", str(BENCH))
    cases = [(4, 4, 8, 1, 1, 0, 0), (4, 4, 8, 1, 1, 0, 1), (4, 4, 8, 1, 1, 1, 0), (4, 4, 8, 1, 1, 1, 1),
             (4, 8, 8, 6, 1, 1, 1), (4, 4, 8, 1, 0, 1, 1), (4, 8, 8, 1, 1, 0, 0), (8, 8, 8, 3, 0, 0, 0)]
    pointers = {"x_ptr": "*bf16", "w_ptr": "*bf16", "g_ptr": "*bf16", "tab_ptr": "*fp32", "pos_ptr": "*i64",
                "loc_ptr": "*i32", "q_ptr": "*bf16", "kc_ptr": "*bf16", "vc_ptr": "*bf16"}
    specs = [{"constexprs": {"K": 2048, "D": 64, "Q": q, "S": sl, "RB": rb, "NMB": nmb, "FOLD": fold, "MODE": 2,
                             "EARLY": 0, "INP": inp, "EPI": epi},
              "pointers": pointers, "scalars": {"eps": "fp32"}, "divisible": ["Hq"], "num_warps": q,
              "launch_pdl": True, "ptx": True} for q, sl, rb, nmb, fold, inp, epi in cases]
    bars = {}
    for case, info in zip(cases, compile_sm90("explore.explore34:_held_prologue_kernel", specs)):
        q, sl, rb, nmb, fold, inp, epi = case
        assert info["spill_bytes"] == 0 and info["shared"] <= 4608, (case, info)
        ptx = info["ptx"]
        wait = ptx.index("griddepcontrol.wait")
        loads = 16 * 2048 // q * 2 // 32 // 16          # [16, K / Q] bf16 a warp: 16-byte loads a thread
        v4 = ptx[:wait].count("ld.global.v4")
        assert v4 == loads * (2 if fold else 1) and ptx[:wait].count("ld.global") - v4 == 4 * inp, case
        assert "mma.sync" not in ptx[:wait], case
        assert ptx.count("mma.sync.aligned.m16n8k16") == 2048 // 16 // q * rb // 8 * nmb, case
        bars[case] = ptx.count("bar.sync")
    assert bars[(4, 4, 8, 1, 1, 0, 1)] < bars[(4, 4, 8, 1, 1, 0, 0)], bars


def test_held_prologue_explore_edits_apply_and_the_landed_release_precedes_the_wait(monkeypatch, tmp_path):
    """The session 28-29 explores that time variants of the production held prologue edit its source by text
    (explore37's register cap, explore44's QK-norm exchange, explore46's removals, `_common.landed_release_source`):
    each edit still finds its line (a production edit that breaks one fails here, not on the device), and the
    landed-release variant, compiled for sm_90 on the CPU (Llama-3.2-1B, 1 row block, g multiplied in registers),
    issues every weight (and g) load and one predicated release a held weight register before the PDL wait (the
    release after it stays), no spills."""
    monkeypatch.syspath_prepend(str(BENCH / "explore"))
    from _common import landed_release_source
    from explore37 import capped_source
    from explore44 import qk_norm_source
    from explore46 import (BRANCH, EXCHANGE, NORM_LOAD, NORM_USE, R2, ROPE_AFTER, ROPE_PRE, ROPE_SEL, SYNC, edited,
                           variant_sources)
    from sampling_stats import compile_sm90

    from lowlat.kernels import attn_prologue_held as aph

    src = open(aph.__file__).read()
    assert capped_source(src, 168).count("maxnreg=168") == 1
    qk = qk_norm_source(src)
    assert "_cluster_sync" not in edited(qk, SYNC, "").split("def _held_prologue_kernel(")[1]
    assert "xs_ptr +" not in edited(qk, EXCHANGE, "").split("def _held_prologue_kernel(")[1]
    assert "cos0" not in edited(edited(qk, ROPE_PRE, ""), ROPE_SEL, ROPE_AFTER)
    assert all(qk.count(line) == 1 for line in (NORM_LOAD, BRANCH, R2, NORM_USE))          # explore46's other edits
    variants = variant_sources(src)                    # every variant's edits apply (each asserted to match once)
    for v in ("nosum_smem", "qk_smem", "qk_smem_rope_late", "nosum_cpasync", "qk_cpasync"):
        body = variants[v][0].split("def _held_prologue_kernel(")[1]
        assert "nlo_s.store(" in body or "async_copy_global_to_shared(nlo_s" in body, v
        assert "nlo =" not in body and "nlo_s.load(" in body, v
    landed = landed_release_source(capped_source(src, 168))
    (tmp_path / "aph_landed_test.py").write_text(landed)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    pointers = {a: "*bf16" for a in ("x_ptr", "w_ptr", "g_ptr", "q_ptr", "kc_ptr", "vc_ptr")}
    pointers.update(tab_ptr="*fp32", pos_ptr="*i64", loc_ptr="*i32", nvr_ptr="*i32")
    spec = {"constexprs": {"K": 2048, "D": 64, "NMB": 1, "NVR_FROM_PTR": True, "USE_PDL": True, "FOLD_G": True,
                           "Q": 4, "S": 4, "RB": 8},
            "pointers": pointers, "scalars": {"eps": "fp32"}, "divisible": ["Hq"], "num_warps": 4,
            "launch_pdl": True, "ptx": True}
    info, = compile_sm90("aph_landed_test:_held_prologue_kernel", [spec])
    ptx = info["ptx"]
    head, _, tail = ptx.partition("griddepcontrol.wait")
    held = 16 * 2048 // 128                             # a thread's held bf16 weights (16 rows of H over 128 threads)
    assert head.count("ld.global.v4") == 2 * held * 2 // 16                  # the weights and g, 16 bytes a load
    assert head.count("griddepcontrol.launch_dependents") == held       # one a weight element, predicated
    assert tail.count("griddepcontrol.launch_dependents") == 1 and info["spill_bytes"] == 0, info["spill_bytes"]


def test_explore46_smem_norm_weights_stored_before_the_wait_and_read_after_the_barrier(monkeypatch, tmp_path):
    """explore46's qk_smem (session 33: Qwen3-30B-A3B's held prologue with QK-norm, its norm weights staged in shared
    memory), compiled for sm_90 on the CPU as `Launch` launches it at 1 row (`explore46.sm90_spec`): the four
    norm-weight loads and their two shared-memory stores come before the PDL wait, no global norm-weight load after
    it, and both shared-memory reads come after the block loop's first bar.sync (which orders every thread's stores
    before them). The kernel cannot run on the CPU (Gluon has no interpreter path); the device run checks its values
    (`explore44.accuracy_verdict`)."""
    monkeypatch.syspath_prepend(str(BENCH / "explore"))
    from explore37 import capped_source
    from explore46 import sm90_spec, variant_sources
    from sampling_stats import compile_sm90

    from lowlat.kernels import attn_prologue_held as aph

    src, clustered, qk = variant_sources(open(aph.__file__).read())["qk_smem"]
    assert clustered and qk
    (tmp_path / "aph_qk_smem_test.py").write_text(capped_source(src, 168))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    info, = compile_sm90("aph_qk_smem_test:_held_prologue_kernel", [sm90_spec(1, True)])
    head, _, tail = info["ptx"].partition("griddepcontrol.wait")
    assert head.count("ld.global.b16") == 4 and head.count("st.shared.b16") == 2, "the norm weights staged"
    assert "ld.shared" not in head and "ld.global.b16" not in tail
    barrier = tail.index("bar.sync")
    assert "ld.shared.b16" not in tail[:barrier] and tail[barrier:].count("ld.shared.b16") == 2


#: a hand-written sm_90 listing: a step input (8 bytes) and a weight (16 bytes) loaded before the PDL wait, a range
#: check that waits on the step input, a register copy that waits on the weight, then x, a chain of three dependent
#: mma (one through a move) beside an independent one, and the output's store
_SASS = """
        /*0000*/                   LDG.E.64 R14, desc[UR6][R2.64] ;
        /*0010*/                   LDG.E.128 R16, desc[UR6][R4.64] ;
        /*0020*/                   ISETP.GT.U32.AND P2, PT, R14, -0x1, PT ;
        /*0030*/                   LDG.E.128 R20, desc[UR6][R4.64+0x40] ;
        /*0040*/                   IMAD.MOV.U32 R30, RZ, RZ, R17 ;
        /*0050*/                   LDG.E.128 R24, desc[UR6][R4.64+0x80] ;
        /*0060*/                   ACQBULK ;
        /*0070*/                   LDG.E.128 R40, desc[UR6][R8.64] ;
        /*0080*/                   HMMA.16816.F32.BF16 R44, R16, R40, RZ ;
        /*0090*/                   HMMA.16816.F32.BF16 R48, R20, R42, RZ ;
        /*00a0*/                   HMMA.16816.F32.BF16 R44, R24, R40, R44 ;
        /*00b0*/                   MOV R52, R44 ;
        /*00c0*/                   HMMA.16816.F32.BF16 R44, R16, R40, R52 ;
        /*00d0*/                   STG.E.U16 desc[UR6][R10.64], R44 ;
        /*00e0*/                   EXIT ;
"""


def test_llama_prologue_sm90_reads_the_stalls_and_the_chain_of_a_listing(monkeypatch):
    """bench/explore/llama_prologue_sm90.py's SASS readers (session 33) on `_SASS`: the first wait on a load before
    the PDL wait (the range check on the step input, 2 weight loads behind it) and the first on a 16-byte load (the
    copy, 1 behind it); after the wait the chain to the store (6 instructions), 4 HMMA of which 3 depend in turn
    (through the move), 1 load, none after the store. No compile: pure text."""
    monkeypatch.syspath_prepend(str(BENCH / "explore"))
    from llama_prologue_sm90 import chain_after_wait, load_stalls

    assert load_stalls(_SASS) == {"stall": "ISETP.GT.U32.AND<-LDG.E.64", "ldg128_behind_stall": 2,
                                  "weight_stall": "IMAD.MOV.U32<-LDG.E.128", "ldg128_behind_weight_stall": 1}
    c = chain_after_wait(_SASS)
    assert (c["before_wait"], c["ldg128_before"], c["chain"], c["to_last_store"]) == (6, 3, 6, 6)
    assert (c["first_hmma"], c["hmma_after"], c["hmma_depth"], c["ldg_after"], c["ldg_after_store"]) == (1, 4, 3, 1, 0)
    assert c["hmul2_after"] == c["bar_after"] == c["ldl_after"] == c["ffma_depth"] == 0


def test_explore47_rope_edits_apply_and_rope_late_issues_no_weight_load_behind_a_load_wait(monkeypatch, tmp_path):
    """bench/explore/explore47.py (session 33: Llama-3.2-1B's held prologue, the first row block's RoPE inputs moved
    across the PDL wait): each edit applies to the production source once (explore46's `edited` asserts it); before
    the wait rope_late loads no RoPE input and rope_split the positions / KV slots only; rope_late compiled for sm_90
    on the CPU as the per-kernel bench launches it at 1 row (`llama_prologue_sm90.launch_spec`, form "timed": M and
    num_valid_rows constants) spills nothing and issues its 48 weight / g loads (LDG.128) before the wait with no
    instruction before them that waits on one of the program's own loads (`load_stalls`; production issues all 48
    behind the positions' range check). Gluon kernels do not run on the CPU: the device run checks q / K / V bitwise
    against production."""
    monkeypatch.syspath_prepend(str(BENCH / "explore"))
    from explore47 import variant_sources
    from llama_prologue_sm90 import chain_after_wait, launch_spec, load_stalls
    from sampling_stats import compile_sm90

    from lowlat.config import preset
    from lowlat.kernels import attn_prologue_held as aph

    src = open(aph.__file__).read()
    sources = variant_sources(src)
    assert sources["prod"] == src

    def before_wait(s):
        return s.split("def _held_prologue_kernel(")[1].split("    pdl_wait_then_release(")[0]
    assert "_rope_inputs(" in before_wait(src) and "_rope" not in before_wait(sources["rope_late"])
    split = before_wait(sources["rope_split"])
    assert "_rope_slots(" in split and "_rope_cos_sin(" not in split and "_rope_inputs(" not in split
    (tmp_path / "e47_rope_late_test.py").write_text(sources["rope_late"])
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    spec = dict(launch_spec(preset("Llama-3.2-1B"), 1, aph.SLICES, True, "timed"), dump=str(tmp_path / "rope_late"))
    assert spec["constexprs"]["M"] == spec["constexprs"]["nvr_int"] == 1
    info, = compile_sm90("e47_rope_late_test:_held_prologue_kernel", [spec])
    sass = (tmp_path / "rope_late.sass").read_text()
    assert info["spill_bytes"] == 0 and chain_after_wait(sass)["ldg128_before"] == 48
    assert load_stalls(sass)["ldg128_behind_stall"] == 0, load_stalls(sass)
