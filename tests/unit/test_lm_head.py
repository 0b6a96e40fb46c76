"""Fused final RMSNorm + LM head + greedy argmax (lowlat.kernels.lm_head) vs lowlat.reference.lm_head.

Logits within the numerics policy; tokens are exactly the argmax of the kernel's own logits with ties
to the lowest id (ties built on purpose inside one program's tile and across programs), and equal the
reference's tokens wherever the reference's top-2 margin exceeds the logits' error bound.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lowlat.errors import StepContractError
from lowlat.kernels._gemv import GemvWorkspace, plan_gemv
from lowlat.kernels.lm_head import lm_head
from lowlat.numerics import check_accuracy, check_bitwise, oracle_cast, poison
from lowlat.reference import lm_head as ref

EPS = 1e-5
CPU_SHAPES = [(64, 256), (64, 200), (96, 130)]          # (H, V): even and ragged vocab tiles


def make_inputs(m: int, h: int, v: int, seed: int, device):
    """x [M, H] (the residual stream, std ~3), final_norm [H], weight [V, H]: bf16, fresh random."""
    g = torch.Generator(device=device).manual_seed(seed)
    kw = dict(generator=g, device=device)
    x = 3 * torch.randn(m, h, **kw)
    nw = 1.0 + 0.1 * torch.randn(h, **kw)
    w = torch.randn(v, h, **kw)
    return tuple(t.to(torch.bfloat16) for t in (x, nw, w))


def run_fused(x, nw, w, nvalid, *, workspace=None, use_pdl=False, plan=None):
    m, v = x.shape[0], w.shape[0]
    logits = poison(torch.empty(m, v, dtype=torch.float32, device=x.device))
    tokens = poison(torch.empty(m, dtype=torch.int64, device=x.device))
    r = lm_head(x, nw, w, nvalid, EPS, logits_out=logits, tokens_out=tokens, workspace=workspace,
                use_pdl=use_pdl, plan=plan)
    assert r.logits is logits and r.tokens is tokens
    return r


def check_against_reference(x, nw, w, nvalid, r) -> None:
    lo, to = ref.lm_head(*oracle_cast((x, nw, w)), nvalid, EPS)
    lb, _ = ref.lm_head(x, nw, w, nvalid, EPS)
    rep = check_accuracy("lm_head", r.logits, lo, lb, output="logits")
    # tokens: exactly the argmax of the kernel's logits (lowest id on ties) ...
    check_bitwise("lm_head", r.tokens, torch.argmax(r.logits, dim=-1), output="tokens")
    # ... and the oracle's token wherever the oracle's top-2 margin exceeds twice the error bound
    top2 = lo.topk(2, dim=-1).values
    clear = (top2[:, 0] - top2[:, 1]) > 2 * rep.allowed
    check_bitwise("lm_head", r.tokens[clear], to[clear], output="tokens_vs_oracle")
    assert bool((r.logits[nvalid:] == 0).all()) and bool((r.tokens[nvalid:] == 0).all())


@given(m=st.integers(1, 48), shape=st.sampled_from(CPU_SHAPES), pad=st.integers(0, 5),
       seed=st.integers(0, 2 ** 16))
@pytest.mark.interpreter
def test_lm_head_within_2x_baseline_error(m, shape, pad, seed):
    h, v = shape
    x, nw, w = make_inputs(m, h, v, seed, "cpu")
    nvalid = max(1, m - pad)
    r = run_fused(x, nw, w, nvalid)
    check_against_reference(x, nw, w, nvalid, r)


@settings(max_examples=8)
@given(m=st.integers(1, 48), shape=st.sampled_from(CPU_SHAPES), pad=st.integers(0, 5),
       mode=st.sampled_from([dict(preload=True, bn=64), dict(preload=True, bn=16), dict(preload=False, bn=32),
                             dict(preload=False, bn=128)]),
       block_k=st.sampled_from([16, 32]), seed=st.integers(0, 2 ** 16))
@pytest.mark.interpreter
def test_lm_head_every_plan_mode_within_2x_baseline_error(m, shape, pad, mode, block_k, seed):
    h, v = shape
    x, nw, w = make_inputs(m, h, v, seed, "cpu")
    nvalid = max(1, m - pad)
    r = run_fused(x, nw, w, nvalid, plan=plan_gemv(v, h, kind="lm_head", block_k=block_k, **mode))
    check_against_reference(x, nw, w, nvalid, r)


# plans of the ties test: the default (tuned on a GPU) and narrow / wide tiles of both modes, so that the tied ids
# (5, 200), (63, 64) and (3, 129, 250) fall in different programs and (5, 7) in one, on a GPU as on the CPU
TIE_PLANS = [None, dict(preload=True, bn=16), dict(preload=False, bn=64)]


@pytest.mark.parametrize("tied", [(5, 7), (5, 200), (63, 64), (3, 129, 250)])
@pytest.mark.parametrize("mode", TIE_PLANS, ids=["default", "preload_bn16", "stream_bn64"])
def test_lm_head_ties_go_to_the_lowest_token_id(device, tied, mode):
    """Identical weight rows give bitwise-equal maximal logits; the lowest id must win, whether the
    tied ids share a program's tile (5, 7) or sit in different programs (5, 200; 63, 64)."""
    x, nw, w = make_inputs(4, 64, 256, 9, device)
    h = (x.float() * nw.float())                                  # direction of the normed rows
    row = (8 * h[1] / h[1].norm()).bfloat16()
    w = w.clone()
    for t in tied:
        w[t] = row
    r = run_fused(x, nw, w, 4, plan=None if mode is None else plan_gemv(256, 64, kind="lm_head", block_k=32, **mode))
    assert int(r.tokens[1]) == min(tied), (r.tokens, r.logits[1, list(tied)])
    assert len(set(r.logits[1, list(tied)].tolist())) == 1, r.logits[1, list(tied)]     # a real tie
    check_bitwise("lm_head", r.tokens, torch.argmax(r.logits, dim=-1), output="tokens")


