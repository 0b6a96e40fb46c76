"""Rank agreement of the plugin contract, with real processes: 3 ranks in a gloo group on localhost
(lowlat.comm.host_protocol.run_ranks), CPU only.

Every decision a rank makes before a collective -- which spec it found, its guard verdict, the widths
it built, the step it planned -- is agreed over the group (lowlat.comm.agreement.agree). Any
difference refuses (build) or falls back (step) on EVERY rank, naming each rank's value; a rank never
enters a collective alone. The fused runner here performs an all-reduce each step, so a rank that
went fused alone would hang in it (and the gloo timeout / run_ranks' kill would fail the test).
Rank-local faults (a step invalid on one rank, a guard or spec lookup raising on one rank) are
agreed the same way: every rank gets the same typed error or refusal, naming the rank.
"""

from __future__ import annotations

import dataclasses
import sys
import types

import pytest
import torch
import torch.distributed as dist

from lowlat.comm.host_protocol import run_ranks
from lowlat.config import ModelConfig
from lowlat.errors import StepContractError
from lowlat.runtime import contract
from lowlat.step import StepBatch
from lowlat.weights import random_model_weights

pytestmark = [pytest.mark.multi_gpu, pytest.mark.timeout(240)]

WORLD = 3
TIMEOUT_S = 60.0
H200 = contract.DeviceFacts("sm_90", 132, "NVIDIA H200")
# 3 KV heads: TP 3 holds one per rank. The spec below accepts tp_size 3 (lowlat's own claims only 1).
HF = dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=96, num_hidden_layers=1,
          num_attention_heads=6, num_key_value_heads=3, head_dim=64, intermediate_size=192, vocab_size=64,
          tie_word_embeddings=True)
SPEC = dataclasses.replace(contract.LLAMA, name="lowlat-test-tp3", tp_sizes=frozenset({WORLD}))
MODULE = "lowlat_test_rank_specs"
REGISTRY = {"LlamaForCausalLM": f"{MODULE}:SPEC"}


def _install_specs(present: bool, spec: contract.LowlatSpec = SPEC) -> None:
    """The spec module as this rank sees it: present (holding `spec`), or missing (a broken install
    on one rank)."""
    if present:
        mod = types.ModuleType(MODULE)
        mod.SPEC = spec
        sys.modules[MODULE] = mod
    else:
        sys.modules.pop(MODULE, None)


class CollectiveRunner:
    """A step runner that all-reduces over the group every step, as a TP step would; logits [M, V]
    are filled with the all-reduced sum of (rank + 1)."""

    name = "collective"

    def __init__(self, cfg, weights, *, device, widths, validate=True, drop_width=None, **_):
        self.cfg, self.widths = cfg, tuple(w for w in widths if w != drop_width)
        self.entered = 0

    def forward(self, step, kv):
        self.entered += 1
        t = torch.tensor([float(dist.get_rank() + 1)])
        dist.all_reduce(t)
        return torch.full((step.num_rows, self.cfg.vocab_size), float(t))


class NoCollectiveFallback:
    def forward(self, step, pool):
        return torch.full((step.num_rows, 64), -1.0)


def _engine(rank, *, hardware=H200, present=True, drop_width=None, spec=SPEC, num_slots=64, registry=REGISTRY):
    _install_specs(present, spec)
    cfg = ModelConfig.from_hf(HF)
    w = random_model_weights(cfg, seed=0)
    factory = lambda *a, **k: CollectiveRunner(*a, drop_width=drop_width, **k)  # noqa: E731
    return contract.fused_engine(cfg, w, device="cpu", num_slots=num_slots, max_reqs=4, max_ctx=32,
                                 widths=(1, 2, 4), hardware=hardware, runner_factory=factory,
                                 group=dist.group.WORLD, registry=registry)


