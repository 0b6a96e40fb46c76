"""Rank agreement: before any collective, every TP rank must hold the same host-side decision
(guard verdict, planned rows, built widths, chosen spec). `agree` gathers a value over the CPU
(gloo) group and returns it when all ranks hold an equal value; otherwise EVERY rank raises
`RankDisagreement` naming each rank's value (or every rank returns the same fallback), so no rank
runs a collective the others skip.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from lowlat.errors import LowlatError

_RAISE = object()


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


def _equal(a: Any, b: Any) -> bool:
    try:
        eq = a == b
        return eq if isinstance(eq, bool) else bool(eq.all())   # numpy / torch values
    except Exception:  # noqa: BLE001 - incomparable values disagree
        return False


def agree(value: Any, group: dist.ProcessGroup | None = None, *, name: str = "value",
          fallback: Any = _RAISE) -> Any:
    """Gather `value` (picklable, compared with ==) from every rank of `group` (default: the world
    group; a CPU/gloo group in practice) and return it when all are equal.

    When ranks differ: raise `RankDisagreement({rank: value}, name)` on every rank, or, when
    `fallback` is given, return `fallback` on every rank. Without an initialised process group the
    caller is the only rank and `value` is returned. Collective: every rank of the group must call it.
    """
    if not dist.is_available() or not dist.is_initialized():
        return value
    world = dist.get_world_size(group)
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, value, group=group)
    if all(_equal(gathered[0], v) for v in gathered[1:]):
        return value
    if fallback is not _RAISE:
        return fallback
    ranks = [dist.get_global_rank(group, i) for i in range(world)] if group is not None else list(range(world))
    raise RankDisagreement(dict(zip(ranks, gathered)), name)
