"""The reference model on the real SmolLM2 weights equals HF transformers' own GGUF loader + model."""

import importlib.util

import pytest
import torch

from lowlat.gguf_loader import find_smollm2_gguf
from lowlat.numerics import check_accuracy, check_bitwise
from lowlat.runtime.engine import SamplingParams, reference_engine

PROMPTS = ["The capital of France is", "def fibonacci(n):\n    ", "Water boils at a temperature of"]
DECODE_STEPS = 20


@pytest.fixture(scope="module")
def hf_model():
    if importlib.util.find_spec("accelerate") is None:
        pytest.skip("transformers' GGUF loader needs accelerate (pip install -e .[test])")
    from transformers import AutoModelForCausalLM

    path = find_smollm2_gguf()
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():            # the same bf16 rounding our loader applies
            p.copy_(p.bfloat16().float())
    return model.eval()


def test_gguf_weights_equal_transformers_loader(smollm2, hf_model):
    """Our dequantization and Q/K un-permutation give exactly transformers' weights."""
    cfg, w = smollm2
    sd = hf_model.state_dict()
    pairs = {"model.embed_tokens.weight": w.embed, "model.norm.weight": w.final_norm}
    for i in (0, cfg.num_layers - 1):
        lw, p = w.layers[i], f"model.layers.{i}."
        pairs.update({p + "self_attn.q_proj.weight": lw.wq, p + "self_attn.k_proj.weight": lw.wk,
                      p + "self_attn.v_proj.weight": lw.wv, p + "self_attn.o_proj.weight": lw.wo,
                      p + "mlp.gate_proj.weight": lw.w_gate, p + "mlp.up_proj.weight": lw.w_up,
                      p + "mlp.down_proj.weight": lw.w_down, p + "input_layernorm.weight": lw.attn_norm,
                      p + "post_attention_layernorm.weight": lw.mlp_norm})
    for name, ours in pairs.items():
        check_bitwise("gguf_weights", ours.float(), sd[name], output=name)


@pytest.mark.parametrize("prompt", PROMPTS)
def test_logits_equal_transformers_prefill_and_20_decode_steps(smollm2, smollm2_tokenizer, hf_model, prompt):
    """Prefill + 20 greedy decode steps through our engine (fp32 compute on the bf16 weights) against
    transformers' forward over the same token sequence (fp32 on the same bf16-rounded weights)."""
    cfg, w = smollm2
    ids = smollm2_tokenizer(prompt).input_ids
    engine = reference_engine(cfg, w, compute_dtype=torch.float32, num_slots=512, max_ctx=256)
    req = engine.add_request(ids, SamplingParams(max_new_tokens=DECODE_STEPS + 1, ignore_eos=True))
    ours = [engine.prefill(req)]
    tokens = list(ids)
    for _ in range(DECODE_STEPS):
        tokens.append(int(torch.argmax(ours[-1])))
        ours.append(engine.run_step([(req, [tokens[-1]])])[0])
    with torch.no_grad():
        theirs = hf_model(torch.tensor([tokens])).logits[0, len(ids) - 1:]
    check_accuracy("model", torch.stack(ours), theirs, None, output="logits_vs_transformers")


def test_greedy_generation_answers_paris(smollm2, smollm2_tokenizer):
    cfg, w = smollm2
    engine = reference_engine(cfg, w)
    ids = smollm2_tokenizer("The capital of France is").input_ids
    [req] = engine.generate([ids], SamplingParams(max_new_tokens=8))
    assert "Paris" in smollm2_tokenizer.decode(req.output_ids)


# ------------------------------------------------------------------ tiny random models of every family
# The SmolLM2 tests above cover one Llama shape (GQA 3, head_dim 64, tied, default RoPE). These build tiny
# random transformers models of every family the reference implements and copy their weights into lowlat's
# layout: Qwen2's Q/K/V bias, Qwen3's per-head QK RMSNorm (before RoPE), Qwen3-MoE / Mixtral routing
# (softmax, top-k, norm_topk_prob on / off), llama3 RoPE scaling, untied LM heads, GQA ratios 1..8,
# head_dim 16..128, and a step mixing a 0-cached-token prefill chunk, decode rows, verify rows and padding.

