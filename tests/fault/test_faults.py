"""Fault injection on lowlat's collectives: for every injected fault, every rank raises
CollectiveTimeout within deadline + a stated margin, nothing hangs (pytest-timeout is the backstop),
every rank ran the same sequence of collectives, the following step is correct, and outputs of
earlier steps are untouched; a late arrival inside the deadline succeeds.

- Host protocol, real gloo processes on the CPU: never / late (beyond and within the deadline) /
  exit mid-step (the process dies) / wrong epoch, timed against the deadline.
- The Triton kernel on emulated ranks: on the CPU interpreter the deadline is a spin count (no clock
  there, so no timing claim) for never / exit / wrong epoch; on one GPU (`gpu`) all faults, timed.
"""

from __future__ import annotations

import time

import pytest
import torch

from lowlat.comm.deadline import (Deadline, deadline_from_watchdog, pack_abort, error_from_word,
                                  unpack_abort)
from lowlat.comm.emulated import EmulatedGroup
from lowlat.comm.fault import EXIT_CODE, Fault, FaultKind
from lowlat.comm.host_protocol import HostGroup, run_ranks
from lowlat.comm.testing import assert_bits_equal, make_partials, reference, timed_step
from lowlat.errors import CollectiveTimeout, UnsupportedConfigError
from lowlat.numerics import poison

pytestmark = pytest.mark.fault

#: host protocol deadline (s)
HOST_DEADLINE_S = 0.5
#: slack on top of the deadline before a raise counts as late (s): CI's shared CPUs (2 cores, other
#: jobs) delay a sleeping poller's wake-up and the abort word's reader by scheduler quanta
HOST_MARGIN_S = 1.5
#: emulated-GPU deadline (s) and slack: the launch, a device sync and the status read
GPU_DEADLINE_S = 0.2
GPU_MARGIN_S = 0.3


# ----------------------------------------------------------------------------------------------
# configuration: deadlines, abort words, LOWLAT_FAULT


def test_deadline_follows_sglang_rule_and_refuses_short_serving_deadlines():
    assert deadline_from_watchdog(300) == 60.0 and deadline_from_watchdog(20) == 10.0
    assert Deadline.from_watchdog(300).seconds == 60.0
    with pytest.raises(UnsupportedConfigError, match="deadline_s=4.9"):
        Deadline(4.9)
    assert Deadline(0.05, serving=False).ns == 50_000_000
    with pytest.raises(UnsupportedConfigError, match="deadline_s=0"):
        Deadline(0, serving=False)
    with pytest.raises(UnsupportedConfigError, match="watchdog_timeout"):
        deadline_from_watchdog(float("nan"))
    assert Deadline.coerce(0.2) == Deadline(0.2, serving=False) and Deadline.coerce(None).seconds == 60.0
    # bounded: a deadline's ns are added to an int64 ns clock (1e300 s overflowed, 1e10 s wrapped int64)
    assert Deadline(1e6, serving=False).ns == 10**15
    for bad in (1e300, 1e10, 1e6 + 1, float("inf"), True, "soon", [1]):
        with pytest.raises(UnsupportedConfigError, match="deadline_s"):
            Deadline.coerce(bad)


def test_abort_word_names_epoch_stage_origin_and_missing_peer():
    w = pack_abort(7, 3 | 1 << 15, 2, 5)
    assert unpack_abort(w) == (7, 3 | 1 << 15, 2, 5)
    err = error_from_word(1, w, 7, 0.5, {3: "ffn"})
    assert (err.rank, err.step, err.stage, err.missing_peer, err.deadline_s) == (1, 7, "ffn (confirm)", 5, 0.5)
    assert error_from_word(1, w, 8, 0.5) is None, "a word from an earlier step must not abort a later one"
    assert error_from_word(1, w, 6, 0.5) is not None, "a lagging rank must abort when peers gave up later"
    assert error_from_word(0, 0, 1, 0.5) is None
    with pytest.raises(ValueError, match="epoch=0"):
        pack_abort(0, 0, 0, 0)


