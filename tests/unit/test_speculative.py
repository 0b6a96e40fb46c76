"""Speculative decoding on the real SmolLM2-135M-Instruct (reference backend, bf16): greedy speculative
output equals greedy plain output token for token, sampled runs repeat by seed, rollback leaves earlier KV
entries untouched, and the drafters behave as documented.

CPU cost is kept small: 4 real prompts x 16 tokens, one shared engine, torch limited to one thread inside
this module (restored afterwards) so xdist workers do not oversubscribe the cores."""

from __future__ import annotations

import time

import pytest
import torch

from lowlat.errors import StepContractError
from lowlat.eval.prompts import prompt_token_ids
from lowlat.numerics import check_bitwise
from lowlat.runtime.drafters import (DraftProposal, LayerSkipDrafter, NgramDrafter,
                                     SpecState, rows_step)
from lowlat.runtime.engine import SamplingParams, reference_engine
from lowlat.runtime.speculative import SpeculativeDecoder, summarize

NEW_TOKENS = 16
#: draft depth in these tests: shallow, to keep CPU time low (correctness does not depend on n; the
#: greedy-equality and rollback properties hold for every n, and a shallow draft is rejected often,
#: which exercises the residual path)
TEST_DRAFT_LAYERS = 6

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def engine(smollm2):
    cfg, w = smollm2
    return reference_engine(cfg, w, num_slots=1024, max_reqs=8, max_ctx=256)


@pytest.fixture(scope="module")
def prompts(smollm2_tokenizer):
    return prompt_token_ids(smollm2_tokenizer, 4)         # 2 chat-formatted + 2 plain-text prompts


@pytest.fixture(scope="module")
def plain_greedy(engine, prompts):
    reqs = engine.generate(prompts, SamplingParams(max_new_tokens=NEW_TOKENS, ignore_eos=True))
    return [r.output_ids for r in reqs]


def _drafter(name: str):
    return LayerSkipDrafter(TEST_DRAFT_LAYERS) if name == "layers" else NgramDrafter()


class _FixedDrafter:
    """Proposes the same k tokens every step (a drafter the target will mostly reject)."""

    name = "fixed"

    def __init__(self, tokens):
        self.tokens = list(tokens)

    def propose(self, engine, states):
        return DraftProposal([self.tokens[: s.max_draft] for s in states], [None] * len(states))


@pytest.mark.parametrize("drafter,uniform", [("layers", False), ("ngram", False), ("ngram", True)])
def test_greedy_speculative_equals_greedy_plain_token_for_token(engine, prompts, plain_greedy, drafter, uniform):
    """4 requests share every draft and verify step (up to 4 x 6 = 24 verify rows; `uniform` pads every
    request to k+1 rows as the fused backend needs, with padded drafts never accepted); the emitted
    tokens equal Engine.generate's greedy tokens exactly, and every KV slot is freed afterwards."""
    free_before = engine.pool.free_slots
    res = SpeculativeDecoder(engine, _drafter(drafter), k=5, uniform_verify=uniform).generate(
        prompts, SamplingParams(max_new_tokens=NEW_TOKENS, ignore_eos=True))
    for i, (r, want) in enumerate(zip(res, plain_greedy)):
        assert r.output_ids == want, f"prompt {i}: speculative {r.output_ids} != plain {want}"
        assert sum(r.accept_lengths) == NEW_TOKENS - 1          # every token after the first came from a verify step
        assert all(1 <= a <= 6 for a in r.accept_lengths)
        assert len(r.token_latency_s) == NEW_TOKENS - 1 and all(x > 0 for x in r.token_latency_s)
    assert engine.pool.free_slots == free_before
    st = summarize(res, 1.0)
    assert st.mean_accept_length >= 1.0 and st.p90_itl_ms > 0 and st.output_tok_s == 4 * NEW_TOKENS


def test_plain_loop_equals_engine_generate_greedy_and_seeded(engine, prompts, plain_greedy):
    """Without a drafter the loop is plain decoding: same tokens as Engine.generate, greedy and sampled
    (the same per-request generator draws)."""
    dec = SpeculativeDecoder(engine, None)
    assert [r.output_ids for r in dec.generate(prompts[:2], SamplingParams(max_new_tokens=NEW_TOKENS,
                                                                            ignore_eos=True))] == plain_greedy[:2]
    sp = SamplingParams(temperature=0.9, top_p=0.95, seed=11, max_new_tokens=8, ignore_eos=True)
    ours = [r.output_ids for r in dec.generate(prompts[:2], sp)]
    theirs = [r.output_ids for r in engine.generate(prompts[:2], sp)]
    assert ours == theirs


