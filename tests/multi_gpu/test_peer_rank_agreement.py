"""The ranks of a `PeerGroup` agree on each call on the device: a flag's tag carries the call's rows M,
so ranks passing different M, or one rank refusing its call on the host, end every rank's wait at once
with `StepContractError` (never a sum over rows a peer did not push, never a wait to the deadline), and
the next step is aligned.

`PeerRank` is `PeerGroup`'s per-rank logic over any buffers; `ranks_on_one_device` gives each rank its
own epoch counter over one device's buffers, as separate processes have. Under the CPU interpreter a
call runs its phases in order, so the ranks' calls are interleaved phase by phase (`phases=PUSH`, then
`phases=SUM`); on one GPU the same interleaving runs as it is, and the last test launches the ranks on
separate streams so that a rank already spinning sees its peer's refusal.
"""

from __future__ import annotations

import pytest
import torch

from lowlat.comm.deadline import CONTRACT_STAGE_BIT, error_from_word, pack_abort
from lowlat.comm.ordered_reduce import (CONFIRM_PUBLISH, CONFIRM_WAIT, MAX_TAG_ROWS, PUSH, SUM, check_group_shape,
                                        launch_all_reduce, make_tag, tag_rows)
from lowlat.comm.testing import assert_bits_equal, make_partials, ranks_on_one_device, reference
from lowlat.errors import CollectiveTimeout, StepContractError, UnsupportedConfigError
from lowlat.numerics import poison

pytestmark = pytest.mark.multi_gpu
#: generous deadline (s): these calls must end by agreement or by a contract abort, never by a timeout
DEADLINE_S = 20.0


def _step(ranks, partials, outs):
    """One collective call on every rank, interleaved phase by phase (push on every rank, then sum, then
    the confirm round's wait where the ranks run it)."""
    phases = [PUSH, SUM | CONFIRM_PUBLISH] + ([CONFIRM_WAIT] if ranks[0].confirm else [])
    for ph in phases:
        for r, pr in enumerate(ranks):
            pr.all_reduce(partials[r], outs[r], phases=ph, check=False)
    return [pr.status() for pr in ranks]


def _good_step(ranks, rows, hidden, seed, device):
    parts = make_partials(len(ranks), rows, hidden, seed, device=device)
    outs = [poison(torch.empty_like(p)) for p in parts]
    assert _step(ranks, parts, outs) == [None] * len(ranks)
    for r, o in enumerate(outs):
        assert_bits_equal("ordered_all_reduce", o.cpu(), reference(parts), output=f"rank{r}")


@pytest.mark.parametrize("world,hidden", [(2, 300), (3, 700)])
def test_peer_ranks_bitwise_equal_across_rows_and_parities(world, hidden, device):
    """Every rank its own epoch counter; M changes from step to step (3, 5, 3: a parity's flags left by
    a step of other rows two steps back must not read as a disagreement)."""
    ranks = ranks_on_one_device(world, hidden, max_rows=6, device=device, deadline=DEADLINE_S)
    for step, rows in enumerate((3, 5, 3, 1)):
        _good_step(ranks, rows, hidden, seed=10 * world + step, device=device)
    assert [pr.epoch for pr in ranks] == [4] * world
    assert [int(pr.bufs.epoch.item()) for pr in ranks] == [4] * world


def test_ranks_passing_different_rows_raise_on_every_rank_and_stay_aligned(device):
    world, hidden = 3, 700
    ranks = ranks_on_one_device(world, hidden, max_rows=6, device=device, deadline=DEADLINE_S)
    _good_step(ranks, 2, hidden, seed=1, device=device)
    full = make_partials(world, 5, hidden, seed=2, device=device)
    parts = [full[0, :3], full[1, :3], full[2]]         # rank 2 passes M=5, the others M=3
    outs = [poison(torch.empty_like(p)) for p in parts]
    errs = _step(ranks, parts, outs)
    for r, e in enumerate(errs):
        assert isinstance(e, StepContractError), f"rank {r}: {e!r} (a rows mismatch must not wait for a timeout)"
        assert (e.rank, e.step, e.field, e.value) == (r, 2, "rows", {0: 3, 1: 3, 2: 5})
        assert "different rows" in str(e) and "{0: 3, 1: 3, 2: 5}" in str(e)
    for r, o in enumerate(outs):
        assert o.isnan().all(), f"rank {r} wrote an output for a step its peers disagreed on"
    _good_step(ranks, 4, hidden, seed=3, device=device)    # the next step is aligned
    _good_step(ranks, 5, hidden, seed=4, device=device)


