"""Fused output projection + residual + mlp_norm (lowlat.kernels.out_proj) vs lowlat.reference.out_proj.

CPU: tiny shapes under the Triton interpreter (hypothesis over rows 1..48, split-K forced on and off,
ragged N and K). GPU: SmolLM2-135M and Llama-3.2-1B shapes, bitwise determinism and row invariance. The tiny-shape
tests that take the `device` fixture (rows independence, padding rows, in-place forms, workspace reuse) run on a GPU
runner too; the `interpreter` ones are skipped there.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lowlat.errors import StepContractError
from lowlat.kernels._gemv import GemvWorkspace, plan_gemv
from lowlat.kernels.out_proj import out_proj, residual_gemv, residual_gemv_deferred
from lowlat.numerics import check_accuracy, check_bitwise, oracle_cast, poison
from lowlat.reference import out_proj as ref

EPS = 1e-5
#: (H, Hq*D) pairs: even tiles, ragged N (H % 64 != 0), K not a multiple of the block
CPU_SHAPES = [(64, 64), (96, 128), (64, 80), (128, 96)]


def make_inputs(m: int, h: int, k: int, seed: int, device) -> tuple[torch.Tensor, ...]:
    """attn [M, K], wo [H, K], residual [M, H], mlp_norm [H], all bf16, fresh random (never zeros)."""
    g = torch.Generator(device=device).manual_seed(seed)
    kw = dict(generator=g, device=device)
    attn = torch.randn(m, k, **kw)
    wo = torch.randn(h, k, **kw) / k ** 0.5
    x = torch.randn(m, h, **kw)
    nw = 1.0 + 0.1 * torch.randn(h, **kw)
    return tuple(t.to(torch.bfloat16) for t in (attn, wo, x, nw))


def run_fused(attn, wo, x, nw, *, plan=None, workspace=None, use_pdl=False):
    """out_proj into poisoned buffers; returns (x, h, rstd)."""
    m, h = x.shape
    out = poison(torch.empty_like(x))
    h_out = poison(torch.empty_like(x))
    rstd = poison(torch.empty(m, dtype=torch.float32, device=x.device))
    r = out_proj(attn, wo, x, nw, EPS, out=out, h_out=h_out, rstd_out=rstd, plan=plan, workspace=workspace,
                 use_pdl=use_pdl)
    assert r.x is out and r.h is h_out and r.rstd is rstd
    return r


def check_against_reference(attn, wo, x, nw, r) -> None:
    xo, ho = ref.out_proj(*oracle_cast((attn, wo, x, nw)), EPS)
    xb, hb = ref.out_proj(attn, wo, x, nw, EPS)
    check_accuracy("out_proj", r.x, xo, xb, output="x")
    check_accuracy("out_proj", r.h, ho, hb, output="h")
    # rstd is of the kernel's own stored x (what the MLP kernel normalises with): float64 oracle on it
    rstd_o = torch.rsqrt(r.x.double().pow(2).mean(-1) + EPS)
    rstd_b = torch.rsqrt(r.x.float().pow(2).mean(-1) + EPS)
    check_accuracy("out_proj", r.rstd, rstd_o, rstd_b, output="rstd", dtype=torch.float32)


@given(m=st.integers(1, 48), shape=st.sampled_from(CPU_SHAPES), split=st.sampled_from([None, 1, 2, 3]),
       seed=st.integers(0, 2 ** 16))
@pytest.mark.interpreter
def test_out_proj_within_2x_baseline_error(m, shape, split, seed):
    h, k = shape
    attn, wo, x, nw = make_inputs(m, h, k, seed, "cpu")
    plan = None if split is None else plan_gemv(h, k, block_k=16, split=split)
    r = run_fused(attn, wo, x, nw, plan=plan)
    check_against_reference(attn, wo, x, nw, r)


#: tile plans of both modes (see lowlat.kernels._gemv): preload (weights loaded before the PDL wait)
#: and stream (pipelined chunk loop), narrow (mma.sync) and wide (wgmma on the GPU) tiles, split-K
PLAN_MODES = [dict(preload=True, bn=64), dict(preload=True, bn=16), dict(preload=False, bn=16),
              dict(preload=False, bn=32), dict(preload=False, bn=64)]


@settings(max_examples=10)
@given(m=st.integers(1, 48), shape=st.sampled_from(CPU_SHAPES), mode=st.sampled_from(PLAN_MODES),
       split=st.sampled_from([1, 2, 3]), seed=st.integers(0, 2 ** 16))
@pytest.mark.interpreter
def test_out_proj_every_plan_mode_within_2x_baseline_error(m, shape, mode, split, seed):
    h, k = shape
    attn, wo, x, nw = make_inputs(m, h, k, seed, "cpu")
    r = run_fused(attn, wo, x, nw, plan=plan_gemv(h, k, kind="out_proj", block_k=16, split=split, **mode))
    check_against_reference(attn, wo, x, nw, r)


@settings(max_examples=10)
@given(m=st.integers(1, 48), shape=st.sampled_from(CPU_SHAPES), mode=st.sampled_from(PLAN_MODES),
       split=st.sampled_from([None, 1, 3]), seed=st.integers(0, 2 ** 16))
@pytest.mark.interpreter
def test_residual_gemv_every_plan_mode_within_2x_baseline_error(m, shape, mode, split, seed):
    """The fused step's output projection: out = residual + attn Wo^T, in place as the step runs it."""
    h, k = shape
    attn, wo, x, _ = make_inputs(m, h, k, seed, "cpu")
    plan = plan_gemv(h, k, kind="residual", block_k=16, split=split, **mode)
    out = residual_gemv(attn, wo, x, out=poison(torch.empty_like(x)), plan=plan)
    check_accuracy("residual_gemv", out, x.double() + attn.double() @ wo.double().T,
                   x + torch.nn.functional.linear(attn, wo))
    xi = x.clone()
    assert residual_gemv(attn, wo, xi, out=xi, plan=plan) is xi
    check_bitwise("residual_gemv", xi, out, output="in_place")


