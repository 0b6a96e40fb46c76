"""Cross-GPU reduction for lowlat: push + rank-ordered all-reduce with deadlines, abort and fault
injection (README.md in this folder explains the protocol and the tests).

    ordered_reduce  Triton device functions (push, publish, wait, ordered sum, abort) + standalone kernel
    emulated        EmulatedGroup: N ranks' buffers on one GPU (or the CPU interpreter), one kernel grid
    peer_buffers    PeerGroup: one process per GPU, buffers from PyTorch symmetric memory (no multicast);
                    PeerRank: its per-rank calls over any buffers
    host_protocol   HostGroup: the same protocol in Python over shared memory, for gloo processes (CPU CI)
    deadline        Deadline (SGLang's min(60 s, watchdog/2), >= 5 s when serving), abort word
    fault           Fault / LOWLAT_FAULT: never arrives, late, exits mid-step, wrong epoch
    agreement       agree(value, group): every rank gets the value or raises RankDisagreement

Names are imported lazily so that `from lowlat.comm.agreement import agree` does not import Triton.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "EmulatedGroup": "emulated", "PeerGroup": "peer_buffers", "PeerRank": "peer_buffers", "HostGroup": "host_protocol",
    "run_ranks": "host_protocol", "Deadline": "deadline", "deadline_from_watchdog": "deadline",
    "Fault": "fault", "FaultKind": "fault", "agree": "agreement", "RankDisagreement": "agreement",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"lowlat.comm.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'lowlat.comm' has no attribute {name!r}")