REFUSALS = {  # a call rank 2 refuses on the host, the error it raises there and its field
    "rows": (lambda p: torch.cat([p, p, p]), StepContractError, r"^rank \d, step \d: rows M=\d+ must be in 1\.\.",
             "rows"),
    "dtype": (lambda p: p.float(), StepContractError, "dtype torch.float32 != group dtype torch.bfloat16", "partial"),
    "hidden": (lambda p: p[:, :-1], StepContractError, r"\[M, 700\]", "partial"),
    "not_a_tensor": (lambda p: p.tolist(), StepContractError, "got list", "partial"),
    "strides": (lambda p: p.t().contiguous().t(), StepContractError, "contiguous in the hidden dim", "partial"),
    "sparse": (lambda p: p.to_sparse(), StepContractError, "must be a strided", "partial"),
    "out_overlaps": ("overlap", StepContractError, "out overlaps inp", "out"),
    "out_in_the_group": ("group", StepContractError, "out overlaps the group's receive buffers", "out"),
    "stage": (None, UnsupportedConfigError, r"stage=70000.*\(rank 2, step 2\)", "stage"),
}


def _refuse(pr, case, part, **kw):
    bad, exc, match, field = REFUSALS[case]
    with pytest.raises(exc, match=match) as ei:
        if bad is None:
            pr.all_reduce(part, stage=70000, **kw)
        elif bad == "group":            # out inside the group's own receive buffers (the peers push there)
            pr.all_reduce(part, pr.data[pr.rank, 0, 0, :part.shape[0]], **kw)
        elif bad == "overlap":          # out one column off the partial: a tile would overwrite the next one's input
            buf = torch.cat([part, part[:, :1]], dim=1)
            pr.all_reduce(buf[:, :-1], buf[:, 1:], **kw)
        else:
            pr.all_reduce(bad(part), **kw)
    assert ei.value.field == field, (case, ei.value.field)


@pytest.mark.parametrize("refusal", sorted(REFUSALS))
def test_a_call_refused_on_one_rank_aborts_its_peers_at_once(refusal, device):
    world, hidden = 3, 700
    ranks = ranks_on_one_device(world, hidden, max_rows=6, device=device, deadline=DEADLINE_S)
    _good_step(ranks, 3, hidden, seed=5, device=device)
    parts = make_partials(world, 3, hidden, seed=6, device=device)
    _refuse(ranks[2], refusal, parts[2], phases=PUSH)          # publishes its rows-0 flags
    outs = [poison(torch.empty_like(parts[r])) for r in range(2)]
    for r in range(2):      # whole calls after the refusal: rank 1 has not even pushed when rank 0 waits
        with pytest.raises(StepContractError, match="rank 2 refused the call") as ei:
            ranks[r].all_reduce(parts[r], outs[r])
        assert (ei.value.field, ei.value.peer, ei.value.value[2], ei.value.step) == ("partial", 2, 0, 2)
        assert outs[r].isnan().all()
    _refuse(ranks[2], refusal, parts[2], phases=SUM)           # the refusal's wait: every flag is there
    assert [type(pr.status()) for pr in ranks] == [StepContractError] * world, "no rank may time out"
    assert [pr.epoch for pr in ranks] == [2] * world, "the refused call must consume its step on its rank"
    _good_step(ranks, 6, hidden, seed=7, device=device)


def test_a_refused_call_waits_for_its_peers_flags(device):
    """The refusing rank's next call must not start before every peer pushed the refused step (else it could
    overwrite slots a peer still reads for the step before): its wait ends only when every peer's flag is there,
    or at the deadline. Under the interpreter a refusal made before any peer called therefore times out (the spin
    limit), naming the first peer not seen."""
    world, hidden = 3, 300
    ranks = ranks_on_one_device(world, hidden, max_rows=4, device=device, deadline=DEADLINE_S)
    _good_step(ranks, 2, hidden, seed=1, device=device)
    if device.type == "cuda":
        pytest.skip("on a GPU the refusal's wait spins to the deadline when no peer calls: the streams test covers it")
    _refuse(ranks[1], "rows", make_partials(world, 3, hidden, seed=2, device=device)[1])
    err = ranks[1].status()
    assert isinstance(err, CollectiveTimeout) and (err.origin_rank, err.missing_peer) == (1, 0), repr(err)


