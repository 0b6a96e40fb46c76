"""Goodness-of-fit helpers for the sampling tests: the G-test (log-likelihood ratio) against a known
distribution, with a stated false-failure rate.

G = 2 sum_c O_c ln(O_c / E_c) is asymptotically chi-square with (bins - 1) degrees of freedom under the
null; categories whose expected count is below MIN_EXPECTED are pooled so the approximation holds. An
observation in a category of expected probability 0 is an impossible event: p-value 0 outright.

Every test fixes its seeds, so a verdict is reproducible; ALPHA is the false-failure rate a test would
have over fresh seeds (Bonferroni-split over the statistics one test checks).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

#: false-failure rate of one test (over fresh seeds); each test splits it over its statistics
ALPHA = 1e-4
MIN_EXPECTED = 5.0


@dataclass
class GTest:
    stat: float
    df: int
    pvalue: float
    impossible: int       # observations in categories of probability 0

    def __str__(self) -> str:
        return f"G={self.stat:.2f} df={self.df} p={self.pvalue:.3g} impossible={self.impossible}"


def g_test(counts: torch.Tensor, expected: torch.Tensor) -> GTest:
    """counts [C] observed (ints), expected [C] expected counts (same total; 0 = impossible)."""
    o = counts.double().cpu()
    e = expected.double().cpu()
    impossible = int(o[e <= 0].sum())
    if impossible:
        return GTest(float("inf"), 0, 0.0, impossible)
    keep = e > 0
    o, e = o[keep], e[keep]
    order = torch.argsort(e)
    o, e = o[order], e[order]
    # pool the smallest categories until the pooled bin reaches MIN_EXPECTED
    cut = 0
    pooled_e = 0.0
    while cut < len(e) and (e[cut] < MIN_EXPECTED or 0 < pooled_e < MIN_EXPECTED):
        pooled_e += float(e[cut])
        cut += 1
    bins_o = torch.cat([o[:cut].sum().reshape(1), o[cut:]]) if cut else o
    bins_e = torch.cat([e[:cut].sum().reshape(1), e[cut:]]) if cut else e
    if len(bins_e) < 2:
        return GTest(0.0, 0, 1.0, 0)
    pos = bins_o > 0
    g = 2.0 * float((bins_o[pos] * torch.log(bins_o[pos] / bins_e[pos])).sum())
    df = len(bins_e) - 1
    p = float(torch.special.gammaincc(torch.tensor(df / 2.0, dtype=torch.float64),
                                      torch.tensor(max(g, 0.0) / 2.0, dtype=torch.float64)))
    return GTest(g, df, p, 0)


def token_counts(tokens: torch.Tensor, v: int) -> torch.Tensor:
    """Histogram over v tokens plus one extra category (index v) for anything outside [0, v) (e.g. -1)."""
    t = tokens.flatten().cpu()
    out = torch.where((t >= 0) & (t < v), t, v)
    return torch.bincount(out, minlength=v + 1)


def fits(counts: torch.Tensor, probs: torch.Tensor, alpha: float) -> GTest:
    """G-test of token counts [V+1] (last = invalid) against probabilities [V]; returns the result and
    whether p-value >= alpha (the caller asserts)."""
    n = counts.sum()
    expected = torch.cat([probs.double().cpu() * n, torch.zeros(1, dtype=torch.float64)])
    return g_test(counts, expected)


def compile_sm90(target: str, specs: list[dict]) -> list[dict]:
    """Run tests/unit/compile_sm90.py in a subprocess without TRITON_INTERPRET; skip when this machine's
    Triton has no NVIDIA backend (ptxas) to compile with."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    import pytest

    try:
        import triton
        ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    except ImportError:
        pytest.skip("triton is not installed")
    if not ptxas.exists():
        pytest.skip(f"no ptxas at {ptxas}: this Triton cannot compile for sm_90 here")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    # the checkout this test file belongs to first on the path, so the kernels compiled are the ones under
    # test (not another installed copy of lowlat), and the test modules are importable by name
    here = Path(__file__).resolve().parent
    env["PYTHONPATH"] = os.pathsep.join([str(here.parents[1]), str(here), *filter(None, [env.get("PYTHONPATH")])])
    script = Path(__file__).with_name("compile_sm90.py")
    res = subprocess.run([sys.executable, str(script), target, json.dumps(specs)], capture_output=True, text=True,
                         env=env, timeout=600)
    if res.returncode:
        raise AssertionError(f"{target} failed to compile for sm_90:\n{res.stderr[-4000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])
