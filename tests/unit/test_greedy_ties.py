"""lowlat/eval/greedy_ties.py: where two greedy generations part, and whether the float64 oracle calls it a tie
(the sign-off's allowance on the reference backend, which is not row-invariant)."""

from __future__ import annotations

import pytest
import torch

from lowlat.eval.greedy_ties import divergence_tie, first_divergence


def test_first_divergence():
    assert first_divergence([1, 2, 3], [1, 2, 4]) == 2
    assert first_divergence([5], [6]) == 0
    assert first_divergence([1, 2], [1, 2, 3]) is None          # a prefix: no token differs
    assert first_divergence([], [1]) is None
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None


class _Pool:
    def __init__(self):
        self.freed = []

    def free_request(self, idx):
        self.freed.append(idx)


class _Req:
    def __init__(self, ids):
        self.prompt_ids, self.req_pool_idx = ids, len(ids)


class _StubEngine:
    """Returns fixed last-position logits and records each prefix it was asked for."""

    def __init__(self, logits):
        self.logits, self.asked, self.pool = torch.tensor(logits), [], _Pool()

    def add_request(self, ids, params):
        self.asked.append(list(ids))
        return _Req(list(ids))

    def prefill(self, req):
        return self.logits.float()


@pytest.mark.parametrize("ref,oracle,gap,err,tie", [
    ([0.0, 10.0, 10.125, 3.0], [0.0, 10.0625, 10.0, 3.0], 0.0625, 0.125, True),
    ([0.0, 10.0, 11.0, 3.0], [0.0, 10.0, 11.0, 3.0], 1.0, 0.0, False),             # the reference is exact
    ([0.0, 10.0, 10.5, 3.0], [0.0, 10.0, 10.75, 3.0], 0.75, 0.25, False),
    ([0.0, 10.5, 10.5, 3.0], [0.0, 10.0, 10.5, 3.0], 0.5, 0.5, True),              # equal: the policy cannot order
])
def test_divergence_tie_compares_the_oracle_gap_with_the_reference_error(ref, oracle, gap, err, tie):
    """Tokens 1 (plain) and 2 (speculative) at position 1; values exact in binary, so the comparison is too."""
    r, o = _StubEngine(ref), _StubEngine(oracle)
    got = divergence_tie(r, o, [7, 8], plain_ids=[3, 1, 0], spec_ids=[3, 2, 0])
    assert got["position"] == 1 and (got["plain_token"], got["spec_token"]) == (1, 2)
    assert (got["oracle_gap"], got["reference_error"], got["tie"]) == (gap, err, tie)
    assert r.asked == o.asked == [[7, 8, 3]]                        # the prompt + the common prefix
    assert r.pool.freed == o.pool.freed == [3]


def test_divergence_tie_is_none_without_a_differing_token():
    r, o = _StubEngine([0.0, 1.0]), _StubEngine([0.0, 1.0])
    assert divergence_tie(r, o, [1], [1, 0], [1, 0, 1]) is None
    assert r.asked == o.asked == []


def test_a_forced_divergence_on_the_real_model_is_not_a_tie(smollm2, smollm2_tokenizer):
    """SmolLM2-135M on the CPU: 4 greedy tokens, then the same with token 2 replaced by the oracle's least likely
    token there. That is a real divergence, so the oracle's gap exceeds the bf16 reference's error. No KV slot is
    left allocated."""
    from lowlat.runtime.engine import SamplingParams, reference_engine

    cfg, w = smollm2
    ref = reference_engine(cfg, w, num_slots=128, max_reqs=2, max_ctx=64)
    oracle = reference_engine(cfg, w, num_slots=128, max_reqs=2, max_ctx=64, compute_dtype=torch.float64)
    prompt = smollm2_tokenizer("The capital of France is").input_ids
    plain = ref.generate([prompt], SamplingParams(max_new_tokens=4, ignore_eos=True))[0].output_ids
    free = (ref.pool.free_slots, oracle.pool.free_slots)
    r = oracle.add_request(prompt + plain[:2], SamplingParams(max_new_tokens=1))
    worst = int(oracle.prefill(r).argmin())
    oracle.pool.free_request(r.req_pool_idx)
    spec = plain[:2] + [worst] + plain[3:]
    got = divergence_tie(ref, oracle, prompt, plain, spec)
    assert (got["position"], got["plain_token"], got["spec_token"]) == (2, plain[2], worst)
    assert got["oracle_gap"] > 1.0 > got["reference_error"] > 0.0
    assert got["tie"] is False
    assert (ref.pool.free_slots, oracle.pool.free_slots) == free
