"""SwiGLU MLP reference (Shazeer 2020): down( silu(gate(x)) * up(x) ).

Runs in x's dtype (bf16 rounds after each matmul, as HF's LlamaMLP does).
"""

import torch
import torch.nn.functional as F


def swiglu_mlp(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor) -> torch.Tensor:
    """x [M, H]; w_gate, w_up [I, H]; w_down [H, I]. Returns [M, H] in x's dtype."""
    return F.linear(F.silu(F.linear(x, w_gate)) * F.linear(x, w_up), w_down)
