"""ModelConfig: presets with public shapes, HF / GGUF readers, typed refusals."""

import pytest

from lowlat.config import PRESET_NAMES, ModelConfig, preset, preset_hf_config
from lowlat.errors import UnsupportedConfigError

# (hidden, layers, heads, kv heads, head_dim, intermediate, vocab) from each model's config.json
PUBLIC_SHAPES = {
    "SmolLM2-135M": (576, 30, 9, 3, 64, 1536, 49152),
    "Llama-3.2-1B": (2048, 16, 32, 8, 64, 8192, 128256),
    "Qwen2.5-0.5B": (896, 24, 14, 2, 64, 4864, 151936),
    "Qwen3-0.6B": (1024, 28, 16, 8, 128, 3072, 151936),
    "Qwen3-30B-A3B": (2048, 48, 32, 4, 128, 6144, 151936),
}


@pytest.mark.parametrize("name", PRESET_NAMES)
def test_presets_have_public_shapes(name):
    c = preset(name)
    assert (c.hidden_size, c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim, c.intermediate_size,
            c.vocab_size) == PUBLIC_SHAPES[name]


def test_family_options():
    assert preset("Qwen2.5-0.5B").qkv_bias and not preset("Qwen2.5-0.5B").qk_norm
    assert preset("Qwen3-0.6B").qk_norm
    moe = preset("Qwen3-30B-A3B")
    assert (moe.num_experts, moe.top_k, moe.moe_intermediate_size, moe.norm_topk_prob) == (128, 8, 768, True)
    llama = preset("Llama-3.2-1B")
    assert llama.rope_scaling.factor == 32.0 and llama.rope_scaling.original_max_position_embeddings == 8192
    assert preset("SmolLM2-135M").tie_word_embeddings


def test_transformers_v5_rope_parameters_are_read():
    hf = preset_hf_config("Llama-3.2-1B")
    scaling = hf.pop("rope_scaling")
    hf["rope_parameters"] = {"rope_theta": hf.pop("rope_theta"), **scaling}
    c = ModelConfig.from_hf(hf)
    assert c.rope_theta == 500000.0 and c.rope_scaling == preset("Llama-3.2-1B").rope_scaling


@pytest.mark.parametrize("change,field", [
    ({"sliding_window": 4096}, "sliding_window"),
    ({"use_sliding_window": True, "sliding_window": 4096}, "sliding_window"),
    ({"kv_lora_rank": 512}, "kv_lora_rank"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"num_key_value_heads": 5}, "num_key_value_heads"),
    ({"architectures": ["DeepseekV3ForCausalLM"]}, "architectures"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_scaling.rope_type"),
])
def test_unsupported_configs_raise_naming_the_field(change, field):
    hf = preset_hf_config("SmolLM2-135M")
    hf.update(change)
    with pytest.raises(UnsupportedConfigError) as e:
        ModelConfig.from_hf(hf)
    assert e.value.field == field and field in str(e.value)


def test_qwen_with_sliding_window_disabled_is_accepted():
    assert preset("Qwen2.5-0.5B").name == "Qwen2.5-0.5B"


def test_gguf_metadata_reader_matches_the_preset(smollm2):
    cfg, _ = smollm2
    p = preset("SmolLM2-135M")
    for f in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim", "intermediate_size",
              "vocab_size", "rope_theta", "tie_word_embeddings"):
        assert getattr(cfg, f) == getattr(p, f), f


def _tiny_hf(**changes):
    hf = dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, head_dim=64, intermediate_size=256, vocab_size=256)
    hf.update(changes)
    return hf


MOE = dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=64)


