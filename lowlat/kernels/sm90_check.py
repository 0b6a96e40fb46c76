"""Compile lowlat's GEMV kernels for sm_90 without a GPU (Triton's bundled ptxas), and report what the
machine code uses: wgmma (Hopper tensor cores), cp.async pipelining, griddepcontrol (PDL), spills.

    python -m lowlat.kernels.sm90_check            # needs TRITON_INTERPRET unset (the compiled path)

Catches GPU-only failures (layouts, dot shapes, inline asm, atomics) on a CPU-only machine, where the
interpreter runs none of that. Shapes are SmolLM2-135M's and Llama-3.2-1B's.
"""

from __future__ import annotations

import os
import sys
import time


def _compile(kernel, signature: dict, constexprs: dict, *, num_warps: int, num_stages: int, pdl: bool):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    names = kernel.arg_names
    sig = {}
    attrs = {}
    for i, name in enumerate(names):
        if name in constexprs:
            sig[name] = "constexpr"
        else:
            sig[name] = signature[name]
            if sig[name].startswith("*") or name.startswith("stride") or name in ("N", "K", "I", "V"):
                attrs[(i,)] = [["tt.divisibility", 16]]
    src = ASTSource(fn=kernel, signature=sig, constexprs=constexprs, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": num_warps, "num_stages": num_stages, "launch_pdl": pdl})


def _report(name: str, c, t: float) -> dict:
    ptx = c.asm["ptx"]
    info = {"kernel": name, "compile_s": round(t, 2), "shared_bytes": c.metadata.shared,
            "wgmma": "wgmma" in ptx, "cp_async": "cp.async" in ptx, "griddepcontrol": "griddepcontrol" in ptx,
            "prefetch": "prefetch.global.L2" in ptx, "local_memory": ".local" in ptx}
    print(" ".join(f"{k}={v}" for k, v in info.items()), flush=True)
    return info


def compile_all(quick: bool = False) -> list[dict]:
    """Compile every kernel variant the fused model launches (quick: 1 and 3 row blocks only)."""
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise RuntimeError("unset TRITON_INTERPRET: this compiles the GPU path")
    from lowlat.kernels._gemv import BLOCK_N, plan_gemv
    from lowlat.kernels.lm_head import _lm_head_kernel
    from lowlat.kernels.mlp import _gate_up_kernel
    from lowlat.kernels.out_proj import _residual_gemv_kernel

    out = []
    shapes = [("SmolLM2", 576, 576, 1536, 49152)] if quick else [
        ("SmolLM2", 576, 576, 1536, 49152), ("Llama-3.2-1B", 2048, 2048, 8192, 128256)]
    row_blocks = (1, 3) if quick else (1, 2, 3)
    for model, h, q, i, v in shapes:
        for nmb in row_blocks:
            for name, n, k, norm in (("out_proj", h, q, True), ("down", h, i, False)):
                p = plan_gemv(n, k)
                sig = {a: "*bf16" for a in ("a_ptr", "w_ptr", "res_ptr", "out_ptr", "nw_ptr", "h_ptr")}
                sig.update({"rstd_ptr": "*fp32", "ws_ptr": "*fp32", "ss_ptr": "*fp32", "cnt_ptr": "*i32",
                            "stride_am": "i32", "stride_wn": "i32", "stride_rm": "i32", "stride_om": "i32",
                            "stride_hm": "i32", "M": "i32", "N": "i32", "K": "i32", "n_tiles": "i32",
                            "eps": "fp32"})
                const = dict(SPLIT=p.split, CPS=p.chunks_per_split, BN=BLOCK_N, BK=p.block_k, NUM_MB=nmb,
                             NORM=norm, WRITE_H=False, NT_P2=max(2, triton_next_pow2(p.n_tiles)), BH=512,
                             N_COLS=1, EVEN_N=p.even_n, EVEN_K=p.even_k, PF_K=p.prefetch_k, USE_PDL=True,
                             UPCAST=False)
                t = time.time()
                c = _compile(_residual_gemv_kernel, sig, const, num_warps=4, num_stages=4 if nmb == 1 else 3, pdl=True)
                out.append(_report(f"{model}/{name}/mb{nmb}/split{p.split}", c, time.time() - t))
            if nmb != 2:   # WRITE_H (standalone out_proj) once per row-block count
                p = plan_gemv(h, q)
                const.update(SPLIT=p.split, CPS=p.chunks_per_split, BK=p.block_k, NORM=True, WRITE_H=True,
                             N_COLS=h, EVEN_N=p.even_n, EVEN_K=p.even_k, PF_K=p.prefetch_k,
                             NT_P2=max(2, triton_next_pow2(p.n_tiles)), USE_PDL=False)
                t = time.time()
                c = _compile(_residual_gemv_kernel, sig, const, num_warps=4, num_stages=4 if nmb == 1 else 3, pdl=False)
                out.append(_report(f"{model}/out_proj_write_h/mb{nmb}", c, time.time() - t))
            p = plan_gemv(i, h, pair=True)
            sig = {"x_ptr": "*bf16", "w_ptr": "*bf16", "nw_ptr": "*bf16", "rstd_ptr": "*fp32", "act_ptr": "*bf16",
                   "ws_ptr": "*fp32", "cnt_ptr": "*i32", "stride_xm": "i32", "stride_wn": "i32",
                   "stride_am": "i32", "M": "i32", "I": "i32", "K": "i32"}
            const = dict(SPLIT=p.split, CPS=p.chunks_per_split, BN=BLOCK_N, BK=p.block_k, NUM_MB=nmb,
                         NORM_IN=True, EVEN_N=p.even_n, EVEN_K=p.even_k, PF_K=min(512, p.prefetch_k),
                         USE_PDL=True, UPCAST=False)
            t = time.time()
            c = _compile(_gate_up_kernel, sig, const, num_warps=4, num_stages=3, pdl=True)
            out.append(_report(f"{model}/gate_up/mb{nmb}/split{p.split}", c, time.time() - t))
            p = plan_gemv(v, h, split=1)
            sig = {"x_ptr": "*bf16", "w_ptr": "*bf16", "nw_ptr": "*bf16", "nvalid_ptr": "*i32",
                   "logits_ptr": "*fp32", "tokens_ptr": "*i64", "keys_ptr": "*i64", "cnt_ptr": "*i32",
                   "stride_xm": "i32", "stride_wn": "i32", "stride_lm": "i32", "M": "i32", "V": "i32",
                   "K": "i32", "n_tiles": "i32", "eps": "fp32"}
            const = dict(BN=BLOCK_N, BK=p.block_k, CPS=p.chunks_per_split, NUM_MB=nmb, EVEN_N=p.even_n,
                         EVEN_K=p.even_k, PF_K=p.prefetch_k, USE_PDL=True, UPCAST=False)
            t = time.time()
            c = _compile(_lm_head_kernel, sig, const, num_warps=4, num_stages=4 if nmb == 1 else 3, pdl=True)
            out.append(_report(f"{model}/lm_head/mb{nmb}", c, time.time() - t))
    return out


def triton_next_pow2(n: int) -> int:
    return 1 << (max(1, n) - 1).bit_length()


if __name__ == "__main__":
    res = compile_all(quick="--quick" in sys.argv)
    bad = [r["kernel"] for r in res if not (r["wgmma"] or "UPCAST" in r["kernel"])]
    print(f"{len(res)} kernels compiled for sm_90; without wgmma: {bad or 'none'}")
