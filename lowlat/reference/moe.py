"""Mixture-of-experts reference: softmax router, top-k, optional renormalisation, routing bitmap.

Routing (Qwen3-MoE / Mixtral, as HF transformers computes it):
    logits  = x @ router^T in x's dtype (bf16 logits for bf16 x, as HF's router Linear)     [M, E]
    probs   = softmax(logits) in fp32 (fp64 for an fp64 x)                                 [M, E]
    chosen  = top-k of probs per row; ties go to the lower expert index
    gates   = probs[chosen] (fp32), divided by their sum when `renormalize`
The routing is expressed as a bitmap [M, E] (bool: expert e serves row m) and a gate matrix [M, E]
(0 where the bitmap is False), so that a fused kernel can place (expert, row) tiles with population
counts instead of sorting tokens. The layer output is

    y[m] = sum_{e : bitmap[m, e]} gates[m, e] * SwiGLU_e(x[m])  (+ SwiGLU_shared(x[m]) if present)

Padding rows (m >= num_valid_rows) route to no expert and output 0.
"""

from __future__ import annotations

import torch

from lowlat.reference.mlp import swiglu_mlp


def route_topk(x: torch.Tensor, router: torch.Tensor, top_k: int, renormalize: bool,
               num_valid_rows: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Router + top-k as a routing bitmap.

    Parameters: x [M, H]; router [E, H]; 1 <= top_k <= E.
    Returns: bitmap [M, E] bool, gates [M, E] float32 (float64 for a float64 x); padding rows all False/0.
    Ties: among equal probabilities the lower expert index wins (a stable descending sort).
    """
    m = x.shape[0]
    n = m if num_valid_rows is None else num_valid_rows
    acc = torch.promote_types(x.dtype, torch.float32)
    probs = torch.softmax((x @ router.T).to(acc), dim=-1)               # [M, E]
    order = torch.sort(probs, dim=-1, descending=True, stable=True).indices[:, :top_k]
    bitmap = torch.zeros_like(probs, dtype=torch.bool).scatter_(1, order, True)
    gates = torch.where(bitmap, probs, torch.zeros_like(probs))
    if renormalize:
        gates = gates / gates.sum(-1, keepdim=True)
    bitmap[n:] = False
    gates[n:] = 0
    return bitmap, gates


def moe_experts(x: torch.Tensor, bitmap: torch.Tensor, gates: torch.Tensor, expert_gate: torch.Tensor,
                expert_up: torch.Tensor, expert_down: torch.Tensor) -> torch.Tensor:
    """Weighted sum of the routed experts' SwiGLU outputs.

    Parameters: x [M, H]; bitmap [M, E] bool; gates [M, E] float; expert_gate/up [E, Ie, H];
    expert_down [E, H, Ie]. Returns [M, H]: each expert output is rounded to x's dtype, scaled by its
    gate in the gate dtype (fp32), summed in expert order, then rounded to x's dtype.
    """
    out = torch.zeros(x.shape, dtype=gates.dtype, device=x.device)
    for e in range(bitmap.shape[1]):
        rows = bitmap[:, e].nonzero().flatten()
        if rows.numel() == 0:
            continue
        y = swiglu_mlp(x[rows], expert_gate[e], expert_up[e], expert_down[e])
        out[rows] += gates[rows, e, None] * y.to(gates.dtype)
    return out.to(x.dtype)


def moe(x: torch.Tensor, router: torch.Tensor, expert_gate: torch.Tensor, expert_up: torch.Tensor,
        expert_down: torch.Tensor, top_k: int, renormalize: bool, num_valid_rows: int | None = None,
        shared: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """The MoE block: route, run the chosen experts, add the shared expert. x [M, H] -> [M, H]."""
    bitmap, gates = route_topk(x, router, top_k, renormalize, num_valid_rows)
    y = moe_experts(x, bitmap, gates, expert_gate, expert_up, expert_down)
    if shared is not None:
        s = swiglu_mlp(x, *shared)
        n = x.shape[0] if num_valid_rows is None else num_valid_rows
        s[n:] = 0
        y = y + s
    return y
