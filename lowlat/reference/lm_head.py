"""LM-head reference: the end of `lowlat.reference.model.ReferenceModel.forward` plus greedy choice.

    h       = rms_norm(x, final_norm);  h[num_valid_rows:] = 0
    logits  = (h lm_head^T) cast to float32 (float64 stays float64)
    tokens  = greedy(logits)            argmax, ties to the lowest token id

The fused kernel `lowlat.kernels.lm_head.lm_head` matches this. Every op runs in x's dtype.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from lowlat.reference.rms_norm import rms_norm
from lowlat.reference.sampling import greedy


def lm_head(x: torch.Tensor, final_norm: torch.Tensor, weight: torch.Tensor, num_valid_rows: int,
            eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Final RMSNorm, LM-head projection over the vocabulary, greedy token.

    Parameters:
        x            [M, H]  last layer's residual stream (bf16 baseline, float64 oracle)
        final_norm   [H];  weight [V, H] (the embedding when tied)
        num_valid_rows  rows >= it are padding (logits 0, token 0); eps: RMSNorm epsilon
    (the kernel `lowlat.kernels.lm_head.lm_head` takes its arguments in the same order)
    Returns: (logits [M, V] float32 (float64 for float64 x), tokens [M] int64).
    """
    h = rms_norm(x, final_norm, eps)
    h[num_valid_rows:] = 0
    logits = F.linear(h, weight)
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    return logits, greedy(logits)
