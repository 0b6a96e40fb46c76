"""Output-projection reference: the lines of a decoder layer between attention and the FFN.

    x = x + attn Wo^T                  (residual add)
    h = rms_norm(x, mlp_norm)          (the FFN's pre-norm)

exactly as `lowlat.reference.layer.decoder_layer` computes them, so the fused kernel
`lowlat.kernels.out_proj.out_proj` has one specification. Every op runs in the dtype of x and the
weights (bf16 baseline, float64 oracle).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from lowlat.reference.rms_norm import rms_norm


def out_proj(attn: torch.Tensor, wo: torch.Tensor, residual: torch.Tensor, mlp_norm: torch.Tensor,
             eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Output projection + residual add + the next RMSNorm.

    Parameters:
        attn      [M, Hq*D]  attention output, heads flattened (x's dtype)
        wo        [H, Hq*D]  output projection (nn.Linear layout)
        residual  [M, H]     the residual stream x before the attention block
        mlp_norm  [H]        RMSNorm weight of the FFN
        eps       RMSNorm epsilon
    Returns: (x [M, H], h [M, H]) in residual's dtype: the new residual stream and its normed rows.
    """
    x = residual + F.linear(attn, wo)
    return x, rms_norm(x, mlp_norm, eps)
