"""Push + rank-ordered all-reduce: Triton device functions and a standalone all-reduce kernel.

Matches `lowlat.reference.tp.ordered_sum`: every rank ends with

    y = round_to_dtype( (((float32(p_0) + float32(p_1)) + float32(p_2)) + ... + float32(p_{N-1})) )

bitwise identical on every rank whatever order the partials arrive in (the sum order is fixed by
rank, not by arrival).

Protocol (per collective call = one *epoch*, per tile of columns):
1. push: rank r stores its partial tile into slot [parity][r] of EVERY rank's receive buffer
   (itself included), then, after a block barrier, publishes into every rank's flag
   [parity][r][tile] the tag `epoch << 32 | rows << 20 | tile` (`flag_tag`; rows = the call's M)
   with a release store (never a bare 0/1, so a flag left by an earlier step can never satisfy a
   later wait);
2. wait: each block polls its own rank's N flags with acquire loads, one flag address per thread
   (no atomic read-modify-write in the spin loop), until all carry this epoch's tag. A flag of this
   epoch and tile with OTHER rows fails the step (state CONTRACT): the ranks' calls disagree on M
   (rows 0: the peer refused its call on the host and published only its flags, `publish_refusal`);
   the block goes on waiting for every peer's flag of the step (any rows, abort words ignored, to
   the deadline: no rank leaves a step before every peer pushed it), writes a contract abort word
   (deadline.CONTRACT_STAGE_BIT) and does not sum; every rank raises `StepContractError`, so no
   rank sums rows a peer never pushed;
3. sum: the slots are read and summed in rank order 0..N-1 in fp32, rounded once to the dtype.
`parity = epoch % 2` double-buffers slots and flags: a rank may start step k+1 while a peer still
reads step k, but it cannot reach step k+2 before every peer has pushed (so finished reading) k+1.

Deadline and abort: every wait reads `%globaltimer` (from the waiter's first miss) against the
deadline given at build (lowlat/comm/deadline.py). On expiry the block writes the abort word
(epoch, stage, its rank, the missing peer) into every rank's control block with a release
compare-and-swap (the step's first cause is kept); blocks that see an abort word of this or a later
epoch stop waiting; a block that did not complete never
writes its output tile. The host reads the abort words after the step and raises
`CollectiveTimeout` (`StepContractError` for a contract word) on every rank. The decisions
(arrived / timed out / aborted / contract) are block-uniform:
they are reductions over the per-thread polls, so no thread of a block proceeds while another
aborts.

Optional confirm round (`confirm=True`, for separate processes): after its sum, a block publishes a
done flag (tag | 1 << 19) to every rank and waits for every rank's done flag of its tile, so a rank
whose own waits all succeeded still raises when a peer timed out (without it, such a rank could
finish before the peer's abort word arrives). One emulated launch does not need it: the host reads
the status after every rank's blocks have finished.

Under the Triton CPU interpreter (no inline asm, programs run one after another) the loads are
volatile loads, the deadline counts spin iterations (`spin_limit`) instead of ns, and the launcher
runs push, sum and confirm as separate launches so no program waits for one not yet run.

Control block of each rank (int64): [abort word, failed epoch, 14 pad | flags [2][N][T] | done [2][N][T]]
(failed epoch: the last step in which one of the rank's own programs did not complete).
Receive buffer of each rank: [2 parity][N src][max_rows][H] in the partials' dtype.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import triton
import triton.language as tl

from lowlat.comm.deadline import CONTRACT_STAGE_BIT, MAX_RANKS, check_stage, is_stage
from lowlat.comm.fault import FaultKind
from lowlat.errors import StepContractError, UnsupportedConfigError
from lowlat.kernels._attn_common import interpreting, require_runnable
from lowlat.kernels._gemv import same_view

CTRL_HEADER = 16
#: int64 word 1 of a control block: the last epoch in which one of the rank's own programs did not complete
FAILED_WORD = 1
#: flag tag = epoch << EPOCH_SHIFT | rows << ROWS_SHIFT | done << 19 | tile (`make_tag` / `flag_tag`)
EPOCH_SHIFT = 32
ROWS_SHIFT = 20
CONFIRM_TAG_BIT = 1 << 19
MAX_TILES = 1 << 19
#: largest M a call can carry in its flags' tags (12 bits)
MAX_TAG_ROWS = (1 << (EPOCH_SHIFT - ROWS_SHIFT)) - 1
MIN_BLOCK_H = 128
MAX_BLOCK_H = 2048
#: elements one block handles per row chunk (8 warps: 16 per thread)
CHUNK_ELEMS = 4096
#: steps of at most this many rows use short chunks (decode); longer ones the tallest
SMALL_ROWS = 8
NUM_WARPS = 8
#: block states (CONTRACT: a peer's flag of this step carried other rows, `wait_flags`)
ARRIVED, TIMED_OUT, ABORTED, INACTIVE, CONTRACT = 0, 1, 2, 3, 4
# launch phases (bit mask)
PUSH, SUM, CONFIRM_PUBLISH, CONFIRM_WAIT = 1, 2, 4, 8
SUPPORTED_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
assert CONTRACT_STAGE_BIT == 1 << 14, "abort_peers spells the contract bit as a literal"


def ctrl_len(world: int, max_tiles: int) -> int:
    """int64 elements of one rank's control block."""
    return CTRL_HEADER + 4 * world * max_tiles