def _step(rows, first_slot):
    slots = torch.arange(first_slot, first_slot + rows, dtype=torch.int32)
    return StepBatch(input_ids=torch.zeros(rows, dtype=torch.int64), positions=torch.zeros(rows, dtype=torch.int64),
                     out_cache_loc=slots, req_indices=torch.arange(rows, dtype=torch.int32),
                     seq_lens=torch.ones(rows, dtype=torch.int32), page_table=slots[:, None], num_valid_rows=rows)


# ------------------------------------------------------------------------------ rank functions
def _lookup_differs(rank, world):
    eng = _engine(rank, present=rank != 1)
    return eng.backend.built is None, eng.backend.refusal


def _guard_differs(rank, world):
    hw = contract.DeviceFacts("sm_90", 114, "NVIDIA H100 PCIe") if rank == 1 else H200
    eng = _engine(rank, hardware=hw)
    return eng.backend.built is None, eng.backend.refusal


def _widths_differ(rank, world):
    eng = _engine(rank, drop_width=4 if rank == 2 else None)
    return eng.backend.built is None, eng.backend.refusal


def _steps(rank, world):
    """Three decode steps; on the second, rank 1 holds 3 rows (not a built width: it plans no fused
    step) where the others hold 2 (planned fused): without agreement ranks 0 and 2 would all-reduce alone."""
    eng = _engine(rank)
    backend = eng.backend
    backend.fallback, backend.validate = NoCollectiveFallback(), False
    paths, values = [], []
    for rows in (2, 3 if rank == 1 else 2, 2):
        before = dict(backend.counts)
        out = backend.forward(_step(rows, 1), eng.pool)
        paths.append("fused" if backend.counts["fused"] > before["fused"] else "fallback")
        values.append(float(out[0, 0]))
    return paths, values, backend.built.runner.entered, backend.built.disagreements


@dataclasses.dataclass(frozen=True)
class RaisingGuardSpec(contract.LowlatSpec):
    """A plugin whose guard raises on rank 1 (a plugin bug, or an odd config seen by one rank)."""

    def guard(self, cfg, weights, hw, *, tp_size=1, hf=None):
        if dist.get_rank() == 1:
            raise KeyError("rope_scaling")
        return super().guard(cfg, weights, hw, tp_size=tp_size, hf=hf)


def _step_invalid_on_one_rank(rank, world):
    """Rank 1's KV pool has 8 slots, the others 64: a step writing slot 10 is valid on ranks 0 and 2
    only. Steps (validated): slot 1 (valid everywhere), slot 10, slot 1 again."""
    eng = _engine(rank, num_slots=8 if rank == 1 else 64)
    backend = eng.backend
    backend.fallback = NoCollectiveFallback()
    assert backend.built is not None, backend.refusal
    log = []
    for first in (1, 10, 1):
        try:
            out = backend.forward(_step(2, first), eng.pool)
            log.append(("ok", float(out[0, 0])))
        except StepContractError as e:
            log.append((type(e).__name__, getattr(e, "problems_by_rank", None), str(e)))
    return log, backend.built.runner.entered, dict(backend.counts)


def _guard_raises_on_one_rank(rank, world):
    eng = _engine(rank, spec=RaisingGuardSpec(name="raising", architecture="LlamaForCausalLM",
                                              tp_sizes=frozenset({WORLD})))
    return eng.backend.built is None, eng.backend.refusal


def _lookup_raises_on_one_rank(rank, world):
    """Rank 1's registry is broken: a path that is not a string (find_spec itself raises), and a spec
    whose `isas` is None (checking it raises)."""
    first = _engine(rank, registry={"LlamaForCausalLM": 42} if rank == 1 else REGISTRY)
    second = _engine(rank, spec=dataclasses.replace(SPEC, isas=None) if rank == 1 else SPEC)
    return [(e.backend.built is None, e.backend.refusal) for e in (first, second)]


def _all_ok(outcomes):
    for o in outcomes:
        assert o.error is None and not o.hung, f"rank {o.rank}: {o.error or 'hung'}"
    return [o.value for o in outcomes]


