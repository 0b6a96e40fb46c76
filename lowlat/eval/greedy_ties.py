"""Is a greedy divergence a logit tie? For backends that are not row-invariant.

The fused backend gives a row the same bits whatever else shares its step, so on it greedy speculative decoding must
reproduce greedy plain decoding exactly. The bf16 reference backend does not promise that. Its matmuls may round
differently when a step holds other rows (a verify step's k + 1 rows per request against plain decoding's one), and
the logits it returns are bf16: one unit in the last place is 0.125 at a logit of 16-32. So on the reference two
greedy runs can part where two tokens' logits tie within that rounding.

This module tells such a tie from a real divergence (the rule `tests/unit/test_fused_real_model.py` applies to fused
against reference generations too):
- take the first position where the two generations differ;
- the float64 oracle's logits of the two tokens there must differ by no more than the bf16 reference's own largest
  logit error at that position (the policy cannot order them).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first position where token lists a and b differ; None when one is a prefix of the other."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


def last_logits(engine, ids: Sequence[int]) -> torch.Tensor:
    """The logits [V] (float64, on the CPU) after token ids, from `engine` alone (its prefill in chunks of max_rows
    rows, no other request in the step); the request's KV slots are freed afterwards."""
    from lowlat.runtime.engine import SamplingParams

    req = engine.add_request(list(ids), SamplingParams(max_new_tokens=1))
    try:
        return engine.prefill(req).double().cpu()
    finally:
        engine.pool.free_request(req.req_pool_idx)


def divergence_tie(reference, oracle, prompt_ids: Sequence[int], plain_ids: Sequence[int],
                   spec_ids: Sequence[int]) -> dict | None:
    """Where greedy outputs plain_ids and spec_ids (after prompt_ids) first differ, and whether it is a tie.

    reference: the bf16 reference engine the runs used. oracle: the same model in float64
    (`make_engine("reference", ..., compute_dtype=torch.float64)`). Both need room for the prompt plus the common
    prefix.
    Returns None when no token differs (one list a prefix of the other: not a tie). Otherwise returns
    {"position", "plain_token", "spec_token", "oracle_gap", "reference_error", "tie"}, where:
    - oracle_gap is |oracle[plain] - oracle[spec]| after the prompt and plain_ids[:position];
    - reference_error is max |reference - oracle| over the vocabulary there;
    - tie is oracle_gap <= reference_error.
    """
    k = first_divergence(plain_ids, spec_ids)
    if k is None:
        return None
    prefix = list(prompt_ids) + list(plain_ids[:k])
    ref, orc = last_logits(reference, prefix), last_logits(oracle, prefix)
    p, s = int(plain_ids[k]), int(spec_ids[k])
    gap = float((orc[p] - orc[s]).abs())
    err = float((ref - orc).abs().max())
    return {"position": k, "plain_token": p, "spec_token": s, "oracle_gap": gap, "reference_error": err,
            "tie": gap <= err}
