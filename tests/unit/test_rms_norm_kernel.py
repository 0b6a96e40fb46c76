"""The RMSNorm kernel (lowlat.kernels.rms_norm.rms_norm_into) vs lowlat.reference.rms_norm.rms_norm.

Outputs within the numerics policy against the float64 oracle (bf16 reference as baseline), every output
element written (poisoned before each run) and nothing around it; bitwise equal to the bf16 reference on
inputs whose sum of squares is exact in fp32 in any order (so both roundings, in the reference's order, are
checked bit for bit); a row's output bitwise the same alone and among 48 rows, at any row stride; typed
errors before any write. CPU: the Triton interpreter. GPU (`gpu` marker): H 576 (SmolLM2) and 2048 with
PDL on, chained launches included; the tests taking the `device` fixture (the reference's two roundings, row
invariance, zero rows) run on a GPU runner too. sm_90: compiles with griddepcontrol and no spills.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from lowlat.errors import StepContractError
from lowlat.kernels import rms_norm as kernel
from lowlat.numerics import check_accuracy, check_bitwise, oracle_cast, poison
from lowlat.reference.rms_norm import rms_norm

EPS = 1e-5
CPU_HIDDEN = [64, 96, 100, 576]          # powers of two, a multiple of 32, a ragged width, SmolLM2's
SENTINEL = 7.25                          # a defined value (not NaN) for "nothing was written" checks


def make_inputs(m: int, h: int, seed: int, device, *, row_pad: int = 0, exact: bool = False, scale: float = 1.0):
    """x [M, H] bf16 (a view with row stride H + row_pad when row_pad > 0) and weight [H] bf16, fresh random
    (never 0). exact: x in multiples of 1/8 in [-2, 2] without 0, so every partial sum of a row's x^2 is a
    multiple of 2^-6 below 4H: exact in fp32 whatever the order (H <= 16384), and the kernel's statistic is
    torch's. scale: a power of two multiplying x (2^-10: mean(x^2) ~ 1e-6, below eps, so eps matters)."""
    g = torch.Generator().manual_seed(seed)
    if exact:
        sign = 1 - 2 * torch.randint(0, 2, (m, h + row_pad), generator=g)
        xb = torch.randint(1, 17, (m, h + row_pad), generator=g) * sign * 0.125
    else:
        xb = 3 * torch.randn(m, h + row_pad, generator=g) + 0.01
    xb = xb * scale
    w = 1.0 + 0.1 * torch.randn(h, generator=g)
    xb, w = xb.to(torch.bfloat16).to(device), w.to(torch.bfloat16).to(device)
    return xb[:, :h], w


def run_kernel(x: torch.Tensor, w: torch.Tensor, *, use_pdl: bool = False, out_pad: int = 0) -> torch.Tensor:
    """The kernel's output [M, H] into a NaN-poisoned buffer (row stride H + out_pad; the padding columns are
    SENTINEL and must stay so); asserts every output element was written and nothing else."""
    m, h = x.shape
    buf = torch.full((m, h + out_pad), SENTINEL, dtype=torch.bfloat16, device=x.device)
    out = poison(buf[:, :h])
    assert kernel.rms_norm_into(x, w, EPS, out, use_pdl=use_pdl) is out
    assert not out.isnan().any(), f"{int(out.isnan().sum())} output elements not written"
    assert bool((buf[:, h:] == SENTINEL).all()), "the kernel wrote outside its [M, H] output"
    return out


def check_policy(x, w, out) -> None:
    xc, wc = x.cpu(), w.cpu()
    oracle = rms_norm(*oracle_cast((xc, wc)), EPS)
    check_accuracy("rms_norm", out, oracle, rms_norm(xc, wc, EPS), output="y")


def check_reference_bits(x, w, out) -> None:
    """Exact inputs: the kernel gives the bf16 reference's bits (computed on the CPU, whose rsqrt and division
    round correctly, as the kernel's do)."""
    check_bitwise("rms_norm", out.cpu(), rms_norm(x.cpu(), w.cpu(), EPS), output="y_exact_inputs")


# ------------------------------------------------------------------------------------------------- CPU
@given(m=st.integers(1, 48), h=st.sampled_from(CPU_HIDDEN), row_pad=st.sampled_from([0, 8, 37]),
       seed=st.integers(0, 2 ** 16), scale=st.sampled_from([1.0, 2.0 ** -10]))
