"""Helpers shared by the attention kernels (attn_prologue, decode_attention).

- `interpreting()`: True when Triton runs under its CPU interpreter (TRITON_INTERPRET as Triton reads it).
- `round_bf16` / `to_bf16`: fp32 -> bf16 round-to-nearest-even. On the GPU this is the hardware cast;
  under the interpreter the plain cast truncates (and its RTNE mode mis-rounds mantissa overflow), so
  the interpreter path rounds with integer ops on the fp32 bits instead.
- `to_dot`: operands of `tl.dot`. The interpreter multiplies bf16 as raw uint16, so there the
  operands stay fp32 (holding bf16-exact values); on the GPU they are bf16 for the tensor cores.
- PDL (programmatic dependent launch, sm_90): `gdc_wait` / `gdc_launch_dependents` from
  `triton.language.extra.cuda`, used only behind a `USE_PDL` constexpr (inline asm; never interpreted).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from triton import knobs

from lowlat.errors import StepContractError

try:  # inline-asm PDL intrinsics (Triton >= 3.2)
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait  # noqa: F401
except ImportError:  # pragma: no cover - older Triton
    gdc_wait = gdc_launch_dependents = None


def interpreting() -> bool:
    """True when Triton runs under its CPU interpreter: TRITON_INTERPRET read the way Triton reads it ("1", "true",
    "yes", "on"; triton.knobs)."""
    return bool(knobs.runtime.interpret)


def require_runnable(name: str, t) -> None:
    """Raise `StepContractError` naming `name` when tensor t is on the CPU and Triton is not interpreting (Triton
    would fail deep inside its driver lookup: "0 active drivers"). Launchers call it first, before any output is
    written; non-tensors and other devices pass to the launcher's own checks (meta tensors reach its shape checks)."""
    if isinstance(t, torch.Tensor) and t.device.type == "cpu" and not interpreting():
        raise StepContractError(
            f"{name} is on the CPU: Triton kernels run on a CUDA GPU, or on the CPU only under the Triton "
            "interpreter (set TRITON_INTERPRET=1 before triton is imported)")


@functools.lru_cache(maxsize=None)
def _cuda_props_of(index: int):
    return torch.cuda.get_device_properties(index)


def cuda_props(device):
    """torch.cuda.get_device_properties of a CUDA `device` (index None: the current device), looked up once
    per device: launch paths ask for the capability / SM count on every call."""
    d = torch.device(device)
    return _cuda_props_of(torch.cuda.current_device() if d.index is None else d.index)


def pdl_supported(device: torch.device) -> bool:
    """PDL needs a CUDA device of compute capability >= 9.0 and the gdc intrinsics."""
    return (gdc_wait is not None and device.type == "cuda" and not interpreting()
            and cuda_props(device).major >= 9)


def gluon_sm90_reason(device: torch.device | str) -> str | None:
    """None where a Gluon sm_90 kernel (the held prologue, the held residual GEMV) runs on `device`, else why not: it
    needs a CUDA device (not the Triton interpreter: Gluon kernels do not run there) of compute capability >= 9.0."""
    dev = torch.device(device)
    if dev.type != "cuda" or interpreting():
        return f"device {dev}: a CUDA device (not the interpreter) runs Gluon kernels"
    if cuda_props(dev).major < 9:
        return f"compute capability {cuda_props(dev).major}: needs >= 9.0"
    return None


def check_early_release(early_release) -> None:
    """Refuse an early_release that is not a bool (it waives a launch-ordering rule: no truthy strings or tuples);
    StepContractError naming the value."""
    if not isinstance(early_release, bool):
        raise StepContractError(f"early_release={early_release!r} must be a bool")


@triton.jit
def pdl_wait_then_release(USE_PDL: tl.constexpr, EARLY_RELEASE: tl.constexpr = False):
    """The PDL wait, then the release of the next launch (called after a held kernel's weight loads: the production
    rule, the next launch may read before its own wait only what two or more launches back wrote); with
    EARLY_RELEASE the wait alone (the kernel released at its start, `pdl_release_early`)."""
    if USE_PDL:
        gdc_wait()
        if not EARLY_RELEASE:
            gdc_launch_dependents()


@triton.jit
def pdl_release_early(USE_PDL: tl.constexpr, EARLY_RELEASE: tl.constexpr):
    """With EARLY_RELEASE under PDL, release the next launch now (a program's start): it may then start before this
    launch's predecessor is complete, so it must read before its own wait nothing that predecessor writes (the
    caller's early_release states what its successors read)."""
    if USE_PDL and EARLY_RELEASE:
        gdc_launch_dependents()


