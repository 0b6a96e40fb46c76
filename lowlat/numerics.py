"""The numerics policy (design.md) in one place: tolerance table, accuracy check, bitwise check.

A fast path's output passes when, against the oracle (the reference run in float64 on the same
bf16 inputs and weights),

    max|out - oracle|  <=  multiple * max|baseline - oracle|  +  floor_rel * max|oracle|  +  floor_abs

where the baseline is the same reference run in the low precision (bf16). `multiple` is 2 by default,
as FlashAttention's tests use; the floor absorbs the final rounding of a bf16 output (half an ulp of
the largest value is 2^-9 relative) for outputs whose baseline happens to round exactly.
NaN or Inf anywhere fails. Test bodies hold no literal tolerances: they name an entry here.

Every check is recorded in `RECORDS` (op, output, tolerance, measured errors, verdict); the test
suite attaches them to each test's report so `lowlat signoff` can list them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch


@dataclass(frozen=True)
class Tolerance:
    multiple: float
    floor_rel: float
    floor_abs: float
    reason: str

    def allowed(self, baseline_err: float, scale: float) -> float:
        return self.multiple * baseline_err + self.floor_rel * scale + self.floor_abs


#: default per low-precision dtype
DEFAULTS: dict[torch.dtype, Tolerance] = {
    torch.bfloat16: Tolerance(2.0, 2.0 ** -9, 1e-6, "2x the bf16 reference's error (FlashAttention's rule) "
                                                  "plus half a bf16 ulp of the largest output"),
    torch.float16: Tolerance(2.0, 2.0 ** -12, 1e-7, "2x the fp16 reference's error plus half an fp16 ulp"),
    torch.float32: Tolerance(2.0, 2.0 ** -22, 1e-9, "2x the fp32 reference's error plus fp32 rounding noise"),
}

#: per-(op, output) overrides, each with its reason
OVERRIDES: dict[tuple[str, str], Tolerance] = {
    ("model", "logits_vs_transformers"): Tolerance(
        0.0, 1e-5, 1e-4,
        "same bf16 weights, both run in fp32: only fp32 summation order differs; measured max 7.5e-5 "
        "absolute (logits up to ~40) over 3 prompts x 21 steps, so 1e-5 of the largest logit + 1e-4"),
    ("tp_layer", "out"): Tolerance(
        2.0, 2.0 ** -8, 1e-6,
        "TP partials are rounded to bf16 before the rank-ordered fp32 sum: one extra bf16 rounding per "
        "reduction, so one bf16 ulp of floor instead of half"),
}


def tolerance(op: str, output: str = "out", dtype: torch.dtype = torch.bfloat16) -> Tolerance:
    return OVERRIDES.get((op, output), DEFAULTS[dtype])


RECORDS: list[dict] = []


@dataclass
class AccuracyReport:
    op: str
    output: str
    max_err: float
    mean_err: float
    baseline_err: float
    allowed: float
    passed: bool
    tolerance: str


def _finite_or_fail(name: str, t: torch.Tensor) -> None:
    bad = ~torch.isfinite(t)
    if bad.any():
        idx = bad.nonzero()[:5].tolist()
        raise AssertionError(f"{name}: {int(bad.sum())} non-finite values (NaN/Inf), first at {idx}")


def check_accuracy(op: str, out: torch.Tensor, oracle: torch.Tensor, baseline: torch.Tensor | None, *,
                   output: str = "out", dtype: torch.dtype = torch.bfloat16) -> AccuracyReport:
    """Assert `out` is within the policy; returns (and records) the measured errors.

    out, oracle, baseline: same shape (any dtype; compared in float64). baseline None means 0 baseline
    error (the tolerance's floors alone).
    Raises AssertionError with max / mean error, baseline error and the first offending indices.
    """
    tol = tolerance(op, output, dtype)
    if out.shape != oracle.shape:
        raise AssertionError(f"{op}.{output}: shape {tuple(out.shape)} != oracle {tuple(oracle.shape)}")
    _finite_or_fail(f"{op}.{output}", out)
    o, ref = out.detach().double().cpu(), oracle.detach().double().cpu()
    err = (o - ref).abs()
    base_err = 0.0 if baseline is None or baseline.numel() == 0 else float(
        (baseline.detach().double().cpu() - ref).abs().max())
    scale = float(ref.abs().max()) if ref.numel() else 0.0
    allowed = tol.allowed(base_err, scale)
    max_err = float(err.max()) if err.numel() else 0.0
    rep = AccuracyReport(op, output, max_err, float(err.mean()) if err.numel() else 0.0, base_err, allowed,
                         max_err <= allowed, tol.reason)
    RECORDS.append({"kind": "accuracy", **asdict(rep)})
    if not rep.passed:
        first = (err > allowed).nonzero()[:5].tolist()
        raise AssertionError(
            f"{op}.{output}: max error {max_err:.3e} (mean {rep.mean_err:.3e}) > allowed {allowed:.3e} "
            f"= {tol.multiple} x baseline {base_err:.3e} + floors; first bad indices {first}; rule: {tol.reason}")
    return rep


def check_bitwise(op: str, a: torch.Tensor, b: torch.Tensor, *, output: str = "out") -> None:
    """Assert a and b are bitwise identical (NaN never passes); records the check."""
    _finite_or_fail(f"{op}.{output}", a)
    same = a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b)
    diff = 0.0 if same or a.shape != b.shape else float((a.double() - b.double()).abs().max())
    RECORDS.append({"kind": "bitwise", "op": op, "output": output, "max_err": diff, "allowed": 0.0,
                    "passed": same, "tolerance": "bitwise identical"})
    if not same:
        where = (a != b).nonzero()[:5].tolist() if a.shape == b.shape else "shape differs"
        raise AssertionError(f"{op}.{output}: not bitwise identical (max diff {diff:.3e}); first at {where}")


def poison(t: torch.Tensor) -> torch.Tensor:
    """Fill a float output buffer with NaN (ints with -1) so unwritten elements cannot pass."""
    return t.fill_(float("nan") if t.is_floating_point() else -1)


def oracle_cast(x):
    """float tensors -> float64 (ints unchanged); maps through lists/tuples."""
    if isinstance(x, torch.Tensor):
        return x.double() if x.is_floating_point() else x
    if isinstance(x, (list, tuple)):
        return type(x)(oracle_cast(v) for v in x)
    return x
