"""Deadlines and the abort word of lowlat's collectives.

Every wait of a collective (a device spin loop on a flag, or the host protocol's poll) is bounded by
a deadline fixed at build time. SGLang's rule (sglang-contract.md) is

    deadline_s = min(60 s, watchdog_timeout_s / 2)

and a serving configuration refuses a deadline below 5 s (a shorter one would turn ordinary jitter
into aborted steps); tests may use shorter ones (`serving=False`).

The deadline is measured from the first time a waiter finds a flag missing (a block that never has
to wait never reads the clock), on `%globaltimer` (ns) on the GPU and `time.monotonic_ns()` on the
host. A waiter that misses it writes an *abort word* into every rank's control block, so every
rank's host raises `CollectiveTimeout` after the step:

    word = epoch << 32 | stage << 16 | origin_rank << 8 | missing_peer      (int64, epoch >= 1)

`epoch` is the collective's step counter, so a word left by an earlier step never aborts a later
one; `stage` is a caller-given id (0..MAX_STAGE; bit 15 marks the confirm round); `origin_rank` is
the rank that timed out and `missing_peer` the lowest rank whose flag it did not see.

Bit 14 of the stage field (CONTRACT_STAGE_BIT) marks an abort for a broken call contract, not a
timeout: `origin_rank` found `missing_peer`'s flag of this step and tile carrying other rows than
its own (rows 0: that peer refused its call on the host). Every rank then raises
`StepContractError` (field "partial" when a rank refused, else "rows") instead of `CollectiveTimeout`,
once every peer's flag of the step has arrived, not at the deadline (`error_from_word`). Stage ids
are 0..MAX_STAGE = 16383; bit 15 marks the confirm round.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from lowlat.errors import CollectiveTimeout, LowlatError, StepContractError, UnsupportedConfigError

#: SGLang's cap on a collective's deadline (s)
MAX_DEADLINE_S = 60.0
#: below this a serving configuration refuses the deadline (s)
MIN_SERVING_DEADLINE_S = 5.0
#: largest epoch an abort word / flag tag can carry (31 bits keep the int64 word positive)
MAX_EPOCH = (1 << 31) - 1
#: bit of the stage field that marks the confirm round of a collective
CONFIRM_STAGE_BIT = 1 << 15
#: bit of the stage field that marks a contract abort (a peer's flag carried other rows: module docstring)
CONTRACT_STAGE_BIT = 1 << 14
MAX_STAGE = CONTRACT_STAGE_BIT - 1
MAX_RANKS = 255
#: largest deadline accepted at all (s, ~11.6 days; tests and serving alike): its ns, added to a clock
#: reading (`%globaltimer` counts ns since 1970, ~1.8e18), must stay far inside int64
MAX_ANY_DEADLINE_S = 1e6


def deadline_from_watchdog(watchdog_s: float) -> float:
    """SGLang's rule: min(60 s, watchdog_timeout / 2), in seconds.

    Raises `UnsupportedConfigError` when watchdog_s is not a positive finite number.
    """
    if not (isinstance(watchdog_s, (int, float)) and math.isfinite(watchdog_s) and watchdog_s > 0):
        raise UnsupportedConfigError("watchdog_timeout", watchdog_s, "must be a positive number of seconds")
    return min(MAX_DEADLINE_S, watchdog_s / 2)


@dataclass(frozen=True)
class Deadline:
    """A collective's deadline, fixed at build.

    seconds: the bound on any single wait, measured from the waiter's first miss (s, > 0).
    serving: True for a serving configuration, which refuses seconds < 5 (MIN_SERVING_DEADLINE_S).
    Raises `UnsupportedConfigError` (field "deadline_s") naming the value when it is refused: not a
    positive finite number (bools too), or above MAX_ANY_DEADLINE_S (its ns would not fit the int64
    clock arithmetic of the waits).
    """

    seconds: float = MAX_DEADLINE_S
    serving: bool = True

    def __post_init__(self) -> None:
        s = self.seconds
        if isinstance(s, bool) or not (isinstance(s, (int, float)) and math.isfinite(s) and s > 0):
            raise UnsupportedConfigError("deadline_s", s, "must be a positive finite number of seconds")
        if s > MAX_ANY_DEADLINE_S:
            raise UnsupportedConfigError("deadline_s", s, f"must be at most {MAX_ANY_DEADLINE_S:g} s (its ns are "
                                         "added to an int64 ns clock)")
        if self.serving and s < MIN_SERVING_DEADLINE_S:
            raise UnsupportedConfigError(
                "deadline_s", s, f"a serving configuration needs at least {MIN_SERVING_DEADLINE_S:g} s "
                "(SGLang: min(60, watchdog/2)); pass serving=False for tests")

    @property
    def ns(self) -> int:
        return int(self.seconds * 1e9)

    @classmethod
    def from_watchdog(cls, watchdog_s: float, serving: bool = True) -> "Deadline":
        return cls(deadline_from_watchdog(watchdog_s), serving)

    @classmethod
    def coerce(cls, value: "Deadline | float | None") -> "Deadline":
        """A Deadline as is; a bare number of seconds as a test deadline (serving=False); None: 60 s.
        A bool, or a value float() does not take, raises `UnsupportedConfigError` (field "deadline_s")."""
        if value is None:
            return cls()
        if isinstance(value, Deadline):
            return value
        try:
            if isinstance(value, bool):
                raise TypeError
            seconds = float(value)
        except (TypeError, ValueError):
            raise UnsupportedConfigError("deadline_s", value, "must be a Deadline or a number of seconds") from None
        return cls(seconds, serving=False)


def is_stage(stage: Any) -> bool:
    """Whether `stage` is a valid stage id: an int (not a bool) in 0..MAX_STAGE."""
    return isinstance(stage, int) and not isinstance(stage, bool) and 0 <= stage <= MAX_STAGE


def check_stage(stage: Any, where: str = "") -> None:
    """Raise `UnsupportedConfigError` (field "stage") unless `is_stage(stage)`; where: appended context."""
    if not is_stage(stage):
        raise UnsupportedConfigError("stage", stage, f"must be an int in 0..{MAX_STAGE}{where}")


def pack_abort(epoch: int, stage: int, origin: int, missing: int) -> int:
    """The abort word (see module docstring). Raises ValueError when a field is out of range."""
    if not 1 <= epoch <= MAX_EPOCH:
        raise ValueError(f"epoch={epoch} out of range 1..{MAX_EPOCH}")
    if not 0 <= stage <= 0xFFFF:
        raise ValueError(f"stage={stage} out of range 0..65535")
    if not (0 <= origin <= MAX_RANKS and 0 <= missing <= MAX_RANKS):
        raise ValueError(f"origin={origin} / missing={missing} out of range 0..{MAX_RANKS}")
    return epoch << 32 | stage << 16 | origin << 8 | missing


def unpack_abort(word: int) -> tuple[int, int, int, int]:
    """(epoch, stage, origin_rank, missing_peer) of an abort word; epoch 0 means no abort ever."""
    return word >> 32, (word >> 16) & 0xFFFF, (word >> 8) & 0xFF, word & 0xFF


def stage_label(stage: int, names: dict[int, str] | None = None) -> str:
    base = stage & MAX_STAGE
    label = (names or {}).get(base, f"stage {base}")
    return label + (" (confirm)" if stage & CONFIRM_STAGE_BIT else "")


def step_error(rank: int, step: int, field: str, value: Any, peer: int, msg: str) -> StepContractError:
    """`StepContractError` of a collective step, raised on `rank`: "rank R, step S: msg", with the
    attributes rank, step, field, value and peer (the rank whose call broke the contract)."""
    err = StepContractError(f"rank {rank}, step {step}: {msg}")
    err.rank, err.step, err.field, err.value, err.peer = rank, step, field, value, peer
    return err


def _contract_cause(origin: int, missing: int, label: str, rows: dict[int, int | None] | None) -> tuple[str, int, str]:
    """(field, peer, why) of a contract abort: the refused calls (rows 0) first, else the ranks whose rows
    differ from the most common rows (a tie: the lower rows value counts as the common one, so with two
    ranks the one of more rows is named); without the rows (or none seen differ), the word's ranks."""
    if rows is None:
        return "rows", missing, (f"rank {origin} found rank {missing}'s flag of {label!r} carrying other rows than "
                                 f"its own (rows 0: rank {missing} refused its call)")
    refused = [r for r, m in sorted(rows.items()) if m == 0]
    seen = [m for m in rows.values() if m]
    table = f"rows by rank {rows} (0: refused, None: its flag not seen)"
    if refused:
        who = f"rank {refused[0]}" if len(refused) == 1 else f"ranks {refused}"
        mixed = "; the others' rows differ too" if len(set(seen)) > 1 else ""
        why = f"{who} refused the call of {label!r} (see the error raised there){mixed}: {table}"
        return "partial", refused[0], why
    common = max(sorted(set(seen)), key=seen.count) if seen else None
    odd = [r for r, m in sorted(rows.items()) if m is not None and m != common]
    if not odd:             # the flag that broke it not seen here (read before it landed)
        return "rows", missing, (f"rank {origin} found rank {missing}'s flag of {label!r} carrying other rows than "
                                 f"its own (rows 0: rank {missing} refused its call): {table}")
    return "rows", odd[0], f"the ranks passed different rows M to the same call of {label!r}: {table}"