@pytest.mark.interpreter
def test_lowlat_fault_env_parsing(monkeypatch):
    monkeypatch.delenv("LOWLAT_FAULT", raising=False)
    assert Fault.from_env().kind == FaultKind.NONE and not Fault.from_env().active
    monkeypatch.setenv("LOWLAT_FAULT", "late:rank=2,delay_ms=50,step=3")
    f = Fault.from_env()
    assert (f.kind, f.rank, f.delay_s, f.step) == (FaultKind.LATE, 2, 0.05, 3)
    assert f.kind_at(3) == FaultKind.LATE and f.kind_at(4) == FaultKind.NONE
    assert Fault.parse("wrong_epoch:rank=1").fires(99)
    for bad, field in [("sleepy:rank=1", "sleepy"), ("never:rank=x", "rank=x"), ("late:rank=1", "delay_s"),
                       ("never:bogus=1", "bogus")]:
        with pytest.raises(UnsupportedConfigError, match=field):
            Fault.parse(bad)
    with pytest.raises(UnsupportedConfigError, match="fault.rank"):
        EmulatedGroup(2, 576, max_rows=1, fault=Fault(FaultKind.NEVER, 2))
    for bad in ("late:rank=1,delay_ms=nan", "late:rank=1,delay_s=inf", "late:rank=1,delay_ms=-inf"):
        with pytest.raises(UnsupportedConfigError, match="fault.delay_s"):
            Fault.parse(bad)
    with pytest.raises(UnsupportedConfigError, match="fault.delay_s=True"):
        Fault(FaultKind.LATE, 1, delay_s=True)


@pytest.mark.parametrize("kind", ["never", "exit"])
def test_a_fault_nobody_can_miss_is_refused_in_a_group_of_one(kind, device):
    """world 1: no peer waits for the faulty rank, so a never / exit fault would return an unwritten
    output without error. The group refuses it, at construction and per call."""
    fault = Fault(FaultKind[kind.upper()], 0)
    with pytest.raises(UnsupportedConfigError, match=f"fault.kind='{kind}'"):
        EmulatedGroup(1, 576, max_rows=1, device=device, fault=fault)
    g = EmulatedGroup(1, 576, max_rows=1, device=device)
    out = poison(torch.empty(1, 1, 576, dtype=torch.bfloat16, device=device))
    with pytest.raises(UnsupportedConfigError, match=f"fault.kind='{kind}'"):
        g.all_reduce(make_partials(1, 1, 576, seed=0, device=device), out, fault=fault)
    assert g.epoch == 0


# ----------------------------------------------------------------------------------------------
# host protocol: real processes

HOST_WORLD, HOST_HIDDEN, HOST_ROWS = 3, 2048, 3      # 4 tiles of 512 columns
HOST_CASES = {
    "never": Fault(FaultKind.NEVER, 1, step=2),
    "late_beyond_deadline": Fault(FaultKind.LATE, 2, delay_s=1.5 * HOST_DEADLINE_S, step=2),
    "wrong_epoch": Fault(FaultKind.WRONG_EPOCH, 0, step=2),
    "exit_mid_step": Fault(FaultKind.EXIT, 1, step=2),
}


