"""Session 7 (issue 3), CPU only: where Triton 3.6's software pipeliner puts a GEMV loop's loads relative to a
`gdc_wait` placed in the loop's first iteration. Compiles `_loop_kernel` for sm_90 with Triton's own backend
(no GPU needed, TRITON_INTERPRET unset) and prints the PTX's order of TMA weight loads (cp.async.bulk.tensor),
cp.async activation loads, mbarrier waits and griddepcontrol.wait, runs collapsed.

    python bench/explore/pipeliner_check.py [--k 2048] [--bn 16] [--bk 64]

Seen (2026-12-01, defaults): "before the first griddepcontrol.wait: 32 TMA weight loads, 32 cp.async activation
loads (of 32 steps)": the pipeliner issues the activation loads of every step before the wait too, so they would
read the previous launch's output before it is complete. That
is why the shared-memory-resident GEMV of smem_gemv.py is written in Gluon (its plain-Triton twin keeps the
activations in registers, loaded in an `if` of the first iteration, which the pipeliner does not peel).
"""
from __future__ import annotations

import argparse

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


@triton.jit
def _loop_kernel(x_ptr, w_desc, out_ptr, R, K: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    pid = tl.program_id(0)
    n0 = pid * BN
    gdc_launch_dependents()
    rows = tl.arange(0, 16)
    rmask = rows < R
    acc = tl.zeros([BN, 16], dtype=tl.float32)
    for c in tl.range(0, K // BK, num_stages=K // BK):          # every weight tile in flight at once
        w = w_desc.load([n0, c * BK])
        if c == 0:
            gdc_wait()
        rk = c * BK + tl.arange(0, BK)
        xt = tl.load(x_ptr + rows[None, :] * K + rk[:, None], mask=rmask[None, :], other=0.0)
        acc = tl.dot(w, xt, acc)
    rn = n0 + tl.arange(0, BN)
    tl.store(out_ptr + rows[None, :] * 4096 + rn[:, None], acc, mask=rmask[None, :])


KEYS = ("cp.async.bulk.tensor", "griddepcontrol.wait", "cp.async.cg", "mbarrier.try_wait", "mma.sync",
        "wgmma.mma_async", "st.global")


def ptx_order(ptx: str) -> list[tuple[str, int]]:
    """[(instruction, run length)] of the KEYS instructions in PTX order."""
    seq: list[list] = []
    for line in ptx.splitlines():
        key = next((k for k in KEYS if k in line), None)
        if key is None:
            continue
        if seq and seq[-1][0] == key:
            seq[-1][1] += 1
        else:
            seq.append([key, 1])
    return [tuple(s) for s in seq]


def main() -> None:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    p = argparse.ArgumentParser()
    p.add_argument("--k", type=int, default=2048)
    p.add_argument("--bn", type=int, default=16)
    p.add_argument("--bk", type=int, default=64)
    a = p.parse_args()
    fn = _loop_kernel
    cx = {"K": a.k, "BN": a.bn, "BK": a.bk}
    sig = {"x_ptr": "*bf16", "w_desc": f"tensordesc<bf16[{a.bn}, {a.bk}]>", "out_ptr": "*fp32", "R": "i32",
           **{k: "constexpr" for k in cx}}
    names = fn.arg_names
    src = ASTSource(fn=fn, signature=sig, constexprs={(names.index(k),): v for k, v in cx.items()},
                    attrs={(names.index(n),): [["tt.divisibility", 16]] for n in ("x_ptr", "out_ptr")})
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "launch_pdl": True})
    order = ptx_order(kernel.asm["ptx"])
    for key, n in order:
        print(f"{n:3d} x {key}")
    first_wait = next(i for i, (key, _) in enumerate(order) if key == "griddepcontrol.wait")
    before = {k: sum(n for key, n in order[:first_wait] if key == k) for k in ("cp.async.bulk.tensor", "cp.async.cg")}
    print(f"before the first griddepcontrol.wait: {before['cp.async.bulk.tensor']} TMA weight loads, "
          f"{before['cp.async.cg']} cp.async activation loads (of K / BK = {a.k // a.bk} steps)")


if __name__ == "__main__":
    main()
