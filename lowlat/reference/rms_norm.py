"""RMSNorm reference (Zhang & Sennrich 2019), with HF transformers' rounding order.

    y = weight * cast_to_input_dtype( x / sqrt(mean(x^2, -1) + eps) )

The statistic is computed in at least float32; a float64 input stays float64 (the oracle).
"""

import torch


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMS-normalise over the last dim.

    Parameters: x [..., N] (bf16, fp32 or fp64); weight [N], same dtype family; eps > 0.
    Returns: [..., N] in x's dtype.
    """
    acc = torch.promote_types(x.dtype, torch.float32)
    xf = x.to(acc)
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * y.to(x.dtype)
