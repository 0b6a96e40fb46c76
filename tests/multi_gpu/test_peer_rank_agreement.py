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
from lowlat.comm.ordered_reduce import MAX_TAG_ROWS, PUSH, SUM, check_group_shape, make_tag, tag_rows
from lowlat.comm.testing import assert_bits_equal, make_partials, ranks_on_one_device, reference
from lowlat.errors import CollectiveTimeout, StepContractError, UnsupportedConfigError
from lowlat.numerics import poison

pytestmark = pytest.mark.multi_gpu
#: generous deadline (s): these calls must end by agreement or by a contract abort, never by a timeout
DEADLINE_S = 20.0


def _step(ranks, partials, outs):
    """One collective call on every rank, interleaved phase by phase (push on every rank, then sum)."""
    for r, pr in enumerate(ranks):
        pr.all_reduce(partials[r], outs[r], phases=PUSH, check=False)
    for r, pr in enumerate(ranks):
        pr.all_reduce(partials[r], outs[r], phases=SUM, check=False)
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


REFUSALS = {  # a call rank 2 refuses on the host, and the error it raises there
    "rows": (lambda p: torch.cat([p, p, p]), StepContractError, "rows M=9"),
    "dtype": (lambda p: p.float(), StepContractError, "dtype"),
    "hidden": (lambda p: p[:, :-1], StepContractError, r"\[M, 700\]"),
    "not_a_tensor": (lambda p: p.tolist(), StepContractError, "got list"),
    "stage": (None, UnsupportedConfigError, "stage=70000"),
}


@pytest.mark.parametrize("refusal", sorted(REFUSALS))
def test_a_call_refused_on_one_rank_aborts_its_peers_at_once(refusal, device):
    world, hidden = 3, 700
    ranks = ranks_on_one_device(world, hidden, max_rows=6, device=device, deadline=DEADLINE_S)
    _good_step(ranks, 3, hidden, seed=5, device=device)
    parts = make_partials(world, 3, hidden, seed=6, device=device)
    bad, exc, match = REFUSALS[refusal]
    with pytest.raises(exc, match=match):
        if bad is None:
            ranks[2].all_reduce(parts[2], stage=70000)
        else:
            ranks[2].all_reduce(bad(parts[2]))
    outs = [poison(torch.empty_like(parts[r])) for r in range(2)]
    for r in range(2):      # called after the refusal: rank 1 has not even pushed when rank 0 waits
        with pytest.raises(StepContractError, match="rank 2 refused its call") as ei:
            ranks[r].all_reduce(parts[r], outs[r])
        assert (ei.value.field, ei.value.peer, ei.value.value[2], ei.value.step) == ("rows", 2, 0, 2)
        assert outs[r].isnan().all()
    assert [pr.epoch for pr in ranks] == [2] * world, "the refused call must consume its step on its rank"
    _good_step(ranks, 6, hidden, seed=7, device=device)


def test_tags_and_contract_words():
    assert make_tag(5, 3, 48) == 5 << 32 | 48 << 20 | 3
    assert tag_rows(make_tag(5, 0, 48), 5) == 48 and tag_rows(make_tag(5, 0, 0), 5) == 0
    assert tag_rows(make_tag(4, 0, 48), 5) is None, "a flag of another step carries no rows for this one"
    assert make_tag(5, 3, MAX_TAG_ROWS, done=True) >> 32 == 5, "rows must not spill into the epoch"
    with pytest.raises(UnsupportedConfigError, match="max_rows"):
        check_group_shape(2, MAX_TAG_ROWS + 1, 256, torch.bfloat16)
    word = pack_abort(9, 2 | CONTRACT_STAGE_BIT, 0, 1)
    err = error_from_word(1, word, 9, 5.0, {2: "ffn"}, {0: 4, 1: 6})
    assert isinstance(err, StepContractError) and (err.rank, err.step, err.peer, err.origin_rank) == (1, 9, 1, 0)
    assert "'ffn'" in str(err) and "{0: 4, 1: 6}" in str(err)
    assert "rank 1 refused" in str(error_from_word(0, word, 9, 5.0, None, {0: 4, 1: 0}))
    assert "other rows" in str(error_from_word(0, word, 9, 5.0))
    assert isinstance(error_from_word(0, pack_abort(9, 2, 0, 1), 9, 5.0), CollectiveTimeout)
    assert error_from_word(0, word, 10, 5.0) is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU: two ranks' launches running at once")
@pytest.mark.parametrize("case", ["refusal", "rows"])
def test_gpu_a_spinning_rank_sees_its_peers_disagreement(case):
    """Rank 0's whole call (push, wait, sum, confirm) is launched first and spins on its stream; rank 1's
    refusal (or its call of other rows) follows on another stream and must end rank 0's wait."""
    world, hidden = 2, 4096
    ranks = ranks_on_one_device(world, hidden, max_rows=8, device="cuda", deadline=DEADLINE_S, confirm=True,
                                tiles_cap=8)
    parts = make_partials(world, 8, hidden, seed=8, device="cuda")
    for _ in range(2):          # compile, both parities; whole calls, each rank on its own stream
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