def test_residual_gemv_rows_independent_across_modes_and_widths(device):
    """A row's output is bitwise the same whatever M (1, 16, 17, 33) and whatever the other rows
    hold; checked for a preload and a stream plan with split-K."""
    attn, wo, x, _ = make_inputs(40, 64, 96, 21, device)
    for mode in (dict(preload=True, bn=64), dict(preload=False, bn=16)):
        plan = plan_gemv(64, 96, kind="residual", block_k=16, split=2, **mode)
        full = residual_gemv(attn, wo, x, plan=plan)
        for m in (1, 16, 17, 33):
            a2 = attn[:m].clone()
            a2[1:] = float("nan")                    # the other rows never leak into row 0
            part = residual_gemv(a2, wo, x[:m].contiguous(), plan=plan)
            check_bitwise("residual_gemv", part[:1], full[:1], output=f"row0_m{m}")
            part = residual_gemv(attn[:m].contiguous(), wo, x[:m].contiguous(), plan=plan)
            check_bitwise("residual_gemv", part, full[:m], output=f"rows_m{m}")


def test_out_proj_in_place_residual_matches_out_of_place(device):
    attn, wo, x, nw = make_inputs(7, 96, 128, 1, device)
    plan = plan_gemv(96, 128, block_k=32, split=2)
    want = out_proj(attn, wo, x, nw, EPS, plan=plan)
    xi = x.clone()
    got = out_proj(attn, wo, xi, nw, EPS, out=xi, plan=plan)
    assert got.x is xi
    check_bitwise("out_proj", got.x, want.x, output="x")
    check_bitwise("out_proj", got.h, want.h, output="h")


def test_out_proj_padding_rows_never_change_valid_rows(device):
    """Rows are independent: NaN / huge padding rows leave every other row's outputs bitwise unchanged."""
    m, n = 20, 13
    attn, wo, x, nw = make_inputs(m, 64, 80, 2, device)
    ws = GemvWorkspace.create(64, device)
    plan = plan_gemv(64, 80, block_k=16, split=3)
    base = run_fused(attn, wo, x, nw, plan=plan, workspace=ws)
    base = [t.clone() for t in base]
    attn2, x2 = attn.clone(), x.clone()
    attn2[n:] = float("nan")
    x2[n:] = 3e4
    r = run_fused(attn2, wo, x2, nw, plan=plan, workspace=ws)
    for name, a, b in zip(("x", "h", "rstd"), r, base):
        check_bitwise("out_proj", a[:n], b[:n], output=name)


