"""`lowlat.kernels.sm90_check.programs_per_sm`: how many programs of a kernel one sm_90 SM holds at once (what
bounds how far an early-launched PDL grid can pack onto a few SMs, session 12); `spills`: which compile reports the
check flags as spilling (session 17); `compile_all`'s list holding the held prologue (Gluon) for the models whose
FusedModel runs it, compiled for sm_90 (in a subprocess: compile_all refuses the interpreter)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from lowlat.kernels.sm90_check import programs_per_sm


@pytest.mark.parametrize("registers, shared, warps, expected, why", [
    (44, 28672, 4, 7, "shared memory: 7 x (28 KB + 1 KB) fits 228 KB, 8 does not (SmolLM2 out_proj, session 12)"),
    (40, 28672, 16, 3, "registers: 40 x 512 threads = 20480 a program, 3 fit in 65536"),
    (41, 28672, 16, 2, "registers are allocated in multiples of 8 per thread: 41 counts as 48"),
    (192, 69632, 4, 2, "registers: 192 x 128 = 24576, 2 fit (Qwen3 prologue)"),
    (66, 139648, 8, 1, "shared memory: 137 KB, one (Llama gate/up)"),
    (16, 0, 1, 32, "at most 32 blocks an SM"),
    (16, 0, 32, 2, "threads: 1024 a program, 2048 an SM"),
])
def test_programs_per_sm_takes_the_tightest_limit(registers, shared, warps, expected, why):
    assert programs_per_sm(registers, shared, warps) == expected, why


def test_programs_per_sm_refuses_nonsense():
    with pytest.raises(ValueError, match="registers=0"):
        programs_per_sm(0, 1024, 4)


def test_spills_tolerates_a_register_or_two_of_ptxas_stack_only():
    """`spills`: a local array in the PTX, or more than SPILL_BYTES_OK bytes of ptxas stack a thread, is a finding;
    up to SPILL_BYTES_OK bytes (session 17: Llama's out_proj at 2 row blocks, 8 bytes, measured faster) is not; an
    unknown stack (no cuobjdump) counts as none."""
    from lowlat.kernels.sm90_check import SPILL_BYTES_OK, spills

    assert SPILL_BYTES_OK == 8
    for local_array, stack, bad in ((False, 0, False), (False, 8, False), (False, 16, True), (True, 0, True),
                                    (False, None, False), (True, None, True)):
        assert spills(dict(local_array=local_array, spill_bytes=stack)) is bad, (local_array, stack)


#: run without TRITON_INTERPRET: compile_all's whole list (not --quick) with its compiles and reports replaced by a
#: record of each entry's name and, for `_held_prologue_kernel`, its constexprs; then the held prologue's variants
#: compiled for real (`compile_held_prologue`), reported as compile_all reports them
_HELD_SCRIPT = """
import json
import lowlat.kernels.sm90_check as sc
from lowlat.kernels.attn_prologue_held import _held_prologue_kernel

compile_, report = sc._compile, sc._report
sc._compile = lambda kernel, sig, const, **kw: (kernel, const)
sc._report = lambda name, c, t, **kw: dict(kernel=name, const=c[1] if c[0] is _held_prologue_kernel else None)
listed = sc.compile_all()
sc._compile, sc._report = compile_, report
compiled = sc.compile_held_prologue("Llama-3.2-1B", (1, 2, 3))
print(json.dumps(dict(listed=listed, compiled=compiled, spills=[sc.spills(r) for r in compiled])))
"""


def test_compile_all_holds_the_held_prologue_of_the_models_that_run_it():
    """FusedModel runs `attn_prologue_held` (held_prologue "auto") for Llama-3.2-1B, not for SmolLM2-135M (H 576) nor
    the Qwen models (QKV bias / QK-norm): compile_all's list (without --quick) holds `_held_prologue_kernel` for
    Llama-3.2-1B only, beside its split-K prologue, at every 8-row block count NMB of FusedModel's default widths
    (1 2 3 4 6: the kernel unrolls its blocks, so each is its own compile), with the constexprs of FusedModel's launch:
    K = H 2048, D 64, num_valid_rows from its device tensor, PDL, FOLD_G True (FusedModel's default HELD_FOLD
    "registers": the norm weight multiplied in the kernel's registers) and the launcher's warps / slices / row block. Each compiles for sm_90 on mma.sync
    with griddepcontrol, no local memory (no spill, no local array) and its weight loads before the PDL wait."""
    from lowlat.kernels.attn_prologue_held import ROW_BLOCK, SLICES, WARPS
    from lowlat.runtime.fused_model import DEFAULT_WIDTHS

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, "-c", _HELD_SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    got = json.loads(res.stdout.strip().splitlines()[-1])
    names = [e["kernel"] for e in got["listed"]]
    held = [e for e in got["listed"] if e["const"] is not None]
    nmbs = sorted({-(-w // ROW_BLOCK) for w in DEFAULT_WIDTHS})
    assert nmbs == [1, 2, 3, 4, 6]
    assert [e["kernel"] for e in held] == [f"Llama-3.2-1B/held_prologue/nmb{n}" for n in nmbs], names
    for model in ("SmolLM2-135M", "Llama-3.2-1B"):      # both compiled as prologue models: the split-K one listed
        assert any(n.startswith(f"{model}/attn_prologue/") for n in names), (model, names)
    assert not any("held_prologue" in n for n in names if not n.startswith("Llama-3.2-1B/")), names
    # the MoE layers' out_proj with moe_out_proj "held" (session 26): the held residual GEMV, every launch
    assert [n for n in names if "out_proj_held" in n] == [f"Qwen3-30B-A3B/out_proj_held/nmb{n}-rb{r}"
                                                          for n, r in ((1, 8), (1, 16), (2, 16), (3, 16))], names
    for e, nmb in zip(held, nmbs):
        assert e["const"] == dict(K=2048, D=64, NMB=nmb, NVR_FROM_PTR=True, USE_PDL=True, FOLD_G=True, Q=WARPS,
                                  S=SLICES, RB=ROW_BLOCK), e
    assert [r["kernel"] for r in got["compiled"]] == [e["kernel"] for e in held]
    assert not any(got["spills"]), got["compiled"]
    for r in got["compiled"]:
        assert r["tensor_cores"] and not r["wgmma"] and r["griddepcontrol"], r          # mma.sync, PDL
        assert not r["local_memory"], r                 # no local array in the PTX, no ptxas stack
        assert r["loads_before_wait"] is True and r["programs"] == (32 + 2 * 8) * 64 // 16, r