def _host_fault_body(rank: int, world: int, fault: Fault) -> list[tuple]:
    """Rank body: steps 1..3 (step 2 faulted); per step (epoch, status, payload, elapsed_s)."""
    g = HostGroup.from_process_group(HOST_HIDDEN, max_rows=HOST_ROWS, deadline=HOST_DEADLINE_S, fault=fault)
    log = []
    for step in (1, 2, 3):
        parts = make_partials(world, HOST_ROWS, HOST_HIDDEN, seed=step)
        status, payload, dt = timed_step(g.all_reduce, parts[rank])
        if status == "ok":
            assert_bits_equal("ordered_all_reduce", payload, reference(parts), output=f"step{step}")
            payload = None
        log.append((g.epoch, status, payload, dt))
    return log


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", sorted(HOST_CASES))
def test_host_fault_raises_on_every_rank_within_deadline(case):
    fault = HOST_CASES[case]
    outs = run_ranks(_host_fault_body, HOST_WORLD, fault, timeout_s=45)
    assert not any(o.hung for o in outs), "a rank process hung"
    survivors = [o for o in outs if not (case == "exit_mid_step" and o.rank == fault.rank)]
    if case == "exit_mid_step":
        assert outs[fault.rank].exitcode == EXIT_CODE and outs[fault.rank].value is None
    for o in survivors:
        assert o.exitcode == 0 and o.error is None, f"rank {o.rank}: {o.error}"
        epochs = [e for e, *_ in o.value]
        assert epochs == [1, 2, 3], f"rank {o.rank} ran collectives {epochs}"
        (_, s1, _, _), (_, s2, info, dt2), (_, s3, info3, _) = o.value
        assert s1 == "ok", f"rank {o.rank} step 1: {s1}"
        assert s2 == "timeout", f"rank {o.rank} did not raise at the faulted step"
        assert info["step"] == 2 and info["missing_peer"] == fault.rank and info["rank"] == o.rank, info
        budget = HOST_DEADLINE_S + HOST_MARGIN_S + (fault.delay_s if o.rank == fault.rank else 0.0)
        assert dt2 <= budget, f"rank {o.rank} raised after {dt2:.3f} s > {budget:.3f} s"
        if case == "exit_mid_step":   # the group lost a rank: the next step must time out, not hang
            assert s3 == "timeout" and info3["missing_peer"] == fault.rank
        else:
            assert s3 == "ok", f"rank {o.rank}: the step after the fault failed: {info3}"


@pytest.mark.timeout(60)
def test_host_late_arrival_inside_deadline_succeeds():
    fault = Fault(FaultKind.LATE, 1, delay_s=0.4 * HOST_DEADLINE_S, step=2)
    outs = run_ranks(_host_fault_body, HOST_WORLD, fault, timeout_s=45)
    for o in outs:
        assert o.exitcode == 0 and o.error is None, f"rank {o.rank}: {o.error}"
        assert [s for _, s, _, _ in o.value] == ["ok", "ok", "ok"], o.value
        assert o.value[1][3] >= fault.delay_s * 0.9 or o.rank != fault.rank


# ----------------------------------------------------------------------------------------------
# the Triton kernel on emulated ranks


def _emulated_fault_run(device, fault: Fault, *, world: int, rows: int, hidden: int, deadline_s: float,
                        warm: bool) -> tuple[EmulatedGroup, float, CollectiveTimeout | None, list]:
    """Steps 1..3 with `fault` at step 2 (plus, with warm, one faulted warm-up call first so the
    timed call does not include the kernel's compilation). Returns (group, faulted call's seconds,
    its error, [per-step (partials, out)])."""
    g = EmulatedGroup(world, hidden, max_rows=rows, device=device, deadline=deadline_s, spin_limit=8)
    if warm:
        with pytest.raises(CollectiveTimeout):
            g.all_reduce(make_partials(world, rows, hidden, 0, device=device), fault=Fault(fault.kind, fault.rank,
                         fault.delay_s))
        g.all_reduce(make_partials(world, rows, hidden, 0, device=device))
    steps, err, dt = [], None, 0.0
    for step in (1, 2, 3):
        parts = make_partials(world, rows, hidden, seed=step, device=device)
        out = poison(torch.empty_like(parts))
        f = fault if step == 2 else Fault()
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.monotonic()
        try:
            g.all_reduce(parts, out, fault=f)
        except CollectiveTimeout as e:
            err = e
            dt = time.monotonic() - t0
            if step != 2:
                raise
        steps.append((parts, out))
    return g, dt, err, steps