def test_residual_gemv_matches_reference_add(device):
    """The down-projection variant (no norm): out = residual + a W^T."""
    g = torch.Generator().manual_seed(5)
    a = torch.randn(9, 160, generator=g).bfloat16().to(device)
    w = (torch.randn(96, 160, generator=g) / 160 ** 0.5).bfloat16().to(device)
    res = torch.randn(9, 96, generator=g).bfloat16().to(device)
    out = poison(torch.empty_like(res))
    residual_gemv(a, w, res, out=out, plan=plan_gemv(96, 160, block_k=32, split=3))
    oracle = res.double() + a.double() @ w.double().T
    baseline = res + torch.nn.functional.linear(a, w)
    check_accuracy("residual_gemv", out, oracle, baseline)


@pytest.mark.parametrize("split", [2, 3])
def test_out_proj_workspace_reused_across_calls_is_deterministic(device, split):
    """Counters return to 0 after each launch (split 2 and 3): a second call on the same workspace gives
    the same bits."""
    attn, wo, x, nw = make_inputs(5, 128, 96, 3, device)
    ws = GemvWorkspace.create(128, device)
    plan = plan_gemv(128, 96, block_k=16, split=split)
    a = [t.clone() for t in run_fused(attn, wo, x, nw, plan=plan, workspace=ws)]
    assert int(ws.counters.abs().sum()) == 0
    b = run_fused(attn, wo, x, nw, plan=plan, workspace=ws)
    for name, u, v in zip(("x", "h", "rstd"), a, b):
        check_bitwise("out_proj", u, v, output=name)


def storage_bytes(t: torch.Tensor) -> torch.Tensor:
    """A copy of every byte of t's storage (the whole buffer a view lies in): equal before and after a refused call
    means nothing was written anywhere in it."""
    return torch.empty(0, dtype=torch.uint8).set_(t.untyped_storage().clone())


def assert_unwritten(buffers: dict, before: dict) -> None:
    for name, t in buffers.items():
        assert torch.equal(storage_bytes(t), before[name]), f"{name} was written by a refused call"


def poisoned_outputs(m: int, n: int) -> dict:
    """out / h_out [M, N] bf16 and rstd_out [M] fp32, NaN."""
    bf = torch.bfloat16
    return dict(out=poison(torch.empty(m, n, dtype=bf)), h_out=poison(torch.empty(m, n, dtype=bf)),
                rstd_out=poison(torch.empty(m, dtype=torch.float32)))