@triton.jit
def round_bf16(x):
    """fp32 -> fp32 holding the bf16 round-to-nearest-even of x (integer ops: exact everywhere)."""
    b = x.to(tl.uint32, bitcast=True)
    b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
    return b.to(tl.float32, bitcast=True)


@triton.jit
def to_bf16(x, INTERP: tl.constexpr):
    """fp32 -> bf16, round to nearest even."""
    if INTERP:
        b = x.to(tl.uint32, bitcast=True)
        b = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
        return b.to(tl.uint16).to(tl.bfloat16, bitcast=True)
    else:
        return x.to(tl.bfloat16)


@triton.jit
def to_dot(x, INTERP: tl.constexpr):
    """A bf16-exact operand (fp32 or bf16) as `tl.dot` takes it: bf16 on the GPU, fp32 interpreted."""
    if INTERP:
        return x.to(tl.float32)
    else:
        return x.to(tl.bfloat16)


# ----------------------------------------------------------------------------- host-side checks
def check_tensor(name: str, t, *, dtype: torch.dtype | None = None, ndim: int | None = None,
                 shape: tuple | None = None, device: torch.device | None = None,
                 last_contiguous: bool = True) -> None:
    """Raise `StepContractError` naming `name` when t is not a tensor of the stated facts.

    shape: expected sizes, None entries are free; the message names each dim's glossary letter when
    `shape` holds (letter, size) pairs.
    """
    if not isinstance(t, torch.Tensor):
        raise StepContractError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if dtype is not None and t.dtype != dtype:
        raise StepContractError(f"{name} must be {dtype}, got {t.dtype}")
    if ndim is not None and t.dim() != ndim:
        raise StepContractError(f"{name} must be {ndim}-D, got shape {tuple(t.shape)}")
    if shape is not None:
        for i, want in enumerate(shape):
            if want is None:
                continue
            letter, size = want
            if t.shape[i] != size:
                raise StepContractError(
                    f"{name} has shape {tuple(t.shape)}: dim {i} must be {letter}={size}, got {t.shape[i]}")
    if device is not None and t.device != device:
        raise StepContractError(f"{name} is on {t.device}, expected {device} (same device as x/q)")
    if last_contiguous and t.dim() > 0 and t.shape[-1] > 1 and t.stride(-1) != 1:   # size 1: stride unused
        raise StepContractError(f"{name} must have a contiguous last dim, got strides {t.stride()}")


def overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether the byte spans of two tensors (first to last element, strides included) share a byte: a conservative
    aliasing test (tensors of one storage whose spans interleave without sharing an element count as overlapping)."""
    if a.numel() == 0 or b.numel() == 0 or a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr():
        return False

    def span(t):
        last = sum((size - 1) * abs(stride) for size, stride in zip(t.shape, t.stride()))
        return t.data_ptr(), t.data_ptr() + (last + 1) * t.element_size()

    (a0, a1), (b0, b1) = span(a), span(b)
    return a0 < b1 and b0 < a1


def refuse_overlaps(first: dict, second: dict, message: str) -> None:
    """Raise StepContractError(message.format(a=name, b=name)) for the first pair of a tensor of `first` and a
    tensor of `second` (name -> tensor; None entries skipped) whose byte spans overlap (`overlap`)."""
    for a, ta in first.items():
        for b, tb in second.items():
            if ta is not None and tb is not None and overlap(ta, tb):
                raise StepContractError(message.format(a=a, b=b))


def check_num_valid_rows(num_valid_rows, m: int, device: torch.device):
    """Returns (int value or 0, device tensor or None). An int must be in 0..M; a tensor must be a
    1-element int32 tensor on `device` (read in-kernel: CUDA-graph friendly, value not checked)."""
    if isinstance(num_valid_rows, torch.Tensor):
        if num_valid_rows.numel() != 1 or num_valid_rows.dtype != torch.int32:
            raise StepContractError(
                f"num_valid_rows tensor must hold 1 int32 element, got shape {tuple(num_valid_rows.shape)} "
                f"dtype {num_valid_rows.dtype}")
        if num_valid_rows.device != device:
            raise StepContractError(f"num_valid_rows is on {num_valid_rows.device}, expected {device}")
        return 0, num_valid_rows
    if isinstance(num_valid_rows, bool) or not isinstance(num_valid_rows, int):
        raise StepContractError(f"num_valid_rows must be an int or an int32 tensor, got {type(num_valid_rows).__name__}")
    if not 0 <= num_valid_rows <= m:
        raise StepContractError(f"num_valid_rows={num_valid_rows} must be in 0..M={m}")
    return num_valid_rows, None
