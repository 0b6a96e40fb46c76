"""Rank agreement (lowlat.comm.agreement.agree) over real gloo processes: equal values pass through,
different values make EVERY rank raise RankDisagreement naming each rank's value (or return the same
fallback on every rank)."""

from __future__ import annotations

import pickle

import pytest

from lowlat.comm.agreement import RankDisagreement, agree, canonical
from lowlat.comm.host_protocol import run_ranks

pytestmark = pytest.mark.multi_gpu


def _agreement_body(rank: int, world: int) -> dict:
    import torch

    res: dict = {}
    res["same"] = agree(("decode", 8, (1, 2, 4, 8)), name="plan")
    res["tensor_same"] = agree(torch.arange(4), name="widths").tolist()
    try:
        agree(rank == 1, name="guard verdict")       # rank 1 says True, the others False
        res["differ"] = "no error"
    except RankDisagreement as e:
        res["differ"] = (e.name, e.values_by_rank, str(e))
    res["fallback"] = agree(8 if rank else 6, name="rows", fallback="general forward")
    try:
        agree(torch.tensor([rank]), name="tensor")
        res["tensor_differ"] = "no error"
    except RankDisagreement as e:
        res["tensor_differ"] = sorted(e.values_by_rank)
    # values == would call equal: 1 == True, a broadcast [3] == [1], int32 == int64 arrays
    import numpy as np

    differ = {"int_vs_bool": lambda: 1 if rank == 0 else True,
              "broadcast": lambda: torch.ones(3) if rank == 0 else torch.ones(1),
              "array_dtype": lambda: np.arange(3, dtype=np.int32 if rank == 2 else np.int64),
              "unpicklable": lambda: (lambda: 0) if rank == 1 else 0}
    for key, make in differ.items():
        try:
            agree(make(), name=key)
            res[key] = "no error"
        except RankDisagreement as e:
            res[key] = (sorted(e.values_by_rank), str(e).splitlines()[0][:200])
    # NaN equals NaN (scalars, tensors, inside containers), so equal plans with a NaN agree
    res["nan"] = repr(agree({"eps": float("nan"), "w": torch.tensor([1.0, float("nan")])}, name="nan")["eps"])
    return res


@pytest.mark.timeout(60)
def test_agree_raises_or_falls_back_on_every_rank():
    world = 3
    outs = run_ranks(_agreement_body, world, timeout_s=45)
    for o in outs:
        assert o.exitcode == 0 and o.error is None, f"rank {o.rank}: {o.error}"
        v = o.value
        assert v["same"] == ("decode", 8, (1, 2, 4, 8))
        assert v["tensor_same"] == [0, 1, 2, 3]
        name, values, msg = v["differ"]
        assert name == "guard verdict" and values == {0: False, 1: True, 2: False}
        assert "rank 0: False" in msg and "rank 1: True" in msg and "rank 2: False" in msg
        assert v["fallback"] == "general forward"
        assert v["tensor_differ"] == [0, 1, 2]
        for key in ("int_vs_bool", "broadcast", "array_dtype", "unpicklable"):
            assert v[key] != "no error", f"rank {o.rank}: {key} agreed"
            assert v[key][0] == [0, 1, 2], v[key]
        assert "unpicklable" in v["unpicklable"][1] and "rank 1" in v["unpicklable"][1], v["unpicklable"]
        assert v["nan"] == "nan"


def test_agree_without_a_process_group_is_the_identity():
    assert agree({"widths": [1, 2]}) == {"widths": [1, 2]}


def test_rank_disagreement_names_values_and_pickles():
    e = RankDisagreement({1: "b", 0: "a"}, "spec")
    assert str(e) == "ranks disagree on spec: rank 0: 'a', rank 1: 'b'"
    e2 = pickle.loads(pickle.dumps(e))
    assert e2.values_by_rank == {0: "a", 1: "b"} and e2.name == "spec"


def test_canonical_is_exact_and_type_aware():
    import numpy as np
    import torch

    same = [(float("nan"), float("nan")), ((1, "a", None), (1, "a", None)), ({"b": 1, "a": 2}, {"a": 2, "b": 1}),
            (torch.tensor([1.0, float("nan")]), torch.tensor([1.0, -float("nan")])),
            (np.array([np.nan, 2.0]), np.array([np.nan, 2.0])), ({3, 1}, {1, 3})]
    for a, b in same:
        assert canonical(a) == canonical(b), (a, b)
    differ = [(1, True), (1, 1.0), (0.0, -0.0), ((1, 2), [1, 2]), (torch.ones(3), torch.ones(1)),
              (torch.ones(2), torch.ones(2, dtype=torch.float64)), (torch.ones(2, 1), torch.ones(1, 2)),
              (np.arange(3, dtype=np.int32), np.arange(3, dtype=np.int64)), (torch.arange(3), np.arange(3))]
    for a, b in differ:
        assert canonical(a) != canonical(b), (a, b)
    with pytest.raises(Exception):
        canonical(lambda: 0)
