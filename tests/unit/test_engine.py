"""Decode engine v0: batching, padding, sampling, KV slots (random tiny model; real model elsewhere)."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from lowlat.numerics import check_accuracy, check_bitwise
from lowlat.runtime.engine import ReferenceBackend, SamplingParams, pad_width, reference_engine
from lowlat.runtime.kv_cache import KVCachePool
from lowlat.testing import tiny_config
from lowlat.weights import random_model_weights

CFG = tiny_config(num_layers=2, vocab_size=256)
W = random_model_weights(CFG, seed=1)


def _engine(**kw):
    return reference_engine(CFG, W, num_slots=512, max_reqs=8, max_ctx=128, **kw)


@given(lens=st.lists(st.integers(1, 9), min_size=2, max_size=4), seed=st.integers(0, 1000))
def test_batched_requests_equal_each_alone(lens, seed):
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(0, CFG.vocab_size, (n,), generator=g).tolist() for n in lens]
    params = SamplingParams(max_new_tokens=6, ignore_eos=True)
    together = [r.output_ids for r in _engine(compute_dtype=torch.float32).generate(prompts, params)]
    alone = [_engine(compute_dtype=torch.float32).generate([p], params)[0].output_ids for p in prompts]
    assert together == alone


def test_decode_rows_padded_to_captured_width_change_nothing():
    """A 3-row decode step padded to width 4 gives the same valid logits as the unpadded step."""
    eng = _engine()
    reqs = [eng.add_request([5, 6, 7 + i]) for i in range(3)]
    for r in reqs:
        eng.prefill(r)
    chunks = [(r, [9]) for r in reqs]
    padded = eng.build_step(chunks)
    assert padded.num_rows == 4 and padded.num_valid_rows == 3
    assert padded.out_cache_loc[3] == 0
    for r in reqs:                                          # roll back, then the same step unpadded
        eng.pool.truncate(r.req_pool_idx, eng.pool.seq_lens[r.req_pool_idx] - 1)
    unpadded = eng.build_step(chunks, pad=False)
    a = eng.backend.forward(padded, eng.pool)
    b = eng.backend.forward(unpadded, eng.pool)
    check_accuracy("model", a[:3], b, None, output="padded_vs_unpadded", dtype=torch.bfloat16)
    assert torch.equal(a[3], torch.zeros_like(a[3]))


def test_sampling_is_reproducible_by_seed_and_varies_across_seeds():
    prompt = [[3, 4, 5]]
    run = lambda seed: _engine().generate(prompt, SamplingParams(temperature=1.0, top_p=0.9, seed=seed,  # noqa
                                                                 max_new_tokens=12, ignore_eos=True))[0].output_ids
    assert run(7) == run(7)
    assert len({tuple(run(s)) for s in range(4)}) > 1


def test_prefill_longer_than_max_rows_is_chunked_and_matches_one_pass():
    """A 70-token prompt runs as chunks of <= 48 rows; logits equal a single 70-row reference step."""
    eng = _engine(compute_dtype=torch.float64)
    prompt = torch.randint(0, CFG.vocab_size, (70,), generator=torch.Generator().manual_seed(3)).tolist()
    req = eng.add_request(prompt)
    chunked = eng.prefill(req)
    one = _engine(compute_dtype=torch.float64)
    one.max_rows, one.widths = 128, (128,)
    req1 = one.add_request(prompt)
    whole = one.run_step([(req1, prompt)])[-1]
    check_accuracy("model", chunked, whole, None, output="chunked_prefill", dtype=torch.float32)


def test_kv_slots_are_freed_and_reused():
    eng = _engine()
    free0 = eng.pool.free_slots
    eng.generate([[1, 2, 3], [4, 5]], SamplingParams(max_new_tokens=4, ignore_eos=True))
    assert eng.pool.free_slots == free0
    assert not eng.pool.seq_lens


def test_truncate_frees_only_later_positions_and_keeps_earlier_kv():
    eng = _engine()
    req = eng.add_request([1, 2, 3, 4, 5])
    eng.prefill(req)
    keep = eng.pool.req_to_token[req.req_pool_idx, :3].clone()
    kv = eng.pool.k_caches[0][keep.long()].clone()
    eng.pool.truncate(req.req_pool_idx, 3)
    assert eng.pool.seq_lens[req.req_pool_idx] == 3
    assert torch.equal(eng.pool.req_to_token[req.req_pool_idx, :3], keep)
    check_bitwise("kv_cache", eng.pool.k_caches[0][keep.long()], kv, output="rollback")


def test_pad_width_and_refusals():
    assert [pad_width(n) for n in (1, 3, 5, 7, 13, 48)] == [1, 4, 6, 8, 16, 48]
    from lowlat.errors import StepContractError
    with pytest.raises(StepContractError, match="49 rows"):
        pad_width(49)
    eng = _engine()
    with pytest.raises(StepContractError, match="token id 256"):
        eng.add_request([1, 256])
    for t in (-1, float("nan"), float("inf")):      # NaN would pass a plain `< 0` check
        with pytest.raises(ValueError, match="temperature"):
            SamplingParams(temperature=t)


def test_reference_backend_is_the_engine_default():
    assert isinstance(_engine().backend, ReferenceBackend)


@pytest.mark.parametrize("field,value", [
    ("top_k", 2.5), ("top_k", None), ("seed", 1.5), ("seed", "7"), ("seed", 2 ** 64), ("max_new_tokens", 2.5),
    ("max_new_tokens", True), ("temperature", True), ("temperature", "1"), ("temperature", 1e-38),
    ("top_p", True), ("ignore_eos", "no")])
def test_sampling_params_refuse_wrong_types_and_tiny_temperature_naming_the_field(field, value):
    """Before: top_k 2.5 / seed 1.5 failed deep in a step (TypeError, RuntimeError), max_new_tokens 2.5 / True
    and temperature True were silently used, and temperature 1e-38 made logits / T overflow to NaN
    probabilities (a speculative run then emitted token 0)."""
    from lowlat.errors import UnsupportedConfigError
    kw = {"temperature": 1.0, field: value}
    with pytest.raises(UnsupportedConfigError, match=f"{field}="):
        SamplingParams(**kw)
    SamplingParams(temperature=1e-5, top_k=-1, seed=-(2 ** 63), max_new_tokens=1)       # the edges pass


def test_generate_refusing_a_prompt_leaves_no_request_row_and_params_must_match_prompts():
    """A refused later prompt used to leak the request rows of the prompts before it (allocated before the
    try); a params list shorter than the prompts silently dropped prompts (zip); float / bool token ids were
    truncated / taken as 1."""
    from lowlat.errors import StepContractError
    eng = _engine()
    free_reqs, free_slots = len(eng.pool._free_reqs), eng.pool.free_slots
    with pytest.raises(StepContractError, match="token id 999"):
        eng.generate([[1, 2], [3, 4], [999]])
    with pytest.raises(StepContractError, match="1 SamplingParams for 3 prompts"):
        eng.generate([[1, 2], [3, 4], [5]], [SamplingParams(max_new_tokens=2)])
    for bad in ([1.7, 2], [True, 2], "ab", []):
        with pytest.raises(StepContractError, match="prompt_ids"):
            eng.generate([[1, 2], bad], SamplingParams(max_new_tokens=2))
    assert (len(eng.pool._free_reqs), eng.pool.free_slots, eng.pool.seq_lens) == (free_reqs, free_slots, {})
    sp = SamplingParams(max_new_tokens=3, ignore_eos=True)
    as_tensor = eng.generate([torch.tensor([1, 2, 3])], sp)[0]
    assert as_tensor.prompt_ids == [1, 2, 3] and all(type(t) is int for t in as_tensor.prompt_ids)
    assert as_tensor.output_ids == eng.generate([[1, 2, 3]], sp)[0].output_ids


def test_kv_pool_misuse_raises_kv_cache_error_and_changes_nothing():
    """Freeing a request twice / an unknown row raised KeyError; extend with n < 0 silently shrank seq_len
    (leaking the slot of the dropped position); a float new_len raised TypeError."""
    from lowlat.errors import KVCacheError, UnsupportedConfigError
    pool = _engine().pool
    req = pool.alloc_request()
    pool.extend(req, 5)

    def state():
        return (dict(pool.seq_lens), pool.free_slots, list(pool._free_reqs), pool.req_to_token.clone())

    before = state()
    for call, match in ((lambda: pool.extend(req, -1), "n=-1"), (lambda: pool.extend(req, 1.0), "n=1.0"),
                        (lambda: pool.truncate(req, 2.5), "new_len=2.5"), (lambda: pool.truncate(req, 6), "new_len=6"),
                        (lambda: pool.truncate(7, 0), "row 7 is not allocated"),
                        (lambda: pool.extend(True, 1), "row True is not allocated")):
        with pytest.raises(KVCacheError, match=match):
            call()
        after = state()
        assert after[:3] == before[:3] and torch.equal(after[3], before[3])
    pool.free_request(req)
    with pytest.raises(KVCacheError, match="freed already"):
        pool.free_request(req)
    assert pool._free_reqs.count(req) == 1 and pool.free_slots == pool.num_slots - 1
    small = KVCachePool(CFG, num_slots=4, max_reqs=1, max_ctx=16)
    with pytest.raises(RuntimeError, match="KV cache full"):              # KVCacheError is a RuntimeError
        small.extend(small.alloc_request(), 4)
    with pytest.raises(KVCacheError, match="all 1 request rows"):
        small.alloc_request()
    for kw, field in ((dict(num_slots=1), "num_slots=1"), (dict(max_reqs=0), "max_reqs=0"),
                      (dict(max_ctx=0), "max_ctx=0"), (dict(max_ctx=2.5), "max_ctx=2.5"),
                      (dict(max_reqs=True), "max_reqs=True")):
        with pytest.raises(UnsupportedConfigError, match=field):
            KVCachePool(CFG, **{**dict(num_slots=4, max_reqs=1, max_ctx=16), **kw})