@pytest.mark.parametrize("bad, match", [
    (dict(attn=torch.randn(3, 64)), "attn must be torch.bfloat16"),
    (dict(wo=torch.randn(64, 32).bfloat16()), r"wo has shape \(64, 32\)"),
    (dict(residual=torch.randn(4, 64).bfloat16()), r"residual has shape \(4, 64\)"),
    (dict(mlp_norm=torch.randn(32).bfloat16()), r"mlp_norm has shape \(32,\)"),
    (dict(attn=torch.randn(49, 64).bfloat16(), residual=torch.randn(49, 64).bfloat16()), "M=49"),
    (dict(plan=plan_gemv(64, 32)), r"plan is for N=64, K=32; wo is N=64, K=64"),
    (dict(plan=(64, 64)), r"plan must be a GemvPlan \(`plan_gemv`\) or None, got tuple"),
    (dict(workspace="ws"), "workspace must be a GemvWorkspace or None, got str"),
    (dict(eps=0.0), "eps=0.0"),
    # not tensors: typed errors naming the argument, not AttributeError
    (dict(attn=np.random.default_rng(0).standard_normal((3, 64), dtype=np.float32)),
     "attn must be a torch.Tensor, got ndarray"),
    (dict(wo=[[1.0] * 64] * 64), "wo must be a torch.Tensor, got list"),
    (dict(residual=np.ones((3, 64), np.float32)), "residual must be a torch.Tensor, got ndarray"),
    # eps that is not a finite float > 0: typed, naming the value (a string was a TypeError)
    (dict(eps="x"), "eps='x' must be > 0 and finite"),
    (dict(eps="1e-5"), "eps='1e-5' must be > 0 and finite"),
    (dict(eps=True), "eps=True must be > 0"),
    (dict(eps=float("nan")), "eps=nan must be > 0"),
    (dict(eps=float("inf")), "eps=inf must be > 0"),
    # outputs whose rows share memory (row stride 0: every row written to the same place)
    (dict(out=poison(torch.empty(1, 64, dtype=torch.bfloat16)).expand(3, 64)), r"out's rows overlap \(row stride 0"),
    (dict(h_out=poison(torch.empty(1, 64, dtype=torch.bfloat16)).expand(3, 64)), r"h_out's rows overlap"),
    (dict(out=poison(torch.empty(2 * 64, dtype=torch.bfloat16)).as_strided((3, 64), (32, 1))),
     r"out's rows overlap \(row stride 32 < N=64\)"),
])
@pytest.mark.interpreter
def test_out_proj_bad_input_raises_typed_error(bad, match):
    """Each bad argument: a StepContractError naming it, and nothing written (outputs poisoned with NaN and the
    inputs compared byte for byte before / after)."""
    attn, wo, x, nw = make_inputs(3, 64, 64, 0, "cpu")
    args = dict(attn=attn, wo=wo, residual=x, mlp_norm=nw, eps=EPS, **poisoned_outputs(3, 64))
    args.update(bad)
    bufs = {k: v for k, v in args.items() if isinstance(v, torch.Tensor)}
    before = {k: storage_bytes(v) for k, v in bufs.items()}
    with pytest.raises(StepContractError, match=match):
        out_proj(args["attn"], args["wo"], args["residual"], args["mlp_norm"], args["eps"], out=args["out"],
                 h_out=args["h_out"], rstd_out=args["rstd_out"], plan=args.get("plan"), workspace=args.get("workspace"))
    assert_unwritten(bufs, before)


@pytest.mark.interpreter
def test_out_proj_refuses_outputs_overlapping_inputs_and_writes_nothing():
    """An output sharing bytes with an input (or another output) that the kernel reads while other programs write it:
    refused naming both tensors, before anything is written. out over attn (K = N) gave x off by 5.5 (the column
    tiles read attn rows other tiles had overwritten)."""
    m, n = 3, 64
    g = torch.Generator().manual_seed(11)
    big = torch.randn(5 * m * n + n * n, generator=g).bfloat16()    # a buffer the inputs and outputs are views of
    attn, wo, res, nw = make_inputs(m, n, n, 4, "cpu")
    attn_b = big[:m * n].view(m, n)
    attn_b.copy_(attn)
    res_b = big[2 * m * n:3 * m * n].view(m, n)
    res_b.copy_(res)
    wo_b = big[4 * m * n:4 * m * n + n * n].view(n, n)
    wo_b.copy_(wo)
    spare = big[-m * n:].view(m, n)                                   # overlaps no input
    rstd_in_res = res_b.view(-1)[:2 * m].view(torch.float32)          # rstd_out's 3 fp32 over residual's first bytes
    cases = [
        (dict(out=attn_b), "out overlaps attn: out_proj reads attn while it writes out"),
        (dict(h_out=attn_b), "h_out overlaps attn"),
        (dict(out=wo_b[:m]), "out overlaps wo"),
        (dict(h_out=res_b), "h_out overlaps residual"),
        (dict(rstd_out=rstd_in_res), "rstd_out overlaps residual"),
        (dict(out=big[2 * m * n + n:3 * m * n + n].view(m, n)), "out overlaps residual without being the same view"),
        (dict(out=spare, h_out=spare), "out overlaps h_out: both are outputs"),
        (dict(h_out=spare, rstd_out=spare.reshape(-1)[:2 * m].view(torch.float32)), "h_out overlaps rstd_out"),
    ]
    for change, match in cases:
        outs = poisoned_outputs(m, n)
        outs.update(change)
        before = storage_bytes(big)
        with pytest.raises(StepContractError, match=match):
            out_proj(attn_b, wo_b, res_b, nw, EPS, **outs)
        assert torch.equal(storage_bytes(big), before), f"{match}: written"
        for k, t in outs.items():
            if t.untyped_storage().data_ptr() != big.untyped_storage().data_ptr():
                assert bool(t.isnan().all()), f"{match}: {k} written"


