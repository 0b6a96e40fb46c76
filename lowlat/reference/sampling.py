"""Token sampling reference: temperature, top-k, top-p (nucleus, Holtzman et al. 2020), seeded.

    p = softmax(logits / T) in float32; order the tokens by p, descending, equal p to the lower token id;
    keep the first k of that order (top-k; so ties at the k-th place go to the lower ids); then keep the
    smallest prefix of that order whose mass reaches top_p (the token crossing the threshold is kept: a
    token is kept iff the mass before it is < top_p); renormalise; draw. T == 0 is greedy (argmax; ties ->
    lowest token id).

The top-p mass is that of p itself, not of p renormalised over the top-k tokens, as SGLang 0.5.23's torch
sampler (`top_k_top_p_min_p_sampling_from_probs_torch`) computes it. HF transformers' warpers and vLLM's
torch sampler renormalise after top-k first, so with both filters on they can keep fewer tokens
(p = [.4, .3, .2, .1], top_k 2, top_p 0.5: here tokens 0 and 1, there token 0 alone).
"""

from __future__ import annotations

import torch


def filtered_probs(logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Sampling distribution [R, V] (float32, rows sum to 1) from logits [R, V] for temperature > 0.

    top_k <= 0 or >= V keeps every token; top_p >= 1 keeps every token.
    Raises ValueError for temperature <= 0, top_p outside (0, 1].
    """
    if temperature <= 0:
        raise ValueError(f"temperature={temperature} must be > 0 here (use greedy for 0)")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p={top_p} must be in (0, 1]")
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    v = probs.shape[-1]
    sorted_p, order = torch.sort(probs, dim=-1, descending=True, stable=True)
    keep = torch.ones_like(sorted_p, dtype=torch.bool)
    if 0 < top_k < v:
        keep[:, top_k:] = False
    if top_p < 1:
        mass_before = torch.cumsum(sorted_p * keep, dim=-1) - sorted_p * keep
        keep &= mass_before < top_p
    kept = torch.zeros_like(probs).scatter(-1, order, sorted_p * keep)
    return kept / kept.sum(-1, keepdim=True)


def greedy(logits: torch.Tensor) -> torch.Tensor:
    """argmax over the last dim, ties to the lowest id; [R, V] -> [R] int64. A row holding NaN gives its lowest NaN
    id (torch.argmax's rule; the draft and rejection sampling kernels follow it); the NaN stays in the logits."""
    return torch.argmax(logits, dim=-1)


def sample(logits: torch.Tensor, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
           generator: torch.Generator | None = None) -> torch.Tensor:
    """One token per row: logits [R, V] -> [R] int64 (greedy when temperature == 0)."""
    if temperature == 0:
        return greedy(logits)
    probs = filtered_probs(logits, temperature, top_k, top_p)
    return torch.multinomial(probs.cpu(), 1, generator=generator).flatten().to(logits.device)
