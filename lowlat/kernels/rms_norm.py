"""RMSNorm of a row block, one launch (Triton): the final norm of the self-speculation draft step.

Matches `lowlat.reference.rms_norm.rms_norm` on bf16 inputs, with its two roundings in its order:

    rstd[m] = 1 / sqrt(sum_k x[m, k]^2 / H + eps)              fp32 statistic of the bf16 row, each
                                                               operation rounded to nearest
    y[m, k] = bf16( weight[k] * bf16(x[m, k] * rstd[m]) )      first x * rstd -> bf16, then * weight -> bf16

(weight * bf16 value is exact in fp32, so rounding it once to bf16 is what the reference's bf16 multiply
gives.) The mean, sqrt and reciprocal are correctly rounded (div_rn / sqrt_rn), as torch computes them on
the CPU; only the fp32 sum of squares is ordered differently from torch's, so a row's rstd can differ in
the last bit from the reference's (never where that sum is exact); the numerics policy (2x the bf16
reference's error against float64) judges.

One program per block of ROWS rows, each row whole in registers (BLOCK_H = next power of two of H). ROWS and
the warp count are functions of H only, never of M: every row is reduced in the same layout whatever the
row count or the row's place in its block, so a row's output is bitwise the same alone or among 48 rows. On a GPU
the layout also follows x's alignment (Triton picks the per-thread vector width from the pointer's and row
stride's divisibility by 16 bytes), so a view of x that is not 16-byte aligned may sum its squares in another
order (session 35's reading of the sm_90 build; on the row-stride test's data both orders, emulated on the CPU,
give the same output bits).
With PDL (USE_PDL) a program loads the norm weight (which no earlier kernel writes), then waits for the
previous kernel (`gdc_wait`: its x is complete and visible), then lets the next kernel launch
(`gdc_launch_dependents`) and reads x. Under the Triton CPU interpreter there is no PDL and the fp32 -> bf16
roundings use integer ops (`_gemv.to_bf16`: the interpreter's cast truncates).
"""

from __future__ import annotations

import numbers

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from lowlat.errors import StepContractError
from lowlat.kernels._attn_common import require_runnable
from lowlat.kernels._gemv import check_tensor, interpreting, rstd_of, to_bf16

#: The widest row one program holds (16 warps x 32 threads x 32 fp32 values).
MAX_HIDDEN = 16384
#: Elements of a program's [ROWS, BLOCK_H] tile: rows are added to a program while the tile stays this small.
_TILE_ELEMS = 4096
#: Most rows one program normalises.
_MAX_ROWS_PER_PROGRAM = 16


@triton.jit(do_not_specialize=["M"])
def _rms_norm_kernel(x_ptr, w_ptr, out_ptr, M, stride_x, stride_o, eps,
                     H: tl.constexpr, ROWS: tl.constexpr, BLOCK_H: tl.constexpr, INTERP: tl.constexpr,
                     USE_PDL: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_H)
    cmask = cols < H
    w = tl.load(w_ptr + cols, mask=cmask, other=0.0).to(tl.float32)       # not written by any kernel
    if USE_PDL:
        gdc_wait()
        gdc_launch_dependents()
    msk = (rows < M)[:, None] & cmask[None, :]
    x = tl.load(x_ptr + rows[:, None] * stride_x + cols[None, :], mask=msk, other=0.0).to(tl.float32)
    rstd = rstd_of(tl.sum(x * x, axis=1), H, eps, EXACT=True)      # correctly rounded, as torch's on the CPU
    y = to_bf16(x * rstd[:, None], INTERP).to(tl.float32)                   # the reference's first rounding
    o = to_bf16(w[None, :] * y, INTERP)                                    # ... and its second
    tl.store(out_ptr + rows[:, None] * stride_o + cols[None, :], o, mask=msk)


