"""Compile a Triton kernel for sm_90 (H200) without a GPU, as a real launch would: like compile_sm90.py, plus
the argument specialisations a launch adds (16-byte aligned pointers, integers divisible by 16) and launch
options such as maxnreg. Without the alignment Triton cannot prove that a weight tile's rows are 16-byte
aligned and does not software-pipeline the GEMV loop (no cp.async, one stage of shared memory), so
compile_sm90.py reports neither the shared memory nor the registers of the kernel that actually runs.

    python tests/unit/compile_sm90_aligned.py MODULE:KERNEL 'JSON [{"constexprs": {...}, "pointers": {...},
        "divisible": [scalar names], "num_warps": 4, "num_stages": 4, "maxnreg": 168}, ...]'

prints one JSON line: a list of {"registers": N, "spill_bytes": N, "shared": N} (ptxas -v on the PTX).
A spec's optional "dump": PATH_PREFIX keeps PATH_PREFIX.ptx / .cubin / .sass (nvdisasm) for inspection.
Must run without TRITON_INTERPRET; tests call it through a subprocess.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
import tempfile


def compile_aligned(fn, spec: dict) -> dict:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    constexprs, pointers = spec.get("constexprs", {}), spec.get("pointers", {})
    scalars, divisible = spec.get("scalars", {}), set(spec.get("divisible", ()))
    sig = {n: "constexpr" if n in constexprs else pointers.get(n, scalars.get(n, "i32")) for n in fn.arg_names}
    attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in fn.arg_names
             if n in pointers or n in divisible}
    src = ASTSource(fn=fn, signature=sig, attrs=attrs,
                    constexprs={(fn.arg_names.index(n),): v for n, v in constexprs.items()})
    options = {"num_warps": spec.get("num_warps", 4), "num_stages": spec.get("num_stages", 3)}
    if spec.get("maxnreg"):
        options["maxnreg"] = spec["maxnreg"]
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "k.ptx")
        with open(path, "w") as f:
            f.write(k.asm["ptx"])
        res = subprocess.run([ptxas, "-arch=sm_90a", "-v", path, "-o", os.path.join(d, "k.cubin")],
                             capture_output=True, text=True, check=True)
        if spec.get("dump"):      # keep the PTX, cubin and SASS for inspection (spec["dump"]: a path prefix)
            import shutil
            shutil.copy(path, spec["dump"] + ".ptx")
            shutil.copy(os.path.join(d, "k.cubin"), spec["dump"] + ".cubin")
            sass = subprocess.run([os.path.join(os.path.dirname(ptxas), "nvdisasm"), "-c",
                                   os.path.join(d, "k.cubin")], capture_output=True, text=True).stdout
            with open(spec["dump"] + ".sass", "w") as f:
                f.write(sass)
    info = res.stdout + res.stderr
    regs = re.search(r"Used (\d+) registers", info)
    spills = [int(x) for x in re.findall(r"(\d+) bytes spill (?:stores|loads)", info)]
    return {"registers": int(regs.group(1)) if regs else None, "spill_bytes": max(spills) if spills else 0,
            "shared": k.metadata.shared, "cp_async": k.asm["ptx"].count("cp.async.cg")}


def main() -> int:
    target, specs = sys.argv[1], json.loads(sys.argv[2])
    mod, name = target.split(":")
    fn = getattr(importlib.import_module(mod), name)
    print(json.dumps([compile_aligned(fn, spec) for spec in specs]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