@pytest.mark.parametrize("drafter", ["layers", "ngram"])
def test_sampled_speculative_is_reproducible_by_seed(engine, prompts, drafter):
    """temperature > 0 with real rejection sampling: the same seeds give the same tokens; another seed
    gives other tokens (over 2 x 8 sampled tokens at T=1 an identical draw would be a seeding bug)."""
    def run(seed):
        sp = [SamplingParams(temperature=1.0, top_k=50, seed=seed + i, max_new_tokens=8, ignore_eos=True)
              for i in range(2)]
        return [r.output_ids for r in SpeculativeDecoder(engine, _drafter(drafter)).generate(prompts[2:], sp)]

    a, b, c = run(5), run(5), run(6)
    assert a == b
    assert a != c
    assert all(len(x) == 8 for x in a)


def test_rollback_leaves_earlier_kv_entries_untouched(engine, prompts):
    """A verify step whose drafts are rejected: positions before the step keep their K/V and slots
    bitwise, the request keeps exactly pending + accepted positions, and the rejected slots go back to
    the pool. Same for the self-speculative draft, which writes layers < n of the step's own slots."""
    pool = engine.pool
    for drafter in (_FixedDrafter([0, 1, 2, 3, 4]), LayerSkipDrafter(TEST_DRAFT_LAYERS)):
        req = engine.add_request(prompts[1], SamplingParams(max_new_tokens=8, ignore_eos=True))
        try:
            first = int(torch.argmax(engine.prefill(req)))
            n = pool.seq_lens[req.req_pool_idx]
            slots = pool.req_to_token[req.req_pool_idx, :n].clone()
            k_before = [kc[slots.long()].clone() for kc in pool.k_caches]
            v_before = [vc[slots.long()].clone() for vc in pool.v_caches]
            free_before = pool.free_slots
            dec = SpeculativeDecoder(engine, drafter, k=5)
            st = SpecState(req=req, pending=first, history=list(prompts[1]) + [first])
            req.output_ids.append(first)
            req.token_times.append(time.perf_counter())
            dec._iteration([(0, st)], None, None)
            emitted = st.accept_lengths[-1]
            assert pool.seq_lens[req.req_pool_idx] == n + emitted
            assert pool.free_slots == free_before - emitted
            check_bitwise("spec_rollback", pool.req_to_token[req.req_pool_idx, :n], slots, output="slots")
            assert (pool.req_to_token[req.req_pool_idx, n + emitted:] == 0).all()
            for layer, (kb, vb) in enumerate(zip(k_before, v_before)):
                check_bitwise("spec_rollback", pool.k_caches[layer][slots.long()], kb, output=f"k{layer}")
                check_bitwise("spec_rollback", pool.v_caches[layer][slots.long()], vb, output=f"v{layer}")
        finally:
            pool.free_request(req.req_pool_idx)


def test_ngram_drafter_proposes_the_continuation_of_the_latest_longest_match():
    d = NgramDrafter(max_ngram=3)
    #                 0  1  2  3  4  5  6  7  8  9 10
    history = [5, 6, 7, 8, 9, 5, 6, 7, 1, 2, 5, 6, 7]
    assert d.lookup(history, 4) == [1, 2, 5, 6]        # latest earlier "5 6 7" is at 5, not 0
    assert d.lookup(history, 1) == [1]
    assert d.lookup([1, 2, 3, 4, 9, 4], 3) == [9, 4]    # only a 1-gram "4" matches
    assert d.lookup([1, 2, 3], 5) == []
    assert d.lookup(history, 0) == []
    with pytest.raises(ValueError, match="min_ngram"):
        NgramDrafter(max_ngram=1, min_ngram=2)


def test_bad_arguments_raise_named_errors(engine, prompts):
    with pytest.raises(ValueError, match="k=0"):
        SpeculativeDecoder(engine, NgramDrafter(), k=0)
    with pytest.raises(ValueError, match="num_layers=30"):
        SpeculativeDecoder(engine, LayerSkipDrafter(30)).generate(prompts[:1], SamplingParams(max_new_tokens=3))
    req = engine.add_request(prompts[0], SamplingParams(max_new_tokens=4))
    try:
        with pytest.raises(StepContractError, match="hole"):
            rows_step(engine, [(req.req_pool_idx, 5, [1])])
        assert engine.pool.seq_lens[req.req_pool_idx] == 0
    finally:
        engine.pool.free_request(req.req_pool_idx)
    assert engine.pool.free_slots == engine.pool.num_slots - 1