@pytest.mark.parametrize("confirm", [True, False])
def test_a_late_status_read_of_a_completed_step(confirm, device):
    """Rank 2 reads its status for step 1 only after the others went on and aborted step 2 (rank 0 refused it).
    With the confirm round nobody could reach step 3 before rank 2 had read step 2's slots, so its completed step
    stands (None); without it a later abort may have overwritten them, so the read reports that abort (never a
    silent wrong result; here the output happens to be right)."""
    world, hidden = 3, 300
    ranks = ranks_on_one_device(world, hidden, max_rows=4, device=device, deadline=DEADLINE_S, confirm=confirm)
    parts = make_partials(world, 3, hidden, seed=3, device=device)
    outs = [poison(torch.empty_like(p)) for p in parts]
    phases = [PUSH, SUM | CONFIRM_PUBLISH] + ([CONFIRM_WAIT] if confirm else [])
    for ph in phases:
        for r, pr in enumerate(ranks):
            pr.all_reduce(parts[r], outs[r], phases=ph, check=False)
    assert ranks[0].status() is None and ranks[1].status() is None
    _refuse(ranks[0], "rows", parts[0], phases=PUSH)
    with pytest.raises(StepContractError, match="rank 0 refused"):
        ranks[1].all_reduce(parts[1])
    late = ranks[2].status()
    if confirm:
        assert late is None, f"a later step's abort failed a step this rank completed: {late!r}"
    else:
        assert isinstance(late, StepContractError) and "(aborted with step 2, a later step)" in str(late), late
    assert_bits_equal("ordered_all_reduce", outs[2].cpu(), reference(parts), output="rank2")
    with pytest.raises(StepContractError, match="rank 0 refused"):
        ranks[2].all_reduce(parts[2])
    _refuse(ranks[0], "rows", parts[0], phases=SUM)
    _good_step(ranks, 4, hidden, seed=4, device=device)


def test_a_replayed_call_that_failed_is_not_taken_for_a_completed_step(device):
    """A launch made past the host's epoch (a CUDA-graph replay bumps the device counter only) that failed must
    not read as "completed" through the failed-epoch word being newer than the host's step."""
    world, hidden = 2, 300
    ranks = ranks_on_one_device(world, hidden, max_rows=4, device=device, deadline=DEADLINE_S, confirm=True,
                                spin_limit=16)
    _good_step(ranks, 2, hidden, seed=8, device=device)
    pr = ranks[1]
    part = make_partials(world, 2, hidden, seed=9, device=device)[1]
    pr.bufs.epoch.add_(1)                         # as a replay would; rank 0 never calls: a timeout
    launch_all_reduce(pr.bufs, part[None], poison(torch.empty_like(part))[None], rank_base=1, ranks=1, stage=0,
                      deadline_ns=pr.deadline.ns, fault_kind=pr.fault.kind, fault_rank=0, tiles_cap=pr.tiles_cap,
                      confirm=True, spin_limit=16)
    assert int(pr.ctrl[1]) == pr.epoch + 1, "the failed launch must record its epoch"
    assert isinstance(pr.status(), CollectiveTimeout), "a failure newer than the host's step hidden"


def test_legitimate_layouts_are_not_refused_and_aliases_through_another_storage_are(device):
    """Exact row spans: partial and out as the two halves of one [M, 2H] buffer share no byte (accepted); an out
    one column off the partial through a second storage object over the same memory is refused."""
    world, hidden = 2, 300
    ranks = ranks_on_one_device(world, hidden, max_rows=4, device=device, deadline=DEADLINE_S)
    parts = make_partials(world, 3, hidden, seed=10, device=device)
    bufs = [torch.cat([p, poison(torch.empty_like(p))], dim=1) for p in parts]       # [M, 2H]: partial | out
    assert _step(ranks, [b[:, :hidden] for b in bufs], [b[:, hidden:] for b in bufs]) == [None, None]
    for r, b in enumerate(bufs):
        assert_bits_equal("ordered_all_reduce", b[:, hidden:].cpu(), reference(parts), output=f"halves_rank{r}")
    if device.type == "cpu":
        base = torch.cat([parts[0], parts[0][:, :1]], dim=1)
        alias = torch.from_numpy(base.view(torch.int16).numpy()).view(torch.bfloat16)[:, 1:]
        with pytest.raises(StepContractError, match="out overlaps inp"):
            ranks[0].all_reduce(base[:, :-1], alias, phases=PUSH)


