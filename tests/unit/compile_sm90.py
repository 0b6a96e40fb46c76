"""Compile a Triton (or Gluon) kernel for sm_90 (H200) on a machine without a GPU: Triton's own front end, its NVIDIA
lowering and the bundled ptxas (`-v`: registers and spills). Catches what the CPU interpreter cannot see
(type unification across branches, layouts, wgmma lowering, register spills) before the kernel ever meets
the GPU.

Must run in a process WITHOUT TRITON_INTERPRET (under the interpreter `@triton.jit` gives interpreted
functions); the tests call it through `subprocess`:

    python tests/unit/compile_sm90.py MODULE:KERNEL 'JSON [{"constexprs": {...}, "pointers": {...}}, ...]'

compiles each variant of the list and prints one JSON line, a list of
{"ok": true, "registers": N, "spill_bytes": N, "shared": N, "cp_async": N (cp.async.cg in the PTX),
"source": the kernel module's file (which checkout was compiled)}, or raises.
A spec's keys: "constexprs", "pointers" (name -> "*bf16" ..., or a TMA descriptor's type as
`triton.runtime.jit.mangle_type` gives it: "tensordesc<bf16[4, 16, 64],NVMMASharedLayout(...)>"), "scalars" (name -> type; default i32),
"num_warps" (4), "num_stages" (3), and optionally
  "divisible"   scalar names a launch specialises as divisible by 16; with it every pointer is taken as
                16-byte aligned too, as a real launch does. Without the alignment Triton cannot prove that
                a weight tile's rows are aligned and does not software-pipeline GEMV loops (no cp.async,
                one stage of shared memory): give it to read the registers / shared memory of the kernel
                that actually runs;
  "maxnreg", "launch_pdl"   compile options as the launch passes them;
  "ptx": true   also return the PTX text ("ptx");
  "dump": PATH_PREFIX      keep PATH_PREFIX.ttgir / .ptx / .cubin / .sass (nvdisasm) for inspection.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile


def compile_for_sm90(fn, spec: dict) -> dict:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from lowlat.kernels.sm90_check import constexpr_defaults

    constexprs, pointers = spec.get("constexprs", {}), spec.get("pointers", {})
    scalars = spec.get("scalars") or {}
    # constexpr parameters with a default that the spec does not name take their default (as a launch does)
    constexprs = {**{k: v for k, v in constexpr_defaults(fn).items() if k not in pointers and k not in scalars},
                  **constexprs}
    sig = {n: "constexpr" if n in constexprs else pointers.get(n, scalars.get(n, "i32")) for n in fn.arg_names}
    aligned = set(spec["divisible"]) | {n for n, t in pointers.items() if t.startswith("*")} if "divisible" in spec \
        else set()
    if getattr(fn, "is_gluon", lambda: False)():
        from triton.experimental.gluon._runtime import GluonASTSource as ASTSource  # noqa: N814
    src = ASTSource(fn=fn, signature=sig, attrs={(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in aligned},
                    constexprs={(fn.arg_names.index(n),): v for n, v in constexprs.items()})
    options = {"num_warps": spec.get("num_warps", 4), "num_stages": spec.get("num_stages", 3)}
    for opt in ("maxnreg", "launch_pdl"):
        if spec.get(opt):
            options[opt] = spec[opt]
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    with tempfile.TemporaryDirectory() as d:
        path, cubin = os.path.join(d, "k.ptx"), os.path.join(d, "k.cubin")
        with open(path, "w") as f:
            f.write(k.asm["ptx"])
        res = subprocess.run([ptxas, "-arch=sm_90a", "-v", path, "-o", cubin], capture_output=True, text=True,
                             check=True)
        if spec.get("dump"):
            shutil.copy(path, spec["dump"] + ".ptx")
            with open(spec["dump"] + ".ttgir", "w") as f:
                f.write(k.asm["ttgir"])
            shutil.copy(cubin, spec["dump"] + ".cubin")
            sass = subprocess.run([os.path.join(os.path.dirname(ptxas), "nvdisasm"), "-c", cubin],
                                  capture_output=True, text=True).stdout
            with open(spec["dump"] + ".sass", "w") as f:
                f.write(sass)
    info = res.stdout + res.stderr
    regs = re.search(r"Used (\d+) registers", info)
    spills = [int(x) for x in re.findall(r"(\d+) bytes spill (?:stores|loads)", info)]
    out = {"ok": True, "registers": int(regs.group(1)) if regs else None,
           "spill_bytes": max(spills) if spills else 0, "shared": k.metadata.shared,
           "cp_async": k.asm["ptx"].count("cp.async.cg")}
    if spec.get("ptx"):
        out["ptx"] = k.asm["ptx"]
    return out


def main() -> int:
    target, specs = sys.argv[1], json.loads(sys.argv[2])
    mod, name = target.split(":")
    module = importlib.import_module(mod)
    fn = getattr(module, name)
    print(json.dumps([dict(compile_for_sm90(fn, spec), source=os.path.realpath(module.__file__)) for spec in specs]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
