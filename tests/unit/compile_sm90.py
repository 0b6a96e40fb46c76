"""Compile a Triton kernel for sm_90 (H200) on a machine without a GPU: Triton's own front end, its NVIDIA
lowering and the bundled ptxas (`-v`: registers and spills). Catches what the CPU interpreter cannot see
(type unification across branches, layouts, wgmma lowering, register spills) before the kernel ever meets
the GPU.

Must run in a process WITHOUT TRITON_INTERPRET (under the interpreter `@triton.jit` gives interpreted
functions); the tests call it through `subprocess`:

    python tests/unit/compile_sm90.py MODULE:KERNEL 'JSON [{"constexprs": {...}, "pointers": {...}}, ...]'

compiles each variant of the list and prints one JSON line, a list of
{"ok": true, "registers": N, "spill_bytes": N, "shared": N}, or raises.
Scalar arguments not named in "pointers" or "constexprs" are typed "scalars" (default i32).
"""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
import tempfile


def compile_for_sm90(fn, constexprs: dict, pointers: dict, scalars: dict | None = None,
                     num_warps: int = 4, num_stages: int = 3) -> dict:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    scalars = scalars or {}
    sig = {}
    for name in fn.arg_names:
        if name in constexprs:
            sig[name] = "constexpr"
        elif name in pointers:
            sig[name] = pointers[name]
        else:
            sig[name] = scalars.get(name, "i32")
    src = ASTSource(fn=fn, signature=sig, constexprs={(fn.arg_names.index(n),): v for n, v in constexprs.items()})
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                       options={"num_warps": num_warps, "num_stages": num_stages})
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "k.ptx")
        with open(path, "w") as f:
            f.write(k.asm["ptx"])
        res = subprocess.run([ptxas, "-arch=sm_90a", "-v", path, "-o", os.path.join(d, "k.cubin")],
                             capture_output=True, text=True, check=True)
    info = res.stdout + res.stderr
    regs = re.search(r"Used (\d+) registers", info)
    spills = [int(x) for x in re.findall(r"(\d+) bytes spill (?:stores|loads)", info)]
    return {"ok": True, "registers": int(regs.group(1)) if regs else None,
            "spill_bytes": max(spills) if spills else 0, "shared": k.metadata.shared}


def main() -> int:
    target, specs = sys.argv[1], json.loads(sys.argv[2])
    mod, name = target.split(":")
    fn = getattr(importlib.import_module(mod), name)
    out = [compile_for_sm90(fn, spec.get("constexprs", {}), spec.get("pointers", {}), spec.get("scalars"),
                            spec.get("num_warps", 4), spec.get("num_stages", 3)) for spec in specs]
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
