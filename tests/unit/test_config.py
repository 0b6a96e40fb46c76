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
