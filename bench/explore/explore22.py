"""Session-11 exploration (issue 3): the shared-memory-resident GEMV on tensor cores (`mma_smem_gemv.py`, one
arithmetic path for every row count; "mma" version 1, measured in session 11's call1, and "mma2" version 2,
written afterwards and not yet run) at 1 / 6 / 16 / 48 rows, beside session 7's FMA kernel (`smem_gemv.py`, 1 row)
and the production residual GEMV (out_proj shapes), with explore18's shapes, epilogues and timing (one CUDA graph
of PDL-chained launches over rotating cold weight copies). Also checks each shape's bitwise row invariance (every
row of 48 alone, and the first 6 and 17) on the GPU.

    python bench/explore/explore22.py --out $OUT/explore22.json [--budget-s 200] [--reps 2] [--rows 1 6 16 48]
"""
from __future__ import annotations

import time

from _common import Recorder, check_and_time, explore_parser, gemv_reference, time_gemv_plans

import torch  # noqa: E402

from lowlat.benchmarking import rotation_copies  # noqa: E402

#: (label, N, K, epilogue) as explore18.SHAPES
SHAPES = [("llama_qkv", 3072, 2048, "norm"), ("qwen3_qkv", 5120, 2048, "norm"), ("qwen3_out", 2048, 4096, "res"),
          ("llama_out", 2048, 2048, "res")]


def make_cases(dev):
    from mma_smem_gemv import MmaSmemGemv
    from smem_gemv import SmemGemv

    cases = []
    for label, n, k, epi in SHAPES:
        nc = max(rotation_copies(n * k * 2), 8)
        gen = torch.Generator(device=dev).manual_seed(22)
        ws = [(torch.randn(n, k, generator=gen, device=dev) * k ** -0.5).to(torch.bfloat16) for _ in range(nc)]
        g = (1 + 0.1 * torch.randn(k, generator=gen, device=dev)).to(torch.bfloat16)
        cases.append(dict(label=label, n=n, k=k, epi=epi, nc=nc, ws=ws, g=g, gen=gen, mma=MmaSmemGemv(ws),
                          fma={bn: SmemGemv(ws, bn) for bn in (8, 16)}))
    return cases


def row_invariance(rec, c, version: int = 1) -> None:
    """48 rows at once, then each row alone and the first 6 and 17 rows: bitwise the same outputs (recorded)."""
    dev = c["ws"][0].device
    x = torch.randn(48, c["k"], generator=c["gen"], device=dev).to(torch.bfloat16)
    res = torch.randn(48, c["n"], generator=c["gen"], device=dev).to(torch.bfloat16)
    full = torch.full((48, c["n"]), float("nan"), device=dev, dtype=torch.bfloat16)
    c["mma"](0, x, c["g"], res, full, res_epi=c["epi"] == "res", version=version)
    bad = []
    for lo, hi in [(i, i + 1) for i in range(48)] + [(0, 6), (0, 17)]:
        part = torch.full((hi - lo, c["n"]), float("nan"), device=dev, dtype=torch.bfloat16)
        c["mma"](0, x[lo:hi], c["g"], res[lo:hi], part, res_epi=c["epi"] == "res", version=version)
        if not torch.equal(part.view(torch.int16), full[lo:hi].view(torch.int16)):
            bad.append(f"{lo}:{hi}")
    torch.cuda.synchronize()
    want = gemv_reference(c["epi"], x, c["g"], res, c["ws"][0])
    err = (full.double() - want).abs().max().item()
    rec(dict(op="row_invariance", shape=c["label"], version=version, n=c["n"], k=c["k"], differing=bad, ok=not bad,
             max_err_48=round(err, 5), nan=bool(full.isnan().any().item())))


def mma(rec, deadline, cases, rows, reps) -> None:
    for c in cases:
        for v in (1, 2):
            rec.guard(f"rowinv/{c['label']}/v{v}", lambda c=c, v=v: row_invariance(rec, c, v), op="row_invariance")
    for r in rows:
        for c in cases:
            dev = c["ws"][0].device
            x = torch.randn(r, c["k"], generator=c["gen"], device=dev).to(torch.bfloat16)
            res = torch.randn(r, c["n"], generator=c["gen"], device=dev).to(torch.bfloat16)
            out = torch.empty(r, c["n"], device=dev, dtype=torch.bfloat16)
            want = gemv_reference(c["epi"], x, c["g"], res, c["ws"][0])
            variants = [("mma", 2, None), ("mma2", 2, None)] + ([("mma", 1, None)] if r == 1 else [])
            if r == 1:
                variants += [("fma", 2, bn) for bn in (8, 16)]
            for rep in range(reps):
                for kern, mode, bn in variants:
                    if time.time() > deadline:
                        return

                    def launch(i, kern=kern, mode=mode, bn=bn, c=c, x=x, res=res, out=out):
                        if kern.startswith("mma"):
                            c["mma"](i, x, c["g"], res, out, mode=mode, res_epi=c["epi"] == "res",
                                     version=2 if kern == "mma2" else 1)
                        else:
                            c["fma"][bn](i, x, c["g"], res, out, mode=mode, res_epi=c["epi"] == "res", group=16)

                    entry = dict(op="smem", shape=c["label"], n=c["n"], k=c["k"], rows=r, rep=rep, kernel=kern,
                                 mode=mode, bn=bn)
                    rec.guard(f"{c['label']}/{kern}/m{mode}/bn{bn}/r{r}",
                              lambda launch=launch, entry=entry, out=out, want=want, c=c: check_and_time(
                                  rec, launch, out, want, c["nc"], c["n"] * c["k"] * 2, entry), op="smem", rows=r)


def main():
    p = explore_parser()
    p.set_defaults(rows=[1, 6, 16, 48], budget_s=200)
    p.add_argument("--skip", nargs="*", default=[])
    a = p.parse_args()
    deadline = time.time() + a.budget_s
    rec = Recorder(a.out)
    print(f"copy bandwidth {rec.bw / 1e12:.3f} TB/s", flush=True)
    dev = torch.device("cuda")
    if "mma" not in a.skip:
        cases = make_cases(dev)
        rec.guard("mma", lambda: mma(rec, deadline, cases, a.rows, a.reps), op="smem")
        del cases
    if "production" not in a.skip:
        for label, n, k, epi in SHAPES:
            if epi == "res":
                rec.guard(f"production/{label}", lambda n=n, k=k: time_gemv_plans(
                    rec, deadline + 60, "residual", n, k, 1e-5, [("production", {})], a.reps, rows=a.rows),
                    op="residual")


if __name__ == "__main__":
    main()