def flag_index(parity: int, src: int, tile: int, world: int, max_tiles: int, *, done: bool = False) -> int:
    """Index of flag [parity][src][tile] (or done flag) inside a control block."""
    return CTRL_HEADER + (2 * world * max_tiles if done else 0) + (parity * world + src) * max_tiles + tile


def make_tag(epoch: int, tile: int, rows: int, *, done: bool = False) -> int:
    """Flag tag of (epoch, tile) of a call of `rows` rows (0: a refused call), or its done flag."""
    return epoch << EPOCH_SHIFT | rows << ROWS_SHIFT | (CONFIRM_TAG_BIT if done else 0) | tile


def tag_rows(tag: int, epoch: int) -> int | None:
    """The rows a flag carries if it is a tag of `epoch`, else None (not published for that step)."""
    return (tag >> ROWS_SHIFT) & MAX_TAG_ROWS if tag >> EPOCH_SHIFT == epoch else None


def rows_by_rank(ctrl: torch.Tensor, epoch: int, world: int, max_tiles: int) -> dict[int, int | None]:
    """Each rank's rows for step `epoch` as its tile-0 flag in control block `ctrl` (int64 [ctrl_len],
    any device: one copy to the host) carries them (`tag_rows`: 0 refused, None not arrived)."""
    idx = [flag_index(epoch % 2, src, 0, world, max_tiles) for src in range(world)]
    return {src: tag_rows(int(v), epoch) for src, v in enumerate(ctrl[idx].tolist())}


# ----------------------------------------------------------------------------------------------
# device functions


@triton.jit
def _ld_acquire(ptrs, SCOPE: tl.constexpr, USE_ASM: tl.constexpr):
    """Acquire load of int64 values, one address per element (the thread that holds it polls it)."""
    if USE_ASM:
        if SCOPE == "sys":
            v = tl.inline_asm_elementwise("ld.acquire.sys.global.b64 $0, [$1];", "=l,l", [ptrs],
                                          dtype=tl.int64, is_pure=False, pack=1)
        else:
            v = tl.inline_asm_elementwise("ld.acquire.gpu.global.b64 $0, [$1];", "=l,l", [ptrs],
                                          dtype=tl.int64, is_pure=False, pack=1)
    else:
        v = tl.load(ptrs, volatile=True)
    return v


@triton.jit
def flag_tag(epoch, rows, tile):
    """The tag `epoch << 32 | rows << 20 | tile` (int64) a call of `rows` rows publishes for `tile`
    (epoch: a loaded int64 scalar; rows / tile: scalars or ints, promoted through it)."""
    e = epoch.to(tl.int64)
    zero = e * 0
    return (e << 32) | ((zero + rows) << 20) | (zero + tile)


@triton.jit
def _flag_misses(v, tag, src, WORLD: tl.constexpr):
    """Of the flags v (src = the rank each was published by): (lowest src whose flag is not `tag`, lowest
    src whose flag is `tag` but for its rows field (the same step and tile from a call of other rows),
    lowest src whose flag is not of the step and tile at all, whatever its rows); WORLD where none."""
    diff = v ^ tag
    missing = tl.min(tl.where(diff != 0, src, WORLD), axis=0)
    other = missing                     # all arrived (the common case): one reduction, not three
    absent = missing
    if missing < WORLD:
        same_step = ((diff >> 32) == 0) & ((diff & 0xFFFFF) == 0)   # epoch, done bit and tile
        other = tl.min(tl.where((diff != 0) & same_step, src, WORLD), axis=0)
        absent = tl.min(tl.where(same_step, WORLD, src), axis=0)
    return missing, other, absent


@triton.jit
def _globaltimer(lanes):
    """%globaltimer (ns), read by every thread; the block-wide max is uniform across the block."""
    t = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [lanes], dtype=tl.int64,
                                  is_pure=False, pack=1)
    return tl.max(t, axis=0)


@triton.jit
def round_to(x, DT: tl.constexpr):
    """fp32 -> DT with round-to-nearest-even. bf16 is rounded with integer ops (bitwise equal to
    `torch.Tensor.to(torch.bfloat16)`; the CPU interpreter's own cast truncates)."""
    if DT == tl.bfloat16:
        b = x.to(tl.uint32, bitcast=True)
        r = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
        r = tl.where(x != x, 0x7FC0, r)
        y = r.to(tl.uint16).to(tl.bfloat16, bitcast=True)
    else:
        y = x.to(DT)
    return y


@triton.jit
def push_to_peers(x, offs, mask, data_ptrs, rank, parity, slot_elems,
                  WORLD: tl.constexpr, DT: tl.constexpr):
    """Store tile `x` (values already of the buffer dtype DT) into slot [parity][rank] of every
    rank's receive buffer at element offsets `offs` (row * H + col inside a slot).

    data_ptrs: int64 [WORLD] base address of each rank's receive buffer [2][WORLD][max_rows][H].
    Call `publish` once every chunk of the tile is stored."""
    slot = (parity * WORLD + rank) * slot_elems
    for p in tl.static_range(WORLD):
        dst = tl.load(data_ptrs + p).to(tl.pointer_type(DT))
        tl.store(dst + slot + offs, x, mask=mask)