def test_tags_and_contract_words(device):
    assert make_tag(5, 3, 48) == 5 << 32 | 48 << 20 | 3
    assert tag_rows(make_tag(5, 0, 48), 5) == 48 and tag_rows(make_tag(5, 0, 0), 5) == 0
    assert tag_rows(make_tag(4, 0, 48), 5) is None, "a flag of another step carries no rows for this one"
    assert make_tag(5, 3, MAX_TAG_ROWS, done=True) >> 32 == 5, "rows must not spill into the epoch"
    with pytest.raises(UnsupportedConfigError, match="max_rows"):
        check_group_shape(2, MAX_TAG_ROWS + 1, 256, torch.bfloat16)
    pr = ranks_on_one_device(2, 128, max_rows=4, device=device)[0]      # PeerRank checks hand-built buffers too
    pr.bufs.max_rows = MAX_TAG_ROWS + 1
    with pytest.raises(UnsupportedConfigError, match="max_rows"):
        type(pr)(pr.bufs, pr.ctrl, 0, deadline=1.0, fault=pr.fault, confirm=False, tiles_cap=4)
    word = pack_abort(9, 2 | CONTRACT_STAGE_BIT, 0, 1)
    err = error_from_word(1, word, 9, 5.0, {2: "ffn"}, {0: 4, 1: 6})
    assert isinstance(err, StepContractError) and (err.rank, err.step, err.peer, err.origin_rank) == (1, 9, 1, 0)
    assert err.field == "rows" and "'ffn'" in str(err) and "{0: 4, 1: 6}" in str(err)
    refused = error_from_word(0, word, 9, 5.0, None, {0: 4, 1: 0})
    assert "rank 1 refused" in str(refused) and (refused.field, refused.peer) == ("partial", 1)
    both = error_from_word(0, word, 9, 5.0, None, {0: 4, 1: 0, 2: 0, 3: 6})
    assert "ranks [1, 2] refused" in str(both) and "differ too" in str(both) and both.peer == 1
    odd = error_from_word(2, pack_abort(9, 2 | CONTRACT_STAGE_BIT, 0, 1), 9, 5.0, None, {0: 5, 1: 3, 2: 3, 3: 3})
    assert odd.peer == 0, "the odd rank out, not the first rank the word's origin saw differ"
    assert "other rows" in str(error_from_word(0, word, 9, 5.0))
    assert isinstance(error_from_word(0, pack_abort(9, 2, 0, 1), 9, 5.0), CollectiveTimeout)
    assert error_from_word(0, word, 10, 5.0) is None
    # a later step's word: fatal unless the caller knows its own step completed
    assert "step 9, a later step" in str(error_from_word(0, word, 8, 5.0, completed=False))
    assert error_from_word(0, word, 8, 5.0, completed=True) is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU: two ranks' launches running at once")
