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