@pytest.mark.parametrize("negative", [False, True], ids=["nan", "negative_nan"])
def test_lm_head_nan_logits_win_the_argmax_as_in_torch(device, negative):
    """A NaN weight row gives NaN logits in that column for every row; as torch.argmax, the token is that NaN
    position (the module docstring's contract), and a row whose logits are all NaN (a NaN input row) takes id 0.
    A NaN with its sign bit set keeps its sign through the interpreter's numpy arithmetic and so sorts below
    -inf there (`_gemv.argmax_key`); a GPU's arithmetic gives the positive canonical NaN, so that case runs on
    a GPU only."""
    if negative and device.type != "cuda":
        pytest.skip("the interpreter keeps a negative NaN's sign (argmax_key sorts it below -inf)")
    x, nw, w = make_inputs(5, 64, 256, 21, device)
    w, x = w.clone(), x.clone()
    nan = torch.tensor(float("nan"), dtype=torch.bfloat16, device=device)
    w[77] = -nan.abs() if negative else nan.abs()
    x[3] = nan.abs()                                   # every logit of row 3 is NaN
    r = run_fused(x, nw, w, 5)
    assert bool(torch.isnan(r.logits[:, 77]).all()) and bool(torch.isnan(r.logits[3]).all())
    assert r.tokens.tolist() == [77, 77, 77, 0, 77], r.tokens
    check_bitwise("lm_head", r.tokens, torch.argmax(r.logits, dim=-1), output="tokens")


def test_lm_head_device_valid_rows_and_repeated_calls(device):
    """num_valid_rows as a device tensor; the keys and counters are reset after each launch."""
    x, nw, w = make_inputs(20, 64, 200, 10, device)
    ws = GemvWorkspace.create(64, device)
    a = run_fused(x, nw, w, torch.tensor([17], dtype=torch.int32, device=device), workspace=ws)
    a = [t.clone() for t in a]
    assert int(ws.counters.abs().sum()) == 0 and bool((ws.keys == torch.iinfo(torch.int64).min).all())
    b = run_fused(x, nw, w, 17, workspace=ws)
    check_bitwise("lm_head", b.logits, a[0], output="logits")
    check_bitwise("lm_head", b.tokens, a[1], output="tokens")
    check_against_reference(x, nw, w, 17, b)


def storage_bytes(t: torch.Tensor) -> torch.Tensor:
    """A copy of every byte of t's storage (the whole buffer a view lies in)."""
    return torch.empty(0, dtype=torch.uint8).set_(t.untyped_storage().clone())