def _hf_arch(family):
    import transformers

    name = {"llama": "Llama", "qwen2": "Qwen2", "qwen3": "Qwen3", "qwen3_moe": "Qwen3Moe", "mixtral": "Mixtral"}[family]
    return getattr(transformers, f"{name}Config"), getattr(transformers, f"{name}ForCausalLM")


TINY_FAMILIES = {
    # id: (family, HF config fields); hidden 96, 2 layers, vocab 97 unless set
    "llama_gqa4_d64_llama3_rope_untied": ("llama", dict(
        num_attention_heads=8, num_key_value_heads=2, head_dim=64, tie_word_embeddings=False, rope_theta=500000.0,
        max_position_embeddings=64,
        rope_scaling=dict(rope_type="llama3", factor=4.0, low_freq_factor=1.0, high_freq_factor=4.0,
                          original_max_position_embeddings=16))),
    "llama_mha_d128_tied": ("llama", dict(num_attention_heads=2, num_key_value_heads=2, head_dim=128,
                                          tie_word_embeddings=True, max_position_embeddings=64)),
    "qwen2_bias_gqa3_d16": ("qwen2", dict(num_attention_heads=6, num_key_value_heads=2, head_dim=16,
                                          tie_word_embeddings=False, rope_theta=1e6)),
    "qwen3_qk_norm_gqa8_d16": ("qwen3", dict(num_attention_heads=8, num_key_value_heads=1, head_dim=16,
                                             tie_word_embeddings=False)),
    "qwen3_qk_norm_gqa4_d64_tied": ("qwen3", dict(num_attention_heads=4, num_key_value_heads=1, head_dim=64,
                                                  tie_word_embeddings=True)),
    "qwen3_moe_norm_topk": ("qwen3_moe", dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                              num_experts=8, num_experts_per_tok=3, moe_intermediate_size=24,
                                              norm_topk_prob=True, tie_word_embeddings=False)),
    "qwen3_moe_no_norm_topk": ("qwen3_moe", dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                                 num_experts=8, num_experts_per_tok=2, moe_intermediate_size=24,
                                                 norm_topk_prob=False, tie_word_embeddings=False)),
    "mixtral": ("mixtral", dict(num_attention_heads=4, num_key_value_heads=1, num_local_experts=4,
                                num_experts_per_tok=2, intermediate_size=40, sliding_window=None,
                                tie_word_embeddings=False)),
}


def _tiny_hf_model(family, fields, seed=0):
    """A tiny random HF model (fp32) whose weights are bf16 values scaled like a trained model's."""
    config_cls, model_cls = _hf_arch(family)
    base = dict(vocab_size=97, hidden_size=96, intermediate_size=80, num_hidden_layers=2, rms_norm_eps=1e-5)
    hf_cfg = config_cls(**{**base, **fields})
    hf_cfg._attn_implementation = "eager"
    model = model_cls(hf_cfg).float().eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name and p.dim() == 1:            # RMSNorm weights near 1, not all 1
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith("bias"):
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)
            p.copy_(p.bfloat16().float())
    return model


