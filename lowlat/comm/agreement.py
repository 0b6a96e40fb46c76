"""Rank agreement: before any collective, every TP rank must hold the same host-side decision
(guard verdict, planned rows, built widths, chosen spec). `agree` gathers a value over the CPU
(gloo) group and returns it when all ranks hold an equal value; otherwise EVERY rank raises
`RankDisagreement` naming each rank's value (or every rank returns the same fallback), so no rank
runs a collective the others skip.

"Equal" is exact and type-aware, decided on a canonical encoding of each value (`canonical`), never
on `==` (which broadcasts tensors / arrays and equates 1 with True): the type, and for tensors and
arrays the dtype, shape and bytes, must match; NaN equals NaN. Every rank decides from the same
gathered encodings, so every rank takes the same branch, even when a value cannot be pickled or
encoded on one rank (that rank's value then disagrees with every other).
"""

from __future__ import annotations

import dataclasses
import enum
import pickle
from typing import Any

import torch.distributed as dist

from lowlat.errors import LowlatError

_RAISE = object()
_MAX_DEPTH = 64


class RankDisagreement(LowlatError, RuntimeError):
    """TP ranks hold different values for a decision that must be the same on every rank.

    values_by_rank: {rank: value} as gathered (the same dict on every rank); name: what was agreed.
    """

    def __init__(self, values_by_rank: dict[int, Any], name: str = "value") -> None:
        self.values_by_rank, self.name = dict(values_by_rank), name
        listing = ", ".join(f"rank {r}: {v!r}" for r, v in sorted(self.values_by_rank.items()))
        super().__init__(f"ranks disagree on {name}: {listing}")

    def __reduce__(self):   # picklable, so it can cross process boundaries
        return (RankDisagreement, (self.values_by_rank, self.name))


def _type_name(v: Any) -> str:
    t = type(v)
    return f"{t.__module__}.{t.__qualname__}"


def canonical(value: Any, _depth: int = 0) -> tuple:
    """An exact, type-aware encoding of `value` made of str / bytes / tuples only: two values agree
    when their encodings are equal. Scalars: exact type and value (1 and True differ, NaN equals
    NaN, -0.0 and 0.0 differ); tensors / numpy arrays: type, dtype, shape and bytes (not the device);
    containers, dataclasses and enums recursively; anything else: its type and pickled bytes.
    Raises (TypeError, pickle errors, ...) for a value it cannot encode."""
    if _depth > _MAX_DEPTH:
        raise ValueError("value nested too deeply to agree on")
    d = _depth + 1
    name = _type_name(value)
    if value is None or isinstance(value, (bool, int, str, bytes)):
        return (name, repr(value))
    if isinstance(value, float):
        return (name, value.hex())                       # every NaN is 'nan'
    if isinstance(value, complex):
        return (name, value.real.hex(), value.imag.hex())
    if isinstance(value, enum.Enum):
        return (name, value.name)
    if isinstance(value, (tuple, list)):
        return (name, tuple(canonical(v, d) for v in value))
    if isinstance(value, (set, frozenset)):
        return (name, tuple(sorted((canonical(v, d) for v in value), key=repr)))
    if isinstance(value, dict):
        return (name, tuple(sorted(((canonical(k, d), canonical(v, d)) for k, v in value.items()), key=repr)))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return (name, tuple((f.name, canonical(getattr(value, f.name), d)) for f in dataclasses.fields(value)))
    import torch

    if isinstance(value, torch.Tensor):
        t = value.detach().cpu()
        if t.layout != torch.strided or t.is_quantized:
            return (name, str(t.dtype), str(t.layout), pickle.dumps(t))
        if (t.is_floating_point() or t.is_complex()) and bool(torch.isnan(t).any()):
            t = t.clone()                                # NaN equals NaN whatever its payload
            t[torch.isnan(t)] = float("nan")
        data = t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        return (name, str(t.dtype), tuple(t.shape), data)
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - numpy ships with torch
        np = None
    if np is not None and isinstance(value, (np.ndarray, np.generic)):
        a = np.asarray(value)
        if a.dtype.hasobject:
            return (name, a.dtype.str, a.shape, canonical(a.tolist(), d))
        nan = np.isnan(a) if a.dtype.kind in "fc" else None
        if nan is not None and nan.any():                # NaN equals NaN whatever its payload
            a = a.copy()
            a[nan] = np.nan
        return (name, a.dtype.str, a.shape, np.ascontiguousarray(a).tobytes())
    return (name, pickle.dumps(value, protocol=4))


def _encode(value: Any, rank: int) -> tuple[bytes, bytes]:
    """(encoding, pickled value) of this rank's value; an encoding no other rank can match when the
    value cannot be encoded or pickled here (so every rank sees the disagreement)."""
    try:
        key = pickle.dumps(canonical(value), protocol=4)
    except Exception as e:  # noqa: BLE001 - an unencodable value disagrees, on every rank alike
        key = pickle.dumps(("<unencodable>", rank, f"{type(e).__name__}: {e}"), protocol=4)
    try:
        data = pickle.dumps(value, protocol=4)
    except Exception as e:  # noqa: BLE001
        key = pickle.dumps(("<unpicklable>", rank), protocol=4)
        data = pickle.dumps(f"<unpicklable {type(value).__name__} on rank {rank}: {type(e).__name__}: {e}>")
    return key, data


def _decode(data: bytes) -> Any:
    try:
        return pickle.loads(data)
    except Exception as e:  # noqa: BLE001 - only for the message: the decision is made on the encodings
        return f"<value not readable here: {type(e).__name__}: {e}>"


def agree(value: Any, group: dist.ProcessGroup | None = None, *, name: str = "value",
          fallback: Any = _RAISE) -> Any:
    """Gather `value` from every rank of `group` (default: the world group; a CPU/gloo group in
    practice) and return it when all are equal by `canonical` encoding (exact type; tensors and arrays
    by dtype, shape and bytes; NaN equal to NaN) -- then every rank returns an identical value.

    When ranks differ (or a value cannot be encoded / pickled on some rank): raise
    `RankDisagreement({rank: value}, name)` on every rank, or, when `fallback` is given, return
    `fallback` on every rank. Without an initialised process group the caller is the only rank and
    `value` is returned. Collective: every rank of the group must call it; it never raises on one
    rank only.
    """
    if not dist.is_available() or not dist.is_initialized():
        return value
    world = dist.get_world_size(group)
    me = dist.get_rank(group)
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, _encode(value, me), group=group)
    if all(k == gathered[0][0] for k, _ in gathered[1:]):
        return value
    if fallback is not _RAISE:
        return fallback
    ranks = [dist.get_global_rank(group, i) for i in range(world)] if group is not None else list(range(world))
    values = [value if i == me else _decode(data) for i, (_, data) in enumerate(gathered)]
    raise RankDisagreement(dict(zip(ranks, values)), name)