@triton.jit
def publish(ctrl_ptrs, rank, tile, tag, parity, max_tiles, enabled, DONE: tl.constexpr,
            WORLD: tl.constexpr, WORLD_P2: tl.constexpr, SCOPE: tl.constexpr):
    """After a block barrier, release-store `tag` into flag [parity][rank][tile] (DONE: the done
    flag) of every rank's control block. `enabled` (scalar bool) masks the whole publication."""
    tl.debug_barrier()
    peers = tl.arange(0, WORLD_P2)
    valid = peers < WORLD
    cp = tl.load(ctrl_ptrs + peers, mask=valid, other=0).to(tl.pointer_type(tl.int64))
    region = 2 * WORLD * max_tiles if DONE else 0
    fl = cp + 16 + region + (parity * WORLD + rank) * max_tiles + tile
    tl.atomic_xchg(fl, tag + 0 * peers.to(tl.int64), mask=valid & enabled, sem="release", scope=SCOPE)


@triton.jit
def wait_flags(flag_base, tag, stride_src, abort_ptr, epoch, state, deadline_at, deadline_ns, spin_limit,
               WORLD: tl.constexpr, POLL: tl.constexpr, SCOPE: tl.constexpr, USE_ASM: tl.constexpr,
               USE_DEADLINE: tl.constexpr, ABORT_EVERY: tl.constexpr, REFUSAL: tl.constexpr = False):
    """Spin until flags flag_base[src * stride_src], src = 0..WORLD-1, all equal `tag` (`flag_tag`).

    Each of the block's POLL threads (POLL = 32 * num_warps) polls one address (src = thread %
    WORLD) with acquire loads; decisions are block-wide reductions, so uniform. The deadline starts
    at the first miss (`deadline_at` 0 = not started; it carries over between waits of a block);
    with USE_ASM it is `deadline_ns` of `%globaltimer`, else `spin_limit` spins (interpreter).
    Every ABORT_EVERY spins the rank's abort word is read: a word of this or a later epoch ends the
    wait.
    A flag of the same step and tile with another rows field makes the state CONTRACT 4 (the ranks'
    calls disagree on M, or the peer refused its call: rows 0); the wait then goes on, abort words
    no longer read, until every peer's flag of the step has arrived (any rows) or the deadline: a
    peer pushes a step only after it finished reading the step before, so no rank can leave a step
    and overwrite (two steps later, same parity) slots a slow peer still reads (the k+2 guard of the
    module docstring holds for aborted-by-contract steps as for completed ones).
    REFUSAL (a call refused on its host, `publish_refusal`): that second wait from the start.
    Returns (state, deadline_at, missing): state ARRIVED 0 / TIMED_OUT 1 / ABORTED 2 / CONTRACT 4 (a
    state already non-zero on entry is kept and nothing is waited for); missing = lowest src not
    arrived (WORLD when all arrived), for CONTRACT the lowest src whose flag carried other rows."""
    lanes = tl.arange(0, POLL)
    src = lanes % WORLD
    ptrs = flag_base + src * stride_src
    fresh = state == 0
    v = _ld_acquire(ptrs, SCOPE, USE_ASM)
    missing, other, absent = _flag_misses(v, tag, src, WORLD)
    if REFUSAL:
        missing = absent
    else:
        state = tl.where((other < WORLD) & (state == 0), 4, state)
        missing = tl.where(state == 4, absent, missing)
    contract = other
    # 1: nothing more to wait for in CONTRACT (its flags' deadline passed, or the state was CONTRACT on entry: a
    # later wait of the same block, e.g. the confirm round's, waits for nothing, as for any non-zero state)
    late = tl.where(fresh, 0, 1)
    spins = 0
    while (missing < WORLD) & ((state == 0) | ((state == 4) & (late == 0))):
        spins += 1
        if USE_DEADLINE:
            if USE_ASM:
                now = _globaltimer(lanes)
                deadline_at = tl.where(deadline_at == 0, now + deadline_ns, deadline_at)
                expired = now > deadline_at
            else:
                expired = spins > spin_limit
            late = tl.where(expired & (state == 4), 1, late)
            state = tl.where(expired & (state == 0), 1, state)
        if not REFUSAL:
            if spins % ABORT_EVERY == 0:
                a = tl.max(_ld_acquire(abort_ptr + 0 * lanes, SCOPE, USE_ASM), axis=0)
                state = tl.where(((a >> 32) >= epoch) & (state == 0), 2, state)
        v = _ld_acquire(ptrs, SCOPE, USE_ASM)
        missing, other, absent = _flag_misses(v, tag, src, WORLD)
        if REFUSAL:
            missing = absent
        else:
            contract = tl.where(state == 4, contract, other)
            state = tl.where((other < WORLD) & (state == 0), 4, state)
            missing = tl.where(state == 4, absent, missing)
    # a flag that arrived while the deadline expired wins
    state = tl.where((missing >= WORLD) & (state == 1), 0, state)
    missing = tl.where(state == 4, contract, missing)
    return state, deadline_at, missing


