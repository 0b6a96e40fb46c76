"""tests/unit/compile_sm90.py reads what the kernel tests assert on (registers, spills, shared memory, the PTX
and a dump): positive controls with a tiny kernel whose register need is known, so a spec key the script
ignored or a ptxas report it stopped parsing fails here instead of silently passing every kernel test."""

from __future__ import annotations

from pathlib import Path

import triton
import triton.language as tl
from sampling_stats import compile_sm90


@triton.jit
def _square_normalise_kernel(x_ptr, y_ptr, N: tl.constexpr):
    """y = x / sum(x^2): every loaded value stays live across the reduction (N / threads registers each)."""
    offs = tl.arange(0, N)
    v = tl.load(x_ptr + offs)
    s = tl.sum(v * v, axis=0)
    tl.store(y_ptr + offs, v / s)


def _spec(n: int, **extra) -> dict:
    return {"constexprs": {"N": n}, "pointers": {"x_ptr": "*fp32", "y_ptr": "*fp32"}, "num_warps": 1, **extra}


def test_register_cap_spills_and_dump_are_reported(tmp_path):
    small, capped, dumped = compile_sm90("test_compile_sm90:_square_normalise_kernel", [
        _spec(256),                                  # 8 values a thread: fits, no spills
        _spec(4096, maxnreg=64),                     # 128 values a thread under a 64-register cap: must spill
        _spec(256, ptx=True, dump=str(tmp_path / "k"))])
    assert small["registers"] is not None and small["spill_bytes"] == 0, small
    assert capped["registers"] <= 64, f"maxnreg not applied: {capped}"
    assert capped["spill_bytes"] > 0, f"spills not detected: {capped}"
    assert "ld.global" in dumped["ptx"] and dumped["registers"] == small["registers"]
    for suffix in (".ptx", ".cubin", ".sass"):
        assert (tmp_path / f"k{suffix}").stat().st_size > 0, suffix


def test_the_checkout_under_test_is_compiled():
    """The harness compiles this checkout's modules, not another installed lowlat (a scratch copy or a
    worktree testing a change must not silently compile the main tree)."""
    root = Path(__file__).resolve().parents[2]
    [info] = compile_sm90("lowlat.kernels.moe:_router_logits_kernel", [{
        "constexprs": {"BE": 16, "HS": 64, "BK": 64, "BM": 16, "INTERP": False, "USE_PDL": False},
        "pointers": {"x_ptr": "*bf16", "w_ptr": "*bf16", "part_ptr": "*fp32"}}])
    assert Path(info["source"]).is_relative_to(root), (info["source"], root)