def _lowlat_from_hf(model):
    """(ModelConfig, ModelWeights fp32) of an HF model, the weights copied name by name."""
    from lowlat.config import ModelConfig
    from lowlat.weights import LayerWeights, ModelWeights, shape_problems

    d = model.config.to_dict()
    # transformers 5 writes layer_types (every layer "full_attention"): read as is
    cfg = ModelConfig.from_hf(d)
    sd = {k: v.detach().float() for k, v in model.state_dict().items()}
    layers = []
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        lw = LayerWeights(
            attn_norm=sd[p + "input_layernorm.weight"], wq=sd[p + "self_attn.q_proj.weight"],
            wk=sd[p + "self_attn.k_proj.weight"], wv=sd[p + "self_attn.v_proj.weight"],
            wo=sd[p + "self_attn.o_proj.weight"], mlp_norm=sd[p + "post_attention_layernorm.weight"],
            bq=sd.get(p + "self_attn.q_proj.bias"), bk=sd.get(p + "self_attn.k_proj.bias"),
            bv=sd.get(p + "self_attn.v_proj.bias"), q_norm=sd.get(p + "self_attn.q_norm.weight"),
            k_norm=sd.get(p + "self_attn.k_norm.weight"))
        if not cfg.is_moe:
            lw.w_gate, lw.w_up = sd[p + "mlp.gate_proj.weight"], sd[p + "mlp.up_proj.weight"]
            lw.w_down = sd[p + "mlp.down_proj.weight"]
        else:
            moe = next(m for m in ("mlp.", "block_sparse_moe.") if p + m + "gate.weight" in sd)
            lw.router = sd[p + moe + "gate.weight"]
            fused = sd.get(p + moe + "experts.gate_up_proj")           # transformers 5: [E, 2 Ie, H]
            if fused is not None:
                ie = fused.shape[1] // 2
                lw.expert_gate, lw.expert_up = fused[:, :ie].contiguous(), fused[:, ie:].contiguous()
                lw.expert_down = sd[p + moe + "experts.down_proj"]
            else:                                                      # transformers 4: one module per expert
                names = ("gate_proj", "up_proj", "down_proj") if moe == "mlp." else ("w1", "w3", "w2")
                lw.expert_gate, lw.expert_up, lw.expert_down = (
                    torch.stack([sd[f"{p}{moe}experts.{e}.{n}.weight"] for e in range(cfg.num_experts)])
                    for n in names)
        layers.append(lw)
    embed = sd["model.embed_tokens.weight"]
    lm_head = embed if cfg.tie_word_embeddings else sd["lm_head.weight"]
    w = ModelWeights(embed=embed, layers=layers, final_norm=sd["model.norm.weight"], lm_head=lm_head)
    assert shape_problems(cfg, w) == []
    return cfg, w


def _two_steps(reqs, seqs, max_ctx, pad):
    """Step 1 prefills every request's first ctx tokens; step 2 runs its n new rows (+ `pad` padding rows).
    reqs: [(ctx, n)] per request; seqs: their token lists. Slots are a fixed shuffle of 1..S-1."""
    from lowlat.step import StepBatch

    g = torch.Generator().manual_seed(7)
    total = sum(c + n for c, n in reqs)
    perm = torch.randperm(total + 8, generator=g)[: total] + 1
    page_table = torch.zeros(len(reqs), max_ctx, dtype=torch.int32)
    at = 0
    for r, (c, n) in enumerate(reqs):
        page_table[r, : c + n] = perm[at: at + c + n].int()
        at += c + n

    def step(rows, seq_lens, pad_rows):
        z = [0] * pad_rows
        return StepBatch(
            input_ids=torch.tensor([seqs[r][p] for r, p in rows] + z),
            positions=torch.tensor([p for _, p in rows] + z),
            out_cache_loc=torch.tensor([int(page_table[r, p]) for r, p in rows] + z, dtype=torch.int32),
            req_indices=torch.tensor([r for r, _ in rows] + z, dtype=torch.int32),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32), page_table=page_table.clone(),
            num_valid_rows=len(rows))

    first = step([(r, p) for r, (c, _) in enumerate(reqs) for p in range(c)], [c for c, _ in reqs], 3)
    second = step([(r, p) for r, (c, n) in enumerate(reqs) for p in range(c, c + n)], [c + n for c, n in reqs], pad)
    return first, second, total + 9


