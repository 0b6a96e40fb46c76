"""`lowlat.kernels.sm90_check.programs_per_sm`: how many programs of a kernel one sm_90 SM holds at once (what
bounds how far an early-launched PDL grid can pack onto a few SMs, session 12); `spills`: which compile reports the
check flags as spilling (session 17); `compile_all`'s list holding the held prologue (Gluon) for the models whose
FusedModel runs it, compiled for sm_90 (in a subprocess: compile_all refuses the interpreter), and, without --quick,
every MoE kernel (`compile_moe`, nothing compiled: `_compile` faked); `findings`, what the check fails on (a kernel
that needs tensor cores without them: not the MoE block's routing / plan / combine kernels)."""

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


def _listed(monkeypatch, quick: bool) -> tuple[list[dict], list[tuple], list[tuple]]:
    """compile_all's reports with nothing compiled: `_compile` returns one empty compile (no PTX: no tensor cores,
    no PDL wait, no local array) and `_resources` 32 registers and no stack, so the real `_report` reports every entry
    without tensor cores and nothing else to find. Returns (reports, each `_compile` call's (kernel, constexprs,
    options), each `_report` call's (name, options)). TRITON_INTERPRET is lifted for the test only (compile_all
    refuses it; nothing here compiles or runs a kernel)."""
    from types import SimpleNamespace

    import lowlat.runtime.fused_model  # noqa: F401  (its Gluon import checks the interpreter's state: done under it)
    from lowlat.kernels import sm90_check as sc

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    empty = SimpleNamespace(asm={"ptx": "", "cubin": b""}, metadata=SimpleNamespace(shared=0, num_warps=4))
    compiles, reported, report = [], [], sc._report

    def fake_compile(kernel, sig, const, **kw):
        compiles.append((kernel, dict(const), kw))
        return empty

    def spy_report(name, c, t, **kw):
        reported.append((name, kw))
        return report(name, c, t, **kw)

    monkeypatch.setattr(sc, "_compile", fake_compile)
    monkeypatch.setattr(sc, "_resources", lambda cubin: (32, 0))
    monkeypatch.setattr(sc, "_report", spy_report)
    return sc.compile_all(quick=quick), compiles, reported


def test_compile_all_lists_every_moe_kernel_once_without_quick(monkeypatch):
    """Without quick, compile_all compiles (`compile_moe`) every kernel `moe.sm90_compile_specs` lists at
    Qwen3-30B-A3B's shapes (H 2048, E 128, Ie 768, top-8; PDL on), each once, as Qwen3-30B-A3B/moe/<spec name>, with
    the spec's constexprs, warps and stages and E, H, NSS taken as 16-divisible (a launch passes 128, 2048 and 128 or
    0: Triton specialises them so), never M; quick compiles none. The router, expert and shared-expert kernels (tl.dot)
    are reported as needing tensor cores, the route / plan and combine kernels not; only the router is a preload kernel
    (its first weight slice before the PDL wait). Every other report needs tensor cores. With no tensor cores in any
    compile, `findings` names exactly the reports that need them."""
    from lowlat.config import preset
    from lowlat.kernels import moe
    from lowlat.kernels.sm90_check import findings

    cfg = preset("Qwen3-30B-A3B")
    specs = moe.sm90_compile_specs(cfg.hidden_size, cfg.num_experts, cfg.moe_intermediate_size, cfg.top_k,
                                   use_pdl=True)
    assert (cfg.hidden_size, cfg.num_experts, cfg.moe_intermediate_size, cfg.top_k) == (2048, 128, 768, 8)
    assert len(specs) == 14 and len({s[0] for s in specs}) == 14
    reports, compiles, reported = _listed(monkeypatch, quick=False)
    names = [r["kernel"] for r in reports]
    assert [n for n in names if "/moe/" in n] == [f"Qwen3-30B-A3B/moe/{s[0]}" for s in specs], names
    moe_kernels = [s[1] for s in specs]       # by identity: hashing a JIT function (the Gluon one) walks its source
    moe_compiles = [c for c in compiles if any(c[0] is k for k in moe_kernels)]
    assert len(moe_compiles) == len(specs)
    for (spec, kernel, sig, const, opts), (k, got_const, kw) in zip(specs, moe_compiles):
        assert k is kernel and got_const == const and const["USE_PDL"] is True, spec
        assert kw == dict(num_warps=opts["num_warps"], num_stages=opts["num_stages"], pdl=True,
                          divisible=("E", "H", "NSS")), (spec, kw)
    roles = {"router_logits": (True, True), "route_plan": (False, False), "plan_forced": (False, False),
             "expert_gate_up": (True, False), "expert_down": (True, False), "shared_gate_up": (True, False),
             "shared_down": (True, False), "combine": (False, False)}
    for name, kw in reported:
        if "/moe/" in name:
            spec = name.rsplit("/", 1)[1]
            role = next(v for k, v in roles.items() if spec == k or spec.startswith(k + "_"))
            assert (kw["needs_tensor_cores"], kw["preload"]) == role, (name, kw)
        else:
            assert kw.get("needs_tensor_cores", True), (name, kw)
    assert sum(not r["needs_tensor_cores"] for r in reports) == 7        # route_plan x3, plan_forced x3, combine
    assert all(r["tensor_cores"] is False and r["loads_before_wait"] is None for r in reports)
    assert findings(reports) == [r["kernel"] for r in reports if r["needs_tensor_cores"]]
    quick, _, _ = _listed(monkeypatch, quick=True)
    assert quick and not any("/moe/" in r["kernel"] for r in quick), [r["kernel"] for r in quick]
    assert all(r["needs_tensor_cores"] for r in quick)


@pytest.mark.parametrize("change, bad, why", [
    ({}, False, "tensor cores, no stack, weights before the wait"),
    (dict(tensor_cores=False), True, "a matrix product without tensor cores"),
    (dict(tensor_cores=False, needs_tensor_cores=False), False, "a routing / plan / combine kernel: none needed"),
    (dict(needs_tensor_cores=False), False, "tensor cores where none are needed is no finding"),
    (dict(needs_tensor_cores=False, tensor_cores=False, spill_bytes=16), True, "a spill counts whatever the kernel"),
    (dict(needs_tensor_cores=False, tensor_cores=False, local_array=True), True, "so does a local array"),
    (dict(spill_bytes=8), False, "up to SPILL_BYTES_OK bytes of stack"),
    (dict(loads_before_wait=False), True, "a preload kernel's first load after its PDL wait"),
    (dict(loads_before_wait=None), False, "not a preload kernel"),
])
def test_findings_names_the_reports_the_check_fails_on(change, bad, why):
    """`findings` (what `python -m lowlat.kernels.sm90_check` exits 1 on): a report that needs tensor cores and has
    none, one that `spills`, or a preload kernel whose first global load follows its PDL wait; a kernel that needs no
    tensor cores (needs_tensor_cores False: the MoE block's route / plan and combine kernels) is not flagged for
    having none."""
    from lowlat.kernels.sm90_check import findings

    ok = dict(kernel="k", tensor_cores=True, needs_tensor_cores=True, local_array=False, spill_bytes=0,
              loads_before_wait=True)
    assert findings([ok, dict(ok, kernel="x", **change), ok]) == (["x"] if bad else []), why
