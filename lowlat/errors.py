"""Typed errors of lowlat. Each names the offending field or value in its message."""

from __future__ import annotations


class LowlatError(Exception):
    """Base class of every error lowlat raises on purpose."""


class UnsupportedConfigError(LowlatError, ValueError):
    """A model config asks for something lowlat does not implement."""

    def __init__(self, field: str, value: object, why: str) -> None:
        self.field, self.value, self.why = field, value, why
        super().__init__(f"unsupported config field {field}={value!r}: {why}")


class StepContractError(LowlatError, ValueError):
    """A step's tensors break the step contract (dtype, shape, range); nothing was written."""


class KVCacheError(LowlatError, RuntimeError):
    """The KV-cache pool refused an operation: no free slot or request row, a request row that is not
    allocated (e.g. freed twice), or a count / length outside its range. The pool is unchanged."""


class WeightsNotFoundError(LowlatError, FileNotFoundError):
    """Model weights are missing or unreadable; the message says how to install them."""


class CollectiveTimeout(LowlatError, RuntimeError):
    """A cross-GPU wait missed its deadline; raised on every rank of the step."""

    def __init__(self, rank: int, step: int, stage: str, missing_peer: int, deadline_s: float) -> None:
        self.rank, self.step, self.stage, self.missing_peer, self.deadline_s = (
            rank, step, stage, missing_peer, deadline_s)
        super().__init__(
            f"collective timeout on rank {rank}: step {step}, stage {stage!r}, "
            f"peer {missing_peer} did not arrive within {deadline_s:g} s; the step was aborted on every rank")