@pytest.mark.interpreter
def test_residual_gemv_refuses_out_overlapping_inputs_and_writes_nothing():
    """residual_gemv(out=a) (K = N) gave out off by 5.5; out over w, a shifted view of the residual, and out rows
    sharing memory are refused too, naming the tensors, and nothing is written."""
    m, n = 3, 128
    attn, wo, res, _ = make_inputs(m, n, n, 6, "cpu")
    plan = plan_gemv(n, n, kind="residual", block_k=32, split=2)
    big = torch.cat([attn.reshape(-1), res.reshape(-1), res.reshape(-1)])   # a, residual, then room to shift
    a_b, res_b = big[:m * n].view(m, n), big[m * n:2 * m * n].view(m, n)
    for out, match in [
        (a_b, "out overlaps a: residual_gemv reads a while it writes out"),
        (big[m * n + 1:2 * m * n + 1].view(m, n), "out overlaps residual without being the same view"),
        (big[m * n + n:2 * m * n + n].view(m, n), "out overlaps residual without being the same view"),
        (wo[:m], "out overlaps w"),
        (poison(torch.empty(1, n, dtype=torch.bfloat16)).expand(m, n), r"out's rows overlap \(row stride 0"),
    ]:
        before, wo_before = storage_bytes(big), storage_bytes(wo)
        out_before = storage_bytes(out)
        with pytest.raises(StepContractError, match=match):
            residual_gemv(a_b, wo, res_b, out=out, plan=plan)
        assert torch.equal(storage_bytes(big), before) and torch.equal(storage_bytes(wo), wo_before), match
        assert torch.equal(storage_bytes(out), out_before), match


def test_residual_gemv_in_place_forms_match_out_of_place(device):
    """The allowed aliasing: out is the residual itself (`FusedModel`'s output projection: out=x), or another view
    of exactly its elements (same data_ptr and strides; at one row the row stride is free): bitwise the out-of-place
    result."""
    for m, split in ((5, 3), (1, 2)):
        attn, wo, res, _ = make_inputs(m, 96, 128, 8 + m, device)
        plan = plan_gemv(96, 128, kind="residual", block_k=32, split=split)
        want = residual_gemv(attn, wo, res, plan=plan)
        r1 = res.clone()
        assert residual_gemv(attn, wo, r1, out=r1, plan=plan) is r1
        check_bitwise("residual_gemv", r1, want, output=f"out_is_residual_m{m}")
        r2 = res.clone()
        residual_gemv(attn, wo, r2, out=r2.view(m, 96)[:], plan=plan)           # a second view, same layout
        check_bitwise("residual_gemv", r2, want, output=f"out_same_view_m{m}")
        if m == 1:      # one row: row strides differ, the same elements
            wide = torch.empty(1, 200, dtype=torch.bfloat16, device=device)
            wide[:, :96] = res
            residual_gemv(attn, wo, wide[:, :96], out=wide.as_strided((1, 96), (7, 1)), plan=plan)
            check_bitwise("residual_gemv", wide[:, :96], want, output="out_row_stride_free_m1")