@pytest.mark.parametrize("case", ["refusal", "rows"])
def test_gpu_a_spinning_rank_sees_its_peers_disagreement(case):
    """Rank 0's whole call (push, wait, sum, confirm) is launched first and spins on its stream; rank 1's
    refusal (or its call of other rows) follows on another stream and must end rank 0's wait."""
    world, hidden = 2, 4096
    ranks = ranks_on_one_device(world, hidden, max_rows=8, device="cuda", deadline=DEADLINE_S, confirm=True,
                                tiles_cap=8)
    for pr in ranks:        # no call may load a kernel while a peer's launch spins in this process (preload)
        pr.preload([8, 5])
    parts = make_partials(world, 8, hidden, seed=8, device="cuda")
    for _ in range(2):          # both parities; whole calls, each rank on its own stream
        outs = [poison(torch.empty_like(p)) for p in parts]
        streams = [torch.cuda.Stream() for _ in ranks]
        for r, pr in enumerate(ranks):
            with torch.cuda.stream(streams[r]):
                pr.all_reduce(parts[r], outs[r], check=False)
        torch.cuda.synchronize()
        assert [pr.status() for pr in ranks] == [None, None]
        for r in range(world):
            assert_bits_equal("ordered_all_reduce", outs[r].cpu(), reference(parts), output=f"rank{r}")
    outs = [poison(torch.empty_like(p)) for p in parts]
    s0, s1 = torch.cuda.Stream(), torch.cuda.Stream()
    with torch.cuda.stream(s0):
        ranks[0].all_reduce(parts[0], outs[0], check=False)
    with torch.cuda.stream(s1):
        if case == "refusal":
            with pytest.raises(StepContractError):
                ranks[1].all_reduce(parts[1][:, :100])
        else:
            ranks[1].all_reduce(parts[1][:5], outs[1][:5], check=False)
    torch.cuda.synchronize()
    errs = [pr.status() for pr in ranks]
    want = {0: 8, 1: 0 if case == "refusal" else 5}
    for r, e in enumerate(errs):
        assert isinstance(e, StepContractError) and e.value == want, f"rank {r}: {e!r}"
    assert outs[0].isnan().all()
    outs = [poison(torch.empty_like(p)) for p in parts]
    for r, pr in enumerate(ranks):
        with torch.cuda.stream((s0, s1)[r]):
            pr.all_reduce(parts[r], outs[r], check=False)
    torch.cuda.synchronize()
    assert [pr.status() for pr in ranks] == [None, None], "the step after the disagreement must be aligned"
    for r in range(world):
        assert_bits_equal("ordered_all_reduce", outs[r].cpu(), reference(parts), output=f"after_rank{r}")


def test_preload_takes_each_row_count_once_and_refuses_what_is_not_a_sequence_of_row_counts(monkeypatch, device):
    """`PeerRank.preload`'s GPU path, its launches recorded (the interpreter loads nothing): the refusal's variant,
    then each M's call variant, from a list or a generator alike (a generator used to be spent by the validation,
    preloading no call); an int, a string, None, or an M outside 1..max_rows is refused by name before any load;
    tiles_cap / spin_limit (which the GPU path's preload uses at construction) are checked there.
    The group lives on the worker's device: one on the CPU is refused without the interpreter (session 36's GPU
    run)."""
    import lowlat.comm.peer_buffers as pb

    pr = ranks_on_one_device(2, 128, max_rows=4, device=device)[0]
    for name in ("tiles_cap", "spin_limit"):
        with pytest.raises(UnsupportedConfigError, match=name):
            type(pr)(pr.bufs, pr.ctrl, 0, deadline=1.0, fault=pr.fault, confirm=False,
                     **{"tiles_cap": 4, "spin_limit": 64, name: 0})
    loads = []
    monkeypatch.setattr(pb, "interpreting", lambda: False)
    monkeypatch.setattr(pb.torch.cuda, "device", lambda d: __import__("contextlib").nullcontext())
    monkeypatch.setattr(pb, "publish_refusal", lambda *a, **kw: loads.append(("refusal", kw["load_only"])))
    monkeypatch.setattr(pb, "launch_all_reduce", lambda b, part, out, **kw: loads.append((part.shape[1],
                                                                                           kw["load_only"])))
    pr.preload([2, 4])
    pr.preload(m for m in (3,))
    assert loads == [("refusal", True), (2, True), (4, True), ("refusal", True), (3, True)]
    for bad in (8, "12", "", None, [0], [5], [True], [2.0]):
        loads.clear()
        with pytest.raises(UnsupportedConfigError, match="rows"):
            pr.preload(bad)
        assert loads == [], bad


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="kernel loads happen only on a GPU")
def test_gpu_preloaded_ranks_load_no_kernel_in_their_calls_and_refusals(device):
    """After `preload`, no call of a preloaded M and no refusal loads a kernel (Triton's load hook): ranks sharing
    a process whose call loaded a module while a peer's launch spun timed out (session 34: a 20 s deadline)."""
    from triton import knobs

    world, hidden = 3, 4096
    ranks = ranks_on_one_device(world, hidden, max_rows=8, device=device, deadline=DEADLINE_S, confirm=True,
                                tiles_cap=8)
    for pr in ranks:
        pr.preload([8, 3])
    with pytest.raises(UnsupportedConfigError, match="rows"):
        ranks[0].preload([9])
    parts = make_partials(world, 8, hidden, seed=12, device=device)
    streams = [torch.cuda.Stream(device) for _ in ranks]
    loads, hook = [], knobs.runtime.kernel_load_start_hook
    knobs.runtime.kernel_load_start_hook = lambda module, function, name, *rest: loads.append(name)
    try:
        for m in (8, 3, 8):
            outs = [poison(torch.empty_like(p[:m])) for p in parts]
            for r, pr in enumerate(ranks):
                with torch.cuda.stream(streams[r]):
                    pr.all_reduce(parts[r][:m], outs[r], check=False)
            torch.cuda.synchronize(device)
            assert [pr.status() for pr in ranks] == [None] * world
            for r in range(world):
                assert_bits_equal("ordered_all_reduce", outs[r].cpu(), reference(parts[:, :m]), output=f"m{m}_{r}")
        for r, pr in enumerate(ranks):
            with torch.cuda.stream(streams[r]):
                if r == 1:
                    with pytest.raises(StepContractError):
                        pr.all_reduce(parts[r][:, :100])
                else:
                    pr.all_reduce(parts[r], check=False)
        torch.cuda.synchronize(device)
    finally:
        knobs.runtime.kernel_load_start_hook = hook
    assert all(isinstance(pr.status(), StepContractError) for pr in ranks)
    assert loads == [], f"kernels loaded during the calls: {loads}"