def overlay(a: dict, key: str, shape: tuple, dtype: torch.dtype, first_byte: int = 0) -> torch.Tensor:
    """Move a[key] to the front of a larger byte buffer (same values) and return a contiguous view of `shape` and
    `dtype` over that buffer from byte `first_byte`: it overlaps a[key]."""
    t = a[key]
    raw = t.reshape(-1).view(torch.uint8)
    pool = torch.cat([raw, torch.randint(0, 256, (1 << 16,), dtype=torch.uint8,
                                         generator=torch.Generator().manual_seed(6))])
    a[key] = pool[:raw.numel()].view(t.dtype).view(t.shape)
    n = shape[0] * (shape[1] if len(shape) > 1 else 1) * torch.tensor([], dtype=dtype).element_size()
    return pool[first_byte:first_byte + n].view(dtype).view(shape)


@pytest.mark.parametrize("change, match", [
    (lambda a: a.update(x=a["x"].float()), "x must be torch.bfloat16"),
    (lambda a: a.update(weight=a["weight"][:, :32]), "weight has shape"),
    (lambda a: a.update(final_norm=a["final_norm"][:10]), "final_norm has shape"),
    (lambda a: a.update(num_valid_rows=0), "num_valid_rows=0"),
    (lambda a: a.update(num_valid_rows=torch.tensor([2])), "num_valid_rows tensor must be one int32"),
    (lambda a: a.update(eps=-1.0), "eps=-1.0"),
    (lambda a: a.update(plan=plan_gemv(128, 32, kind="lm_head")),
     "plan is for N=128, K=32, split=1; lm_head needs N=128, K=64"),
    # a workspace / plan of another type: typed, naming it (were AttributeError)
    (lambda a: a.update(workspace=torch.empty(4)), "workspace must be a GemvWorkspace or None, got Tensor"),
    (lambda a: a.update(plan="lm_head"), r"plan must be a GemvPlan \(`plan_gemv`\) or None, got str"),
    # num_valid_rows that is not an int (int() used to turn True into 1, 2.7 and "2" into 2)
    (lambda a: a.update(num_valid_rows=True), r"num_valid_rows must be an int .*got True \(bool\)"),
    (lambda a: a.update(num_valid_rows=2.7), r"num_valid_rows must be an int .*got 2.7 \(float\)"),
    (lambda a: a.update(num_valid_rows="2"), r"num_valid_rows must be an int .*got '2' \(str\)"),
    (lambda a: a.update(num_valid_rows=np.int64(2)), r"num_valid_rows must be an int .*\(int64\)"),
    # not tensors / bad eps: typed errors naming the argument (were AttributeError / TypeError)
    (lambda a: a.update(x=a["x"].float().numpy()), "x must be a torch.Tensor, got ndarray"),
    (lambda a: a.update(weight=a["weight"].tolist()), "weight must be a torch.Tensor, got list"),
    (lambda a: a.update(final_norm=[1.0] * 64), "final_norm must be a torch.Tensor, got list"),
    (lambda a: a.update(eps="1e-5"), "eps='1e-5' must be > 0 and finite"),
    (lambda a: a.update(eps=True), "eps=True must be > 0"),
    (lambda a: a.update(eps=float("nan")), "eps=nan must be > 0"),
    # logits_out rows sharing memory (row stride 0 wrote every row to one place)
    (lambda a: a.update(logits_out=poison(torch.empty(1, 128)).expand(3, 128)),
     r"logits_out's rows overlap \(row stride 0 < N=128\)"),
    (lambda a: a.update(logits_out=poison(torch.empty(3 * 64)).as_strided((3, 128), (32, 1))),
     r"logits_out's rows overlap \(row stride 32"),
    # outputs over inputs or each other: both named
    (lambda a: a.update(logits_out=overlay(a, "x", (3, 128), torch.float32)),
     "logits_out overlaps x: lm_head reads x while it writes logits_out"),
    (lambda a: a.update(logits_out=overlay(a, "weight", (3, 128), torch.float32, 256)), "logits_out overlaps weight"),
    (lambda a: a.update(tokens_out=overlay(a, "final_norm", (3,), torch.int64, 8)), "tokens_out overlaps final_norm"),
    (lambda a: a.update(tokens_out=overlay(a, "logits_out", (3,), torch.int64, 512)),
     "logits_out overlaps tokens_out: both are outputs"),
    (lambda a: a.update(num_valid_rows=torch.tensor([3], dtype=torch.int32)) or
     a.update(tokens_out=overlay(a, "num_valid_rows", (3,), torch.int64)), "tokens_out overlaps num_valid_rows"),
])
@pytest.mark.interpreter
def test_lm_head_bad_input_raises_typed_error(change, match):
    """Each bad argument: a StepContractError naming it, and nothing written (logits / tokens poisoned, every buffer
    compared byte for byte)."""
    x, nw, w = make_inputs(3, 64, 128, 0, "cpu")
    args = dict(x=x, final_norm=nw, weight=w, num_valid_rows=3, eps=EPS,
                logits_out=poison(torch.empty(3, 128)), tokens_out=poison(torch.empty(3, dtype=torch.int64)))
    change(args)
    bufs = {k: v for k, v in args.items() if isinstance(v, torch.Tensor)}
    before = {k: storage_bytes(v) for k, v in bufs.items()}
    with pytest.raises(StepContractError, match=match):
        lm_head(**args)
    for k, v in bufs.items():
        assert torch.equal(storage_bytes(v), before[k]), f"{k} written by a refused call"