@pytest.mark.parametrize("change,attr,value", [
    # Qwen2 always has Q/K/V biases in HF (attention_bias is not read); Mixtral never has them
    (dict(architectures=["Qwen2ForCausalLM"], attention_bias=False), "qkv_bias", True),
    (dict(architectures=["MixtralForCausalLM"], attention_bias=True, num_local_experts=8,
          num_experts_per_tok=2), "qkv_bias", False),
    # Qwen3-MoE's HF default is no renormalisation; Mixtral always renormalises
    (dict(architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", **MOE), "norm_topk_prob", False),
    (dict(architectures=["MixtralForCausalLM"], norm_topk_prob=False, num_local_experts=8, num_experts_per_tok=2),
     "norm_topk_prob", True),
    # a null num_experts does not hide Mixtral's num_local_experts; a null KV-head count means MHA, as in HF
    (dict(architectures=["MixtralForCausalLM"], num_experts=None, num_local_experts=8, num_experts_per_tok=2),
     "num_experts", 8),
    (dict(num_key_value_heads=None), "num_kv_heads", 4),
], ids=["qwen2-bias-always", "mixtral-no-bias", "qwen3moe-no-renorm-default", "mixtral-renorm-always",
        "mixtral-null-num-experts", "null-kv-heads"])
def test_hf_fields_are_read_with_transformers_meaning(change, attr, value):
    assert getattr(ModelConfig.from_hf(_tiny_hf(**change)), attr) == value


@pytest.mark.parametrize("change,field", [
    # HF gives o_proj a bias too with attention_bias on Llama / Qwen3: lowlat implements none
    (dict(attention_bias=True), "attention_bias"),
    (dict(architectures=["Qwen3ForCausalLM"], attention_bias=True), "attention_bias"),
    (dict(partial_rotary_factor=0.5), "partial_rotary_factor"),
    (dict(rope_parameters={"rope_theta": 1e4, "rope_type": "default", "partial_rotary_factor": 0.25}),
     "rope_parameters.partial_rotary_factor"),
    (dict(rope_scaling={"rope_type": "llama3", "factor": 8.0}), "rope_scaling.low_freq_factor"),
    (dict(hidden_size=128.5), "hidden_size"),
    (dict(num_attention_heads="4"), "num_attention_heads"),
    (dict(vocab_size=None), "vocab_size"),
    (dict(tie_word_embeddings="false"), "tie_word_embeddings"),
    (dict(rope_theta=float("nan")), "rope_theta"),
    (dict(rope_theta=0), "rope_theta"),
    (dict(rms_norm_eps=-1e-6), "rms_norm_eps"),
])
def test_malformed_or_unimplemented_hf_fields_raise_naming_the_field(change, field):
    with pytest.raises(UnsupportedConfigError) as e:
        ModelConfig.from_hf(_tiny_hf(**change))
    assert e.value.field == field


def test_a_missing_required_field_is_a_typed_error_not_a_key_error():
    hf = _tiny_hf()
    del hf["num_hidden_layers"]
    with pytest.raises(UnsupportedConfigError, match="num_hidden_layers=None"):
        ModelConfig.from_hf(hf)


GGUF_FIELDS = {"general.architecture": "llama", "llama.embedding_length": 576, "llama.attention.head_count": 9,
               "llama.attention.head_count_kv": 3, "llama.block_count": 2, "llama.feed_forward_length": 1536,
               "llama.vocab_size": 49152, "llama.rope.dimension_count": 64}


@pytest.mark.parametrize("change,field", [
    ({"llama.expert_count": 8}, "llama.expert_count"),
    ({"llama.rope.scaling.type": "linear"}, "llama.rope.scaling.type"),
    ({"llama.rope.dimension_count": 32}, "llama.rope.dimension_count"),      # partial RoPE
    ({"llama.attention.key_length": 128, "llama.rope.dimension_count": 128,
      "llama.attention.value_length": 64}, "llama.attention.value_length"),
    ({"llama.vocab_size": None}, "llama.vocab_size"),
])
def test_gguf_metadata_lowlat_cannot_run_raises_naming_the_key(change, field):
    with pytest.raises(UnsupportedConfigError) as e:
        ModelConfig.from_gguf_metadata({**GGUF_FIELDS, **change})
    assert e.value.field == field


def test_gguf_head_dim_is_the_key_length():
    cfg = ModelConfig.from_gguf_metadata({**GGUF_FIELDS, "llama.attention.key_length": 128,
                                          "llama.rope.dimension_count": 128})
    assert cfg.head_dim == 128 and cfg.q_size == 9 * 128


def test_layer_types_of_full_attention_only_are_read_other_kinds_refused():
    """transformers 5 writes layer_types into every Qwen2 / Qwen3 config (all "full_attention"; the hub's
    Qwen3-0.6B too): that is the plain model. Any other kind is a per-layer attention lowlat lacks."""
    cfg = ModelConfig.from_hf(_tiny_hf(layer_types=["full_attention"] * 2))
    assert cfg == ModelConfig.from_hf(_tiny_hf())
    with pytest.raises(UnsupportedConfigError) as e:
        ModelConfig.from_hf(_tiny_hf(layer_types=["full_attention", "sliding_attention"]))
    assert e.value.field == "layer_types" and e.value.value == ["sliding_attention"]
