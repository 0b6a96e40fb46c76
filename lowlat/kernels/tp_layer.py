"""TP epilogue kernels of the tensor-parallel fused decoder layer (Triton; Hopper and the CPU interpreter).

Matches the two reductions of `lowlat.reference.tp.tp_decoder_layer` (Megatron-style TP, Shoeybi et
al. 2019) together with the residual adds and the FFN's RMSNorm around them:

    partial_r = bf16( a_r W_r^T )                          rank r's partial GEMV, fp32 accumulation
    s         = bf16( ((p_0 + p_1) + ...) + p_{N-1} )      `ordered_sum`: fp32, rank order 0..N-1
    x'        = bf16( x + s )                              residual add (reference: bf16 x + bf16 s)
    h         = mlp_norm * bf16( x' * rstd ),  rstd = 1 / sqrt(mean(x'^2) + eps)     (optional)

Two kernels per reduction, each a grid over ALL emulated ranks (rank = a program_id axis):

1. `partial_gemv_push`: program (column tile, rank r) computes its [M, BN] tile of a_r W_r^T and,
   in its epilogue, pushes the bf16 tile into slot [parity][r] of every rank's receive buffer
   (`lowlat.comm.ordered_reduce.push_to_peers`) and publishes the tag `flag_tag(epoch, M, tile)`
   into every rank's flag [parity][r][tile] (`publish`). It never waits.
2. `reduce_residual_norm`: program (row block, rank r) walks the column tiles in order; per tile it
   waits for the N flags of that tile (`wait_flags`: acquire loads, deadline on `%globaltimer`, abort
   word), sums the slots in rank order in fp32 (`ordered_sum_tile`), rounds, adds the residual, stores
   x' and accumulates the rows' sums of squares; with the norm it then writes h from its own x'.

So the reduction of tile t starts as soon as every rank pushed tile t (per-tile waits, no grid
barrier). Both kernels are launched in that order (push, then reduce) on one stream, in one of two
modes (`use_pdl`, `TPFusedLayer(overlap=...)`):

* serial (no PDL; always under the CPU interpreter): the reduce grid starts after the whole push
  grid finished. It only waits for flags of a kernel that already completed, so it needs no
  co-residency and cannot deadlock however blocks are scheduled; under the interpreter (programs run
  one after another) this order is what makes it work at all. The reduction then overlaps the GEMV
  only across ranks (a real rank's reduce starts while slower peers still compute), not within one
  rank's stream.
* overlap (PDL, Hopper): the reduce kernel is launched with programmatic dependent launch and
  overlaps the GEMV within a rank: its programs spin on the per-tile flags while the push programs
  are still computing, and sum tile t as soon as it is published.
  - Push, USE_PDL: every program first calls `gdc_wait()` (its activations come from the previous
    kernel), then at once `gdc_launch_dependents()`, before the GEMV.
  - No deadlock: PDL starts the dependent (reduce) grid only after EVERY program of the push grid
    has executed the trigger or exited. A program triggers only once it runs, so by then every push
    program has been scheduled: it is resident on an SM or already finished, whatever the grid size
    (a grid larger than one wave still triggers only after its last wave started). A push program
    never waits for anything after its `gdc_wait` (which waits for the kernel BEFORE it, not for the
    reduce), so every push program runs to completion regardless of the spinning reduce programs:
    they can occupy free SM slots but cannot starve a program they wait for.
  - Reduce, USE_PDL: NO `gdc_wait` before the flag waits (that would wait for the whole GEMV and
    remove the overlap); the pushed tiles are ordered by the flags (release exchange after the tile's
    stores + block barrier in the push, acquire load + block barrier before the `.cg` slot loads in
    the reduce), as between any two ranks. Everything else it reads (residual x, norm weight, epoch
    counter, pointer tables, and the abort words' values from earlier collectives; during its waits
    it reads them volatile, since programs of this same reduce grid may write them) was written by
    kernels launched BEFORE the push kernel:
    those completed (and their writes were made visible) before the push kernel's `gdc_wait`
    returned, and the push programs trigger only after that wait, so the reduce grid starts after
    all of them completed. The reduce kernel writes nothing the push of the same collective reads.
  - Reduce, USE_PDL, at its very end: `gdc_wait()`. By then all flags arrived (or the step was
    aborted), so it costs only the push grid's exit; it makes the reduce grid's completion imply the
    push grid's completion, so a normally launched successor (the TP layer's next per-rank kernel,
    the next collective's epoch bump, the host's read of the abort words) is ordered after BOTH
    kernels without relying on stream order being transitive through a PDL kernel that never
    waited. The reduce kernel never calls `gdc_launch_dependents`: a successor launched with PDL is
    released only at its completion too.
  - Slots: a collective's reduce reads slots/flags of parity epoch % 2 and the push of the SAME
    collective writes them (ordered by the flags); the next push into that parity is two
    collectives later, behind normally launched kernels (per-rank kernels, the epoch bump) that
    start only after this reduce grid completed, so there is no reuse race within a rank; across
    real ranks the parity double-buffering covers it as in the serial mode (lowlat/comm/README.md).
  - Deadline: a reduce program's deadline starts at its first missed flag, which in this mode can
    be while the GEMV still runs (microseconds against a deadline of seconds).
  The launch sequence this relies on: nothing between the push and the reduce launches, and every
  input of the reduce produced before the push launch (as `TPFusedLayer` does). Under the CPU
  interpreter (no PDL) both modes are the serial launch order.

Deadline and abort are the comm layer's (lowlat/comm/README.md): a waiter whose deadline expires
writes the abort word (epoch, stage, rank, missing peer) into every rank's control block; programs
that see a word of this step's epoch, or of `abort_floor` (the layer's first collective), or later,
stop and write nothing more; the host reads the words after the layer and raises
`CollectiveTimeout`.

Glossary: M rows (1..48), H hidden (N of the output projections), K per-rank input width
(Hq/N * D for the output projection, I/N for the down projection), N ranks (world).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from lowlat.comm.deadline import check_stage
from lowlat.comm.fault import FaultKind
from lowlat.comm.ordered_reduce import (MIN_BLOCK_H, ReduceBuffers, abort_peers, flag_tag, interpreting,
                                        ordered_sum_tile, publish, push_to_peers, round_to, wait_flags)
from lowlat.errors import StepContractError, UnsupportedConfigError
from lowlat.kernels._attn_common import require_runnable
from lowlat.kernels._gemv import mma, pdl_available, rstd_of

#: columns per tile: the comm layer's smallest tile, so tile ids stay within its flag array
BLOCK_N = MIN_BLOCK_H
#: K per GEMV step
BLOCK_K = 64
#: rows per program of the reduce kernel
REDUCE_ROWS = 16
NUM_WARPS = 8
REDUCE_WARPS = 4
MAX_ROWS = 48
#: the faults the TP layer's push epilogue injects (LATE needs per-rank delays: not implemented here)
SUPPORTED_FAULTS = (FaultKind.NONE, FaultKind.NEVER, FaultKind.EXIT, FaultKind.WRONG_EPOCH)


@triton.jit
def _partial_gemv_push_kernel(
        a_ptr, stride_ar, stride_am, w_ptr, stride_wr, stride_wn,
        data_ptrs, ctrl_ptrs, epoch_ptr, M, slot_elems, max_tiles, fault_rank,
        N: tl.constexpr, K: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, BM: tl.constexpr,
        WORLD: tl.constexpr, WORLD_P2: tl.constexpr, SCOPE: tl.constexpr, FAULT: tl.constexpr,
        UPCAST: tl.constexpr, USE_PDL: tl.constexpr):
    """Program (tile, rank): bf16(a[rank] @ W[rank][tile cols]^T) pushed to every rank + tagged flag.

    USE_PDL: wait for the previous kernel, then trigger the dependent (reduce) launch at once, before
    the GEMV: the reduce grid starts only when every program of this grid has reached this point (or
    exited), so every push program is resident before any reduce program spins (module docstring)."""
    if USE_PDL:
        gdc_wait()                  # a, the epoch counter: written by earlier kernels
        gdc_launch_dependents()     # every program, first thing: all of them are scheduled before any waiter
    tile = tl.program_id(0)
    rank = tl.program_id(1)
    epoch = tl.load(epoch_ptr)
    parity = epoch % 2
    rn = tile * BN + tl.arange(0, BN)
    nmask = rn < N
    rm = tl.arange(0, BM)
    mmask = rm < M
    a_base = a_ptr + rank * stride_ar
    w_base = w_ptr + rank * stride_wr
    acc = tl.zeros((BN, BM), dtype=tl.float32)
    for k0 in range(0, K, BK):
        rk = k0 + tl.arange(0, BK)
        kmask = rk < K
        w = tl.load(w_base + rn[:, None] * stride_wn + rk[None, :], mask=nmask[:, None] & kmask[None, :], other=0.0)
        x = tl.load(a_base + rm[None, :] * stride_am + rk[:, None], mask=kmask[:, None] & mmask[None, :], other=0.0)
        if UPCAST:                  # the interpreter's bf16 arithmetic is wrong: fp32 right after the load
            w = w.to(tl.float32)
            x = x.to(tl.float32)
        acc = mma(w, x, acc, UPCAST)
    part = round_to(acc, tl.bfloat16)
    active = rank >= 0
    if FAULT == 1:      # never arrives
        active = rank != fault_rank
    if FAULT == 3:      # exits mid-step: only its first half of tiles runs
        active = (rank != fault_rank) | (tile < tl.num_programs(0) // 2)
    tag = flag_tag(epoch, M, tile)
    if FAULT == 4:      # publishes the previous epoch's tag
        tag = tl.where(rank == fault_rank, flag_tag(epoch - 1, M, tile), tag)
    offs = rm[None, :] * N + rn[:, None]          # [row][col] inside a slot of [max_rows][H]
    push_to_peers(part, offs, nmask[:, None] & mmask[None, :] & active, data_ptrs, rank, parity, slot_elems,
                  WORLD, tl.bfloat16)
    publish(ctrl_ptrs, rank, tile, tag, parity, max_tiles, active, False, WORLD, WORLD_P2, SCOPE)


@triton.jit
def _reduce_residual_norm_kernel(
        res_ptr, stride_rr, stride_rm, out_ptr, stride_or, stride_om, h_ptr, stride_hr, stride_hm, nw_ptr,
        data_ptrs, ctrl_ptrs, epoch_ptr, abort_floor, M, slot_elems, max_tiles, stage, deadline_ns,
        spin_limit, eps,
        N: tl.constexpr, N_TILES: tl.constexpr, BN: tl.constexpr, BM: tl.constexpr,
        WORLD: tl.constexpr, WORLD_P2: tl.constexpr, POLL: tl.constexpr, SCOPE: tl.constexpr,
        USE_ASM: tl.constexpr, USE_DEADLINE: tl.constexpr, ABORT_EVERY: tl.constexpr, NORM: tl.constexpr,
        USE_PDL: tl.constexpr):
    """Program (row block, rank): per tile wait, rank-ordered sum, + residual -> out; then h (NORM).

    USE_PDL (launched as the push kernel's programmatic dependent): no `gdc_wait` before the flag
    waits, only at the very end (module docstring). The pushed tiles are ordered by their flags
    (acquire). Everything else read here -- epoch counter, pointer tables, abort words, residual,
    norm weight -- was written by kernels launched before the push kernel, which completed before the
    push programs' `gdc_wait` returned; they trigger this launch only after that wait, so those writes
    are complete when this grid starts (and are read through L2: volatile epoch, `.cg` residual; the
    norm weight and pointer tables never change)."""
    rb = tl.program_id(0)
    rank = tl.program_id(1)
    # volatile / .cg (below): values written by earlier kernels are read from L2, never from an L1 line an
    # earlier grid left on this SM (with PDL this grid starts while the push grid still runs)
    epoch = tl.load(epoch_ptr, volatile=True)
    parity = epoch % 2
    my_data = tl.load(data_ptrs + rank).to(tl.pointer_type(tl.bfloat16))
    my_ctrl = tl.load(ctrl_ptrs + rank).to(tl.pointer_type(tl.int64))
    rm = rb * BM + tl.arange(0, BM)
    mmask = rm < M
    # an earlier collective of this layer was aborted: its inputs are not valid, stop now
    a = tl.load(my_ctrl, volatile=True)
    state = tl.where((a >> 32) >= abort_floor, 2, 0)
    deadline_at = tl.zeros([], dtype=tl.int64)
    ss = tl.zeros((BM,), dtype=tl.float32)
    for t in range(N_TILES):
        tag = flag_tag(epoch, M, t)
        flag_base = my_ctrl + 16 + parity * WORLD * max_tiles + t
        state, deadline_at, missing = wait_flags(
            flag_base, tag, max_tiles, my_ctrl, epoch, state, deadline_at, deadline_ns, spin_limit,
            WORLD, POLL, SCOPE, USE_ASM, USE_DEADLINE, ABORT_EVERY)
        abort_peers(ctrl_ptrs, epoch, stage, rank, missing, state, WORLD, WORLD_P2, SCOPE)
        tl.debug_barrier()
        cols = t * BN + tl.arange(0, BN)
        mask = mmask[:, None] & (cols < N)[None, :]
        ok = mask & (state == 0)
        acc = ordered_sum_tile(my_data, rm[:, None] * N + cols[None, :], ok, parity, slot_elems, WORLD,
                               tl.bfloat16)
        s = round_to(acc, tl.bfloat16).to(tl.float32)
        r = tl.load(res_ptr + rank * stride_rr + rm[:, None] * stride_rm + cols[None, :], mask=ok, other=0.0,
                    cache_modifier=".cg")
        xn = round_to(r.to(tl.float32) + s, tl.bfloat16)
        tl.store(out_ptr + rank * stride_or + rm[:, None] * stride_om + cols[None, :], xn, mask=ok)
        xf = tl.where(ok, xn.to(tl.float32), 0.0)
        ss += tl.sum(xf * xf, axis=1)
    if NORM:
        tl.debug_barrier()
        rstd = rstd_of(ss, N, eps)
        for t in range(N_TILES):
            cols = t * BN + tl.arange(0, BN)
            cm = cols < N
            ok = mmask[:, None] & cm[None, :] & (state == 0)
            xv = tl.load(out_ptr + rank * stride_or + rm[:, None] * stride_om + cols[None, :], mask=ok, other=0.0,
                         cache_modifier=".cg").to(tl.float32)
            w = tl.load(nw_ptr + cols, mask=cm, other=0.0).to(tl.float32)
            y = round_to(xv * rstd[:, None], tl.bfloat16).to(tl.float32)
            tl.store(h_ptr + rank * stride_hr + rm[:, None] * stride_hm + cols[None, :],
                     round_to(w[None, :] * y, tl.bfloat16), mask=ok)
    if USE_PDL:
        # all flags arrived (or the step aborted): this waits only for the push grid's exit, and makes
        # this grid's completion imply the push grid's for every normally launched successor
        gdc_wait()


# ---------------------------------------------------------------------------------------------- host
def _check(name: str, t: torch.Tensor, shape: tuple, device: torch.device) -> None:
    if tuple(t.shape) != tuple(shape):
        raise StepContractError(f"{name} must be {list(shape)}, got {list(t.shape)}")
    if t.dtype != torch.bfloat16:
        raise StepContractError(f"{name} must be bfloat16, got {t.dtype}")
    if t.device != device:
        raise StepContractError(f"{name} is on {t.device}, the group's buffers on {device}")
    if t.stride(-1) != 1:
        raise StepContractError(f"{name} must be contiguous in its last dim, strides {t.stride()}")


def pdl_enabled(bufs: ReduceBuffers, use_pdl: bool) -> bool:
    """Whether a launch on the group's device really uses PDL: asked for, Hopper or newer, compiled
    (never under the CPU interpreter, whose sequential programs need the serial order)."""
    return bool(use_pdl) and pdl_available(bufs.data_ptrs.device)


def partial_gemv_push(bufs: ReduceBuffers, a: torch.Tensor, w: torch.Tensor, *, fault_kind: FaultKind = FaultKind.NONE,
                      fault_rank: int = 0, use_pdl: bool = False) -> int:
    """Every rank's partial GEMV with the push epilogue, one launch over all N emulated ranks.

    Parameters:
        bufs   the group's receive buffers / control blocks (`EmulatedGroup.bufs`); its device epoch
               must already be bumped for this collective
        a      [N, M, K] bf16: rank r's activations a[r] (attention output or SwiGLU activation)
        w      [N, H, K] bf16: rank r's weight shard (columns of Wo / W_down), row-major
        fault_kind / fault_rank  injected fault (NEVER, EXIT, WRONG_EPOCH; NONE costs nothing)
        use_pdl  launch with PDL and trigger the dependent launch at every program's start, so a
               `reduce_residual_norm(use_pdl=True)` launched next overlaps this GEMV (sm_90; off under
               the interpreter and on older GPUs: `pdl_enabled`)
    Effect: slot [epoch % 2][r] of every rank's receive buffer holds bf16(a[r] W[r]^T) [M, H], and
    flag [epoch % 2][r][tile] of every rank holds `flag_tag(epoch, M, tile)`. Returns the number of tiles.
    Raises StepContractError (shapes, dtypes, devices, M), UnsupportedConfigError (fault kind).
    """
    require_runnable("a", a); require_runnable("w", w)
    n = bufs.world
    if a.dim() != 3 or w.dim() != 3:
        raise StepContractError(f"a [N, M, K] and w [N, H, K] expected, got {list(a.shape)} and {list(w.shape)}")
    m, k = a.shape[1], a.shape[2]
    if not 1 <= m <= bufs.max_rows:
        raise StepContractError(f"rows M={m} must be in 1..max_rows={bufs.max_rows}")
    dev = bufs.data_ptrs.device
    _check("a", a, (n, m, k), dev)
    _check("w", w, (n, bufs.hidden, k), dev)
    if bufs.dtype != torch.bfloat16:
        raise UnsupportedConfigError("group dtype", bufs.dtype, "the TP layer reduces bf16 partials")
    if fault_kind not in SUPPORTED_FAULTS:
        raise UnsupportedConfigError("fault", fault_kind.name, f"the TP layer injects {[f.name for f in SUPPORTED_FAULTS]}")
    n_tiles = triton.cdiv(bufs.hidden, BLOCK_N)
    bm = max(16, triton.next_power_of_2(m))
    pdl = pdl_enabled(bufs, use_pdl)
    _partial_gemv_push_kernel[(n_tiles, n)](
        a, a.stride(0), a.stride(1), w, w.stride(0), w.stride(1),
        bufs.data_ptrs, bufs.ctrl_ptrs, bufs.epoch, m, bufs.slot_elems, bufs.max_tiles, fault_rank,
        N=bufs.hidden, K=k, BN=BLOCK_N, BK=BLOCK_K, BM=bm, WORLD=n, WORLD_P2=max(2, triton.next_power_of_2(n)),
        SCOPE=bufs.scope, FAULT=int(fault_kind), UPCAST=interpreting(), USE_PDL=pdl, num_warps=NUM_WARPS,
        **({"launch_pdl": True} if pdl else {}))
    return n_tiles


def reduce_residual_norm(bufs: ReduceBuffers, residual: torch.Tensor, out: torch.Tensor, *, stage: int,
                         abort_floor: int, deadline_ns: int, spin_limit: int = 64,
                         norm_weight: torch.Tensor | None = None, eps: float | None = None,
                         h_out: torch.Tensor | None = None, use_deadline: bool = True, use_pdl: bool = False) -> None:
    """Wait per tile for every rank's pushed partial, sum in rank order, add the residual, normalise.

    Parameters:
        bufs         the group's buffers (same epoch as the `partial_gemv_push` launched before)
        residual     [N, M, H] bf16: each rank's copy of the residual stream x
        out          [N, M, H] bf16: x' = bf16(x + ordered_sum(partials)); must not alias residual
                     (an aborted step leaves the residual untouched)
        stage        stage id written into the abort word (names via the group's stage_names)
        abort_floor  epoch of the layer's first collective: an abort word of that epoch or later
                     makes every program stop before waiting (inputs of an aborted stage are garbage)
        deadline_ns  deadline of each wait (ns, GPU); spin_limit: the interpreter's, in spins
        norm_weight  [H] bf16 with eps > 0 and h_out [N, M, H] bf16: also h = rms_norm(x', norm_weight)
                     with the reference's rounding order; all three None: no norm
        use_pdl      launch as the previous (push) kernel's programmatic dependent: waits only on the
                     per-tile flags, so it overlaps a `partial_gemv_push(use_pdl=True)` launched just
                     before; it then completes only after that push grid completed (module docstring).
                     Ignored where `pdl_enabled` is False. Any earlier kernel it reads from (residual,
                     norm weight) must come before the push launch, never between push and reduce.
    Mutates out (and h_out) on ranks whose waits succeeded; aborts are left in the control blocks
    for the host to read (`EmulatedGroup.status`). Raises StepContractError for bad tensors,
    UnsupportedConfigError for a stage outside 0..MAX_STAGE.
    """
    require_runnable("residual", residual); require_runnable("out", out)
    n, hdim = bufs.world, bufs.hidden
    dev = bufs.data_ptrs.device
    if residual.dim() != 3:
        raise StepContractError(f"residual must be [N, M, H], got {list(residual.shape)}")
    m = residual.shape[1]
    if not 1 <= m <= bufs.max_rows:
        raise StepContractError(f"rows M={m} must be in 1..max_rows={bufs.max_rows}")
    check_stage(stage)
    _check("residual", residual, (n, m, hdim), dev)
    _check("out", out, (n, m, hdim), dev)
    if out.data_ptr() == residual.data_ptr():
        raise StepContractError("out must not alias residual (an aborted step must leave x untouched)")
    norm = norm_weight is not None
    if norm != (h_out is not None) or norm != (eps is not None):
        raise StepContractError("norm_weight, eps and h_out go together (all or none)")
    if norm:
        _check("norm_weight", norm_weight, (hdim,), dev)
        _check("h_out", h_out, (n, m, hdim), dev)
        if not eps > 0:
            raise StepContractError(f"eps={eps} must be > 0")
    h = h_out if norm else out
    interp = interpreting()
    pdl = pdl_enabled(bufs, use_pdl)
    _reduce_residual_norm_kernel[(triton.cdiv(m, REDUCE_ROWS), n)](
        residual, residual.stride(0), residual.stride(1), out, out.stride(0), out.stride(1),
        h, h.stride(0), h.stride(1), norm_weight if norm else residual,
        bufs.data_ptrs, bufs.ctrl_ptrs, bufs.epoch, abort_floor, m, bufs.slot_elems, bufs.max_tiles, stage,
        deadline_ns, spin_limit, float(eps) if norm else 0.0,
        N=hdim, N_TILES=triton.cdiv(hdim, BLOCK_N), BN=BLOCK_N, BM=REDUCE_ROWS, WORLD=n,
        WORLD_P2=max(2, triton.next_power_of_2(n)), POLL=32 * REDUCE_WARPS, SCOPE=bufs.scope, USE_ASM=not interp,
        USE_DEADLINE=use_deadline, ABORT_EVERY=8, NORM=norm, USE_PDL=pdl, num_warps=REDUCE_WARPS,
        **({"launch_pdl": True} if pdl else {}))


def sm90_compile_specs(hidden: int, k: int, world: int, rows: int, *, fault: FaultKind = FaultKind.NONE,
                       norm: bool = True, pdl: bool = False) -> dict[str, dict]:
    """Arguments for `tests/unit/compile_sm90.py` (kernel name -> spec) compiling both kernels for
    sm_90 exactly as the launchers configure them for (H, K, N, M), serial (pdl False) or overlapped."""
    p2 = max(2, triton.next_power_of_2(world))
    i64 = "*i64"
    push = {"constexprs": dict(N=hidden, K=k, BN=BLOCK_N, BK=BLOCK_K, BM=max(16, triton.next_power_of_2(rows)),
                               WORLD=world, WORLD_P2=p2, SCOPE="gpu", FAULT=int(fault), UPCAST=False,
                               USE_PDL=pdl),
            "pointers": {"a_ptr": "*bf16", "w_ptr": "*bf16", "data_ptrs": i64, "ctrl_ptrs": i64, "epoch_ptr": i64},
            "num_warps": NUM_WARPS}
    red = {"constexprs": dict(N=hidden, N_TILES=triton.cdiv(hidden, BLOCK_N), BN=BLOCK_N, BM=REDUCE_ROWS, WORLD=world,
                              WORLD_P2=p2, POLL=32 * REDUCE_WARPS, SCOPE="gpu", USE_ASM=True, USE_DEADLINE=True,
                              ABORT_EVERY=8, NORM=norm, USE_PDL=pdl),
           "pointers": {"res_ptr": "*bf16", "out_ptr": "*bf16", "h_ptr": "*bf16", "nw_ptr": "*bf16",
                        "data_ptrs": i64, "ctrl_ptrs": i64, "epoch_ptr": i64},
           "scalars": {"deadline_ns": "i64", "eps": "fp32", "abort_floor": "i64"}, "num_warps": REDUCE_WARPS}
    return {"_partial_gemv_push_kernel": push, "_reduce_residual_norm_kernel": red}
