"""Compile lowlat's GEMV kernels (the attention prologue included; without --quick also the MoE block's kernels) for
sm_90 without a GPU (Triton's bundled ptxas), and report what the machine code uses: tensor cores (wgmma or mma.sync;
and whether the kernel is a matrix product that needs them), cp.async pipelining, griddepcontrol (PDL), L2
prefetches, registers, spills (a local array in the PTX, or a ptxas stack frame of more than SPILL_BYTES_OK bytes a
thread: `spills`), shared memory, and whether a preload kernel issues its weight loads before the PDL wait; plus the
launch's program count and how many of its programs fit on one SM (`programs_per_sm`).

    python -m lowlat.kernels.sm90_check [--quick]   # needs TRITON_INTERPRET unset (the compiled path)

Catches GPU-only failures (layouts, dot shapes, inline asm, atomics, register spills) on a CPU-only
machine, where the interpreter runs none of that. Shapes are SmolLM2-135M's (and, without --quick,
Llama-3.2-1B's and Qwen3-30B-A3B's prologue), each with the plan the fused model uses (`plan_gemv`,
tuned table included); for a model whose FusedModel runs the held prologue (`attn_prologue_held`, Gluon:
Llama-3.2-1B, without --quick) that kernel too, as FusedModel launches it; without --quick also every kernel of the
MoE block (`moe.sm90_compile_specs`) at Qwen3-30B-A3B's shapes (`compile_moe`). Exits 1 when `findings` names a
kernel.
"""

from __future__ import annotations

import inspect
import os
import re
import subprocess
import sys
import tempfile
import time


def constexpr_defaults(kernel) -> dict:
    """{name: default} of a @triton.jit kernel's tl.constexpr parameters that have a default: a launch that does not
    name them compiles them at that value, so a compile for inspection must too."""
    return {k: v.default for k, v in inspect.signature(kernel.fn).parameters.items()
            if v.default is not inspect.Parameter.empty and "constexpr" in str(v.annotation)}


