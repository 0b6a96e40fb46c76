"""The achievable floor of a memory-bound launch: a cold-L2 read of W bytes, timed as the GEMV benches time a
launch (one CUDA graph of launches over rotating copies, time per launch), beside the copy-bandwidth floor
(W / device-to-device copy bandwidth) that issues 3 and 5 state their targets against.

    python bench/bench_stream_floor.py --out bench/results/stream_floor_h200.json [--mb 33.554432 56.623104]

Per size W (defaults: the Llama-3.2-1B down projection [2048, 8192] and SmolLM2's LM head [49152, 576], bf16):
  torch_sum          torch.sum(w, dtype=float32): PyTorch's reduction kernel, launches back to back;
  read_p{P}          Triton: P programs, each sums a contiguous W / P bytes (8 warps, 16 KB per loop step);
  read_p{P}_pdl      the same PDL-chained with `gdc_wait` first (every load after the wait: the dependency
                     pattern of a GEMV whose loads all follow the wait);
  read_p{P}_early    PDL-chained, every load before `gdc_wait` (the ideal overlap of loads that do not
                     depend on the previous launch; the next launch's programs start at once).
No kernel can read W from HBM, cold, faster than the best of these in this timing method; the GEMVs' share
of copy bandwidth is judged against that.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))     # run from a checkout, installed or not

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from lowlat.benchmarking import copy_bandwidth, rotation_copies, time_launches, versions  # noqa: E402

BLOCK = 8192          # bf16 elements per loop step of a program (16 KB; 8 warps: 64 B per thread)


@triton.jit
def _read_kernel(src, out, SPAN: tl.constexpr, BLOCK: tl.constexpr, MODE: tl.constexpr):
    """out[pid] = sum of src[pid * SPAN : (pid + 1) * SPAN] (fp32). MODE 0: no PDL; 1: gdc_wait first;
    2: every load before gdc_wait (launch_dependents first)."""
    pid = tl.program_id(0)
    if MODE == 1:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    if MODE == 2:
        tl.extra.cuda.gdc_launch_dependents()
    base = src + pid.to(tl.int64) * SPAN
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for i in range(SPAN // BLOCK):
        acc += tl.load(base + i * BLOCK + tl.arange(0, BLOCK)).to(tl.float32)
    s = tl.sum(acc, axis=0)
    if MODE == 2:
        tl.extra.cuda.gdc_wait()
    tl.store(out + pid, s)


def read_launcher(ws, out, programs: int, mode: int):
    span = ws[0].numel() // programs
    if span * programs != ws[0].numel() or span % BLOCK:
        raise ValueError(f"{ws[0].numel()} elements do not split into {programs} programs of whole {BLOCK} blocks")

    def launch(i):
        _read_kernel[(programs,)](ws[i], out, SPAN=span, BLOCK=BLOCK, MODE=mode, num_warps=8,
                                  launch_pdl=mode > 0)
    return launch


def program_counts(numel: int) -> list[int]:
    """Grids whose programs read whole BLOCKs: spans of 16, 32, 64, 128 and 256 KB where they divide W."""
    out = []
    for span_kb in (16, 32, 64, 128, 256):
        span = span_kb * 512                     # bf16 elements
        if numel % span == 0:
            out.append(numel // span)
    return out


def bench_size(nbytes: int, bw: float, iters: int, rec) -> None:
    """Every variant for one size W = nbytes, into `rec` (a `lowlat.bench._Recorder`): us, bytes, floor_us
    (W / copy bandwidth) and, added by the recorder, GBps and frac_of_floor; a failing variant is recorded
    as an error and the run goes on."""
    dev = torch.device("cuda")
    numel = nbytes // 2
    n = rotation_copies(nbytes)
    ws = [torch.randn(numel, device=dev).to(torch.bfloat16) for _ in range(n)]
    out = torch.empty(numel // (16 * 512) + 1, dtype=torch.float32, device=dev)
    sums = torch.empty(n, dtype=torch.float32, device=dev)

    def timed(variant, fn, **extra):
        try:
            us = time_launches(fn, n, iters=iters)["us_median"]
        except Exception as exc:                                  # noqa: BLE001 - record, go on
            torch.cuda.synchronize()
            rec.error(f"{nbytes} B/{variant}", exc)
            return
        rec.add(bytes=nbytes, variant=variant, us=us, floor_us=nbytes / bw * 1e6, **extra)

    timed("torch_sum", lambda i: torch.sum(ws[i], dim=0, dtype=torch.float32, out=sums[i]))
    counts = program_counts(numel)
    for p in counts:
        for mode, suffix in ((0, ""), (1, "_pdl"), (2, "_early")):
            timed(f"read_p{p}{suffix}", read_launcher(ws, out, p, mode), programs=p)
    # the sums are right (a kernel that skipped its loads would time faster than memory allows)
    read_launcher(ws, out, counts[0], 0)(0)
    got = out[: counts[0]].double().sum()
    want = ws[0].double().sum()
    if not torch.isclose(got, want, rtol=1e-3, atol=1e-1 * numel ** 0.5 * 1e-3):
        raise AssertionError(f"read kernel sum {float(got)} != torch {float(want)}")
    del ws
    torch.cuda.empty_cache()


def main(argv=None) -> int:
    from lowlat.bench import _Recorder

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mb", type=float, nargs="+", default=[2048 * 8192 * 2 / 1e6, 49152 * 576 * 2 / 1e6],
                   help="weight sizes in MB (1e6 bytes), rounded to whole 16 KB")
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    bw = copy_bandwidth()
    rec = _Recorder(args.out, dict(versions(), copy_bandwidth_TBps=round(bw / 1e12, 3)))
    print(f"copy bandwidth {bw / 1e12:.3f} TB/s", flush=True)
    for mb in args.mb:
        bench_size(int(round(mb * 1e6 / 16384)) * 16384, bw, args.iters, rec)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
