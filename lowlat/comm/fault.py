"""Fault injection for lowlat's collectives: off by default, zero cost when off.

A fault makes one chosen rank misbehave in a collective:

    never        the rank never arrives: it pushes nothing and publishes no flag
    late         the rank spins `delay_s` before pushing (inside the deadline it must still succeed)
    exit         the rank exits mid-step: it pushes the first half of its tiles, then stops
                 (host protocol: the process dies with exit code EXIT_CODE)
    wrong_epoch  the rank publishes its flags tagged with the previous step's epoch

In the Triton kernel the fault kind is a `tl.constexpr` (`FAULT`): with no fault the kernel is
compiled without any fault code, so it costs nothing. A fault applies to every collective call
unless `step` names the one epoch it fires at.

The environment variable LOWLAT_FAULT sets a process-wide default, e.g.

    LOWLAT_FAULT="never:rank=1"                  LOWLAT_FAULT="late:rank=2,delay_ms=50"
    LOWLAT_FAULT="exit:rank=0,step=3"            LOWLAT_FAULT="wrong_epoch:rank=1"
"""

from __future__ import annotations

import enum
import math
import os
from dataclasses import dataclass

from lowlat.errors import UnsupportedConfigError

ENV_VAR = "LOWLAT_FAULT"
#: exit status of a host-protocol process killed by an `exit` fault
EXIT_CODE = 75


class FaultKind(enum.IntEnum):
    NONE = 0
    NEVER = 1
    LATE = 2
    EXIT = 3
    WRONG_EPOCH = 4


_NAMES = {"none": FaultKind.NONE, "never": FaultKind.NEVER, "late": FaultKind.LATE,
          "exit": FaultKind.EXIT, "wrong_epoch": FaultKind.WRONG_EPOCH}


@dataclass(frozen=True)
class Fault:
    """One injected fault.

    kind: what goes wrong; rank: the faulty rank (0..world-1); delay_s: the late arrival's delay (s,
    kind LATE only; finite, >= 0); step: the epoch (1-based collective call number) it fires at,
    None = every call. Raises `UnsupportedConfigError` naming the bad field and value (also from
    `parse` / LOWLAT_FAULT, e.g. delay_ms=nan or delay_s=inf).
    """

    kind: FaultKind = FaultKind.NONE
    rank: int = 0
    delay_s: float = 0.0
    step: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.kind, FaultKind):
            object.__setattr__(self, "kind", FaultKind(self.kind))
        if self.rank < 0:
            raise UnsupportedConfigError("fault.rank", self.rank, "must be >= 0")
        if isinstance(self.delay_s, bool) or not isinstance(self.delay_s, (int, float)) \
                or not math.isfinite(self.delay_s):
            raise UnsupportedConfigError("fault.delay_s", self.delay_s, "must be a finite number of seconds")
        if self.delay_s < 0 or (self.kind == FaultKind.LATE and self.delay_s == 0):
            raise UnsupportedConfigError("fault.delay_s", self.delay_s, "a late fault needs a delay > 0 s")
        if self.step is not None and self.step < 1:
            raise UnsupportedConfigError("fault.step", self.step, "epochs start at 1")

    @property
    def active(self) -> bool:
        return self.kind != FaultKind.NONE

    def fires(self, epoch: int) -> bool:
        """True when this fault applies to the collective call numbered `epoch`."""
        return self.active and (self.step is None or self.step == epoch)

    def kind_at(self, epoch: int) -> FaultKind:
        """The kernel's FAULT constexpr for this call: NONE unless the fault fires now."""
        return self.kind if self.fires(epoch) else FaultKind.NONE

    def check_world(self, world: int) -> None:
        """Raise `UnsupportedConfigError` when this fault cannot fire as meant in a group of `world`
        ranks: its rank is not in the group, or a never / exit fault with world size 1 (no peer waits
        for the faulty rank, so the step would return with its output unwritten and no error)."""
        if self.active and self.rank >= world:
            raise UnsupportedConfigError("fault.rank", self.rank, f"must be < world size {world}")
        if world == 1 and self.kind in (FaultKind.NEVER, FaultKind.EXIT):
            raise UnsupportedConfigError("fault.kind", self.kind.name.lower(), "needs a peer to miss the faulty rank; "
                                         "with world size 1 the step would return unwritten, not abort")

    @classmethod
    def parse(cls, text: str) -> "Fault":
        """Parse "kind[:key=value,...]" (keys: rank, delay_ms, delay_s, step); "" or "none" = no fault."""
        text = text.strip()
        if not text:
            return cls()
        name, _, rest = text.partition(":")
        if name.strip().lower() not in _NAMES:
            raise UnsupportedConfigError(ENV_VAR, text, f"unknown fault kind {name!r}; one of {sorted(_NAMES)}")
        kw: dict = {"kind": _NAMES[name.strip().lower()]}
        for item in filter(None, (p.strip() for p in rest.split(","))):
            key, eq, val = item.partition("=")
            try:
                if not eq:
                    raise ValueError
                if key == "rank":
                    kw["rank"] = int(val)
                elif key == "step":
                    kw["step"] = int(val)
                elif key == "delay_ms":
                    kw["delay_s"] = float(val) / 1e3
                elif key == "delay_s":
                    kw["delay_s"] = float(val)
                else:
                    raise KeyError(key)
            except (ValueError, KeyError):
                raise UnsupportedConfigError(
                    ENV_VAR, text, f"bad item {item!r}; expected rank=, step=, delay_ms= or delay_s=") from None
        return cls(**kw)

    @classmethod
    def from_env(cls) -> "Fault":
        """The fault LOWLAT_FAULT names; no fault when it is unset or empty."""
        return cls.parse(os.environ.get(ENV_VAR, ""))


NO_FAULT = Fault()
