"""Step alignment of the host protocol (lowlat.comm.host_protocol.HostGroup) over real gloo processes,
CPU only: a call refused on ONE rank (a bad partial, a bad stage), ranks passing different row counts M,
a rank whose call sequence drifted (step_id), and set-up arguments or a set-up failure on one rank.
Each must give a typed error on every rank, quickly (no rank waits out the deadline where the protocol
can tell at once), and leave the group aligned: the next step's sum is bitwise the ordered sum.
"""

from __future__ import annotations

import glob
import os
import time

import pytest
import torch

from lowlat.comm.fault import Fault, FaultKind
from lowlat.comm.host_protocol import HostGroup, run_ranks
from lowlat.comm.testing import assert_bits_equal, make_partials, reference
from lowlat.errors import CollectiveTimeout, StepContractError, UnsupportedConfigError

pytestmark = [pytest.mark.multi_gpu, pytest.mark.fault, pytest.mark.timeout(120)]

WORLD, HIDDEN, ROWS = 3, 1100, 3          # 3 tiles of 512 columns, the last ragged
#: a deadline no step here should reach: a refusal must be seen at once, not by timing out
LONG_DEADLINE_S = 20.0
#: how long an "at once" refusal may take on CI's shared 2 CPUs (s)
QUICK_S = 5.0


def _try(fn, *args, **kw) -> tuple:
    """(outcome, detail, seconds): ("ok", result) / (error type name, its fields) / never raises."""
    t0 = time.monotonic()
    try:
        out = fn(*args, **kw)
        return ("ok", out, time.monotonic() - t0)
    except StepContractError as e:
        return ("StepContractError", (getattr(e, "field", None), getattr(e, "peer", None), str(e)),
                time.monotonic() - t0)
    except UnsupportedConfigError as e:
        return ("UnsupportedConfigError", (e.field, e.value, str(e)), time.monotonic() - t0)
    except CollectiveTimeout as e:
        return ("CollectiveTimeout", (e.step, e.missing_peer, str(e)), time.monotonic() - t0)


def _aligned_step(g: HostGroup, rank: int, seed: int, **kw) -> str:
    parts = make_partials(WORLD, ROWS, HIDDEN, seed=seed)
    out = g.all_reduce(parts[rank], **kw)
    assert_bits_equal("host all_reduce", out, reference(parts), output=f"seed{seed}")
    return "ok"


# ------------------------------------------------------------------------------ rank bodies
def _refusals(rank: int, world: int) -> list:
    """Steps: ok; rank 1 passes a partial of the wrong width; ok; rank 2 passes stage -1; ranks pass
    M = 2 (rank 0) or 3; ok. Per step (outcome, detail, seconds) and the epoch after it."""
    g = HostGroup.from_process_group(HIDDEN, max_rows=ROWS, deadline=LONG_DEADLINE_S)
    log = []
    parts = make_partials(WORLD, ROWS, HIDDEN, seed=5)
    for step in range(1, 7):
        if step in (1, 3, 6):
            res = _try(_aligned_step, g, rank, step)
        elif step == 2:
            bad = torch.randn(ROWS, HIDDEN + 1).to(torch.bfloat16) if rank == 1 else parts[rank]
            res = _try(g.all_reduce, bad)
        elif step == 4:
            res = _try(g.all_reduce, parts[rank], stage=-1 if rank == 2 else 0)
        else:
            res = _try(g.all_reduce, parts[rank][: 2 if rank == 0 else 3])
        log.append((res[0], res[1] if res[0] != "ok" else None, res[2], g.epoch))
    return log


def _drift(rank: int, world: int) -> list:
    """Every call carries step_id. Rank 2 makes one extra call (step_id 100) the others never make;
    from then on its epochs are one ahead, and every later call must fail with a typed error on every
    rank, never return a sum of mismatched partials."""
    g = HostGroup.from_process_group(HIDDEN, max_rows=ROWS, deadline=1.0)
    log = [_try(_aligned_step, g, rank, 1, step_id=1)[0]]
    if rank == 2:
        parts = make_partials(WORLD, ROWS, HIDDEN, seed=100)
        res = _try(g.all_reduce, parts[rank], step_id=100)
        log.append(res[0] + (f" field={res[1][0]}" if res[0] == "StepContractError" else ""))
    for sid in (2, 3):
        parts = make_partials(WORLD, ROWS, HIDDEN, seed=sid)
        res = _try(g.all_reduce, parts[rank], step_id=sid)
        if res[0] == "ok":
            same = torch.equal(res[1], reference(parts))
            log.append("ok, equal to the ordered sum" if same else "ok, WRONG RESULT")
        else:
            log.append(res[0] + (f" field={res[1][0]}" if res[0] == "StepContractError" else ""))
    return log