@pytest.mark.interpreter
def test_rms_norm_within_2x_baseline_error(m, h, row_pad, seed, scale):
    x, w = make_inputs(m, h, seed, "cpu", row_pad=row_pad, scale=scale)
    check_policy(x, w, run_kernel(x, w, out_pad=row_pad // 2))


@pytest.mark.parametrize("scale", [1.0, 2.0 ** -10])
@pytest.mark.parametrize("h", [64, 96, 576])
@pytest.mark.parametrize("m", [1, 5, 48])
def test_rms_norm_rounds_twice_in_the_references_order(device, m, h, scale):
    """Exact sum of squares: output bitwise the bf16 reference's, bf16(w * bf16(x * rstd)) rounded to nearest
    (rstd's mean, + eps, sqrt and reciprocal correctly rounded, as torch's); rows with mean(x^2) far above
    and below eps."""
    x, w = make_inputs(m, h, 100 + m, device, exact=True, row_pad=3, scale=scale)
    check_reference_bits(x, w, run_kernel(x, w))


@pytest.mark.parametrize("h", [96, 576])
def test_rms_norm_row_invariant(device, h):
    """Every row of 48 gives the same bits alone (one launch each), among the first m rows, and as a view of a
    buffer with another row stride."""
    x, w = make_inputs(48, h, 3, device)
    full = run_kernel(x, w)
    for i in range(48):
        check_bitwise("rms_norm", run_kernel(x[i:i + 1], w), full[i:i + 1], output=f"row_{i}_alone")
    for m in (2, 5, 17, 33):
        check_bitwise("rms_norm", run_kernel(x[:m], w), full[:m], output=f"first_{m}_rows")
    wide = torch.full((48, h + 24), SENTINEL, dtype=torch.bfloat16, device=device)
    wide[:, 5:5 + h] = x
    check_bitwise("rms_norm", run_kernel(wide[:, 5:5 + h], w, out_pad=11), full, output="row_stride")


def test_rms_norm_zero_rows_writes_nothing(device):
    x, w = make_inputs(1, 64, 0, device)
    out = torch.full((0, 64), SENTINEL, dtype=torch.bfloat16, device=device)
    assert kernel.rms_norm_into(x[:0], w, EPS, out) is out


def _bad_cases():
    def base():
        x, w = make_inputs(3, 64, 1, "cpu")
        return dict(x=x, weight=w, eps=EPS, out=torch.full((3, 64), SENTINEL, dtype=torch.bfloat16))

    def with_(**kw):
        a = base()
        for k, f in kw.items():
            a[k] = f(a)
        return a

    return [
        (with_(x=lambda a: a["x"].float()), "x must be torch.bfloat16"),
        (with_(x=lambda a: a["x"][0]), "x must be a 2-D"),
        (with_(x=lambda a: torch.zeros(64, 3, dtype=torch.bfloat16).t()), "x must be contiguous in its last dim"),
        (with_(weight=lambda a: a["weight"][:32]), "weight has shape"),
        (with_(weight=lambda a: a["weight"].float()), "weight must be torch.bfloat16"),
        (with_(out=lambda a: a["out"][:2]), "out has shape"),
        (with_(out=lambda a: a["out"].float()), "out must be torch.bfloat16"),
        (with_(out=lambda a: torch.empty(3, 64, dtype=torch.bfloat16, device="meta")), "out is on meta"),
        (with_(out=lambda a: a["out"][:1].expand(3, 64)), "out's rows overlap"),
        (with_(eps=lambda a: 0.0), "eps=0.0"),
        (with_(eps=lambda a: float("nan")), "eps=nan"),
        (with_(x=lambda a: torch.zeros(2, kernel.MAX_HIDDEN + 1, dtype=torch.bfloat16)), "H=16385"),
    ]


@pytest.mark.parametrize("args,match", _bad_cases())
@pytest.mark.interpreter
def test_rms_norm_bad_input_raises_typed_error_before_any_write(args, match):
    before = args["out"].clone() if args["out"].device.type != "meta" else None
    with pytest.raises(StepContractError, match=match):
        kernel.rms_norm_into(args["x"], args["weight"], args["eps"], args["out"])
    if before is not None:
        check_bitwise("rms_norm", args["out"], before, output="out_untouched")


@pytest.mark.interpreter
def test_rms_norm_out_overlapping_x_is_refused():
    x, w = make_inputs(4, 64, 2, "cpu", row_pad=64)
    base = x.clone()
    with pytest.raises(StepContractError, match="overlaps x"):
        kernel.rms_norm_into(x, w, EPS, x)
    with pytest.raises(StepContractError, match="overlaps x"):       # rows 1..3 of x as the output of rows 0..2
        kernel.rms_norm_into(x[:3], w, EPS, x[1:])
    check_bitwise("rms_norm", x, base, output="x_untouched")
    buf = torch.randn(2, 64).bfloat16()                # out's first row is the weight: programs would race on it
    wbase = buf.clone()
    with pytest.raises(StepContractError, match="overlaps weight"):
        kernel.rms_norm_into(x[:2], buf[0], EPS, buf)
    check_bitwise("rms_norm", buf, wbase, output="weight_untouched")


def test_rms_norm_compiles_for_sm90_with_pdl_and_no_spills():
    """As launched on the H200 (SmolLM2's 576, 2048, the widest row): griddepcontrol wait + launch_dependents
    in the PTX, the norm weight's load before the wait, every division correctly rounded (no approximate
    div.full.f32: the interpreter divides exactly, so only the PTX shows it), no register spills."""
    from sampling_stats import compile_sm90

    specs = []
    for h in (576, 2048, kernel.MAX_HIDDEN):
        shape = kernel.launch_shape(h)
        specs.append({"constexprs": {"H": h, "ROWS": shape["ROWS"], "BLOCK_H": shape["BLOCK_H"], "INTERP": False,
                                     "USE_PDL": True},
                      "pointers": {"x_ptr": "*bf16", "w_ptr": "*bf16", "out_ptr": "*bf16"},
                      "scalars": {"eps": "fp32"}, "divisible": ["stride_x", "stride_o"],
                      "num_warps": shape["num_warps"], "launch_pdl": True, "ptx": True})
    for h, info in zip((576, 2048, kernel.MAX_HIDDEN), compile_sm90("lowlat.kernels.rms_norm:_rms_norm_kernel", specs)):
        ptx = info.pop("ptx")
        assert info["spill_bytes"] == 0, (h, info)
        wait, trigger = ptx.find("griddepcontrol.wait"), ptx.find("griddepcontrol.launch_dependents")
        assert 0 < wait < trigger, (h, "PDL wait / early launch missing or out of order")
        assert 0 < ptx.find("ld.global") < wait, (h, "the norm weight is not loaded before the PDL wait")
        assert "div.full" not in ptx and "div.rn.f32" in ptx and "sqrt.rn.f32" in ptx, h


# ------------------------------------------------------------------------------------------------- GPU
@pytest.mark.gpu
@pytest.mark.parametrize("h", [576, 2048])
def test_gpu_rms_norm_within_policy_bitwise_and_row_invariant_with_pdl(device, h):
    """PDL on: within the policy at 1..48 rows (row strides H and H + 40), the bf16 reference's bits on exact
    inputs, every row bitwise the same alone and among 48 rows."""
    for m in (1, 2, 6, 8, 16, 17, 33, 48):
        x, w = make_inputs(m, h, m, device, row_pad=40 if m % 2 else 0)
        check_policy(x, w, run_kernel(x, w, use_pdl=True, out_pad=8 if m % 2 else 0))
        for scale in (1.0, 2.0 ** -10):
            xe, we = make_inputs(m, h, 50 + m, device, exact=True, scale=scale)
            check_reference_bits(xe, we, run_kernel(xe, we, use_pdl=True))
    x, w = make_inputs(48, h, 7, device)
    full = run_kernel(x, w, use_pdl=True)
    for i in range(48):
        check_bitwise("rms_norm", run_kernel(x[i:i + 1], w, use_pdl=True), full[i:i + 1], output=f"row_{i}_alone")
    for m in (5, 20):
        check_bitwise("rms_norm", run_kernel(x[:m], w, use_pdl=True), full[:m], output=f"first_{m}_rows")


@pytest.mark.gpu
def test_gpu_rms_norm_chained_pdl_launches_see_the_previous_output(device):
    """Eight launches chained by PDL, each normalising the previous one's output (the wait must order them),
    in a CUDA graph and eagerly: bitwise the same as the same chain without PDL."""
    x, w = make_inputs(6, 576, 9, device)
    bufs = [poison(torch.empty(6, 576, dtype=torch.bfloat16, device=device)) for _ in range(8)]

    def chain(pdl):
        src = x
        for b in bufs:
            src = kernel.rms_norm_into(src, w, EPS, b, use_pdl=pdl)
        return src.clone()

    want = chain(False)
    check_bitwise("rms_norm", chain(True), want, output="pdl_chain")
    for b in bufs:
        poison(b)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        chain(True)
    for b in bufs:
        poison(b)
    g.replay()
    torch.cuda.synchronize()
    check_bitwise("rms_norm", bufs[-1], want, output="pdl_chain_graph")