@pytest.mark.interpreter
def test_residual_gemv_deferred_refuses_overlapping_partials_and_out_rows():
    """residual_gemv_deferred writes the partials: over a, w or the residual (which the consumer reads after) they
    are refused; so is a deferred out whose rows share memory. Nothing is written."""
    m, n = 3, 64
    attn, wo, res, _ = make_inputs(m, n, n, 9, "cpu")
    plan = plan_gemv(n, n, kind="residual", block_k=16, split=2)
    for over, match in [("a", "partials overlaps a: residual_gemv_deferred reads a while it writes the partials"),
                        ("w", "partials overlaps w: residual_gemv_deferred reads w"),
                        ("residual", "deferred partials overlap deferred residual"),
                        (None, r"deferred out's rows overlap \(row stride 0")]:
        args = dict(a=attn.clone(), w=wo.clone(), residual=res.clone())
        parts = poison(torch.empty(2, m, n))
        out = torch.randn(m, n).bfloat16()
        if over is None:
            out = torch.randn(1, n).bfloat16().expand(m, n)
        else:       # the partials [2, M, N] fp32 laid over the tensor's own storage (padded to hold them)
            t = args[over]
            pool = torch.cat([t.reshape(-1), torch.randn(2 * m * n * 2, generator=torch.Generator().manual_seed(2))
                              .bfloat16()])
            args[over] = pool[:t.numel()].view(t.shape)
            parts = pool[:4 * m * n].view(torch.float32).view(2, m, n)
        before = {k: storage_bytes(v) for k, v in dict(args, parts=parts, out=out).items()}
        with pytest.raises(StepContractError, match=match):
            residual_gemv_deferred(args["a"], args["w"], args["residual"], out, partials=parts, plan=plan)
        assert_unwritten(dict(args, parts=parts, out=out), before)


@pytest.mark.parametrize("call, match", [
    (lambda a, w, r: residual_gemv(a.float().numpy(), w, r), "a must be a torch.Tensor, got ndarray"),
    (lambda a, w, r: residual_gemv(a.tolist(), w, r), "a must be a torch.Tensor, got list"),
    (lambda a, w, r: residual_gemv(a, w.tolist(), r), "w must be a torch.Tensor, got list"),
    (lambda a, w, r: residual_gemv(a, w, r.tolist()), "residual must be a torch.Tensor, got list"),
    (lambda a, w, r: residual_gemv_deferred(a.tolist(), w, r, torch.empty_like(r)), "a must be a torch.Tensor"),
])
@pytest.mark.interpreter
def test_residual_gemv_non_tensor_arguments_raise_typed_error(call, match):
    attn, wo, res, _ = make_inputs(3, 64, 64, 10, "cpu")
    with pytest.raises(StepContractError, match=match):
        call(attn, wo, res)


# ------------------------------------------------------------------------------------------------- GPU
#: Qwen3-30B-A3B's out_proj preloads its weights at 1 row block and streams them at 2-3 (`TUNED_PLANS`, session 16):
#: its row-invariance test compares 1-16 rows (preload) with 48 (stream) bitwise.
GPU_SHAPES = {"SmolLM2-135M": (576, 576), "Llama-3.2-1B": (2048, 2048), "Qwen3-30B-A3B": (2048, 4096)}


@pytest.mark.gpu
@pytest.mark.parametrize("model", list(GPU_SHAPES))
@settings(max_examples=8)
@given(m=st.integers(1, 48), seed=st.integers(0, 2 ** 16))
def test_out_proj_gpu_within_2x_baseline_error(device, model, m, seed):
    h, k = GPU_SHAPES[model]
    attn, wo, x, nw = make_inputs(m, h, k, seed, device)
    r = run_fused(attn, wo, x, nw, use_pdl=True)
    check_against_reference(attn, wo, x, nw, r)