def launch_shape(h: int) -> dict:
    """The tiling of a launch for rows of H elements (a function of H only): {"ROWS": rows per program,
    "BLOCK_H": next power of two of H, "num_warps"}."""
    block_h = triton.next_power_of_2(h)
    rows = max(1, min(_MAX_ROWS_PER_PROGRAM, _TILE_ELEMS // block_h))
    return {"ROWS": rows, "BLOCK_H": block_h, "num_warps": max(4, min(16, rows * block_h // 1024))}


def _byte_span(t: torch.Tensor) -> tuple[int, int]:
    """[first, last) byte addresses a 2-D tensor with stride 1 along its last dim can touch."""
    first = t.data_ptr()
    return first, first + ((t.shape[0] - 1) * t.stride(0) + t.shape[1]) * t.element_size()


def rms_norm_into(x: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor, *,
                  use_pdl: bool = False) -> torch.Tensor:
    """out = rms_norm(x, weight, eps) (`lowlat.reference.rms_norm.rms_norm`), one launch, no host sync
    (CUDA-graph capturable).

    Parameters:
        x        [M, H] bf16, stride 1 along H (any row stride, e.g. a view of a wider buffer); M >= 0
        weight   [H] bf16 contiguous, on x's device; H in 1..MAX_HIDDEN (16384)
        eps      float > 0 (the model's rms_eps)
        out      [M, H] bf16, stride 1 along H (any row stride >= H), on x's device; its bytes (first to
                 last element) must not intersect x's or weight's
        use_pdl  chain with the previous / next kernel by programmatic dependent launch (Hopper; ignored
                 under the CPU interpreter)
    Returns: out. Mutates: out (every element of its M rows); M = 0 launches nothing.
    Raises StepContractError naming the tensor whose shape, dtype, device or layout is wrong, a bad eps,
    or out overlapping x or weight; nothing is written then.
    """
    require_runnable("x", x); require_runnable("weight", weight)
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        raise StepContractError(f"x must be a 2-D [M, H] tensor, got {getattr(x, 'shape', type(x).__name__)}")
    m, h = x.shape
    dev = x.device
    if not 1 <= h <= MAX_HIDDEN:
        raise StepContractError(f"x has H={h}; rms_norm_into takes 1..{MAX_HIDDEN}")
    check_tensor("x", x, (m, h), torch.bfloat16, dev)
    check_tensor("weight", weight, (h,), torch.bfloat16, dev)
    check_tensor("out", out, (m, h), torch.bfloat16, dev)
    if isinstance(eps, bool) or not (isinstance(eps, numbers.Real) and 0 < eps < float("inf")):
        raise StepContractError(f"eps={eps} must be a finite float > 0")
    if m == 0:
        return out
    for name, t in (("x", x), ("out", out)):
        if t.stride(0) < 0 or ((m - 1) * t.stride(0) + h) >= 2 ** 31:
            raise StepContractError(f"{name} with row stride {t.stride(0)} needs 64-bit offsets (the kernel "
                                    "indexes with int32)")
    if m > 1 and out.stride(0) < h:
        raise StepContractError(f"out's rows overlap (row stride {out.stride(0)} < H={h})")
    oa, ob = _byte_span(out)
    for name, t in (("x", x), ("weight", weight.view(1, h))):
        ta, tb = _byte_span(t)
        if ta < ob and oa < tb:
            raise StepContractError(f"out overlaps {name}: rms_norm_into writes a separate buffer")
    shape = launch_shape(h)
    interp = interpreting()
    pdl = bool(use_pdl) and not interp
    kwargs = {} if interp else {"num_warps": shape["num_warps"]}
    if pdl:
        kwargs["launch_pdl"] = True
    _rms_norm_kernel[(triton.cdiv(m, shape["ROWS"]),)](
        x, weight, out, m, x.stride(0), out.stride(0), float(eps), H=h, ROWS=shape["ROWS"],
        BLOCK_H=shape["BLOCK_H"], INTERP=interp, USE_PDL=pdl, **kwargs)
    return out


__all__ = ["MAX_HIDDEN", "launch_shape", "rms_norm_into"]