def _compile(kernel, signature: dict, constexprs: dict, *, num_warps: int, num_stages: int, pdl: bool,
             divisible: tuple = ()):
    """Compile `kernel` for sm_90 as a launch specialises it: pointers, strides (names starting "stride" or holding
    "_stride_"), N, K, I, V and the runtime ints named in `divisible` taken as 16-divisible (a launch passes them as
    multiples of 16 elements: Triton's launcher then specialises them so); constexprs not given take their defaults
    (`constexpr_defaults`), as a launch that does not name them does."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    names = kernel.arg_names
    constexprs = {**{k: v for k, v in constexpr_defaults(kernel).items() if k not in signature}, **constexprs}
    sig = {}
    attrs = {}
    for i, name in enumerate(names):
        if name in constexprs:
            sig[name] = "constexpr"
        else:
            sig[name] = signature[name]
            if (sig[name].startswith("*") or name.startswith("stride") or "_stride_" in name
                    or name in ("N", "K", "I", "V") or name in divisible):
                attrs[(i,)] = [["tt.divisibility", 16]]
    if getattr(kernel, "is_gluon", lambda: False)():      # a Gluon kernel (the held prologue): its own front end
        from triton.experimental.gluon._runtime import GluonASTSource as ASTSource  # noqa: N814
    src = ASTSource(fn=kernel, signature=sig, constexprs=constexprs, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": num_warps, "num_stages": num_stages, "launch_pdl": pdl})


def _resources(cubin: bytes) -> tuple[int | None, int | None]:
    """(registers per thread, stack bytes per thread: ptxas spills) from the cubin, via Triton's
    bundled cuobjdump; (None, None) when it is unavailable."""
    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    if not os.path.exists(tool):
        return None, None
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True).stdout
    reg, stack = re.search(r"REG:(\d+)", out), re.search(r"STACK:(\d+)", out)
    return (int(reg.group(1)) if reg else None), (int(stack.group(1)) if stack else None)


#: Hopper (sm_90) per-SM limits, for `programs_per_sm` (CUDA C++ Programming Guide, compute capability 9.0)
SM90_REGISTERS, SM90_SHARED, SM90_SHARED_RESERVED, SM90_THREADS, SM90_BLOCKS = 65536, 233472, 1024, 2048, 32


def programs_per_sm(registers: int, shared_bytes: int, warps: int) -> int:
    """How many programs (thread blocks) of a kernel fit on one sm_90 SM at once: the least of what its
    registers (allocated per warp, per thread rounded up to a multiple of 8), its shared memory (plus the 1 KB
    the hardware reserves per block, of 228 KB) and its threads allow, at most 32.

    Why it matters (session 12): a grid that PDL launches early is placed on the SMs that have room while the
    previous grid runs, up to this many programs on one SM. Session 12 found the SmolLM2 6-row out_proj's 36
    programs packed 7 to an SM on 6 SMs, at 1.8 -> 5.4 us. Session 13 removed that by releasing out_proj late
    (`decode_attention(pdl_trigger="after_kv")`) and found that this bound does not explain which GEMVs miss
    70% of copy bandwidth at 1 row (they run at most 2 programs an SM there).
    """
    if registers <= 0 or warps <= 0 or shared_bytes < 0:
        raise ValueError(f"registers={registers}, shared_bytes={shared_bytes}, warps={warps}")
    by_regs = SM90_REGISTERS // (-(-registers // 8) * 8 * 32 * warps)
    by_smem = SM90_SHARED // (shared_bytes + SM90_SHARED_RESERVED)
    by_threads = SM90_THREADS // (32 * warps)
    return min(by_regs, by_smem, by_threads, SM90_BLOCKS)


def _report(name: str, c, t: float, *, preload: bool, programs: int | None = None,
            needs_tensor_cores: bool = True) -> dict:
    """Print and return one compile's report: `name`, compile time `t` (s), what the PTX / cubin of the compiled
    kernel `c` uses (see the module docstring); loads_before_wait only for a `preload` kernel (else None);
    needs_tensor_cores: whether the kernel is a matrix product whose PTX should hold mma / wgmma (every GEMV; not the
    MoE block's routing, plan and combine kernels), what `findings` checks tensor_cores against."""
    ptx = c.asm["ptx"]
    wait = ptx.find("griddepcontrol.wait")
    first_ld = ptx.find("ld.global")
    regs, stack = _resources(c.asm["cubin"])
    info = {"kernel": name, "compile_s": round(t, 2), "shared_bytes": c.metadata.shared, "registers": regs,
            "tensor_cores": "wgmma" in ptx or "mma.sync" in ptx, "needs_tensor_cores": needs_tensor_cores,
            "wgmma": "wgmma" in ptx, "cp_async": "cp.async" in ptx, "griddepcontrol": wait >= 0,
            "prefetch": "prefetch.global.L2" in ptx,
            "local_memory": ".local" in ptx or bool(stack), "local_array": ".local" in ptx, "spill_bytes": stack,
            "loads_before_wait": (0 <= first_ld < wait) if preload and wait >= 0 else None,
            "programs": programs,
            "programs_per_sm": programs_per_sm(regs, c.metadata.shared, c.metadata.num_warps) if regs else None}
    print(" ".join(f"{k}={v}" for k, v in info.items()), flush=True)
    return info


#: ptxas stack bytes a thread that `spills` tolerates: a register or two. Session 17: Llama-3.2-1B's out_proj at 2 row
#: blocks (preload bn 32) compiles to 128 registers and 8 bytes of stack, and was measured faster in the step than
#: the plans without (bench/results/session17/call6); a larger spill, or a local array in the PTX, is a finding.
SPILL_BYTES_OK = 8


def spills(report: dict) -> bool:
    """True when a `_report` shows a local array in the PTX or more than SPILL_BYTES_OK bytes of ptxas stack."""
    return report["local_array"] or (report["spill_bytes"] or 0) > SPILL_BYTES_OK


def findings(reports) -> list[str]:
    """Names of the `_report`s the check fails on: a kernel that needs tensor cores (needs_tensor_cores) compiled
    without them, one that `spills`, or a preload kernel whose first global load comes after its PDL wait."""
    return [r["kernel"] for r in reports
            if (r["needs_tensor_cores"] and not r["tensor_cores"]) or spills(r) or r["loads_before_wait"] is False]


def _sig(*pairs) -> dict:
    return {k: v for k, v in pairs}


#: `out_proj._residual_gemv_kernel`'s runtime parameters and their types as a launch specialises them
RESIDUAL_GEMV_SIG = {**{a: "*bf16" for a in ("a_ptr", "w_ptr", "res_ptr", "out_ptr", "nw_ptr", "h_ptr")},
                     "rstd_ptr": "*fp32", "ws_ptr": "*fp32", "ss_ptr": "*fp32", "cnt_ptr": "*i32",
                     "stride_am": "i32", "stride_wn": "i32", "stride_rm": "i32", "stride_om": "i32",
                     "stride_hm": "i32", "M": "i32", "N": "i32", "K": "i32", "n_tiles": "i32", "eps": "fp32",
                     "dp_ptr": "*fp32", "dp_stride_s": "i32", "dp_stride_m": "i32", "fo_ptr": "*fp32",
                     "fml_ptr": "*fp32", "fpos_ptr": "*i64", "fnvr_ptr": "*i32", "f_hq": "i32"}


#: `attn_prologue_held._held_prologue_kernel`'s runtime parameters and their types as FusedModel's launch specialises
#: them (g_ptr: the norm weight with HELD_FOLD "registers", a ones vector or the weight again with "build"; a bf16
#: pointer either way; zero: the paced form's runtime 0; the QK-norm pointers, which the Llama family's launch leaves
#: at their default 0)
HELD_PROLOGUE_SIG = {**{a: "*bf16" for a in ("x_ptr", "w_ptr", "g_ptr", "q_ptr", "kc_ptr", "vc_ptr")},
                     "tab_ptr": "*fp32", "pos_ptr": "*i64", "loc_ptr": "*i32", "nvr_ptr": "*i32", "nvr_int": "i32",
                     **{a: "i32" for a in ("stride_qm", "stride_qh", "stride_kcs", "stride_kch", "stride_vcs",
                                           "stride_vch", "M", "Hq", "Hkv", "max_pos", "zero", "qnorm_ptr",
                                           "knorm_ptr", "hsum_ptr")}, "eps": "fp32"}


def runs_held_prologue(cfg) -> bool:
    """Whether FusedModel (held_prologue "auto", the default) runs `attn_prologue_held` for this model on an sm_90 GPU:
    `held_prologue_model_reason` names no reason (Llama-3.2-1B runs it, SmolLM2-135M's H 576 and the Qwen models' QKV
    bias / QK-norm do not)."""
    from lowlat.kernels.attn_prologue_held import held_prologue_model_reason

    return held_prologue_model_reason(cfg) is None


def held_prologue_variants(cfg, row_blocks) -> list[dict]:
    """The constexprs of each `_held_prologue_kernel` compile FusedModel launches for `cfg` on an sm_90 GPU, at the
    16-row block counts `row_blocks` the GEMVs are compiled at: none where it does not run the held prologue
    (`runs_held_prologue`); else one per 8-row block count NMB = ceil(width / 8) of FusedModel's default widths
    within those counts (1 / 2 / 3 blocks of 16: NMB 1-2 / 3-4 / 6, every NMB FusedModel launches by default; the
    kernel unrolls its NMB blocks), each with what `FusedModel._run`'s launch passes: K = H, D = head_dim,
    NVR_FROM_PTR (num_valid_rows the device tensor nvalid), USE_PDL, FOLD_G (on: `fused_model.HELD_FOLD` "registers"
    multiplies the norm weight in registers, "build" launches with pace=True, whose folded weights take g = 1 in the
    same form; the paced build a "build" model with the prologue's early release runs at width 1 is not listed) and
    the launcher's warps / K slices / row block (Q, S, RB)."""
    from lowlat.kernels._gemv import row_blocks as blocks_of
    from lowlat.kernels.attn_prologue_held import ROW_BLOCK, SLICES, WARPS
    from lowlat.runtime.fused_model import DEFAULT_WIDTHS

    if not runs_held_prologue(cfg):
        return []
    nmbs = sorted({-(-w // ROW_BLOCK) for w in DEFAULT_WIDTHS if blocks_of(w) in row_blocks})
    return [dict(K=cfg.hidden_size, D=cfg.head_dim, NMB=nmb, NVR_FROM_PTR=True, USE_PDL=True,
                 FOLD_G=True, Q=WARPS,
                 S=SLICES, RB=ROW_BLOCK) for nmb in nmbs]


def compile_held_prologue(name: str, row_blocks) -> list[dict]:
    """Compile for sm_90 and report (`_report`: its weight loads checked to come before the PDL wait) each of
    `held_prologue_variants(preset(name), row_blocks)`, as `name`/held_prologue/nmbN; [] for a model whose FusedModel
    does not run the held prologue. Grid: (Hq + 2 Hkv) D / 16 programs of the launcher's WARPS warps, PDL on."""
    from lowlat.config import preset
    from lowlat.kernels.attn_prologue_held import WARPS, _held_prologue_kernel

    cfg = preset(name)
    out = []
    for const in held_prologue_variants(cfg, row_blocks):
        t = time.time()
        c = _compile(_held_prologue_kernel, HELD_PROLOGUE_SIG, const, num_warps=WARPS, num_stages=3,  # the launch's
                     pdl=True)                                                                 # default stages
        out.append(_report(f"{name}/held_prologue/nmb{const['NMB']}", c, time.time() - t, preload=True,
                           programs=(cfg.q_size + 2 * cfg.kv_size) // 16))
    return out


def compile_held_residual(n: int, k: int, name: str) -> list[dict]:
    """Compile for sm_90 and report (its weight loads checked to come before the PDL wait) `residual_gemv_held`'s
    launches of an [n, k] weight at FusedModel's DEFAULT_WIDTHS (one per (row blocks, rows a block) pair, PDL on), as
    `name`/nmbN-rbR: the MoE layers' output projection with `FusedModel(moe_out_proj="held")` (or "auto"), which also
    writes x's partial sums of squares (SS)."""
    from lowlat.kernels.residual_gemv_held import SLICES, _held_residual_gemv_kernel, held_warps, row_block
    from lowlat.runtime.fused_model import DEFAULT_WIDTHS

    sig = {"a_ptr": "*bf16", "w_ptr": "*bf16", "res_ptr": "*bf16", "out_ptr": "*bf16", "ss_ptr": "*fp32",
           "stride_ss": "i32", "M": "i32", "N": "i32"}
    q, out = held_warps(k), []
    for nmb, rb in sorted({(-(-w // row_block(w, k)), row_block(w, k)) for w in DEFAULT_WIDTHS}):
        t = time.time()
        c = _compile(_held_residual_gemv_kernel, sig, dict(K=k, Q=q, S=SLICES, NMB=nmb, RB=rb, USE_PDL=True, SS=True),
                     num_warps=q, num_stages=3, pdl=True)
        out.append(_report(f"{name}/nmb{nmb}-rb{rb}", c, time.time() - t, preload=True, programs=n // 16))
    return out


def moe_roles() -> dict:
    """{kernel: (needs_tensor_cores, preload)} of each kernel `moe.sm90_compile_specs` lists, for `compile_moe`:
    whether its PTX must hold a tensor-core product (mma.sync / wgmma) and whether it loads weights before its PDL
    wait (what `_report`'s loads_before_wait checks). Compiled at Qwen3-30B-A3B's shapes, the three kernels that
    call tl.dot hold mma and the other two none."""
    from lowlat.kernels import moe

    return {
        # partial router logits: tl.dot of a [BE, BK] router weight tile by [BK, 64] rows, bf16 into fp32 - a matrix
        # product; its first router (and norm) weight slice is loaded before griddepcontrol.wait, x only after
        moe._router_logits_kernel: (True, True),
        # route / plan: a sum over splits, softmax, top-k maxima, population counts and a cumsum over a
        # [PLAN_CHUNK, E] tile a program (with several programs, atomics: the experts ORed, an arrival count) - no
        # matrix product; it waits before its first load (the router's logits)
        moe._route_plan_kernel: (False, False),
        # the experts' (and the shared expert's) gate/up: two tl.dot of [BN, BK] weight tiles by [BK, BR] rows;
        # waits first (it reads the plan to know which expert's weights to load)
        moe._expert_gate_up_kernel: (True, False),
        # down: tl.dot of [BNH, BKI] weight tiles by [BKI, BR] act rows; before its wait it reads the plan and the
        # bitmap (two launches old), no weight, so a load before the wait says nothing of weights: not preload
        moe._expert_down_kernel: (True, False),
        # combine: per-row sums of the KMAX slots, the shared expert's output and the residual - elementwise
        moe._combine_kernel: (False, False),
    }


def moe_divisible(cfg) -> tuple[str, ...]:
    """The MoE kernels' runtime ints that every launch of `cfg`'s MoE block passes as multiples of 16, which Triton's
    launcher then specialises as 16-divisible: E (num_experts), H (hidden_size) and NSS (the router's partial sums of
    squares a row: H / BLOCK_N of the held out_proj with moe_out_proj "held", else 0), each where its value is one
    (Qwen3-30B-A3B: E 128, H 2048, NSS 128 or 0 - all three). Never M (a launch's row count) nor nvalid."""
    from lowlat.kernels.residual_gemv_held import BLOCK_N

    vals = (("E", cfg.num_experts), ("H", cfg.hidden_size), ("NSS", cfg.hidden_size // BLOCK_N))
    return tuple(n for n, v in vals if v % 16 == 0)


def compile_moe(name: str = "Qwen3-30B-A3B") -> list[dict]:
    """Compile for sm_90 and report each kernel `moe.sm90_compile_specs` lists for `preset(name)`'s MoE block (its
    hidden_size, num_experts, moe_intermediate_size and top_k; PDL on, each spec's warps and stages), as
    `name`/moe/<spec name>, with `moe_roles`' needs_tensor_cores and preload (a kernel missing there is refused:
    KeyError). The signature is the spec's; taken as 16-divisible, as FusedModel's launches specialise them: pointers,
    strides (at Qwen3-30B-A3B's shapes each 0 or a product of H 2048, E 128, Ie 768 and H / 16 = 128) and
    `moe_divisible(cfg)`; never M (a launch's row count, 1..48) nor nvalid (the row count, or with NV_PTR its bound
    M). Compiled without H and E so, the router's NORM variant spilled 1424 bytes a thread (255 registers) where the
    launch's specialisation spills none. The specs' NV_PTR is True (num_valid_rows a device tensor, as FusedModel
    passes it) but for the forced plan's (an int); the shared expert's two (Is 256) are listed though Qwen3-30B-A3B
    has none. programs None: the expert and combine grids follow the row count."""
    from lowlat.config import preset
    from lowlat.kernels.moe import sm90_compile_specs

    cfg = preset(name)
    roles, divisible = moe_roles(), moe_divisible(cfg)
    out = []
    for spec, kernel, sig, const, opts in sm90_compile_specs(cfg.hidden_size, cfg.num_experts,
                                                              cfg.moe_intermediate_size, cfg.top_k, use_pdl=True):
        role = next((r for k, r in roles.items() if k is kernel), None)     # by identity (no JIT-function hash)
        if role is None:
            raise KeyError(f"sm90_check.moe_roles does not say whether {spec}'s kernel needs tensor cores")
        needs_tc, preload = role
        t = time.time()
        c = _compile(kernel, sig, const, num_warps=opts["num_warps"], num_stages=opts["num_stages"], pdl=True,
                     divisible=divisible)
        out.append(_report(f"{name}/moe/{spec}", c, time.time() - t, preload=preload, needs_tensor_cores=needs_tc))
    return out


def compile_all(quick: bool = False) -> list[dict]:
    """Compile every GEMV kernel variant the fused model launches (quick: SmolLM2 only, 1 and 3 row
    blocks), plus out_proj with the RMSNorm epilogue (MoE layers' `moe_out_proj="norm_epilogue"`) and its h-writing
    form, Qwen3-30B-A3B's held out_proj (`compile_held_residual`, moe_out_proj "held"), the held prologue of the
    models that run it (`compile_held_prologue`) and, without quick, every kernel of Qwen3-30B-A3B's MoE block
    (`compile_moe`: router, route / plan, expert and shared-expert gate/up and down, combine; the routing, plan and
    combine kernels reported with needs_tensor_cores False). One `_report` each; quick compiles no MoE kernel."""
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise RuntimeError("unset TRITON_INTERPRET: this compiles the GPU path")
    import triton

    from lowlat.kernels._gemv import launch_constexprs, plan_gemv
    from lowlat.kernels.lm_head import _lm_head_kernel
    from lowlat.kernels.mlp import _gate_up_kernel
    from lowlat.kernels.out_proj import _residual_gemv_kernel, deferred_pieces
    from lowlat.runtime.fused_model import releases_early

    out = []
    res_sig = RESIDUAL_GEMV_SIG
    shapes = [("SmolLM2", 576, 576, 1536, 49152, 64)] if quick else [
        ("SmolLM2", 576, 576, 1536, 49152, 64), ("Llama-3.2-1B", 2048, 2048, 8192, 128256, 64)]
    row_blocks = (1, 3) if quick else (1, 2, 3)
    gu_sig = {"x_ptr": "*bf16", "w_ptr": "*bf16", "nw_ptr": "*bf16", "rstd_ptr": "*fp32", "act_ptr": "*bf16",
              "ws_ptr": "*fp32", "sss_ptr": "*fp32", "cnt_ptr": "*i32", "stride_xm": "i32", "stride_wn": "i32",
              "stride_am": "i32", "M": "i32", "I": "i32", "K": "i32", "eps": "fp32", "xp_ptr": "*fp32",
              "xp_stride_s": "i32", "xp_stride_m": "i32", "xout_ptr": "*bf16", "stride_om": "i32"}
    lm_sig = {"x_ptr": "*bf16", "w_ptr": "*bf16", "nw_ptr": "*bf16", "nvalid_ptr": "*i32",
              "logits_ptr": "*fp32", "tokens_ptr": "*i64", "keys_ptr": "*i64", "cnt_ptr": "*i32",
              "stride_xm": "i32", "stride_wn": "i32", "stride_lm": "i32", "M": "i32", "V": "i32",
              "K": "i32", "n_tiles": "i32", "eps": "fp32"}

    def run(name, kernel, sig, plan, nmb, pdl, **const):
        plan = plan.at(nmb)
        lc = launch_constexprs(plan, nmb)
        warps, stages = lc.pop("num_warps"), lc.pop("num_stages")
        const.update(lc, USE_PDL=pdl, UPCAST=False)
        t = time.time()
        c = _compile(kernel, sig, const, num_warps=warps, num_stages=stages, pdl=pdl)
        out.append(_report(f"{name}/{'preload' if plan.preload else 'stream'}-bn{plan.bn}-split{plan.split}/mb{nmb}",
                           c, time.time() - t, preload=plan.preload and pdl, programs=plan.n_tiles * plan.split))

    from lowlat.kernels.attn_combine import fold_pieces
    from lowlat.kernels.decode_attention import BLOCK_N, COMBINE_CHUNK, MAX_SPLITS

    for model, h, q, i, v, hd in shapes:
        for nmb in row_blocks:
            for name, n, k in (("out_proj", h, q), ("down", h, i)):
                p = plan_gemv(n, k, kind="residual")
                run(f"{model}/{name}", _residual_gemv_kernel, res_sig, p, nmb, True, NORM=False, WRITE_H=False,
                    NT_P2=2, BH=512, N_COLS=1, EARLY_RELEASE=releases_early(n, k))
            p = plan_gemv(h, q, kind="out_proj")
            nt = max(2, triton.next_power_of_2(p.n_tiles))
            run(f"{model}/out_proj_norm", _residual_gemv_kernel, res_sig, p, nmb, True, NORM=True, WRITE_H=True,
                NT_P2=nt, BH=512, N_COLS=h)
            run(f"{model}/gate_up", _gate_up_kernel, gu_sig, plan_gemv(i, h, kind="gate_up"), nmb, True, NORM=2)
            p = plan_gemv(h, q, kind="residual")
            if p.split > 1:   # out_proj's reduction deferred to gate/up (FusedModel.defers; defer=N allows 48 rows)
                run(f"{model}/out_proj_deferred", _residual_gemv_kernel, res_sig, p, nmb, True, NORM=False,
                    WRITE_H=False, NT_P2=2, BH=512, N_COLS=1, DEFER=True, EARLY_RELEASE=releases_early(h, q))
                pg = plan_gemv(i, h, kind="gate_up")
                run(f"{model}/gate_up_deferred", _gate_up_kernel, gu_sig, pg, nmb, True, NORM=2, XSPLIT=p.split,
                    **deferred_pieces(1 if nmb == 1 else 16 * nmb, pg.block_k, pg.chunks_per_split, p.split))
            # the attention's split combine folded into out_proj (FusedModel.folds): pieces for 1 row and a full
            # launch, as residual_gemv and (1 row block) as residual_gemv_deferred
            for rows in ((1, 16) if nmb == 1 else (16 * nmb,)):
                fold = dict(FOLD=True, F_D=hd, F_BLOCK_N=BLOCK_N, F_SPLITS=MAX_SPLITS,
                            **fold_pieces(rows, p.at(nmb).span, hd, COMBINE_CHUNK))
                run(f"{model}/out_proj_fold_r{rows}", _residual_gemv_kernel, res_sig, p, nmb, True, NORM=False,
                    WRITE_H=False, NT_P2=2, BH=512, N_COLS=1, **fold)
                if p.split > 1 and rows == 1:
                    run(f"{model}/out_proj_deferred_fold_r1", _residual_gemv_kernel, res_sig, p, nmb, True,
                        NORM=False, WRITE_H=False, NT_P2=2, BH=512, N_COLS=1, DEFER=True, **fold)
            run(f"{model}/lm_head", _lm_head_kernel, lm_sig, plan_gemv(v, h, kind="lm_head"), nmb, True)
    if not quick:       # Qwen3-30B-A3B's out_proj with its RMSNorm epilogue (MoE layers; preload at 1 row block)
        from lowlat.config import preset
        qc = preset("Qwen3-30B-A3B")
        p = plan_gemv(qc.hidden_size, qc.q_size, kind="out_proj")
        for nmb in row_blocks:
            run("Qwen3-30B-A3B/out_proj_norm", _residual_gemv_kernel, res_sig, p, nmb, True, NORM=True, WRITE_H=True,
                NT_P2=max(2, triton.next_power_of_2(p.n_tiles)), BH=512, N_COLS=qc.hidden_size)
        out.extend(compile_held_residual(qc.hidden_size, qc.q_size, "Qwen3-30B-A3B/out_proj_held"))
        out.extend(compile_moe("Qwen3-30B-A3B"))         # the MoE block itself (moe.sm90_compile_specs)
    # the attention prologue (a pair GEMV of kind "qkv"; one row block per program, NUM_MB only sizes the
    # workspace rows), with its plan and epilogue-load rule; Qwen3 adds QK-norm
    from lowlat.config import preset
    import torch

    from lowlat.kernels.attn_prologue import _attn_prologue_kernel, make_prologue_workspace

    pro_sig = {a: "*bf16" for a in ("x_ptr", "w_ptr", "an_ptr", "b_ptr", "qn_ptr", "kn_ptr", "kc_ptr", "vc_ptr",
                                    "q_ptr")}
    pro_sig.update({"ws_ptr": "*fp32", "sss_ptr": "*fp32", "cnt_ptr": "*i32", "pos_ptr": "*i64", "loc_ptr": "*i32",
                    "nvr_ptr": "*i32", "tab_ptr": "*fp32", "nvr_int": "i32", "stride_xm": "i32", "stride_wn": "i32",
                    "M": "i32", "NP": "i32", "K": "i32", "Hq": "i32", "Hkv": "i32", "max_pos": "i32", "eps": "fp32",
                    "stride_qm": "i32", "stride_qh": "i32", "stride_kcs": "i32", "stride_kch": "i32",
                    "stride_vcs": "i32", "stride_vch": "i32", "xp_ptr": "*fp32", "xp_stride_s": "i32",
                    "xp_stride_m": "i32", "xout_ptr": "*bf16", "stride_om": "i32"})
    for name in ["SmolLM2-135M"] + ([] if quick else ["Llama-3.2-1B", "Qwen3-30B-A3B", "Qwen2.5-0.5B", "Qwen3-0.6B"]):
        cfg = preset(name)
        w = torch.empty(cfg.q_size + 2 * cfg.kv_size, cfg.hidden_size, dtype=torch.bfloat16, device="meta")
        ws = make_prologue_workspace(w, cfg.head_dim)          # its plan and epilogue-load rule, as launched
        down_split = 0 if cfg.is_moe else plan_gemv(cfg.hidden_size, cfg.intermediate_size, kind="residual").split
        for nmb in row_blocks:
            p = ws.plan.at(nmb)                                    # the plan a launch of nmb row blocks runs
            lc = launch_constexprs(p, nmb, program_row_blocks=1)
            warps, stages = lc.pop("num_warps"), lc.pop("num_stages")
            const = dict(lc, D=cfg.head_dim, HALF=cfg.head_dim // 2, HAS_BIAS=cfg.qkv_bias, QK_NORM=cfg.qk_norm,
                         NVR_FROM_PTR=True, EARLY=ws.early_inputs, USE_PDL=True, UPCAST=False)
            # the down projection's reduction deferred to the prologue (FusedModel.defers_down) where down splits K:
            # pieces of 1 and 16 rows a program at one row block (1-16 rows), 16 past it
            variants = [(0, 0)] + [(down_split, r) for r in ((1, 16) if nmb == 1 else (16,)) if down_split > 1]
            for xsplit, rows in variants:
                dconst = {} if not xsplit else dict(XSPLIT=xsplit, **deferred_pieces(
                    rows, p.block_k, p.chunks_per_split, xsplit))
                t = time.time()
                c = _compile(_attn_prologue_kernel, pro_sig, dict(const, **dconst), num_warps=warps, num_stages=stages,
                             pdl=True)
                out.append(_report(f"{name}/attn_prologue{f'_deferred_r{rows}' if xsplit else ''}/"
                                   f"{'preload' if p.preload else 'stream'}-bn{p.bn}-split{p.split}/mb{nmb}", c,
                                   time.time() - t, preload=p.preload, programs=p.n_tiles * p.split * nmb))
        out.extend(compile_held_prologue(name, row_blocks))    # the prologue FusedModel runs there by default
    return out


if __name__ == "__main__":
    res = compile_all(quick="--quick" in sys.argv)
    bad = findings(res)
    print(f"{len(res)} kernels compiled for sm_90; without tensor cores where needed, spilling (more than "
          f"{SPILL_BYTES_OK} bytes a thread, or a local array), or preloading after the PDL wait: {bad or 'none'}")
    sys.exit(1 if bad else 0)