@pytest.mark.interpreter
def test_lm_head_int_and_int32_tensor_valid_rows_still_accepted():
    """The accepted forms of num_valid_rows: a Python int in 1..M and a [1] / 0-d int32 tensor, same bits."""
    x, nw, w = make_inputs(4, 64, 128, 15, "cpu")
    a = run_fused(x, nw, w, 2)
    for nv in (torch.tensor([2], dtype=torch.int32), torch.tensor(2, dtype=torch.int32)):
        b = run_fused(x, nw, w, nv)
        check_bitwise("lm_head", b.logits, a.logits, output="logits")
        check_bitwise("lm_head", b.tokens, a.tokens, output="tokens")


# ------------------------------------------------------------------------------------------------- GPU
GPU_SHAPES = {"SmolLM2-135M": (576, 49152), "Llama-3.2-1B": (2048, 128256)}


@pytest.mark.gpu
@pytest.mark.parametrize("model", list(GPU_SHAPES))
@settings(max_examples=6)
@given(m=st.integers(1, 48), pad=st.integers(0, 3), seed=st.integers(0, 2 ** 16))
def test_lm_head_gpu_within_2x_baseline_error(device, model, m, pad, seed):
    h, v = GPU_SHAPES[model]
    x, nw, w = make_inputs(m, h, v, seed, device)
    nvalid = max(1, m - pad)
    check_against_reference(x, nw, w, nvalid, run_fused(x, nw, w, nvalid, use_pdl=True))


@pytest.mark.gpu
@pytest.mark.parametrize("model", list(GPU_SHAPES))
def test_lm_head_gpu_bitwise_deterministic_and_row_invariant(device, model):
    h, v = GPU_SHAPES[model]
    x, nw, w = make_inputs(48, h, v, 13, device)
    ws = GemvWorkspace.create(64, device)
    full = [t.clone() for t in run_fused(x, nw, w, 48, workspace=ws, use_pdl=True)]
    again = run_fused(x, nw, w, 48, workspace=ws, use_pdl=True)
    check_bitwise("lm_head", again.logits, full[0], output="logits")
    check_bitwise("lm_head", again.tokens, full[1], output="tokens")
    for m in (1, 6, 16, 17, 33):
        part = run_fused(x[:m].contiguous(), nw, w, m, workspace=ws, use_pdl=True)
        check_bitwise("lm_head", part.logits, full[0][:m], output="logits")
        check_bitwise("lm_head", part.tokens, full[1][:m], output="tokens")
    perm = torch.randperm(48, generator=torch.Generator().manual_seed(0)).to(device)
    moved = run_fused(x[perm].contiguous(), nw, w, 48, workspace=ws, use_pdl=True)
    check_bitwise("lm_head", moved.logits, full[0][perm], output="logits_row_permuted")
    check_bitwise("lm_head", moved.tokens, full[1][perm], output="tokens_row_permuted")