@pytest.mark.parametrize("case", list(TINY_FAMILIES))
def test_reference_model_equals_transformers_on_tiny_random_models(case):
    """ReferenceModel (fp32 on bf16-valued weights) vs the transformers model of the same family, over a
    prefill step of several requests then a step of: a request with 0 cached tokens (5 prefill rows), decode
    rows, verify rows (4 and 2 rows of one request), positions up to 56 (max_position_embeddings 64 in the
    Llama cases), and 4 padding rows. Every request's logits equal transformers' full forward over its tokens;
    padding rows are 0 and write no KV slot."""
    pytest.importorskip("transformers")
    from lowlat.reference.model import ReferenceModel

    family, fields = TINY_FAMILIES[case]
    model = _tiny_hf_model(family, fields)
    cfg, w = _lowlat_from_hf(model)
    reqs = [(0, 5), (7, 1), (3, 4), (55, 2), (12, 1)]         # (cached tokens, rows this step); 55 + 2 of 64
    g = torch.Generator().manual_seed(1)
    seqs = [torch.randint(0, cfg.vocab_size, (c + n,), generator=g).tolist() for c, n in reqs]
    first, second, slots = _two_steps(reqs, seqs, max_ctx=60, pad=4)
    shape = (slots, cfg.num_kv_heads, cfg.head_dim)
    kc = [torch.full(shape, float("nan")) for _ in range(cfg.num_layers)]
    vc = [torch.full(shape, float("nan")) for _ in range(cfg.num_layers)]
    ref = ReferenceModel(cfg, w)
    out1 = ref.forward(first, kc, vc)
    before = [(k.clone(), v.clone()) for k, v in zip(kc, vc)]
    out2 = ref.forward(second, kc, vc)
    n = second.num_valid_rows
    assert torch.equal(out2[n:], torch.zeros_like(out2[n:])), "padding rows must give 0 logits"
    untouched = torch.ones(slots, dtype=torch.bool)
    untouched[second.out_cache_loc[:n].long()] = False
    for (k0, v0), k, v in zip(before, kc, vc):
        for old, new in ((k0, k), (v0, v)):
            assert torch.equal(old[untouched].nan_to_num(7.0), new[untouched].nan_to_num(7.0)), \
                "a KV slot no valid row of the step owns was written"
    ours, theirs = [], []
    at1 = at2 = 0
    for (c, rows), toks in zip(reqs, seqs):
        with torch.no_grad():
            hf = model(torch.tensor([toks])).logits[0]
        ours += [out1[at1: at1 + c], out2[at2: at2 + rows]]
        theirs += [hf[:c], hf[c:]]
        at1, at2 = at1 + c, at2 + rows
    check_accuracy("model", torch.cat(ours), torch.cat(theirs), None, output="logits_vs_transformers")


@pytest.mark.parametrize("scaling", [None, dict(rope_type="llama3", factor=32.0, low_freq_factor=1.0,
                                                high_freq_factor=4.0, original_max_position_embeddings=8192)],
                         ids=["default", "llama3"])
@pytest.mark.parametrize("theta", [10000.0, 500000.0, 1e6])
@pytest.mark.parametrize("head_dim", [8, 64, 128])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_rope_bitwise_equals_transformers_up_to_max_position(scaling, theta, head_dim, dtype):
    """rope_inv_freq / rope_cos_sin / apply_rope vs transformers' LlamaRotaryEmbedding and apply_rotary_pos_emb at
    positions up to max_position_embeddings - 1 (131071): the same float32 angles, the same bits."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    from lowlat.config import ModelConfig
    from lowlat.reference.rope import apply_rope, rope_cos_sin, rope_inv_freq

    hf_cfg = transformers.LlamaConfig(hidden_size=4 * head_dim, num_attention_heads=4, head_dim=head_dim,
                                      rope_theta=theta, rope_scaling=scaling, max_position_embeddings=131072)
    cfg = ModelConfig.from_hf(hf_cfg.to_dict())
    rotary = LlamaRotaryEmbedding(hf_cfg)
    inv = rope_inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)
    check_bitwise("rope", inv, rotary.inv_freq.float(), output="inv_freq")
    pos = torch.tensor([0, 1, 2, 4095, 8191, 8192, 65535, 131070, 131071])
    x = torch.randn(1, 3, len(pos), head_dim, generator=torch.Generator().manual_seed(0)).to(dtype)
    cos_hf, sin_hf = rotary(x, pos[None])
    cos, sin = rope_cos_sin(pos, inv, dtype)
    check_bitwise("rope", cos, cos_hf[0], output="cos")
    check_bitwise("rope", sin, sin_hf[0], output="sin")
    q_hf, _ = apply_rotary_pos_emb(x, x, cos_hf, sin_hf)
    check_bitwise("rope", apply_rope(x[0].transpose(0, 1), cos, sin), q_hf[0].transpose(0, 1), output="rotated")
