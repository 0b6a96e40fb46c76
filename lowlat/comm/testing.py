"""Helpers shared by the collective tests (tests/multi_gpu, tests/fault) and bench_allreduce: seeded
partials, a bit-level equality check, a timed-step wrapper, `ranks_on_one_device` (PeerRanks over one
device's buffers), and an example producer kernel that uses the lowlat.comm device functions in its
epilogue. The reference is always
`lowlat.reference.tp.ordered_sum` (never redefined here)."""

from __future__ import annotations

import hashlib
import time

import torch
import triton
import triton.language as tl

from lowlat import numerics
from lowlat.comm import ordered_reduce as orx
from lowlat.errors import CollectiveTimeout
from lowlat.reference.tp import ordered_sum


def ranks_on_one_device(world: int, hidden: int, *, max_rows: int = 8, dtype: torch.dtype = torch.bfloat16,
                        device: torch.device | str = "cpu", deadline: float = 10.0, confirm: bool = False,
                        spin_limit: int = 64, tiles_cap: int = 4) -> list:
    """`world` `PeerRank`s whose buffers all live on one device (each rank its own epoch counter, as
    separate processes have), so the per-rank host logic of `PeerGroup` runs without symmetric memory:
    under the CPU interpreter the ranks' calls run one after another; on one GPU they must be launched
    on separate streams (each call spins until its peers arrive)."""
    from lowlat.comm.fault import Fault
    from lowlat.comm.peer_buffers import PeerRank

    orx.check_group_shape(world, max_rows, hidden, dtype)
    tiles = orx.max_tiles_for(hidden)
    data = torch.zeros(world, 2, world, max_rows, hidden, dtype=dtype, device=device)
    ctrl = torch.zeros(world, orx.ctrl_len(world, tiles), dtype=torch.int64, device=device)
    i64 = dict(dtype=torch.int64, device=device)
    data_ptrs = torch.tensor([data[p].data_ptr() for p in range(world)], **i64)
    ctrl_ptrs = torch.tensor([ctrl[p].data_ptr() for p in range(world)], **i64)
    ranks = []
    for r in range(world):
        bufs = orx.ReduceBuffers(world, max_rows, hidden, dtype, data_ptrs=data_ptrs, ctrl_ptrs=ctrl_ptrs,
                                 epoch=torch.zeros(1, **i64), delays=torch.zeros(world, **i64), max_tiles=tiles,
                                 scope="gpu")
        pr = PeerRank(bufs, ctrl[r], r, deadline=deadline, fault=Fault(), confirm=confirm, tiles_cap=tiles_cap,
                      spin_limit=spin_limit)
        pr.data = data      # keeps the buffers alive with the ranks
        ranks.append(pr)
    return ranks