@pytest.mark.gpu
@pytest.mark.parametrize("model", list(GPU_SHAPES))
def test_out_proj_gpu_bitwise_deterministic_and_row_invariant(device, model):
    h, k = GPU_SHAPES[model]
    attn, wo, x, nw = make_inputs(48, h, k, 11, device)
    ws = GemvWorkspace.create(h, device)
    full = [t.clone() for t in run_fused(attn, wo, x, nw, workspace=ws, use_pdl=True)]
    again = run_fused(attn, wo, x, nw, workspace=ws, use_pdl=True)
    for name, a, b in zip(("x", "h", "rstd"), again, full):
        check_bitwise("out_proj", a, b, output=name)
    for m in (1, 6, 16, 17, 33):
        part = run_fused(attn[:m].contiguous(), wo, x[:m].contiguous(), nw, workspace=ws, use_pdl=True)
        for name, a, b in zip(("x", "h", "rstd"), part, full):
            check_bitwise("out_proj", a, b[:m], output=name)
    perm = torch.randperm(48, generator=torch.Generator().manual_seed(0)).to(device)
    moved = run_fused(attn[perm].contiguous(), wo, x[perm].contiguous(), nw, workspace=ws, use_pdl=True)
    for name, a, b in zip(("x", "h", "rstd"), moved, full):
        check_bitwise("out_proj", a, b[perm], output=f"{name}_row_permuted")


def bn_by_width_plan(n: int, k: int):
    """The committed residual plan's tiling of (N, K) (block_k, split, warps), streamed (its stages, at least 2), with
    bn 16 / 64 / 128 at 1 / 2 / 3 row blocks (mma.sync at 1 row block, wgmma at 2-3: `_gemv.BN_BY_ROW_BLOCKS_KINDS`)
    and none of its own `by_row_blocks`, checked as a table entry."""
    base = plan_gemv(n, k, kind="residual")
    fields = dict(block_k=base.block_k, split=base.split, chunks_per_split=base.chunks_per_split, bn=base.bn,
                  preload=False, warps=base.warps, stages=max(base.stages, 2), pf_k=base.pf_k,
                  by_row_blocks={1: dict(bn=16), 2: dict(bn=64), 3: dict(bn=128)})
    return plan_gemv(n, k, kind="residual", table={("residual", n, k): fields})


@pytest.mark.gpu
@pytest.mark.parametrize("bn_by_width", [False, True])
@pytest.mark.parametrize("model", [*GPU_SHAPES, "Llama-3.2-1B-down"])
def test_residual_gemv_gpu_bitwise_deterministic_row_invariant_and_within_policy(device, model, bn_by_width):
    """The fused step's output projection and the MLP's down projection (kind "residual" plans: the
    Llama-3.2-1B down projection [2048, 8192] runs the tuned split-K plan; PDL, in place). bn_by_width: the same
    with bn 16 / 64 / 128 at 1 / 2 / 3 row blocks (session 17: mma.sync and wgmma give a row the same bits)."""
    h, k = {**GPU_SHAPES, "Llama-3.2-1B-down": (2048, 8192)}[model]
    attn, wo, x, _ = make_inputs(48, h, k, 17, device)
    ws = GemvWorkspace.create(h, device)
    plan = bn_by_width_plan(h, k) if bn_by_width else None

    def run(a, r):
        return residual_gemv(a, wo, r, out=poison(torch.empty_like(r)), workspace=ws, plan=plan, use_pdl=True)

    full = run(attn, x).clone()
    check_accuracy("residual_gemv", full, x.double() + attn.double() @ wo.double().T,
                   x + torch.nn.functional.linear(attn, wo))
    check_bitwise("residual_gemv", run(attn, x), full, output="rerun")
    xi = x.clone()
    residual_gemv(attn, wo, xi, out=xi, workspace=ws, plan=plan, use_pdl=True)      # in place, as the step runs it
    check_bitwise("residual_gemv", xi, full, output="in_place")
    for m in (1, 6, 16, 17, 33):
        check_bitwise("residual_gemv", run(attn[:m].contiguous(), x[:m].contiguous()), full[:m], output=f"m{m}")
    assert int(ws.counters.abs().sum()) == 0, "counters left non-zero"