def test_a_step_this_rank_did_not_complete_still_fails_after_a_later_abort_overwrote_its_word(device):
    """Rank 1's step 1 was aborted (rank 0 refused it) but rank 1 reads its status only after step 2's abort
    replaced the abort word: its own programs recorded that step 1 did not complete (the failed-epoch word),
    so it still raises, naming the later abort."""
    if device.type == "cuda":
        pytest.skip("rank 1's whole call waits for rank 2, whose call follows on the same stream: on a GPU it spins to "
                    "the deadline (session 34's H100); the GPU tests run such ranks on separate streams")
    world, hidden = 3, 300
    ranks = ranks_on_one_device(world, hidden, max_rows=4, device=device, deadline=DEADLINE_S)
    parts = make_partials(world, 2, hidden, seed=5, device=device)
    _refuse(ranks[0], "rows", parts[0], phases=PUSH)
    out1 = poison(torch.empty_like(parts[1]))
    ranks[1].all_reduce(parts[1], out1, check=False)
    with pytest.raises(StepContractError):
        ranks[2].all_reduce(parts[2])
    _refuse(ranks[0], "rows", parts[0], phases=SUM)
    _refuse(ranks[2], "rows", parts[2], phases=PUSH)          # step 2: rank 2 refuses, rank 0 sees it first
    with pytest.raises(StepContractError, match="rank 2 refused"):
        ranks[0].all_reduce(parts[0])
    err = ranks[1].status()
    assert isinstance(err, StepContractError) and err.step == 1 and "step 2, a later step" in str(err), repr(err)
    assert out1.isnan().all()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU: three ranks' launches running at once")
def test_gpu_a_rank_that_saw_a_disagreement_ends_its_step_only_after_every_peer_pushed():
    """World 3: rank 0's call spins (stream 0) and rank 2 refuses (stream 2) while rank 1 has not called. Rank 0
    sees the refusal at once but must not end its step before rank 1 pushed (else its next call could overwrite
    slots rank 1 still reads for the step before): its stream is still busy 0.3 s later; rank 1's call ends it."""
    import time

    world, hidden = 3, 4096
    ranks = ranks_on_one_device(world, hidden, max_rows=8, device="cuda", deadline=DEADLINE_S, tiles_cap=8)
    for pr in ranks:
        pr.preload([8])
    parts = make_partials(world, 8, hidden, seed=11, device="cuda")
    streams = [torch.cuda.Stream() for _ in ranks]

    def call(r, part, out):
        with torch.cuda.stream(streams[r]):
            return ranks[r].all_reduce(part, out, check=False)

    for _ in range(2):          # both parities
        outs = [poison(torch.empty_like(p)) for p in parts]
        for r in range(world):
            call(r, parts[r], outs[r])
        torch.cuda.synchronize()
        assert [pr.status() for pr in ranks] == [None] * world
    with torch.cuda.stream(streams[2]):
        with pytest.raises(StepContractError):
            ranks[2].all_reduce(parts[2][:, :100])                  # a first disagreed step
    outs = [poison(torch.empty_like(p)) for p in parts]
    call(1, parts[1], outs[1])
    call(0, parts[0], outs[0])
    torch.cuda.synchronize()                                        # that step, aborted, done everywhere
    outs = [poison(torch.empty_like(p)) for p in parts]
    call(0, parts[0], outs[0])
    with torch.cuda.stream(streams[2]):
        with pytest.raises(StepContractError):
            ranks[2].all_reduce(parts[2][:, :100])
    time.sleep(0.3)
    assert not streams[0].query(), "rank 0 ended a disagreed step before rank 1 had pushed it"
    call(1, parts[1], outs[1])
    torch.cuda.synchronize()
    errs = [pr.status() for pr in ranks]
    assert all(isinstance(e, StepContractError) and e.peer == 2 for e in errs[:2]), errs
    assert outs[0].isnan().all() and outs[1].isnan().all()
    outs = [poison(torch.empty_like(p)) for p in parts]
    for r in range(world):
        call(r, parts[r], outs[r])
    torch.cuda.synchronize()
    assert [pr.status() for pr in ranks] == [None] * world, "the step after the disagreement must be aligned"
    for r in range(world):
        assert_bits_equal("ordered_all_reduce", outs[r].cpu(), reference(parts), output=f"after_rank{r}")