@triton.jit
def abort_peers(ctrl_ptrs, epoch, stage, rank, missing, state, WORLD: tl.constexpr,
                WORLD_P2: tl.constexpr, SCOPE: tl.constexpr):
    """After `wait_flags` returned `state`: when it is TIMED_OUT 1 or CONTRACT 4, write the abort word
    (epoch, stage (| CONTRACT_STAGE_BIT for 4), rank, missing) into every rank's control block, unless
    that block already holds a word of this or a later epoch (the first cause is kept). One compare-and-swap per
    rank, not a spin."""
    if (state == 1) | (state == 4):
        peers = tl.arange(0, WORLD_P2) % WORLD
        cp = tl.load(ctrl_ptrs + peers).to(tl.pointer_type(tl.int64))
        zero = epoch * 0            # promotes int arguments (tensors or literals) to int64
        cause = tl.where(state == 4, 1 << 14, 0)   # CONTRACT_STAGE_BIT
        word = (epoch << 32) | ((zero + (stage | cause)) << 16) | ((zero + rank) << 8) | (zero + missing)
        old = tl.load(cp, volatile=True)
        new = tl.where((old >> 32) < epoch, word, old)
        tl.atomic_cas(cp, old, new, sem="release", scope=SCOPE)


@triton.jit
def ordered_sum_tile(my_data, offs, mask, parity, slot_elems, WORLD: tl.constexpr, DT: tl.constexpr):
    """fp32 sum of slots [parity][0..WORLD-1] at `offs`, in rank order (call after `wait_flags`
    returned ARRIVED and a block barrier). my_data: this rank's receive buffer (pointer to DT)."""
    base = my_data + parity * WORLD * slot_elems + offs
    acc = tl.load(base, mask=mask, other=0.0, cache_modifier=".cg").to(tl.float32)
    for s in tl.static_range(1, WORLD):
        acc += tl.load(base + s * slot_elems, mask=mask, other=0.0, cache_modifier=".cg").to(tl.float32)
    return acc


@triton.jit
def _push_chunk(c, inp_ptr, inp_off, stride_im, cols, cmask, M, H, active, data_ptrs, rank, parity, slot_elems,
                CHUNK: tl.constexpr, WORLD: tl.constexpr, DT: tl.constexpr):
    rows = c * CHUNK + tl.arange(0, CHUNK)
    mask = (rows[:, None] < M) & cmask[None, :] & active
    x = tl.load(inp_ptr + inp_off + rows[:, None] * stride_im + cols[None, :], mask=mask)
    push_to_peers(x, rows[:, None] * H + cols[None, :], mask, data_ptrs, rank, parity, slot_elems, WORLD, DT)


@triton.jit
def _sum_chunk(c, out_ptr, out_off, stride_om, cols, cmask, M, H, ok, my_data, parity, slot_elems,
               CHUNK: tl.constexpr, WORLD: tl.constexpr, DT: tl.constexpr):
    rows = c * CHUNK + tl.arange(0, CHUNK)
    mask = (rows[:, None] < M) & cmask[None, :]
    acc = ordered_sum_tile(my_data, rows[:, None] * H + cols[None, :], mask, parity, slot_elems, WORLD, DT)
    tl.store(out_ptr + out_off + rows[:, None] * stride_om + cols[None, :], round_to(acc, DT), mask=mask & ok)