def _residual_sm90_spec(early: bool) -> dict:
    """`_residual_gemv_kernel`'s compile spec as the fused step launches Llama-3.2-1B's deferred out_proj at 1 row
    (its committed plan, one row block, PDL)."""
    from lowlat.kernels._gemv import launch_constexprs
    from lowlat.kernels.sm90_check import RESIDUAL_GEMV_SIG

    plan = plan_gemv(2048, 2048, kind="residual")
    lc = launch_constexprs(plan, 1)
    warps, stages = lc.pop("num_warps"), lc.pop("num_stages")
    ptrs = {a: t for a, t in RESIDUAL_GEMV_SIG.items() if t.startswith("*")}
    scalars = {a: t for a, t in RESIDUAL_GEMV_SIG.items() if not t.startswith("*")}
    return {"constexprs": dict(lc, NORM=False, WRITE_H=False, NT_P2=2, BH=512, N_COLS=1, USE_PDL=True, UPCAST=False,
                               DEFER=True, EARLY_RELEASE=early),
            "pointers": ptrs, "scalars": scalars, "num_warps": warps, "num_stages": stages,
            "launch_pdl": True, "ptx": True,
            "divisible": ["stride_am", "stride_wn", "stride_rm", "stride_om", "N", "K"]}


def test_residual_gemv_early_release_sits_before_the_wait_in_the_sm90_ptx():
    """Compiled for sm_90 on the CPU (Llama-3.2-1B's deferred out_proj at 1 row): with EARLY_RELEASE the one
    `griddepcontrol.launch_dependents` comes before `griddepcontrol.wait` (and before the preloaded weights' loads:
    the next launch may start while this one loads and waits), without it right after the wait; registers and shared
    memory are the same, so the early release leaves the packing unchanged."""
    from sampling_stats import compile_sm90

    early, late = compile_sm90("lowlat.kernels.out_proj:_residual_gemv_kernel",
                               [_residual_sm90_spec(True), _residual_sm90_spec(False)])
    for name, info in (("early", early), ("late", late)):
        ptx = info["ptx"]
        assert ptx.count("griddepcontrol.launch_dependents") == 1 and ptx.count("griddepcontrol.wait") == 1, name
        assert info["spill_bytes"] == 0, (name, info["spill_bytes"])
    e, la = early["ptx"], late["ptx"]
    assert e.find("griddepcontrol.launch_dependents") < e.find("ld.global") < e.find("griddepcontrol.wait")
    wait = la.find("griddepcontrol.wait")
    assert la.find("ld.global") < wait < la.find("griddepcontrol.launch_dependents")
    assert (early["registers"], early["shared"]) == (late["registers"], late["shared"]), (early, late)


@pytest.mark.interpreter
def test_residual_gemv_passes_early_release_to_the_launch(monkeypatch):
    """residual_gemv / residual_gemv_deferred launch EARLY_RELEASE as asked (False by default), with PDL as asked, and
    refuse an early_release that is not a bool before any launch."""
    import lowlat.kernels.out_proj as op
    from lowlat.kernels.out_proj import residual_gemv_deferred

    seen = []

    class Recorder:
        def __getitem__(self, grid):
            return lambda *args, **kw: seen.append(kw)

    monkeypatch.setattr(op, "_residual_gemv_kernel", Recorder())
    monkeypatch.setattr(op, "interpreting", lambda: False)
    attn, wo, x, _ = make_inputs(1, 64, 64, 0, "cpu")
    plan = plan_gemv(64, 64, kind="residual", split=2, block_k=32)
    residual_gemv(attn, wo, x, plan=plan)
    residual_gemv(attn, wo, x, plan=plan, use_pdl=True, early_release=True)
    residual_gemv_deferred(attn, wo, x, torch.empty_like(x), plan=plan, use_pdl=True, early_release=True)
    residual_gemv_deferred(attn, wo, x, torch.empty_like(x), plan=plan, use_pdl=True)
    assert [(kw["EARLY_RELEASE"], kw["USE_PDL"]) for kw in seen] == [(False, False), (True, True), (True, True),
                                                                    (False, True)]
    for bad in ("off", ("down",), 1, None):      # truthy or falsy look-alikes of a bool are refused, nothing launched
        with pytest.raises(StepContractError, match=r"^early_release=.* must be a bool"):
            residual_gemv(attn, wo, x, plan=plan, use_pdl=True, early_release=bad)
        with pytest.raises(StepContractError, match=r"^early_release=.* must be a bool"):
            residual_gemv_deferred(attn, wo, x, torch.empty_like(x), plan=plan, use_pdl=True, early_release=bad)
    assert len(seen) == 4