def make_partials(world: int, rows: int, hidden: int, seed: int, dtype: torch.dtype = torch.bfloat16,
                  device: torch.device | str = "cpu") -> torch.Tensor:
    """[world, rows, hidden] random partials, the same on every process for the same arguments.

    Odd columns: normal values scaled 2^-2..2^2 by rank. Even columns also carry a cancelling pair
    +B on rank 0 and -B on rank world-1 (B = 2^17..2^22): a handful of bf16 values otherwise sums
    exactly in fp32, so without it a sum in the wrong order would still match bit for bit; with it,
    any other order (world >= 3) changes about half of those outputs.
    """
    g = torch.Generator().manual_seed(seed)
    scale = torch.tensor([2.0 ** (r % 5 - 2) for r in range(world)]).view(world, 1, 1)
    x = torch.randn(world, rows, hidden, generator=g) * scale
    if world >= 2:
        big = 2.0 ** torch.randint(17, 23, (rows, (hidden + 1) // 2), generator=g).float()
        x[0, :, ::2] += big
        x[-1, :, ::2] -= big
    return x.to(dtype).to(device)


def assert_bits_equal(op: str, a: torch.Tensor, b: torch.Tensor, *, output: str = "out") -> None:
    """Bitwise equality: numerics.check_bitwise (records, fails on NaN), then the raw bits (so -0.0
    and +0.0 differ too)."""
    numerics.check_bitwise(op, a, b, output=output)
    ints = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    if not torch.equal(a.contiguous().view(ints), b.contiguous().view(ints)):
        raise AssertionError(f"{op}.{output}: equal values but different bits (signed zeros)")


def digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()


def reference(partials: torch.Tensor) -> torch.Tensor:
    """ordered_sum over the rank dim of [world, M, H] partials (on CPU)."""
    return ordered_sum(list(partials.cpu()))


def timed_step(fn, *args, **kw) -> tuple[str, object, float]:
    """Run one collective call: ("ok", result, s) or ("timeout", CollectiveTimeout summary, s)."""
    from lowlat.comm.host_protocol import collect_timeout

    t0 = time.monotonic()
    try:
        res = fn(*args, **kw)
        return "ok", res, time.monotonic() - t0
    except CollectiveTimeout as e:
        return "timeout", collect_timeout(e), time.monotonic() - t0


@triton.jit
def scaled_partial_epilogue_kernel(x_ptr, out_ptr, data_ptrs, ctrl_ptrs, epoch_ptr, M, H, slot_elems,
                                   max_tiles, deadline_ns, spin_limit, scale, WORLD: tl.constexpr,
                                   WORLD_P2: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_H: tl.constexpr,
                                   PHASE: tl.constexpr, USE_ASM: tl.constexpr):
    """Example of the lowlat.comm device functions in a producer kernel's epilogue (tests and docs):
    program (tile, rank) computes partial_r = bf16(x_r * scale * (r + 1)) in fp32 registers, pushes
    it (push_to_peers + publish), waits for every rank's tile (wait_flags, abort_peers on timeout)
    and writes the rank-ordered sum. x, out: [N, M, H] bf16; PHASE 1 = push, 2 = wait + sum, 3 =
    both (two launches under the interpreter); BLOCK_M >= M; 8 warps (wait_flags polls 256 lanes)."""
    tile = tl.program_id(0)
    rank = tl.program_id(1)
    epoch = tl.load(epoch_ptr)
    parity = epoch % 2
    rows = tl.arange(0, BLOCK_M)
    cols = tile * BLOCK_H + tl.arange(0, BLOCK_H)
    mask = (rows[:, None] < M) & (cols[None, :] < H)
    offs = rows[:, None] * H + cols[None, :]
    tag = orx.flag_tag(epoch, M, tile)
    if PHASE & 1:
        x = tl.load(x_ptr + rank * M * H + offs, mask=mask).to(tl.float32)
        part = orx.round_to(x * (scale * (rank + 1)), tl.bfloat16)
        orx.push_to_peers(part, offs, mask, data_ptrs, rank, parity, slot_elems, WORLD, tl.bfloat16)
        orx.publish(ctrl_ptrs, rank, tile, tag, parity, max_tiles, rank >= 0, False, WORLD, WORLD_P2, "gpu")
    if PHASE & 2:
        my_ctrl = tl.load(ctrl_ptrs + rank).to(tl.pointer_type(tl.int64))
        my_data = tl.load(data_ptrs + rank).to(tl.pointer_type(tl.bfloat16))
        state, deadline_at, missing = orx.wait_flags(
            my_ctrl + 16 + parity * WORLD * max_tiles + tile, tag, max_tiles, my_ctrl, epoch,
            tl.zeros([], tl.int32), tl.zeros([], tl.int64), deadline_ns, spin_limit, WORLD, 256, "gpu",
            USE_ASM, True, 8)
        orx.abort_peers(ctrl_ptrs, epoch, 0, rank, missing, state, WORLD, WORLD_P2, "gpu")
        tl.debug_barrier()
        acc = orx.ordered_sum_tile(my_data, offs, mask, parity, slot_elems, WORLD, tl.bfloat16)
        tl.store(out_ptr + rank * M * H + offs, orx.round_to(acc, tl.bfloat16), mask=mask & (state == 0))
