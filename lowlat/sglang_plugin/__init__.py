"""lowlat as SGLang's `nvidia_megakernel` plugin (entry-point group `sglang.srt.plugins`).

SGLang loads the entry point once per process and calls `register_specs()` with no arguments; it
registers, per HF architecture the fused step covers, the "module:attribute" path of its
MegakernelSpec (lowlat/sglang_plugin/spec.py). Importing this package imports nothing of SGLang and
changes no state; the spec module is imported only when SGLang's `find_spec` asks for it.
"""

from __future__ import annotations

from lowlat.runtime.contract import SGLANG_ARCHITECTURES, SPEC_ATTRS

#: The module holding the MegakernelSpec objects, one attribute per architecture (SPEC_ATTRS).
SPEC_MODULE = "lowlat.sglang_plugin.spec"


def spec_paths() -> dict[str, str]:
    """HF architecture -> "module:attribute" of its MegakernelSpec (SGLANG_ARCHITECTURES)."""
    return {arch: f"{SPEC_MODULE}:{SPEC_ATTRS[arch]}" for arch in SGLANG_ARCHITECTURES}


def register_specs() -> None:
    """The `nvidia_megakernel` entry point: register every spec path with SGLang."""
    from sglang.kernels.plugin_kernels.nvidia.spec import register

    for arch, path in spec_paths().items():
        register(architecture=arch, path=path)