# rank_base / stage / fault_rank are not specialized: every rank of a group (and every stage) runs the same
# compiled kernel, so ranks that share a process (tests, ranks_on_one_device) do not each load their own variant
# while a peer's launch spins (see `_launch`'s load_only)
@triton.jit(do_not_specialize=["rank_base", "stage", "fault_rank"])
def _ordered_all_reduce_kernel(
        inp_ptr, out_ptr, stride_ir, stride_im, stride_or, stride_om,
        data_ptrs, ctrl_ptrs, epoch_ptr, delay_ptr,
        M, H, slot_elems, max_tiles, rank_base, stage, deadline_ns, spin_limit, fault_rank,
        WORLD: tl.constexpr, WORLD_P2: tl.constexpr, POLL: tl.constexpr, CHUNK: tl.constexpr,
        N_CHUNKS: tl.constexpr, RUNTIME_ROWS: tl.constexpr, BLOCK_H: tl.constexpr, PHASES: tl.constexpr,
        SCOPE: tl.constexpr, USE_ASM: tl.constexpr, USE_DEADLINE: tl.constexpr, HAS_DELAY: tl.constexpr,
        FAULT: tl.constexpr, ABORT_EVERY: tl.constexpr, REFUSAL: tl.constexpr):
    """One program = one (tile of BLOCK_H columns x all M rows, rank) pair; program_id(1) selects the
    rank rank_base + program_id(1) and its partial inp[program_id(1)] (stride_ir 0 for one rank).
    REFUSAL (M = 0, `publish_refusal`): push no data, publish rows-0 flags, wait for every peer's flag
    of the step (any rows; `wait_flags`), no sum, no confirm round.
    A program that does not complete its sum (or confirm round) records the epoch in its rank's
    control block word 1 (`FAILED_WORD`, atomic max), so the host can tell its own step's outcome
    from an abort of a later step (`PeerRank.status`).
    Rows are handled CHUNK at a time: a runtime loop on the GPU (RUNTIME_ROWS, so one compiled kernel
    serves every M), N_CHUNKS unrolled chunks under the interpreter (which cannot loop to a runtime
    bound)."""
    DT: tl.constexpr = inp_ptr.dtype.element_ty
    tile = tl.program_id(0)
    local = tl.program_id(1)
    rank = rank_base + local
    epoch = tl.load(epoch_ptr)
    parity = epoch % 2
    cols = tile * BLOCK_H + tl.arange(0, BLOCK_H)
    cmask = cols < H
    my_data = tl.load(data_ptrs + rank).to(tl.pointer_type(DT))
    my_ctrl = tl.load(ctrl_ptrs + rank).to(tl.pointer_type(tl.int64))
    abort_ptr = my_ctrl
    tag = flag_tag(epoch, M, tile)
    active = rank >= 0
    if FAULT == 1:      # never arrives
        active = rank != fault_rank
    if FAULT == 3:      # exits mid-step: only its first half of tiles runs
        active = (rank != fault_rank) | (tile < tl.num_programs(0) // 2)
    state = tl.where(active, 0, 3)
    deadline_at = tl.zeros([], dtype=tl.int64)

    if PHASES & 1:
        if HAS_DELAY:
            # injected late arrival: spin delay[rank] ns; stop early once the step is aborted (the
            # whole emulated group is one launch, which cannot return before this block does)
            # (block-wide reductions keep the loop's exit uniform across the block's threads)
            lanes = tl.arange(0, POLL)
            wait_ns = tl.load(delay_ptr + rank)
            t0 = _globaltimer(lanes)
            t = t0
            gone = t0 < 0
            while (t - t0 < wait_ns) & (gone == 0):
                t = _globaltimer(lanes)
                gone = (tl.max(_ld_acquire(abort_ptr + 0 * lanes, SCOPE, USE_ASM), axis=0) >> 32) >= epoch
            state = tl.where(gone & (state == 0), 2, state)
        pub_tag = tag
        if FAULT == 4:  # publishes the previous epoch's tag
            pub_tag = tl.where(rank == fault_rank, flag_tag(epoch - 1, M, tile), tag)
        if RUNTIME_ROWS:
            for c in range(0, tl.cdiv(M, CHUNK)):
                _push_chunk(c, inp_ptr, local * stride_ir, stride_im, cols, cmask, M, H, state == 0, data_ptrs, rank,
                            parity, slot_elems, CHUNK, WORLD, DT)
        else:
            for c in tl.static_range(N_CHUNKS):
                _push_chunk(c, inp_ptr, local * stride_ir, stride_im, cols, cmask, M, H, state == 0, data_ptrs, rank,
                            parity, slot_elems, CHUNK, WORLD, DT)
        publish(ctrl_ptrs, rank, tile, pub_tag, parity, max_tiles, state == 0, False, WORLD, WORLD_P2, SCOPE)

    if PHASES & 2:
        flag_base = my_ctrl + 16 + parity * WORLD * max_tiles + tile
        state, deadline_at, missing = wait_flags(
            flag_base, tag, max_tiles, abort_ptr, epoch, state, deadline_at, deadline_ns, spin_limit,
            WORLD, POLL, SCOPE, USE_ASM, USE_DEADLINE, ABORT_EVERY, REFUSAL)
        abort_peers(ctrl_ptrs, epoch, stage, rank, missing, state, WORLD, WORLD_P2, SCOPE)
        tl.debug_barrier()
        if RUNTIME_ROWS:
            for c in range(0, tl.cdiv(M, CHUNK)):
                _sum_chunk(c, out_ptr, local * stride_or, stride_om, cols, cmask, M, H, state == 0, my_data,
                           parity, slot_elems, CHUNK, WORLD, DT)
        else:
            for c in tl.static_range(N_CHUNKS):
                _sum_chunk(c, out_ptr, local * stride_or, stride_om, cols, cmask, M, H, state == 0, my_data,
                           parity, slot_elems, CHUNK, WORLD, DT)
        if PHASES & 4:
            publish(ctrl_ptrs, rank, tile, tag | (1 << 19), parity, max_tiles, state == 0, True,
                    WORLD, WORLD_P2, SCOPE)

    if PHASES & 8:
        if (PHASES & 2) == 0:
            # interpreter: a separate launch; blocks that did not complete the sum stay out of it
            a = tl.load(abort_ptr, volatile=True)
            state = tl.where(((a >> 32) >= epoch) & (state == 0), 2, state)
        done_base = my_ctrl + 16 + 2 * WORLD * max_tiles + parity * WORLD * max_tiles + tile
        state, deadline_at, missing = wait_flags(
            done_base, tag | (1 << 19), max_tiles, abort_ptr, epoch, state, deadline_at, deadline_ns,
            spin_limit, WORLD, POLL, SCOPE, USE_ASM, USE_DEADLINE, ABORT_EVERY)
        abort_peers(ctrl_ptrs, epoch, stage | (1 << 15), rank, missing, state, WORLD, WORLD_P2, SCOPE)

    if PHASES & 10:
        if state != 0:              # this program's step did not complete (timed out, aborted, inactive, contract)
            tl.atomic_max(my_ctrl + 1, epoch, sem="relaxed", scope=SCOPE)


# ----------------------------------------------------------------------------------------------
# host side


@dataclass(frozen=True)
class TilePlan:
    """How a [M, H] all-reduce is cut: n_tiles tiles of block_h columns, each handled in n_chunks
    (unrolled) chunks of `chunk` rows."""

    block_h: int
    chunk: int
    n_chunks: int
    n_tiles: int


def plan_tiles(rows: int, hidden: int, tiles_cap: int) -> TilePlan:
    """Columns per tile: the smallest power of two in [MIN_BLOCK_H, MAX_BLOCK_H] giving at most
    `tiles_cap` tiles (so every block of the launch can be resident at once). Rows per chunk: at most
    CHUNK_ELEMS elements a chunk, and only two chunk heights (<= SMALL_ROWS rows, or the largest) so
    that few kernel variants are compiled."""
    block_h = MIN_BLOCK_H
    while block_h < MAX_BLOCK_H and triton.cdiv(hidden, block_h) > tiles_cap:
        block_h *= 2
    cap = CHUNK_ELEMS // block_h
    chunk = min(cap, SMALL_ROWS) if rows <= SMALL_ROWS else cap
    return TilePlan(block_h, chunk, triton.cdiv(rows, chunk), triton.cdiv(hidden, block_h))


def max_tiles_for(hidden: int) -> int:
    return triton.cdiv(hidden, MIN_BLOCK_H)


@dataclass
class ReduceBuffers:
    """The receive buffers and control blocks of a group, as the kernel addresses them.

    data_ptrs / ctrl_ptrs: int64 [world] on the launch device, base address of each rank's receive
    buffer [2][world][max_rows][hidden] (dtype) and control block (int64 [ctrl_len]).
    epoch: int64 [1] device counter the kernel reads (bumped on the device before each launch, so a
    CUDA graph replays correctly).
    spans (computed at construction: one copy of the pointer tables to the host): [(start, end)] byte
    addresses of every rank's receive buffer and control block, which no call's partial or output may
    overlap (`check_call`).
    """

    world: int
    max_rows: int
    hidden: int
    dtype: torch.dtype
    data_ptrs: torch.Tensor
    ctrl_ptrs: torch.Tensor
    epoch: torch.Tensor
    delays: torch.Tensor
    max_tiles: int
    scope: str
    spans: list = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        data_bytes = 2 * self.world * self.slot_elems * torch.empty((), dtype=self.dtype).element_size()
        ctrl_bytes = ctrl_len(self.world, self.max_tiles) * 8
        self.spans = ([(p, p + data_bytes) for p in self.data_ptrs.tolist()]
                      + [(p, p + ctrl_bytes) for p in self.ctrl_ptrs.tolist()])

    @property
    def slot_elems(self) -> int:
        return self.max_rows * self.hidden


def check_group_shape(world: int, max_rows: int, hidden: int, dtype: torch.dtype) -> None:
    if not 1 <= world <= MAX_RANKS:
        raise UnsupportedConfigError("world", world, f"must be in 1..{MAX_RANKS}")
    if not 1 <= max_rows <= MAX_TAG_ROWS:
        raise UnsupportedConfigError("max_rows", max_rows, f"must be in 1..{MAX_TAG_ROWS} (the rows field of a "
                                     "flag's tag)")
    if hidden < 1 or max_tiles_for(hidden) > MAX_TILES:
        raise UnsupportedConfigError("hidden", hidden, f"must be in 1..{MAX_TILES * MIN_BLOCK_H}")
    if dtype not in SUPPORTED_DTYPES:
        raise UnsupportedConfigError("dtype", dtype, f"must be one of {SUPPORTED_DTYPES}")


def check_partials(bufs: ReduceBuffers, inp: torch.Tensor, out: torch.Tensor, ranks: int) -> int:
    """Validate inp / out [ranks, M, H] against the group; returns M. Raises StepContractError."""
    for name, t in (("partials", inp), ("out", out)):
        if t.dim() != 3 or t.shape[0] != ranks or t.shape[2] != bufs.hidden:
            raise StepContractError(f"{name} must be [{ranks}, M, {bufs.hidden}], got {tuple(t.shape)}")
        if t.dtype != bufs.dtype:
            raise StepContractError(f"{name} dtype {t.dtype} != group dtype {bufs.dtype}")
        if t.layout != torch.strided:
            raise StepContractError(f"{name} must be a strided (dense) tensor, got {t.layout}")
        if t.stride(2) != 1:
            raise StepContractError(f"{name} must be contiguous in the hidden dim, strides {t.stride()}")
        if t.device != bufs.data_ptrs.device:
            raise StepContractError(f"{name} is on {t.device}, the group on {bufs.data_ptrs.device}")
    m = inp.shape[1]
    if out.shape != inp.shape:
        raise StepContractError(f"out {tuple(out.shape)} != partials {tuple(inp.shape)}")
    if not 1 <= m <= bufs.max_rows:
        raise StepContractError(f"rows M={m} must be in 1..max_rows={bufs.max_rows}")
    return m


def _row_spans(t: torch.Tensor) -> torch.Tensor:
    """[rows, 2] int64 byte addresses [start, end) of each row of t (a strided tensor whose last dim is
    contiguous: one row per index of its leading dims), on the CPU (from shape and strides: no device read)."""
    start = torch.zeros((), dtype=torch.int64)
    for n, st in zip(t.shape[:-1], t.stride()[:-1]):
        start = start.unsqueeze(-1) + torch.arange(n, dtype=torch.int64) * st
    start = start.reshape(-1) * t.element_size() + t.data_ptr()
    return torch.stack([start, start + t.shape[-1] * t.element_size()], 1)


def _byte_range(t: torch.Tensor) -> tuple[int, int]:
    """[first, last + 1) byte addresses of a strided tensor (strides included)."""
    last = sum((n - 1) * st for n, st in zip(t.shape, t.stride())) if t.numel() else -1
    return t.data_ptr(), t.data_ptr() + (last + 1) * t.element_size()


def _meets(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def _spans_overlap(a: torch.Tensor, b: torch.Tensor, *, same: bool = False) -> bool:
    """Whether a byte span of a ([n, 2] [start, end)) meets one of b; same (b is a): whether two of a's spans
    meet. Exact for rows (unlike a whole-tensor span test, interleaved layouts that share no byte pass)."""
    if a.numel() == 0 or b.numel() == 0 or a[:, 0].min() >= b[:, 1].max() or b[:, 0].min() >= a[:, 1].max():
        return False
    bs = b[torch.argsort(b[:, 0])]
    ends = torch.cummax(bs[:, 1], 0).values
    if same:                                   # each span against the ones sorted before it
        return bool((bs[1:, 0] < ends[:-1]).any())
    before = torch.searchsorted(bs[:, 0].contiguous(), a[:, 1].contiguous())      # spans of b starting before a's end
    return bool(((before > 0) & (ends[(before - 1).clamp(min=0)] > a[:, 0])).any())


def check_call(bufs: ReduceBuffers, inp: torch.Tensor, out: torch.Tensor, ranks: int, stage: int) -> int:
    """Every check `launch_all_reduce` makes before launching; returns M. Raises StepContractError
    (tensors: `check_partials`; CPU tensors without the interpreter) or UnsupportedConfigError (stage
    outside 0..MAX_STAGE)."""
    for name, t in (("inp", inp), ("out", out)):
        if not isinstance(t, torch.Tensor):
            raise StepContractError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        require_runnable(name, t)
    m = check_partials(bufs, inp, out, ranks)
    # a program writes its tile of out after pushing its tile of inp: out may be inp itself, no other overlap.
    # Whole-tensor byte ranges first (a few integer compares); the exact row spans only where those meet
    ro, ri = _byte_range(out), _byte_range(inp)
    if not out.is_contiguous() and _spans_overlap(_row_spans(out), _row_spans(out), same=True):
        raise StepContractError(f"out's rows overlap (strides {out.stride()}): every rank's and row's output needs "
                                "memory of its own")
    if _meets(ro, ri) and not same_view(out, inp) and _spans_overlap(_row_spans(out), _row_spans(inp)):
        raise StepContractError("out overlaps inp without being the same view of it: a tile's output would "
                                "overwrite input a later tile still pushes (out may be inp itself)")
    for name, t, rng in (("inp", inp, ri), ("out", out, ro)):
        if any(_meets(rng, g) for g in bufs.spans) and _spans_overlap(_row_spans(t), torch.tensor(bufs.spans)):
            raise StepContractError(f"{name} overlaps the group's receive buffers or control blocks: the peers' "
                                    "pushes and flags would overwrite it")
    check_stage(stage)
    return m


def _launch(bufs: ReduceBuffers, inp: torch.Tensor, out: torch.Tensor, m: int, *, rank_base: int, ranks: int,
            stage: int, deadline_ns: int, spin_limit: int, fault_rank: int, plan: TilePlan, runs: list,
            load_only: bool = False, **flags) -> None:
    """The all-reduce kernel over grid (plan.n_tiles, ranks), once a PHASES of `runs`; flags: the
    constexprs that differ between a call and a refusal (USE_DEADLINE, HAS_DELAY, FAULT, ABORT_EVERY,
    REFUSAL). load_only (GPU): compile the variant and load it into the CUDA context, launching
    nothing. Loading a module waits for the context's running kernels (CUDA_MODULE_LOADING LAZY and
    EAGER alike): a call that first loads its variant while another rank's launch spins in the same
    process waits for that launch, i.e. until its deadline (session 34, bench/explore/lazy_load_deadlock.py)."""
    interp = interpreting()
    if load_only and interp:
        return                  # nothing is loaded under the interpreter
    args = (inp, out, inp.stride(0) if ranks > 1 else 0, inp.stride(1), out.stride(0) if ranks > 1 else 0,
            out.stride(1), bufs.data_ptrs, bufs.ctrl_ptrs, bufs.epoch, bufs.delays, m, bufs.hidden,
            bufs.slot_elems, bufs.max_tiles, rank_base, stage, deadline_ns, spin_limit, fault_rank)
    for ph in runs:
        kw = dict(WORLD=bufs.world, WORLD_P2=max(2, triton.next_power_of_2(bufs.world)), POLL=32 * NUM_WARPS,
                  CHUNK=plan.chunk, N_CHUNKS=plan.n_chunks if interp else 0, RUNTIME_ROWS=not interp,
                  BLOCK_H=plan.block_h, PHASES=ph, SCOPE=bufs.scope, USE_ASM=not interp, num_warps=NUM_WARPS,
                  **flags)
        if load_only:
            compiled = _ordered_all_reduce_kernel.warmup(*args, grid=(plan.n_tiles, ranks), **kw)
            compiled = compiled.result() if hasattr(compiled, "result") else compiled
            compiled._init_handles()    # cuModuleLoadData + cuModuleGetFunction (triton 3.6 is pinned)
        else:
            _ordered_all_reduce_kernel[(plan.n_tiles, ranks)](*args, **kw)


def launch_all_reduce(bufs: ReduceBuffers, inp: torch.Tensor, out: torch.Tensor, *, rank_base: int,
                      ranks: int, stage: int, deadline_ns: int, fault_kind: FaultKind, fault_rank: int,
                      tiles_cap: int, confirm: bool, use_deadline: bool = True, has_delay: bool = False,
                      spin_limit: int = 64, abort_every: int = 8, phases: int | None = None,
                      load_only: bool = False) -> TilePlan:
    """Launch the ordered all-reduce for `ranks` ranks rank_base.. of the group (inp / out
    [ranks, M, H]). The caller has bumped `bufs.epoch`. Under the CPU interpreter the phases run as
    separate launches. phases: one launch of exactly these (PUSH | SUM | CONFIRM_*; the confirm bits
    dropped without `confirm`), for tests interleaving separate ranks' launches under the interpreter or
    running a GPU-style single launch there; None: the whole call. load_only: compile and load this
    call's kernel variant without launching it (`_launch`; a no-op under the interpreter). Returns the
    tile plan used."""
    m = check_call(bufs, inp, out, ranks, stage)
    interp = interpreting()
    if interp and has_delay:
        raise UnsupportedConfigError("delays", "late arrival", "needs %globaltimer: not under the CPU interpreter")
    plan = plan_tiles(m, bufs.hidden, tiles_cap)
    if phases is not None:
        runs = [phases if confirm else phases & (PUSH | SUM)]
    elif interp:
        runs = [PUSH, SUM | (CONFIRM_PUBLISH if confirm else 0)] + ([CONFIRM_WAIT] if confirm else [])
    else:
        runs = [PUSH | SUM | ((CONFIRM_PUBLISH | CONFIRM_WAIT) if confirm else 0)]
    _launch(bufs, inp, out, m, rank_base=rank_base, ranks=ranks, stage=stage, deadline_ns=deadline_ns,
            spin_limit=spin_limit, fault_rank=fault_rank, plan=plan, runs=runs, USE_DEADLINE=use_deadline,
            HAS_DELAY=has_delay, FAULT=int(fault_kind if fault_kind != FaultKind.LATE else FaultKind.NONE),
            ABORT_EVERY=abort_every, REFUSAL=False, load_only=load_only)
    return plan


def publish_refusal(bufs: ReduceBuffers, rank: int, *, stage: int, tiles_cap: int, deadline_ns: int,
                    spin_limit: int = 64, phases: int | None = None, load_only: bool = False) -> None:
    """Rank `rank`'s part of a call it refused on the host (after bumping `bufs.epoch`, as for a call it
    makes): its flags of the step, every tile, carry rows 0 and no data is pushed, so every peer's wait
    for the step turns into a contract abort (`StepContractError` on every rank, field "partial":
    `deadline.error_from_word`), ending once every peer pushed the step, instead of a timeout at the
    deadline; then it waits (in stream order, on the device) for every peer's flag of the step, any
    rows, so that its next call cannot overwrite slots a peer still reads (the k+2 guard), and writes a
    timeout abort word if one does not come within the deadline. The ranks' epochs stay aligned. The
    all-reduce kernel with M = 0 and REFUSAL on; phases as in `launch_all_reduce` (the interpreter runs
    push and wait as two launches; confirm bits are dropped). stage: the timeout word's (a value outside
    0..MAX_STAGE, the reason of a refusal, is written as 0). load_only: compile and load the refusal's
    kernel variant without launching it (`PeerRank` does at construction on a GPU)."""
    dummy = torch.empty(1, 1, bufs.hidden, dtype=bufs.dtype, device=bufs.data_ptrs.device)
    if phases is not None:
        runs = [phases & (PUSH | SUM)] if phases & (PUSH | SUM) else []
    else:
        runs = [PUSH, SUM] if interpreting() else [PUSH | SUM]
    _launch(bufs, dummy, dummy, 0, rank_base=rank, ranks=1, stage=stage if is_stage(stage) else 0,
            deadline_ns=deadline_ns, spin_limit=spin_limit, fault_rank=0, plan=plan_tiles(1, bufs.hidden, tiles_cap),
            runs=runs, USE_DEADLINE=True, HAS_DELAY=False, FAULT=0, ABORT_EVERY=8, REFUSAL=True,
            load_only=load_only)


def compile_sm90(*, dtype: str = "bf16", world: int = 4, phases: int = PUSH | SUM | CONFIRM_PUBLISH | CONFIRM_WAIT,
                 scope: str = "gpu", use_deadline: bool = True, has_delay: bool = False, fault: int = 0,
                 chunk: int = 8, block_h: int = 512, refusal: bool = False):
    """Compile the standalone kernel for sm_90 with Triton's bundled ptxas, no GPU needed (run with
    TRITON_INTERPRET unset). Returns Triton's compiled kernel (asm["ptx"], asm["cubin"]); used by the
    CPU tests to catch GPU-only failures (inline asm, atomics, layouts) that the interpreter skips."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    ce = dict(WORLD=world, WORLD_P2=max(2, triton.next_power_of_2(world)), POLL=32 * NUM_WARPS, CHUNK=chunk,
              N_CHUNKS=0, RUNTIME_ROWS=True, BLOCK_H=block_h, PHASES=phases, SCOPE=scope, USE_ASM=True,
              USE_DEADLINE=use_deadline, HAS_DELAY=has_delay, FAULT=fault, ABORT_EVERY=8, REFUSAL=refusal)
    sig = {"inp_ptr": f"*{dtype}", "out_ptr": f"*{dtype}", "deadline_ns": "i64"}
    for name in _ordered_all_reduce_kernel.arg_names:
        if name in ce:
            sig[name] = "constexpr"
        elif name.endswith("_ptrs") or name in ("epoch_ptr", "delay_ptr"):
            sig[name] = "*i64"
        else:
            sig.setdefault(name, "i32")
    src = ASTSource(fn=_ordered_all_reduce_kernel, signature=sig, constexprs=ce)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": NUM_WARPS})
