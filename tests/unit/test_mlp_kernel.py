"""Fused SwiGLU MLP + residual (lowlat.kernels.mlp) vs residual + lowlat.reference.mlp.swiglu_mlp.

Two input modes: the normed rows h given, or the residual x normalised on load (RMSNorm with a given
rstd, as the fused model runs it) against residual + swiglu_mlp(rms_norm(x, mlp_norm)).
CPU: tiny shapes under the interpreter; GPU: SmolLM2-135M and Llama-3.2-1B shapes, bitwise
determinism and row invariance. The tiny-shape tests that take the `device` fixture (rows independence, padding rows,
in-place and aliasing forms) run on a GPU runner too; the `interpreter` ones are skipped there.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lowlat.errors import StepContractError
from lowlat.kernels._gemv import GemvWorkspace, plan_gemv
from lowlat.kernels.mlp import gate_up_act, mlp, pack_gate_up
from lowlat.numerics import check_accuracy, check_bitwise, oracle_cast, poison
from lowlat.reference.mlp import swiglu_mlp
from lowlat.reference.rms_norm import rms_norm

EPS = 1e-5
#: (H, I): even tiles, ragged I, ragged H / K
CPU_SHAPES = [(64, 128), (64, 96), (96, 160), (80, 64)]


def make_inputs(m: int, h: int, i: int, seed: int, device):
    """x [M, H], w_gate / w_up [I, H], w_down [H, I], mlp_norm [H]: bf16, fresh random."""
    g = torch.Generator(device=device).manual_seed(seed)
    kw = dict(generator=g, device=device)
    x = torch.randn(m, h, **kw)
    wg = torch.randn(i, h, **kw) / h ** 0.5
    wu = torch.randn(i, h, **kw) / h ** 0.5
    wd = torch.randn(h, i, **kw) / i ** 0.5
    nw = 1.0 + 0.1 * torch.randn(h, **kw)
    return tuple(t.to(torch.bfloat16) for t in (x, wg, wu, wd, nw))


def rstd_of(x: torch.Tensor) -> torch.Tensor:
    """rstd [M] fp32 as out_proj hands it on (of the stored bf16 x)."""
    return torch.rsqrt(x.float().pow(2).mean(-1) + EPS)


def run_fused(x, wg, wu, wd, nw=None, *, plans=None, workspace=None, use_pdl=False, residual=None, rstd=None):
    out = poison(torch.empty_like(x))
    act = poison(torch.empty(x.shape[0], wg.shape[0], dtype=torch.bfloat16, device=x.device))
    res = x if residual is None else residual
    norm = {} if nw is None else dict(norm_weight=nw, rstd=rstd_of(x) if rstd is None else rstd)
    y = mlp(x, pack_gate_up(wg, wu), wd, res, out=out, act=act, plans=plans, workspace=workspace,
            use_pdl=use_pdl, **norm)
    assert y is out
    return y


def check_normed(x, wg, wu, wd, nw, y) -> None:
    """y vs x + swiglu_mlp(rms_norm(x, mlp_norm)): float64 oracle, bf16 baseline."""
    xo, wgo, wuo, wdo, nwo = oracle_cast((x, wg, wu, wd, nw))
    oracle = xo + swiglu_mlp(rms_norm(xo, nwo, EPS), wgo, wuo, wdo)
    baseline = x + swiglu_mlp(rms_norm(x, nw, EPS), wg, wu, wd)
    check_accuracy("mlp", y, oracle, baseline)


def cpu_plans(h, i, split):
    if split is None:
        return None
    return plan_gemv(i, h, block_k=16, split=split, pair=True), plan_gemv(h, i, block_k=16, split=split)


@given(m=st.integers(1, 48), shape=st.sampled_from(CPU_SHAPES), split=st.sampled_from([None, 1, 3]),
       seed=st.integers(0, 2 ** 16))
@pytest.mark.interpreter
def test_mlp_norm_on_load_within_2x_baseline_error(m, shape, split, seed):
    h, i = shape
    x, wg, wu, wd, nw = make_inputs(m, h, i, seed, "cpu")
    y = run_fused(x, wg, wu, wd, nw, plans=cpu_plans(h, i, split))
    check_normed(x, wg, wu, wd, nw, y)


@settings(max_examples=6)
@given(m=st.integers(1, 48), shape=st.sampled_from(CPU_SHAPES), split=st.sampled_from([None, 2]),
       seed=st.integers(0, 2 ** 16))
@pytest.mark.interpreter
def test_mlp_given_h_within_2x_baseline_error(m, shape, split, seed):
    """h given (already normed), separate residual: residual + swiglu_mlp(h)."""
    h, i = shape
    x, wg, wu, wd, nw = make_inputs(m, h, i, seed, "cpu")
    hn = rms_norm(x, nw, EPS)
    y = run_fused(hn, wg, wu, wd, plans=cpu_plans(h, i, split), residual=x)
    oracle = x.double() + swiglu_mlp(*oracle_cast((hn, wg, wu, wd)))
    check_accuracy("mlp", y, oracle, x + swiglu_mlp(hn, wg, wu, wd))


PLAN_MODES = [dict(preload=True, bn=64), dict(preload=True, bn=16), dict(preload=False, bn=16),
              dict(preload=False, bn=64)]


@settings(max_examples=10)
@given(m=st.integers(1, 48), shape=st.sampled_from(CPU_SHAPES), mode=st.sampled_from(PLAN_MODES),
       split=st.sampled_from([1, 2, 3]), seed=st.integers(0, 2 ** 16))
@pytest.mark.interpreter
def test_mlp_in_kernel_norm_every_plan_mode_within_2x_baseline_error(m, shape, mode, split, seed):
    """As the fused step runs it: rstd computed in the gate/up kernel from eps (factored RMSNorm; with
    split-K the splits' sums of squares are added in split order), any tile plan."""
    h, i = shape
    x, wg, wu, wd, nw = make_inputs(m, h, i, seed, "cpu")
    plans = (plan_gemv(i, h, kind="gate_up", block_k=16, split=split, **mode),
             plan_gemv(h, i, kind="residual", block_k=16, split=split, **mode))
    out = poison(torch.empty_like(x))
    act = poison(torch.empty(m, i, dtype=torch.bfloat16))
    ws = GemvWorkspace.create(max(h, i), "cpu")
    y = mlp(x, pack_gate_up(wg, wu), wd, x, norm_weight=nw, eps=EPS, out=out, act=act, plans=plans, workspace=ws)
    assert y is out
    check_normed(x, wg, wu, wd, nw, y)
    assert int(ws.counters.abs().sum()) == 0


def test_gate_up_in_kernel_norm_rows_independent(device):
    """In-kernel rstd: a row's act is bitwise the same whatever M and whatever the other rows hold."""
    x, wg, wu, _, nw = make_inputs(40, 64, 96, 22, device)
    wgu = pack_gate_up(wg, wu)
    for mode in (dict(preload=True, bn=64), dict(preload=False, bn=16)):
        plan = plan_gemv(96, 64, kind="gate_up", block_k=16, split=2, **mode)
        full = gate_up_act(x, wgu, norm_weight=nw, eps=EPS, plan=plan)
        for m in (1, 17, 33):
            x2 = x[:m].clone()
            x2[1:] = 3e4
            check_bitwise("mlp", gate_up_act(x2, wgu, norm_weight=nw, eps=EPS, plan=plan)[:1], full[:1],
                          output=f"act_row0_m{m}")
            check_bitwise("mlp", gate_up_act(x[:m].contiguous(), wgu, norm_weight=nw, eps=EPS, plan=plan),
                          full[:m], output=f"act_m{m}")


def test_gate_up_act_matches_silu_times_up(device):
    x, wg, wu, _, _ = make_inputs(11, 64, 96, 4, device)
    act = poison(torch.empty(11, 96, dtype=torch.bfloat16, device=device))
    gate_up_act(x, pack_gate_up(wg, wu), out=act, plan=plan_gemv(96, 64, block_k=16, split=2, pair=True))
    xo, wgo, wuo = oracle_cast((x, wg, wu))
    oracle = torch.nn.functional.silu(xo @ wgo.T) * (xo @ wuo.T)
    baseline = torch.nn.functional.silu(x @ wg.T) * (x @ wu.T)
    check_accuracy("mlp", act, oracle, baseline, output="act")


def test_mlp_padding_rows_never_change_valid_rows(device):
    m, n = 18, 5
    x, wg, wu, wd, nw = make_inputs(m, 64, 96, 6, device)
    plans = cpu_plans(64, 96, 3)
    ws = GemvWorkspace.create(96, device)
    base = run_fused(x, wg, wu, wd, nw, plans=plans, workspace=ws).clone()
    x2 = x.clone()
    x2[n:] = float("nan")
    y = run_fused(x2, wg, wu, wd, nw, plans=plans, workspace=ws)
    check_bitwise("mlp", y[:n], base[:n])
    assert int(ws.counters.abs().sum()) == 0


def test_mlp_in_place_residual(device):
    """The fused model's call: x is input, residual and output at once."""
    x, wg, wu, wd, nw = make_inputs(9, 64, 128, 7, device)
    want = run_fused(x, wg, wu, wd, nw)
    xi = x.clone()
    y = mlp(xi, pack_gate_up(wg, wu), wd, xi, norm_weight=nw, rstd=rstd_of(x), out=xi)
    assert y is xi
    check_bitwise("mlp", y, want)


def storage_bytes(t: torch.Tensor) -> torch.Tensor:
    """A copy of every byte of t's storage (the whole buffer a view lies in)."""
    return torch.empty(0, dtype=torch.uint8).set_(t.untyped_storage().clone())


M, H, I = 3, 64, 96


def bad_args() -> dict:
    """mlp's arguments with poisoned act / out buffers (fresh random inputs)."""
    x, wg, wu, wd, nw = make_inputs(M, H, I, 0, "cpu")
    bf = torch.bfloat16
    return dict(x=x, w_gate_up=pack_gate_up(wg, wu), w_down=wd, residual=x.clone(), norm_weight=nw, rstd=rstd_of(x),
                act=poison(torch.empty(M, I, dtype=bf)), out=poison(torch.empty(M, H, dtype=bf)))


def within(t: torch.Tensor, shape: tuple, first: int = 0) -> torch.Tensor:
    """A bf16 view of `shape` over t's storage from element `first` (t bf16)."""
    return t.reshape(-1)[first:first + shape[0] * shape[1]].view(shape)


def overlay(a: dict, key: str, shape: tuple, first: int = 0) -> torch.Tensor:
    """Move a[key] (bf16) to the front of a larger buffer (same values) and return a contiguous bf16 view of `shape`
    over that buffer from element `first`: it overlaps a[key] and may run past its end."""
    t = a[key]
    pool = torch.cat([t.reshape(-1), torch.randn(4096, generator=torch.Generator().manual_seed(5)).bfloat16()])
    a[key] = pool[:t.numel()].view(t.shape)
    return pool[first:first + shape[0] * shape[1]].view(shape)


@pytest.mark.parametrize("change, match", [
    (lambda a: a.update(x=a["x"].float()), "x must be torch.bfloat16"),
    (lambda a: a.update(w_gate_up=a["w_gate_up"][:-1]), "expected 2I"),
    (lambda a: a.update(w_down=a["w_down"][:, :-2].contiguous()), r"w_down has shape"),
    (lambda a: a.update(residual=a["residual"][:2]), r"residual has shape"),
    (lambda a: a.update(rstd=None), "norm_weight and rstd go together"),
    (lambda a: a.update(rstd=torch.ones(4)), r"rstd has shape \(4,\)"),
    (lambda a: a.update(eps=EPS), "give rstd or eps with norm_weight, not both"),
    (lambda a: a.update(rstd=None, eps=0.0), "eps=0.0 must be > 0"),
    (lambda a: a.update(norm_weight=None, rstd=None, eps=EPS), "eps given without norm_weight"),
    # checked before the gate/up launch (they used to be checked after it had written act)
    (lambda a: a.update(out=poison(torch.empty(M, H + 1, dtype=torch.bfloat16))), r"out has shape \(3, 65\)"),
    (lambda a: a.update(out=poison(torch.empty(M, H))), "out must be torch.bfloat16, got torch.float32"),
    (lambda a: a.update(plans=(plan_gemv(I, H, kind="gate_up"), plan_gemv(H + 16, I, kind="residual"))),
     r"plan is for N=80, K=96; down \(H, I\) is N=64, K=96"),
    # a workspace / plans of another type: typed, naming them (were AttributeError / ValueError)
    (lambda a: a.update(workspace={}), "workspace must be a GemvWorkspace or None, got dict"),
    (lambda a: a.update(plans=plan_gemv(I, H, kind="gate_up")), r"plans must be a \(gate/up, down\) pair of GemvPlan"),
    (lambda a: a.update(plans=(plan_gemv(I, H, kind="gate_up"), None)),
     r"plan must be a GemvPlan \(`plan_gemv`\) or None, got NoneType"),
    (lambda a: a.update(workspace=GemvWorkspace.create(I, "cpu"), x=torch.randn(M, 128).bfloat16(),
                        w_gate_up=torch.randn(2 * I, 128).bfloat16(), w_down=torch.randn(128, I).bfloat16(),
                        residual=torch.randn(M, 128).bfloat16(), out=poison(torch.empty(M, 128, dtype=torch.bfloat16)),
                        norm_weight=None, rstd=None),
     "residual GEMV: workspace made for N <= 96, got N=128"),
    # not tensors / not 2-D / bad eps: typed errors naming the argument (were IndexError, TypeError, a wrong message)
    (lambda a: a.update(x=a["x"][:, 0].contiguous()), r"x must be \[M, H\], got shape \(3,\)"),
    (lambda a: a.update(x=a["x"].float().numpy()), "x must be a torch.Tensor, got ndarray"),
    (lambda a: a.update(w_down=a["w_down"].tolist()), "w_down must be a torch.Tensor, got list"),
    (lambda a: a.update(residual=np.ones((M, H), np.float32)), "residual must be a torch.Tensor, got ndarray"),
    (lambda a: a.update(rstd=None, eps="1e-5"), "eps='1e-5' must be > 0 and finite"),
    (lambda a: a.update(rstd=None, eps=True), "eps=True must be > 0"),
    (lambda a: a.update(rstd=None, eps=float("nan")), "eps=nan must be > 0"),
    # outputs whose rows share memory
    (lambda a: a.update(out=poison(torch.empty(1, H, dtype=torch.bfloat16)).expand(M, H)), r"out's rows overlap"),
    (lambda a: a.update(act=poison(torch.empty(1, I, dtype=torch.bfloat16)).expand(M, I)), r"act's rows overlap"),
    # aliasing the kernels cannot handle: both tensors named
    (lambda a: a.update(act=overlay(a, "residual", (M, I))),
     "act overlaps residual: the gate/up launch writes act before the down launch reads residual"),
    (lambda a: a.update(act=overlay(a, "x", (M, I), H)),
     "act overlaps x: the gate/up launch reads x while it writes act"),
    (lambda a: a.update(act=within(a["w_down"], (M, I))), "act overlaps w_down"),
    (lambda a: a.update(act=within(a["w_gate_up"], (M, I))), "act overlaps w_gate_up"),
    (lambda a: a.update(out=overlay(a, "act", (M, H), I)), "out overlaps act: mlp reads act"),
    (lambda a: a.update(out=overlay(a, "residual", (M, H), H)), "out overlaps residual without being the same view"),
    (lambda a: a.update(out=overlay(a, "x", (M, H), 1)), "out overlaps x without being the same view"),
    (lambda a: a.update(out=within(a["w_down"], (M, H))), "out overlaps w_down"),
])
@pytest.mark.interpreter
def test_mlp_bad_input_raises_typed_error(change, match):
    """Each bad argument: a StepContractError naming it, raised before either launch, so act and out (poisoned) and
    every input keep every byte."""
    args = bad_args()
    change(args)
    bufs = {k: v for k, v in args.items() if isinstance(v, torch.Tensor)}
    before = {k: storage_bytes(v) for k, v in bufs.items()}
    with pytest.raises(StepContractError, match=match):
        mlp(args.pop("x"), args.pop("w_gate_up"), args.pop("w_down"), args.pop("residual"), **args)
    for k, v in bufs.items():
        assert torch.equal(storage_bytes(v), before[k]), f"{k} written by a refused call"


def test_mlp_allowed_aliasing_matches_separate_buffers(device):
    """The documented in-place forms: out = residual (a second view of its exact elements too), and out = x with a
    separate residual (x is read by the gate/up launch only): bitwise the result into separate buffers."""
    x, wg, wu, wd, nw = make_inputs(5, 64, 96, 12, device)
    res = torch.randn(5, 64, generator=torch.Generator().manual_seed(3)).bfloat16().to(device)
    wgu, rstd = pack_gate_up(wg, wu), rstd_of(x)
    want = mlp(x, wgu, wd, res, norm_weight=nw, rstd=rstd)
    r1 = res.clone()
    check_bitwise("mlp", mlp(x, wgu, wd, r1, norm_weight=nw, rstd=rstd, out=r1.view(5, 64)[:]), want,
                  output="out_same_view_as_residual")
    x1 = x.clone()
    assert mlp(x1, wgu, wd, res, norm_weight=nw, rstd=rstd, out=x1) is x1
    check_bitwise("mlp", x1, want, output="out_is_x")


@pytest.mark.parametrize("change, match", [
    (dict(eps="1e-5"), "eps='1e-5' must be > 0 and finite"),
    (dict(eps=False), "eps=False must be > 0"),
    (dict(eps=float("inf")), "eps=inf must be > 0"),
    (dict(out="x"), "act out must be a torch.Tensor, got str"),
    (dict(out=poison(torch.empty(1, I, dtype=torch.bfloat16)).expand(M, I)), r"act out's rows overlap"),
    (dict(x="x"), "x must be a torch.Tensor, got str"),
    (dict(w_gate_up=np.zeros((2 * I, H), np.float32)), "w_gate_up must be a torch.Tensor, got ndarray"),
])
@pytest.mark.interpreter
def test_gate_up_act_bad_input_raises_typed_error(change, match):
    x, wg, wu, _, nw = make_inputs(M, H, I, 13, "cpu")
    args = dict(x=x, w_gate_up=pack_gate_up(wg, wu), norm_weight=nw, eps=EPS,
                out=poison(torch.empty(M, I, dtype=torch.bfloat16)))
    args.update(change)
    bufs = {k: v for k, v in args.items() if isinstance(v, torch.Tensor)}
    before = {k: storage_bytes(v) for k, v in bufs.items()}
    with pytest.raises(StepContractError, match=match):
        gate_up_act(args.pop("x"), args.pop("w_gate_up"), **args)
    for k, v in bufs.items():
        assert torch.equal(storage_bytes(v), before[k]), f"{k} written by a refused call"


@pytest.mark.interpreter
def test_gate_up_act_refuses_out_overlapping_its_inputs():
    """act out over x (its column tiles read all of x) or over the weights / rstd: refused naming both, nothing
    written."""
    x, wg, wu, _, nw = make_inputs(M, H, I, 14, "cpu")
    wgu = pack_gate_up(wg, wu)
    pool = torch.cat([x.reshape(-1), torch.randn(M * I, generator=torch.Generator().manual_seed(4)).bfloat16()])
    xp = pool[:M * H].view(M, H)
    rstd = rstd_of(x)
    for out, kw, match in [
        (pool[H:H + M * I].view(M, I), dict(norm_weight=nw, eps=EPS), "act out overlaps x"),
        (within(wgu, (M, I)), dict(), "act out overlaps w_gate_up"),
    ]:
        before = storage_bytes(pool), storage_bytes(wgu)
        with pytest.raises(StepContractError, match=match):
            gate_up_act(xp, wgu, out=out, **kw)
        assert torch.equal(storage_bytes(pool), before[0]) and torch.equal(storage_bytes(wgu), before[1]), match
    rs = torch.cat([rstd, torch.randn(M * I)])          # out [M, I] bf16 laid over rstd's fp32 bytes
    rs_before = storage_bytes(rs)
    with pytest.raises(StepContractError, match="act out overlaps rstd"):
        gate_up_act(xp, wgu, norm_weight=nw, rstd=rs[:M], out=rs.view(torch.bfloat16)[:M * I].view(M, I))
    assert torch.equal(storage_bytes(rs), rs_before)


# ------------------------------------------------------------------------------------------------- GPU
GPU_SHAPES = {"SmolLM2-135M": (576, 1536), "Llama-3.2-1B": (2048, 8192)}


@pytest.mark.gpu
@pytest.mark.parametrize("model", list(GPU_SHAPES))
@settings(max_examples=8)
@given(m=st.integers(1, 48), seed=st.integers(0, 2 ** 16))
def test_mlp_gpu_within_2x_baseline_error(device, model, m, seed):
    h, i = GPU_SHAPES[model]
    x, wg, wu, wd, nw = make_inputs(m, h, i, seed, device)
    y = run_fused(x, wg, wu, wd, nw, use_pdl=True)
    check_normed(x, wg, wu, wd, nw, y)


@pytest.mark.gpu
@pytest.mark.parametrize("model", list(GPU_SHAPES))
def test_mlp_gpu_bitwise_deterministic_and_row_invariant(device, model):
    h, i = GPU_SHAPES[model]
    x, wg, wu, wd, nw = make_inputs(48, h, i, 12, device)
    ws = GemvWorkspace.create(max(h, i), device)
    rstd = rstd_of(x)               # one rstd for all runs: the kernel's row invariance, not torch's
    full = run_fused(x, wg, wu, wd, nw, workspace=ws, use_pdl=True, rstd=rstd).clone()
    check_bitwise("mlp", run_fused(x, wg, wu, wd, nw, workspace=ws, use_pdl=True, rstd=rstd), full)
    for m in (1, 6, 16, 17, 33):
        part = run_fused(x[:m].contiguous(), wg, wu, wd, nw, workspace=ws, use_pdl=True, rstd=rstd[:m].contiguous())
        check_bitwise("mlp", part, full[:m])
    perm = torch.randperm(48, generator=torch.Generator().manual_seed(0)).to(device)
    moved = run_fused(x[perm].contiguous(), wg, wu, wd, nw, workspace=ws, use_pdl=True, rstd=rstd[perm].contiguous())
    check_bitwise("mlp", moved, full[perm], output="out_row_permuted")


@pytest.mark.gpu
@pytest.mark.parametrize("model", list(GPU_SHAPES))
def test_mlp_in_kernel_norm_gpu_bitwise_row_invariant_and_within_policy(device, model):
    """As the fused step runs it (rstd computed in the gate/up kernel, default plans, PDL)."""
    h, i = GPU_SHAPES[model]
    x, wg, wu, wd, nw = make_inputs(48, h, i, 23, device)
    wgu = pack_gate_up(wg, wu)
    ws = GemvWorkspace.create(max(h, i), device)

    def run(xx):
        return mlp(xx, wgu, wd, xx, norm_weight=nw, eps=EPS, out=poison(torch.empty_like(xx)), workspace=ws,
                   use_pdl=True)

    full = run(x).clone()
    check_normed(x, wg, wu, wd, nw, full)
    check_bitwise("mlp", run(x), full, output="rerun")
    for m in (1, 6, 16, 17, 33):
        check_bitwise("mlp", run(x[:m].contiguous()), full[:m], output=f"m{m}")
    perm = torch.randperm(48, generator=torch.Generator().manual_seed(1)).to(device)
    check_bitwise("mlp", run(x[perm].contiguous()), full[perm], output="row_permuted")
    assert int(ws.counters.abs().sum()) == 0