@pytest.mark.timeout(120)
def test_a_disagreed_step_with_the_confirm_round_in_one_launch_does_not_wait_for_done_flags(device):
    """On the GPU one launch runs the wait, the sum and the confirm round; nobody publishes a done flag for a step
    that failed, so a block that saw the disagreement must not wait for done flags (it would spin to the deadline).
    Here the GPU's single launch runs under the interpreter too, with a spin limit that would take minutes."""
    world, hidden = 2, 300
    ranks = ranks_on_one_device(world, hidden, max_rows=4, device=device, deadline=DEADLINE_S, confirm=True,
                                spin_limit=10 ** 7)
    _good_step(ranks, 2, hidden, seed=12, device=device)
    full = make_partials(world, 3, hidden, seed=13, device=device)
    parts = [full[0, :2], full[1]]
    outs = [poison(torch.empty_like(p)) for p in parts]
    for r, pr in enumerate(ranks):
        pr.all_reduce(parts[r], outs[r], phases=PUSH, check=False)
    for r, pr in enumerate(ranks):          # one launch: wait + sum + confirm publish + confirm wait
        pr.all_reduce(parts[r], outs[r], phases=SUM | CONFIRM_PUBLISH | CONFIRM_WAIT, check=False)
    errs = [pr.status() for pr in ranks]
    assert all(isinstance(e, StepContractError) and e.value == {0: 2, 1: 3} for e in errs), errs
    assert all(o.isnan().all() for o in outs)
    _good_step(ranks, 3, hidden, seed=14, device=device)


def test_an_older_steps_flag_of_other_rows_reads_as_not_arrived_not_as_a_disagreement(device):
    """Flags are double-buffered by parity: when rank 0 waits at step 3, rank 1's flag in that parity may still be
    step 1's, of other rows. It must read as "not arrived" (here, with rank 1 not calling, a timeout at the spin
    limit naming rank 1), never as a disagreement of step 3."""
    if device.type == "cuda":
        pytest.skip("a rank calling alone on a GPU spins to the deadline")
    world, hidden = 2, 300
    ranks = ranks_on_one_device(world, hidden, max_rows=6, device=device, deadline=DEADLINE_S, spin_limit=8)
    _good_step(ranks, 5, hidden, seed=15, device=device)           # step 1: rows 5 (parity 1)
    _good_step(ranks, 3, hidden, seed=16, device=device)           # step 2: rows 3 (parity 0)
    part = make_partials(world, 3, hidden, seed=17, device=device)[0]
    ranks[0].all_reduce(part, check=False)
    err = ranks[0].status()
    assert isinstance(err, CollectiveTimeout) and err.missing_peer == 1, repr(err)


def test_an_overlap_of_one_element_is_refused(device):
    """The byte-range fast path of the overlap checks must count the last element: an output whose first element
    is the partial's last one is refused (the exact row spans decide)."""
    world, hidden = 2, 300
    ranks = ranks_on_one_device(world, hidden, max_rows=4, device=device, deadline=DEADLINE_S)
    base = make_partials(world, 1, 2 * hidden, seed=18, device=device)[0]        # [1, 2H]
    with pytest.raises(StepContractError, match="out overlaps inp"):
        ranks[0].all_reduce(base[:, :hidden], base[:, hidden - 1:2 * hidden - 1], phases=PUSH)