# ------------------------------------------------------------------------------ tests
def test_a_rank_whose_plugin_does_not_import_refuses_on_every_rank():
    values = _all_ok(run_ranks(_lookup_differs, WORLD, timeout_s=TIMEOUT_S))
    assert all(v == values[0] for v in values)
    refused, reasons = values[0]
    assert refused and reasons == [
        "rank 0: found lowlat-test-tp3",
        "rank 1: lowlat_test_rank_specs:SPEC does not import: ModuleNotFoundError: "
        "No module named 'lowlat_test_rank_specs'",
        "rank 2: found lowlat-test-tp3"]


def test_different_guard_verdicts_refuse_on_every_rank_naming_each():
    values = _all_ok(run_ranks(_guard_differs, WORLD, timeout_s=TIMEOUT_S))
    assert all(v == values[0] for v in values)
    refused, reasons = values[0]
    assert refused and reasons == [
        "rank 1: GPU NVIDIA H100 PCIe has 114 SMs; the fused step needs 132 resident blocks (a partitioned GPU?)",
        "rank 0: eligible", "rank 2: eligible"]


def test_different_built_widths_refuse_on_every_rank_naming_each():
    values = _all_ok(run_ranks(_widths_differ, WORLD, timeout_s=TIMEOUT_S))
    assert all(v == values[0] for v in values)
    refused, reasons = values[0]
    assert refused and reasons == [
        "the ranks' built widths differ: rank 0: (1, 2, 4); rank 1: (1, 2, 4); rank 2: (1, 2)"]


def test_a_step_planned_differently_falls_back_on_every_rank():
    values = _all_ok(run_ranks(_steps, WORLD, timeout_s=TIMEOUT_S))
    for paths, vals, entered, disagreements in values:
        assert paths == ["fused", "fallback", "fused"]
        assert vals == [6.0, -1.0, 6.0]          # 1 + 2 + 3: every rank was in each all-reduce
        assert entered == 2 and disagreements == 1


# ------------------------------------------------------------------------------ rank-local faults
# A step that breaks the step contract on one rank only, a guard or a spec lookup that raises on one
# rank: each is agreed before anyone enters a collective (every rank: the same typed error or refusal).
def test_a_step_invalid_on_one_rank_raises_on_every_rank_before_the_collective():
    values = _all_ok(run_ranks(_step_invalid_on_one_rank, WORLD, timeout_s=TIMEOUT_S))
    for log, entered, counts in values:
        assert log[0] == ("ok", 6.0) and log[2] == ("ok", 6.0)      # 1 + 2 + 3: every rank all-reduced
        kind, problems, msg = log[1]
        assert kind == "RankStepContractError"
        assert list(problems) == [1] and "out_cache_loc[0]=10" in problems[1]
        assert "rank 1: out_cache_loc[0]=10" in msg
        assert entered == 2 and counts == {"fused": 2, "fallback": 0}
    assert all(v[0] == values[0][0] for v in values)


def test_a_guard_that_raises_on_one_rank_refuses_on_every_rank_naming_it():
    values = _all_ok(run_ranks(_guard_raises_on_one_rank, WORLD, timeout_s=TIMEOUT_S))
    assert all(v == values[0] for v in values)
    refused, reasons = values[0]
    assert refused and reasons == ["rank 1: the guard of raising raised KeyError: 'rope_scaling'",
                                   "rank 0: eligible", "rank 2: eligible"]


def test_a_spec_lookup_that_raises_on_one_rank_refuses_on_every_rank_naming_it():
    values = _all_ok(run_ranks(_lookup_raises_on_one_rank, WORLD, timeout_s=TIMEOUT_S))
    assert all(v == values[0] for v in values)
    (refused1, reasons1), (refused2, reasons2) = values[0]
    assert refused1 and reasons1[0] == "rank 0: found lowlat-test-tp3"
    assert reasons1[2] == "rank 2: found lowlat-test-tp3"
    assert reasons1[1].startswith("rank 1: finding the spec raised AttributeError")
    assert refused2 and reasons2[1].startswith(f"rank 1: {MODULE}:SPEC cannot be checked: TypeError")
    assert reasons2[0] == "rank 0: found lowlat-test-tp3"