def error_from_word(rank: int, word: int, epoch: int, deadline_s: float, names: dict[int, str] | None = None,
                    rows_by_rank: dict[int, int | None] | None = None, *,
                    completed: bool | None = None) -> LowlatError | None:
    """The error rank `rank` must raise for step `epoch`, or None when its abort word is older than that
    step (no abort, or one left by an earlier step). A word of a LATER epoch also aborts (peers already
    gave up on a later step, so a lagging rank's step may not have completed), unless `completed` is
    True: the caller knows its own programs of step `epoch` completed (`PeerRank.status`, whose host may
    read the word after a peer already aborted a later step).

    A timeout word gives `CollectiveTimeout` (attribute origin_rank: the rank that timed out); a
    contract word (CONTRACT_STAGE_BIT) gives `StepContractError` with field "partial" (a rank refused its
    call: rows 0) or "rows" (the ranks' M differ), value `rows_by_rank` when the caller could read it
    (each rank's rows as its flags of the word's step carry them, 0 for a refused call, None for a flag
    not seen: ranks reading at different times can see different Nones), peer: the refusing rank, else the
    lowest rank whose rows differ from the most common."""
    w_epoch, stage, origin, missing = unpack_abort(int(word))
    if w_epoch < epoch or w_epoch == 0 or (w_epoch > epoch and completed):
        return None
    # named only for a caller that asked about its own step (the TP layer's first_epoch spans its collectives)
    later = f" (aborted with step {w_epoch}, a later step)" if w_epoch > epoch and completed is False else ""
    if stage & CONTRACT_STAGE_BIT:
        field, peer, why = _contract_cause(origin, missing, stage_label(stage, names), rows_by_rank)
        err: LowlatError = step_error(rank, epoch, field, rows_by_rank, peer,
                                      f"{why}; the step is aborted on every rank{later}")
    else:
        err = CollectiveTimeout(rank, epoch, stage_label(stage, names) + later, missing, deadline_s)
    err.origin_rank = origin
    return err