def _setup(rank: int, world: int, case: str):
    kw = dict(max_rows=ROWS, deadline=LONG_DEADLINE_S)
    if case == "max_rows" and rank == 1:
        kw["max_rows"] = ROWS + 1
    if case == "hidden" and rank == 2:
        return _try(HostGroup.from_process_group, HIDDEN + 512, **kw)[:2]
    if case == "fault" and rank == 1:
        kw["fault"] = Fault(FaultKind.NEVER, rank=7)          # refused by HostGroup(...) on rank 1 only
    out = _try(HostGroup.from_process_group, HIDDEN, **kw)
    return out[0], out[1] if out[0] != "ok" else None


# ------------------------------------------------------------------------------ tests
def _values(outs):
    for o in outs:
        assert not o.hung and o.exitcode == 0 and o.error is None, f"rank {o.rank}: {o.error or 'hung'}"
    return [o.value for o in outs]


def test_a_call_refused_on_one_rank_raises_on_every_rank_at_once_and_the_group_stays_aligned():
    logs = _values(run_ranks(_refusals, WORLD, timeout_s=90))
    for rank, log in enumerate(logs):
        outcomes = [s[0] for s in log]
        assert [s[3] for s in log] == [1, 2, 3, 4, 5, 6], f"rank {rank}: a refused call must consume its step"
        assert outcomes[0] == outcomes[2] == outcomes[5] == "ok", f"rank {rank}: {log}"
        for step in (2, 4, 5):
            assert log[step - 1][2] < QUICK_S, f"rank {rank} step {step} took {log[step - 1][2]:.2f} s"
        # step 2: rank 1's partial is [3, 1101]
        field, peer, msg = log[1][1]
        assert outcomes[1] == "StepContractError"
        if rank == 1:
            assert field == "partial" and "[M, 1100]" in msg and "(3, 1101)" in msg
        else:
            assert peer == 1 and "rank 1 refused its call" in msg
        # step 4: rank 2's stage is -1
        if rank == 2:
            assert outcomes[3] == "UnsupportedConfigError" and log[3][1][:2] == ("stage", -1)
        else:
            assert outcomes[3] == "StepContractError" and log[3][1][1] == 2 and "rank 2 refused" in log[3][1][2]
        # step 5: rank 0 passed M=2, ranks 1 and 2 M=3
        assert outcomes[4] == "StepContractError"
        field, peer, msg = log[4][1]
        assert field == "rows" and peer == 1 and "rank 1 passed rows=3, rank 0 rows=2" in msg


def test_a_rank_whose_call_sequence_drifted_fails_every_later_step_with_step_ids():
    logs = _values(run_ranks(_drift, WORLD, timeout_s=90))
    # rank 2's extra call meets the others' next call (same epoch): their step ids differ
    assert logs[2][:2] == ["ok", "StepContractError field=step_id"], logs[2]
    sid = "StepContractError field=step_id"
    assert logs[0] == logs[1] == ["ok", sid, sid], logs
    # its last call (step_id 3, one epoch ahead) has no partner left: it times out
    assert logs[2][2:] == [sid, "CollectiveTimeout"], logs[2]


@pytest.mark.parametrize("case,field,bad_rank", [("max_rows", "max_rows", 1), ("hidden", "hidden", 2),
                                                 ("fault", "fault.rank", 1)])
def test_set_up_arguments_or_failure_on_one_rank_fail_on_every_rank_naming_it(case, field, bad_rank):
    before = set(glob.glob("/dev/shm/lowlat_comm_*")) if os.path.isdir("/dev/shm") else set()
    values = _values(run_ranks(_setup, WORLD, case, timeout_s=60))
    for rank, (outcome, detail) in enumerate(values):
        assert outcome == "UnsupportedConfigError", f"rank {rank}: {outcome}"
        assert detail[0] == field, detail
        assert f"rank {bad_rank}" in detail[2] or rank == bad_rank, detail
    if os.path.isdir("/dev/shm"):
        assert set(glob.glob("/dev/shm/lowlat_comm_*")) <= before, "the set-up left its shared file behind"


def test_the_same_arguments_set_up_and_reduce_with_step_ids():
    def_ok = _values(run_ranks(_drift_free, WORLD, timeout_s=60))
    assert def_ok == [["ok", "ok"]] * WORLD


def _drift_free(rank: int, world: int) -> list:
    g = HostGroup.from_process_group(HIDDEN, max_rows=ROWS, deadline=LONG_DEADLINE_S)
    return [_try(_aligned_step, g, rank, s, step_id=s)[0] for s in (7, 8)]
