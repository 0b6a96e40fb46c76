"""The whole decoder-only model as a plain specification (gpt-fast style):

    x = embed[input_ids]  ->  decoder_layer x num_layers  ->  rms_norm(final_norm)  ->  logits = x lm_head^T

`ReferenceModel(cfg, weights).forward(step, k_caches, v_caches)` runs one step of the step contract
(lowlat/step.py). The compute dtype is the weights' dtype: bf16 weights give the bf16 baseline;
`weights.to(dtype=torch.float64)` gives the oracle on the same (bf16-rounded) values.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from lowlat.config import ModelConfig
from lowlat.errors import UnsupportedConfigError
from lowlat.reference.layer import decoder_layer
from lowlat.reference.rms_norm import rms_norm
from lowlat.reference.rope import rope_cos_sin, rope_inv_freq
from lowlat.step import StepBatch
from lowlat.weights import ModelWeights


class ReferenceModel:
    """Reference forward of one model. Holds no KV cache: the caller passes per-layer caches."""

    def __init__(self, cfg: ModelConfig, weights: ModelWeights) -> None:
        if len(weights.layers) != cfg.num_layers:
            raise ValueError(f"weights have {len(weights.layers)} layers, config says {cfg.num_layers}")
        self.cfg, self.weights = cfg, weights
        self.dtype = weights.embed.dtype
        self.device = weights.embed.device
        freq_dtype = torch.float64 if self.dtype == torch.float64 else torch.float32
        self.inv_freq = rope_inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling, freq_dtype).to(self.device)

    def embed(self, step: StepBatch) -> torch.Tensor:
        """[M, H]; padding rows embed token 0 (their ids are not checked)."""
        rows = torch.arange(step.num_rows, device=step.input_ids.device)
        ids = torch.where(rows < step.num_valid_rows, step.input_ids, torch.zeros_like(step.input_ids))
        return self.weights.embed[ids]

    def hidden_states(self, step: StepBatch, k_caches: list[torch.Tensor], v_caches: list[torch.Tensor],
                      num_layers: int | None = None) -> torch.Tensor:
        """Final-normed hidden states [M, H] after `num_layers` layers (all by default; a smaller number
        gives the early-exit draft model of self-speculation). Padding rows are 0.

        Raises UnsupportedConfigError (a ValueError) for num_layers outside 1..num_layers of the config (0, a
        negative or a larger count would otherwise slice the layer list silently), before any KV write."""
        cfg = self.cfg
        if num_layers is None:
            num_layers = cfg.num_layers
        elif type(num_layers) is not int or not 1 <= num_layers <= cfg.num_layers:
            raise UnsupportedConfigError("num_layers", num_layers, f"must be an int in 1..{cfg.num_layers}")
        x = self.embed(step)
        cos, sin = rope_cos_sin(step.positions, self.inv_freq, self.dtype)
        for i, lw in enumerate(self.weights.layers[:num_layers]):
            x = decoder_layer(cfg, lw, x, step, k_caches[i], v_caches[i], cos, sin)
        x = rms_norm(x, self.weights.final_norm, cfg.rms_eps)
        x[step.num_valid_rows:] = 0
        return x

    def forward(self, step: StepBatch, k_caches: list[torch.Tensor], v_caches: list[torch.Tensor], *,
                validate: bool = True, num_layers: int | None = None) -> torch.Tensor:
        """Logits [M, V], float32 (float64 for float64 weights); padding rows are 0.

        Raises `StepContractError` (before any KV write) when `validate` and the step breaks the contract.
        Mutates: the KV caches at the valid rows' out_cache_loc.
        """
        if validate:
            step.validate(vocab_size=self.cfg.vocab_size, num_slots=k_caches[0].shape[0])
        h = self.hidden_states(step, k_caches, v_caches, num_layers)
        logits = F.linear(h, self.weights.lm_head)
        return logits.to(torch.promote_types(logits.dtype, torch.float32))
