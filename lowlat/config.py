"""Model configuration: one dataclass for the Llama / Qwen2 / Qwen3 / Qwen3-MoE / Mixtral family.

`ModelConfig.from_hf(config_dict)` reads a Hugging Face `config.json` (transformers 4.x `rope_theta` /
`rope_scaling` and 5.x `rope_parameters` alike); `ModelConfig.from_gguf_metadata(fields)` reads
llama.cpp GGUF metadata; `preset(name)` returns the public shape of a named model, looked up by exact
name. Anything this project does not implement raises `UnsupportedConfigError` naming the field.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from lowlat.errors import UnsupportedConfigError

#: Architectures (HF `architectures[0]`) whose decoder layer the reference implements.
SUPPORTED_ARCHITECTURES = (
    "LlamaForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "Qwen3MoeForCausalLM",
    "MixtralForCausalLM",
)


@dataclass(frozen=True)
class RopeScaling:
    """Llama-3 frequency scaling (`rope_scaling.rope_type == "llama3"`), as HF transformers applies it."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


@dataclass(frozen=True)
class ModelConfig:
    """Shapes and options of one decoder-only model.

    Dims used throughout lowlat: H = hidden_size, Hq = num_heads, Hkv = num_kv_heads, D = head_dim,
    I = intermediate_size (dense MLP), E = num_experts, K = top_k, Ie = moe_intermediate_size, V = vocab.
    """

    name: str
    architecture: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    rms_eps: float = 1e-6
    qkv_bias: bool = False
    qk_norm: bool = False
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 8192
    # MoE (num_experts == 0 means a dense SwiGLU MLP in every layer)
    num_experts: int = 0
    top_k: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    norm_topk_prob: bool = True
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        for name in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim", "vocab_size"):
            if getattr(self, name) <= 0:
                raise UnsupportedConfigError(name, getattr(self, name), "must be positive")
        if self.num_heads % self.num_kv_heads:
            raise UnsupportedConfigError(
                "num_key_value_heads", self.num_kv_heads,
                f"must divide num_attention_heads={self.num_heads} (GQA groups)")
        if self.head_dim % 2:
            raise UnsupportedConfigError("head_dim", self.head_dim, "RoPE needs an even head_dim")
        if self.is_moe:
            if not 0 < self.top_k <= self.num_experts:
                raise UnsupportedConfigError("num_experts_per_tok", self.top_k,
                                             f"must be in 1..num_experts={self.num_experts}")
            if self.moe_intermediate_size <= 0:
                raise UnsupportedConfigError("moe_intermediate_size", self.moe_intermediate_size,
                                             "must be positive for an MoE model")
        elif self.intermediate_size <= 0:
            raise UnsupportedConfigError("intermediate_size", self.intermediate_size, "must be positive")

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def gqa_group(self) -> int:
        """Query heads per KV head."""
        return self.num_heads // self.num_kv_heads

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def replace(self, **changes: Any) -> "ModelConfig":
        return dataclasses.replace(self, **changes)

    # ------------------------------------------------------------------ readers
    @classmethod
    def from_hf(cls, hf: Mapping[str, Any], name: str | None = None) -> "ModelConfig":
        """Build from an HF `config.json` dict, with HF transformers' meaning of every field it reads.

        Raises `UnsupportedConfigError(field, value, why)` for a feature lowlat does not implement, a
        required field that is missing or null, or a value of the wrong type or range (an integer field
        holding 2.5 or "abc", a flag holding "false", a NaN rope_theta): never KeyError / TypeError.
        """
        archs = name_list(hf, "architectures")
        model_type = hf.get("model_type", "")
        arch = archs[0] if archs else _ARCH_BY_MODEL_TYPE.get(model_type, "")
        if arch not in SUPPORTED_ARCHITECTURES:
            raise UnsupportedConfigError("architectures", arch or model_type,
                                         f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}")
        _refuse_unsupported_fields(hf)

        rope = _mapping(hf, "rope_parameters")
        rope_theta = _float(hf, "rope_theta") if hf.get("rope_theta") is not None else \
            _float(rope, "rope_theta", 10000.0)
        scaling_dict = _mapping(hf, "rope_scaling") or (rope if rope.get("rope_type", "default") != "default" else None)
        for where, d in (("", hf), ("rope_parameters.", rope), ("rope_scaling.", scaling_dict or {})):
            factor = d.get("partial_rotary_factor")
            if factor is not None and factor != 1:
                raise UnsupportedConfigError(f"{where}partial_rotary_factor", factor,
                                             "partial RoPE (only part of head_dim rotated) is not implemented")
        rope_scaling = _read_rope_scaling(scaling_dict)

        hidden = int_field(hf, "hidden_size")
        heads = int_field(hf, "num_attention_heads")
        head_dim = int_field(hf, "head_dim", 0) or (hidden // heads if heads > 0 else 0)
        num_experts = int_field(hf, "num_experts", 0) or int_field(hf, "num_local_experts", 0)
        eos_ids = _token_ids(hf, "eos_token_id")
        return cls(
            name=name or hf.get("_name_or_path") or arch,
            architecture=arch,
            hidden_size=hidden,
            num_layers=int_field(hf, "num_hidden_layers"),
            num_heads=heads,
            num_kv_heads=int_field(hf, "num_key_value_heads", heads),      # null means MHA, as in HF
            head_dim=head_dim,
            intermediate_size=int_field(hf, "intermediate_size", 0),
            vocab_size=int_field(hf, "vocab_size"),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            rms_eps=_float(hf, "rms_norm_eps", 1e-6),
            qkv_bias=_qkv_bias(hf, arch),
            qk_norm=arch in ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM"),
            tie_word_embeddings=_flag(hf, "tie_word_embeddings", False),
            max_position_embeddings=int_field(hf, "max_position_embeddings", 8192),
            num_experts=num_experts,
            top_k=int_field(hf, "num_experts_per_tok", 0) if num_experts else 0,
            moe_intermediate_size=(int_field(hf, "moe_intermediate_size", 0) or int_field(hf, "intermediate_size", 0))
            if num_experts else 0,
            shared_expert_intermediate_size=int_field(hf, "shared_expert_intermediate_size", 0),
            # Mixtral always renormalises its top-k (HF ignores the field); Qwen3-MoE says so in
            # norm_topk_prob, whose HF default is False.
            norm_topk_prob=True if arch == "MixtralForCausalLM" else _flag(hf, "norm_topk_prob", False),
            bos_token_id=hf.get("bos_token_id"),
            eos_token_ids=eos_ids,
        )

    @classmethod
    def from_gguf_metadata(cls, fields: Mapping[str, Any], name: str | None = None) -> "ModelConfig":
        """Build from GGUF key/values (`gguf.GGUFReader(...).fields[k].contents()`), llama architecture.

        head_dim is `llama.attention.key_length` (else hidden / heads). Raises `UnsupportedConfigError`
        naming the key for a required key missing, experts (`llama.expert_count`), RoPE scaling metadata,
        a rotary dimension other than head_dim (partial RoPE) or value heads of another size.
        """
        arch = fields.get("general.architecture")
        if arch != "llama":
            raise UnsupportedConfigError("general.architecture", arch, "only llama GGUF files are read")
        p = "llama."

        def req(key: str) -> Any:
            if fields.get(p + key) is None:
                raise UnsupportedConfigError(p + key, None, "a required GGUF key is missing")
            return fields[p + key]

        experts = int(fields.get(p + "expert_count") or 0)
        if experts:
            raise UnsupportedConfigError(p + "expert_count", experts, "MoE GGUF files are not read (dense only)")
        scaling = fields.get(p + "rope.scaling.type")
        if scaling not in (None, "", "none"):
            raise UnsupportedConfigError(p + "rope.scaling.type", scaling, "RoPE scaling is not read from GGUF")
        hidden = int(req("embedding_length"))
        heads = int(req("attention.head_count"))
        head_dim = int(fields.get(p + "attention.key_length") or (hidden // heads if heads > 0 else 0))
        for key in ("attention.value_length", "rope.dimension_count"):
            v = fields.get(p + key)
            if v is not None and int(v) != head_dim:
                raise UnsupportedConfigError(p + key, int(v), f"must equal head_dim={head_dim} (partial RoPE or "
                                             "value heads of another size are not implemented)")
        has_output = bool(fields.get("_has_output_weight", False))
        eos = fields.get("tokenizer.ggml.eos_token_id")
        return cls(
            name=name or str(fields.get("general.name", "llama")),
            architecture="LlamaForCausalLM",
            hidden_size=hidden,
            num_layers=int(req("block_count")),
            num_heads=heads,
            num_kv_heads=int(fields.get(p + "attention.head_count_kv", heads)),
            head_dim=head_dim,
            intermediate_size=int(req("feed_forward_length")),
            vocab_size=int(req("vocab_size")),
            rope_theta=float(fields.get(p + "rope.freq_base", 10000.0)),
            rms_eps=float(fields.get(p + "attention.layer_norm_rms_epsilon", 1e-5)),
            tie_word_embeddings=not has_output,
            max_position_embeddings=int(fields.get(p + "context_length", 8192)),
            bos_token_id=fields.get("tokenizer.ggml.bos_token_id"),
            eos_token_ids=(int(eos),) if eos is not None else (),
        )


_ARCH_BY_MODEL_TYPE = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "mixtral": "MixtralForCausalLM",
}


_REQUIRED = object()


def name_list(hf: Mapping[str, Any], key: str) -> list[str]:
    """hf[key] as a list of names ([] when missing or null); UnsupportedConfigError for anything else (a bare
    string, a number, a list holding a non-string)."""
    v = hf.get(key)
    if v is None:
        return []
    if not isinstance(v, (list, tuple)) or not all(isinstance(n, str) for n in v):
        raise UnsupportedConfigError(key, v, "must be a list of names")
    return list(v)


def _mapping(hf: Mapping[str, Any], key: str) -> dict:
    """hf[key] as a dict ({} when missing or null); UnsupportedConfigError for a non-mapping."""
    v = hf.get(key)
    if v is None:
        return {}
    if not isinstance(v, Mapping):
        raise UnsupportedConfigError(key, v, "must be a mapping")
    return dict(v)


def _token_ids(hf: Mapping[str, Any], key: str) -> tuple[int, ...]:
    """hf[key], one token id or a list of them, as a tuple of ints (() when missing or null)."""
    v = hf.get(key)
    if v is None:
        return ()
    items = v if isinstance(v, (list, tuple)) else [v]
    return tuple(int_field({key: t}, key) for t in items)


def int_field(hf: Mapping[str, Any], key: str, default: Any = _REQUIRED) -> int:
    """hf[key] as an int; a missing or null field is `default` (UnsupportedConfigError when required).
    Integral floats (2048.0) are accepted; bools, strings, fractions, NaN and +-inf are refused."""
    v = hf.get(key)
    if v is None:
        if default is _REQUIRED:
            raise UnsupportedConfigError(key, v, "a required field is missing or null")
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (isinstance(v, float) and not math.isfinite(v)) \
            or int(v) != v:
        raise UnsupportedConfigError(key, v, "must be an integer")
    return int(v)


def _float(hf: Mapping[str, Any], key: str, default: Any = _REQUIRED) -> float:
    """hf[key] as a finite float >= 0 (rope_theta > 0); a missing or null field is `default`."""
    v = hf.get(key)
    if v is None:
        if default is _REQUIRED:
            raise UnsupportedConfigError(key, v, "a required field is missing or null")
        v = default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0 or (
            key == "rope_theta" and v == 0):
        raise UnsupportedConfigError(key, v, "must be a finite number" + (" > 0" if key == "rope_theta" else " >= 0"))
    return float(v)


def _flag(hf: Mapping[str, Any], key: str, default: bool) -> bool:
    """hf[key] as a bool (JSON true / false); null or missing is `default`; "false", 0.5, ... are refused."""
    v = hf.get(key)
    if v is None:
        return default
    if not isinstance(v, bool) and v not in (0, 1):
        raise UnsupportedConfigError(key, v, "must be true or false")
    return bool(v)


def _qkv_bias(hf: Mapping[str, Any], arch: str) -> bool:
    """Q/K/V biases as HF builds them: Qwen2 always has them (attention_bias is ignored), Mixtral never;
    Llama / Qwen3 / Qwen3-MoE take `attention_bias`, which also gives o_proj a bias: not implemented."""
    if arch == "Qwen2ForCausalLM":
        return True
    if arch == "MixtralForCausalLM":
        return False
    if _flag(hf, "attention_bias", False):
        raise UnsupportedConfigError("attention_bias", True, f"{arch} then also has an o_proj bias, which "
                                     "lowlat's attention does not implement")
    return False


def _refuse_unsupported_fields(hf: Mapping[str, Any]) -> None:
    """Raise for every feature the reference does not implement (first one found, by field name)."""
    window = hf.get("sliding_window")
    if window and hf.get("use_sliding_window", True):
        raise UnsupportedConfigError("sliding_window", window, "sliding-window attention")
    for key, what in (("kv_lora_rank", "multi-head latent attention (MLA)"),
                      ("q_lora_rank", "multi-head latent attention (MLA)"),
                      ("mlp_only_layers", "dense layers inside an MoE model")):
        if hf.get(key):
            raise UnsupportedConfigError(key, hf.get(key), what)
    kinds = sorted({t for t in name_list(hf, "layer_types") if t != "full_attention"})
    if kinds:       # transformers 5 writes layer_types for every Qwen2 / Qwen3 config: all full attention is fine
        raise UnsupportedConfigError("layer_types", kinds, "per-layer attention types other than full attention")
    if hf.get("hidden_act", "silu") != "silu":
        raise UnsupportedConfigError("hidden_act", hf.get("hidden_act"), "only SwiGLU (silu) MLPs")
    if hf.get("mlp_bias"):
        raise UnsupportedConfigError("mlp_bias", True, "MLP biases")
    if int(hf.get("decoder_sparse_step", 1) or 1) != 1:
        raise UnsupportedConfigError("decoder_sparse_step", hf["decoder_sparse_step"], "MoE in every layer only")
    if hf.get("shared_expert_intermediate_size") and hf.get("model_type") == "qwen2_moe":
        raise UnsupportedConfigError("shared_expert_gate", "qwen2_moe", "gated shared experts")


def _read_rope_scaling(scaling: Mapping[str, Any] | None) -> RopeScaling | None:
    if not scaling:
        return None
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return None
    if kind != "llama3":
        raise UnsupportedConfigError("rope_scaling.rope_type", kind, "only 'llama3' scaling is implemented")
    for key in ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"):
        v = scaling.get(key)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            raise UnsupportedConfigError(f"rope_scaling.{key}", v, "llama3 scaling needs a finite number > 0")
    return RopeScaling(
        factor=float(scaling["factor"]),
        low_freq_factor=float(scaling["low_freq_factor"]),
        high_freq_factor=float(scaling["high_freq_factor"]),
        original_max_position_embeddings=int(scaling["original_max_position_embeddings"]),
    )


# ---------------------------------------------------------------------- presets
# Public shapes, copied field by field from each model's published config.json.
_PRESETS: dict[str, dict[str, Any]] = {
    "SmolLM2-135M": dict(
        architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=576, num_hidden_layers=30,
        num_attention_heads=9, num_key_value_heads=3, head_dim=64, intermediate_size=1536,
        vocab_size=49152, rope_theta=100000.0, rms_norm_eps=1e-5, tie_word_embeddings=True,
        max_position_embeddings=8192, bos_token_id=1, eos_token_id=2),
    "Llama-3.2-1B": dict(
        architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=2048, num_hidden_layers=16,
        num_attention_heads=32, num_key_value_heads=8, head_dim=64, intermediate_size=8192,
        vocab_size=128256, rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=True,
        max_position_embeddings=131072, bos_token_id=128000, eos_token_id=128001,
        rope_scaling=dict(rope_type="llama3", factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
                          original_max_position_embeddings=8192)),
    "Qwen2.5-0.5B": dict(
        architectures=["Qwen2ForCausalLM"], model_type="qwen2", hidden_size=896, num_hidden_layers=24,
        num_attention_heads=14, num_key_value_heads=2, intermediate_size=4864, vocab_size=151936,
        rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True, attention_bias=True,
        max_position_embeddings=32768, use_sliding_window=False, sliding_window=32768,
        bos_token_id=151643, eos_token_id=151643),
    "Qwen3-0.6B": dict(
        architectures=["Qwen3ForCausalLM"], model_type="qwen3", hidden_size=1024, num_hidden_layers=28,
        num_attention_heads=16, num_key_value_heads=8, head_dim=128, intermediate_size=3072,
        vocab_size=151936, rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
        attention_bias=False, max_position_embeddings=40960, use_sliding_window=False,
        sliding_window=None, bos_token_id=151643, eos_token_id=151645),
    "Qwen3-30B-A3B": dict(
        architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", hidden_size=2048,
        num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
        intermediate_size=6144, moe_intermediate_size=768, num_experts=128, num_experts_per_tok=8,
        norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[], vocab_size=151936,
        rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=False, attention_bias=False,
        max_position_embeddings=40960, use_sliding_window=False, sliding_window=None,
        bos_token_id=151643, eos_token_id=151645),
}

PRESET_NAMES = tuple(_PRESETS)


def preset_hf_config(name: str) -> dict[str, Any]:
    """The HF config dict of a preset (a fresh copy)."""
    if name not in _PRESETS:
        raise KeyError(f"unknown preset {name!r}; known: {', '.join(PRESET_NAMES)}")
    return {k: (list(v) if isinstance(v, list) else dict(v) if isinstance(v, dict) else v)
            for k, v in _PRESETS[name].items()}


def preset(name: str) -> ModelConfig:
    """The `ModelConfig` of a public model, looked up by exact name (see `PRESET_NAMES`)."""
    return ModelConfig.from_hf(preset_hf_config(name), name=name)