def _tiny_engine(num_slots=512):
    from lowlat.testing import tiny_config
    from lowlat.weights import random_model_weights
    cfg = tiny_config(num_layers=2, vocab_size=256)
    return reference_engine(cfg, random_model_weights(cfg, seed=1), num_slots=num_slots, max_reqs=8, max_ctx=128)


def test_k_must_be_an_int_below_max_rows_and_the_draft_offset_stride():
    """k=2.5 used to fail later with a TypeError, k=True was taken as 1, and with an engine of more than 64
    rows k >= DRAFT_OFFSET_STRIDE=64 was accepted: the Philox offsets of draft position j of step s and of
    position j - 64 of step s + 1 coincide, so their draws repeat."""
    from lowlat.errors import UnsupportedConfigError
    eng = _tiny_engine()
    for k in (2.5, True, 0, 48):
        with pytest.raises(UnsupportedConfigError, match=f"k={k}"):
            SpeculativeDecoder(eng, NgramDrafter(), k=k)
    eng.max_rows, eng.widths = 256, (256,)
    assert SpeculativeDecoder(eng, NgramDrafter(), k=63).k == 63
    with pytest.raises(UnsupportedConfigError, match="k=64.*DRAFT_OFFSET_STRIDE"):
        SpeculativeDecoder(eng, NgramDrafter(), k=64)


class _BadDrafter:
    """Writes KV for its draft positions (as LayerSkipDrafter does), then returns a broken proposal."""

    name = "bad"

    def __init__(self, tokens, probs=None):
        self.tokens, self.probs = tokens, probs

    def propose(self, engine, states):
        rows_step(engine, [(s.pool_idx, engine.pool.seq_lens[s.pool_idx], [s.pending] * 2) for s in states])
        return DraftProposal([list(self.tokens) for _ in states], [self.probs] * len(states))


@pytest.mark.parametrize("tokens,probs,match", [
    ([999], None, "draft 0 = 999"), ([1.5], None, "draft 0 = 1.5"), ([True], None, "draft 0 = True"),
    ([1, 2, 3, 4], None, "proposed 4 tokens"), ([1, 2], torch.ones(2, 10), r"probs must be \[n_b, V\]")])
def test_a_broken_drafter_proposal_is_refused_with_nothing_left_allocated(tokens, probs, match):
    """Out-of-vocabulary drafts failed in the verify step, float / bool drafts were verified as token 1, a
    probs tensor of the wrong shape raised an untyped RuntimeError; and the drafter's KV writes (slots past
    the pending token) stayed allocated when the iteration failed."""
    eng = _tiny_engine()
    dec = SpeculativeDecoder(eng, _BadDrafter(tokens, probs), k=3)
    req = eng.add_request([1, 2, 3], SamplingParams(temperature=1.0, max_new_tokens=8))
    try:
        eng.prefill(req)
        st = SpecState(req=req, pending=4, history=[1, 2, 3, 4])
        req.output_ids.append(4)
        req.token_times.append(time.perf_counter())
        free = eng.pool.free_slots
        with pytest.raises(StepContractError, match=match):
            dec._iteration([(0, st)], None, None)
        assert eng.pool.seq_lens[req.req_pool_idx] == 3 and eng.pool.free_slots == free
        assert st.rng_offset == 0 and req.output_ids == [4]
    finally:
        eng.pool.free_request(req.req_pool_idx)


def test_rows_step_that_runs_out_of_slots_allocates_nothing():
    """rows_step extended request after request: when the KV cache ran out at the second, the first kept
    its new slots (the doc promised nothing allocated on a refusal)."""
    from lowlat.errors import KVCacheError
    eng = _tiny_engine(num_slots=8)
    a, b = (eng.add_request([1], SamplingParams(max_new_tokens=1)) for _ in range(2))
    try:
        with pytest.raises(KVCacheError, match="KV cache full"):
            rows_step(eng, [(a.req_pool_idx, 0, [1, 2, 3]), (b.req_pool_idx, 0, [1, 2, 3, 4, 5])])
        assert eng.pool.seq_lens == {a.req_pool_idx: 0, b.req_pool_idx: 0} and eng.pool.free_slots == 7
        assert not eng.pool.req_to_token.any()
        with pytest.raises(KVCacheError, match="row 3 is not allocated"):          # was a KeyError
            rows_step(eng, [(a.req_pool_idx, 0, [1]), (3, 0, [1])])
        assert eng.pool.seq_lens == {a.req_pool_idx: 0, b.req_pool_idx: 0}
    finally:
        for r in (a, b):
            eng.pool.free_request(r.req_pool_idx)
