"""Weights of one model in lowlat's plain layout (HF `nn.Linear` convention: [out_features, in_features]).

Dims: H hidden, Hq/Hkv query/KV heads, D head_dim, I intermediate, E experts, Ie expert intermediate,
Is shared-expert intermediate, V vocab. Every tensor is bf16 unless a test casts it (the float64 oracle).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

import torch

from lowlat.config import ModelConfig


@dataclass
class LayerWeights:
    attn_norm: torch.Tensor              # [H]
    wq: torch.Tensor                     # [Hq*D, H]
    wk: torch.Tensor                     # [Hkv*D, H]
    wv: torch.Tensor                     # [Hkv*D, H]
    wo: torch.Tensor                     # [H, Hq*D]
    mlp_norm: torch.Tensor               # [H]
    bq: torch.Tensor | None = None       # [Hq*D]   (Qwen2 QKV bias)
    bk: torch.Tensor | None = None       # [Hkv*D]
    bv: torch.Tensor | None = None       # [Hkv*D]
    q_norm: torch.Tensor | None = None   # [D]      (Qwen3 per-head QK RMSNorm)
    k_norm: torch.Tensor | None = None   # [D]
    # dense SwiGLU MLP
    w_gate: torch.Tensor | None = None   # [I, H]
    w_up: torch.Tensor | None = None     # [I, H]
    w_down: torch.Tensor | None = None   # [H, I]
    # MoE
    router: torch.Tensor | None = None        # [E, H]
    expert_gate: torch.Tensor | None = None   # [E, Ie, H]
    expert_up: torch.Tensor | None = None     # [E, Ie, H]
    expert_down: torch.Tensor | None = None   # [E, H, Ie]
    shared_gate: torch.Tensor | None = None   # [Is, H]
    shared_up: torch.Tensor | None = None     # [Is, H]
    shared_down: torch.Tensor | None = None   # [H, Is]

    def map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> "LayerWeights":
        return LayerWeights(**{f.name: (None if (t := getattr(self, f.name)) is None else fn(t))
                               for f in dataclasses.fields(self)})


@dataclass
class ModelWeights:
    embed: torch.Tensor              # [V, H]
    layers: list[LayerWeights]
    final_norm: torch.Tensor         # [H]
    lm_head: torch.Tensor            # [V, H]; the same tensor as `embed` when tied

    def map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> "ModelWeights":
        tied = self.lm_head is self.embed
        embed = fn(self.embed)
        return ModelWeights(embed=embed, layers=[lw.map(fn) for lw in self.layers],
                            final_norm=fn(self.final_norm), lm_head=embed if tied else fn(self.lm_head))

    def to(self, device=None, dtype=None) -> "ModelWeights":
        return self.map(lambda t: t.to(device=device, dtype=dtype))


def layer_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...] | None]:
    """The shape `cfg` gives each LayerWeights field (the comments above), None for a field it leaves
    empty (biases without qkv_bias, QK norms without qk_norm, the MLP form it does not use)."""
    h, d, q, kv = cfg.hidden_size, cfg.head_dim, cfg.q_size, cfg.kv_size
    shapes: dict[str, tuple[int, ...] | None] = {f.name: None for f in dataclasses.fields(LayerWeights)}
    shapes.update(attn_norm=(h,), wq=(q, h), wk=(kv, h), wv=(kv, h), wo=(h, q), mlp_norm=(h,))
    if cfg.qkv_bias:
        shapes.update(bq=(q,), bk=(kv,), bv=(kv,))
    if cfg.qk_norm:
        shapes.update(q_norm=(d,), k_norm=(d,))
    if cfg.is_moe:
        e, ie = cfg.num_experts, cfg.moe_intermediate_size
        shapes.update(router=(e, h), expert_gate=(e, ie, h), expert_up=(e, ie, h), expert_down=(e, h, ie))
        if cfg.shared_expert_intermediate_size:
            si = cfg.shared_expert_intermediate_size
            shapes.update(shared_gate=(si, h), shared_up=(si, h), shared_down=(h, si))
    else:
        i = cfg.intermediate_size
        shapes.update(w_gate=(i, h), w_up=(i, h), w_down=(h, i))
    return shapes


def shape_problems(cfg: ModelConfig, weights: ModelWeights) -> list[str]:
    """Every tensor of `weights` whose shape is not the one `cfg` gives it, every tensor `cfg` needs
    that is missing and every tensor it would leave unread, by name ("layers.3.wk"); [] when all match.
    Layers beyond min(len(weights.layers), cfg.num_layers) are not looked at (count them apart)."""
    h, v = cfg.hidden_size, cfg.vocab_size
    found: list[tuple[str, torch.Tensor | None, tuple[int, ...] | None]] = [
        ("embed", weights.embed, (v, h)), ("final_norm", weights.final_norm, (h,)),
        ("lm_head", weights.lm_head, (v, h))]
    want = layer_shapes(cfg)
    for i, lw in enumerate(weights.layers[: cfg.num_layers]):
        found += [(f"layers.{i}.{name}", getattr(lw, name), shape) for name, shape in want.items()]
    problems = []
    for name, t, shape in found:
        if shape is None and t is not None:
            problems.append(f"{name} is set, but the config does not use it (it would be left unread)")
        elif shape is not None and not isinstance(t, torch.Tensor):
            problems.append(f"{name} is missing (the config needs {shape})")
        elif shape is not None and tuple(t.shape) != shape:
            problems.append(f"{name} has shape {tuple(t.shape)}, the config gives {shape}")
    return problems


def random_layer_weights(cfg: ModelConfig, *, generator: torch.Generator, dtype=torch.bfloat16,
                         device="cpu", num_experts: int | None = None) -> LayerWeights:
    """Random weights of one layer, scaled like a trained model (std 1/sqrt(fan_in)); never zeros."""

    def lin(out_f: int, in_f: int, *lead: int) -> torch.Tensor:
        w = torch.randn(*lead, out_f, in_f, generator=generator) / in_f ** 0.5
        return w.to(device=device, dtype=dtype)

    def norm(n: int) -> torch.Tensor:
        return (1.0 + 0.1 * torch.randn(n, generator=generator)).to(device=device, dtype=dtype)

    def bias(n: int) -> torch.Tensor:
        return (0.1 * torch.randn(n, generator=generator)).to(device=device, dtype=dtype)

    h, d = cfg.hidden_size, cfg.head_dim
    lw = LayerWeights(attn_norm=norm(h), wq=lin(cfg.q_size, h), wk=lin(cfg.kv_size, h),
                      wv=lin(cfg.kv_size, h), wo=lin(h, cfg.q_size), mlp_norm=norm(h))
    if cfg.qkv_bias:
        lw.bq, lw.bk, lw.bv = bias(cfg.q_size), bias(cfg.kv_size), bias(cfg.kv_size)
    if cfg.qk_norm:
        lw.q_norm, lw.k_norm = norm(d), norm(d)
    if cfg.is_moe:
        e, ie = num_experts or cfg.num_experts, cfg.moe_intermediate_size
        lw.router = lin(e, h)
        lw.expert_gate, lw.expert_up, lw.expert_down = lin(ie, h, e), lin(ie, h, e), lin(h, ie, e)
        if cfg.shared_expert_intermediate_size:
            s = cfg.shared_expert_intermediate_size
            lw.shared_gate, lw.shared_up, lw.shared_down = lin(s, h), lin(s, h), lin(h, s)
    else:
        i = cfg.intermediate_size
        lw.w_gate, lw.w_up, lw.w_down = lin(i, h), lin(i, h), lin(h, i)
    return lw


def random_model_weights(cfg: ModelConfig, *, seed: int = 0, dtype=torch.bfloat16, device="cpu") -> ModelWeights:
    """Random weights of a whole model (for shapes with no installable weights)."""
    g = torch.Generator().manual_seed(seed)
    embed = torch.randn(cfg.vocab_size, cfg.hidden_size, generator=g).to(device=device, dtype=dtype)
    layers = [random_layer_weights(cfg, generator=g, dtype=dtype, device=device) for _ in range(cfg.num_layers)]
    final_norm = (1.0 + 0.1 * torch.randn(cfg.hidden_size, generator=g)).to(device=device, dtype=dtype)
    lm_head = embed if cfg.tie_word_embeddings else (
        torch.randn(cfg.vocab_size, cfg.hidden_size, generator=g) / cfg.hidden_size ** 0.5).to(device=device, dtype=dtype)
    return ModelWeights(embed=embed, layers=layers, final_norm=final_norm, lm_head=lm_head)