def _check_emulated_outcome(world, fault, err, steps):
    assert err is not None, "the faulted step did not raise"
    assert all(e is not None for e in err.per_rank), f"ranks that did not raise: {err.per_rank}"
    for r, e in enumerate(err.per_rank):
        assert (e.rank, e.step, e.missing_peer) == (r, err.step, fault.rank), str(e)
    for step, (parts, out) in zip((1, 3), (steps[0], steps[2])):
        for r in range(world):
            assert_bits_equal("ordered_all_reduce", out[r].cpu(), reference(parts), output=f"step{step}_rank{r}")


CPU_KINDS = {"never": Fault(FaultKind.NEVER, 1), "exit_mid_step": Fault(FaultKind.EXIT, 2),
             "wrong_epoch": Fault(FaultKind.WRONG_EPOCH, 0)}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", sorted(CPU_KINDS))
def test_emulated_fault_raises_on_every_rank_next_step_correct(case, device):
    """CPU: interpreter, deadline = 8 spins; GPU: real clock (the timed test is below)."""
    fault = CPU_KINDS[case]
    world, rows, hidden = 3, 2, 600 if device.type == "cpu" else 4096
    g, _, err, steps = _emulated_fault_run(device, fault, world=world, rows=rows, hidden=hidden,
                                           deadline_s=GPU_DEADLINE_S, warm=False)
    out1 = steps[0][1].clone()
    _check_emulated_outcome(world, fault, err, steps)
    assert_bits_equal("ordered_all_reduce", steps[0][1], out1, output="earlier_output_untouched")


def test_emulated_fault_from_lowlat_fault_env(monkeypatch, device):
    monkeypatch.setenv("LOWLAT_FAULT", "wrong_epoch:rank=2,step=2")
    g = EmulatedGroup(3, 600, max_rows=1, device=device, deadline=GPU_DEADLINE_S, spin_limit=8)
    parts = make_partials(3, 1, 600, seed=9, device=device)
    g.all_reduce(parts)
    with pytest.raises(CollectiveTimeout, match="peer 2"):
        g.all_reduce(parts)
    out = g.all_reduce(parts)
    assert_bits_equal("ordered_all_reduce", out[1].cpu(), reference(parts))


GPU_KINDS = {**CPU_KINDS, "late_beyond_deadline": Fault(FaultKind.LATE, 1, delay_s=4 * GPU_DEADLINE_S)}


@pytest.mark.gpu
@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", sorted(GPU_KINDS))
def test_emulated_gpu_fault_raises_within_deadline(case):
    fault = GPU_KINDS[case]
    world = 4
    g, dt, err, steps = _emulated_fault_run(torch.device("cuda"), fault, world=world, rows=8, hidden=4096,
                                            deadline_s=GPU_DEADLINE_S, warm=True)
    _check_emulated_outcome(world, fault, err, steps)
    assert dt <= GPU_DEADLINE_S + GPU_MARGIN_S, f"raised after {dt:.3f} s (deadline {GPU_DEADLINE_S} s)"


@pytest.mark.gpu
@pytest.mark.timeout(120)
def test_emulated_gpu_late_arrival_inside_deadline_succeeds():
    world, rows, hidden = 4, 8, 4096
    g = EmulatedGroup(world, hidden, max_rows=rows, device="cuda", deadline=GPU_DEADLINE_S)
    parts = make_partials(world, rows, hidden, seed=1, device="cuda")
    late = Fault(FaultKind.LATE, 2, delay_s=0.3 * GPU_DEADLINE_S)
    g.all_reduce(parts, fault=late)                                  # compile
    torch.cuda.synchronize()
    t0 = time.monotonic()
    out = g.all_reduce(parts, poison(torch.empty_like(parts)), fault=late)
    dt = time.monotonic() - t0
    assert dt >= 0.9 * late.delay_s, f"the late rank did not wait ({dt:.3f} s)"
    for r in range(world):
        assert_bits_equal("ordered_all_reduce", out[r].cpu(), reference(parts), output=f"rank{r}")
