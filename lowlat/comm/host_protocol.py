"""Host-level reference protocol: the push / tagged flag / rank-ordered sum / deadline / abort
semantics of lowlat/comm/ordered_reduce.py, run by real processes on the CPU, so CI tests the
protocol with separate processes, crashes included.

Processes form a `torch.distributed` gloo group over a TCPStore on 127.0.0.1 (loopback only); the
gloo group carries set-up and rank agreement, and the data path is a shared-memory file that every
rank maps (the stand-in for peer memory): per rank a receive buffer [2][N][max_rows][H], a control
block laid out exactly as on the GPU (flags [2][N][T] and done flags tagged
`epoch << 32 | rows << 20 | tile`, rows 0 for a refused call, abort word at 0) and, host only, a step descriptor per
[parity][src] (rows M, or REFUSED, and the caller's step id, or -1). A rank copies each tile of its
partial into slot [parity][rank] of every rank, writes its descriptor into every rank, then stores
the tag into every rank's flag; each rank polls its own flags (one at a time, backing off with short
sleeps), checks every rank's descriptor against rank 0's once all tile-0 flags are in (a mismatch
raises `StepContractError` on every rank, no wait), and sums slots in rank order 0..N-1 in fp32.
Ordering relies on x86-64's total store order (data stores land before the flag store; loads are not
reordered with loads); on weaker machines this module would need fences.

Step alignment: the epoch is a per-rank call counter, so every rank must make the same sequence of
calls. A call refused on one rank (bad partial, bad stage) still consumes its step there: it
publishes a REFUSED descriptor, so every rank raises `StepContractError` for that step and the ranks
stay aligned; before raising, the refusing rank waits (to the deadline) for every peer's flag of the
step, so its next call cannot overwrite a slot or descriptor a peer still reads. A rank that makes
an extra call (or skips one) shifts its epochs for good; pass `step_id` (the caller's own step
number, the same on every rank) to have that detected (a typed error on every rank, every later step
too); without it the results are silently wrong. Either way a misaligned group must be rebuilt.

Deadline: `time.monotonic_ns()` from a rank's first miss; on expiry the rank writes the abort word
into every rank's control block and raises `CollectiveTimeout`; a rank polling sees this epoch's
abort word and raises too. A confirm round (done flags) follows the sum, so a rank whose own waits
succeeded still raises when a peer timed out. The next call's epoch ignores everything left behind.
"""

from __future__ import annotations

import os
import tempfile
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable

import torch
import torch.distributed as dist

from lowlat.comm.deadline import (CONFIRM_STAGE_BIT, MAX_EPOCH, Deadline, check_stage, error_from_word, is_stage,
                                  pack_abort, stage_label, step_error, unpack_abort)
from lowlat.comm.fault import EXIT_CODE, Fault, FaultKind
from lowlat.comm.ordered_reduce import MAX_TAG_ROWS, ROWS_SHIFT, check_group_shape, ctrl_len, flag_index, make_tag
from lowlat.errors import CollectiveTimeout, LowlatError, UnsupportedConfigError

#: columns per tile of the host protocol
HOST_BLOCK_H = 512
#: polls before the poll loop starts sleeping, and the sleep (s)
SPIN_POLLS, POLL_SLEEP_S = 200, 50e-6
#: int64 per step descriptor ([rows, step_id]); rows REFUSED marks a call refused on that rank
DESC_LEN, REFUSED, NO_STEP_ID = 2, -1, -1
#: construction arguments every rank must agree on (checked by `from_process_group`)
AGREED_FIELDS = ("world", "hidden", "dtype", "block_h", "max_rows", "confirm")


class HostGroup:
    """One rank of the host protocol.

    rank / world: this process's rank and the group size N.
    path: the shared-memory file (created and sized by `create_file`, mapped by every rank).
    hidden, max_rows, dtype: H, largest M, partials' dtype (bf16, fp16, fp32).
    deadline: `Deadline` or seconds (a bare number: a test deadline). fault: default LOWLAT_FAULT's.
    confirm: run the confirm round (default True: separate processes need it to agree on aborts).
    """

    def __init__(self, rank: int, world: int, path: str, hidden: int, *, max_rows: int = 48,
                 dtype: torch.dtype = torch.bfloat16, deadline: Deadline | float | None = None,
                 fault: Fault | None = None, confirm: bool = True, block_h: int = HOST_BLOCK_H,
                 stage_names: dict[int, str] | None = None) -> None:
        check_group_shape(world, max_rows, hidden, dtype)
        if not 0 <= rank < world:
            raise UnsupportedConfigError("rank", rank, f"must be in 0..{world - 1}")
        self.rank, self.world, self.hidden, self.max_rows, self.dtype = rank, world, hidden, max_rows, dtype
        self.deadline = Deadline.coerce(deadline)
        self.fault = Fault.from_env() if fault is None else fault
        self.fault.check_world(world)
        self.confirm, self.block_h = confirm, block_h
        self.n_tiles = -(-hidden // block_h)
        self.stage_names = {0: "all_reduce"} if stage_names is None else stage_names
        n_data, n_ctrl, n_desc = self.layout(world, hidden, max_rows, dtype, block_h)
        raw = torch.from_file(path, shared=True, size=n_data + n_ctrl + n_desc, dtype=torch.uint8)
        exact = world * 2 * world * max_rows * hidden
        self.path = path
        self.data = raw[:n_data].view(dtype)[:exact].view(world, 2, world, max_rows, hidden)
        self.ctrl = raw[n_data:n_data + n_ctrl].view(torch.int64).view(world, -1).numpy()   # shared, no copy
        self.desc = raw[n_data + n_ctrl:].view(torch.int64).view(world, 2, world, DESC_LEN).numpy()
        self.epoch = 0

    @staticmethod
    def layout(world: int, hidden: int, max_rows: int, dtype: torch.dtype,
               block_h: int = HOST_BLOCK_H) -> tuple[int, int, int]:
        """(data bytes, control bytes, step-descriptor bytes) of the shared file."""
        elem = torch.empty((), dtype=dtype).element_size()
        n_data = world * 2 * world * max_rows * hidden * elem
        n_data = -(-n_data // 128) * 128
        return n_data, world * ctrl_len(world, -(-hidden // block_h)) * 8, world * 2 * world * DESC_LEN * 8

    @classmethod
    def create_file(cls, world: int, hidden: int, max_rows: int = 48, dtype: torch.dtype = torch.bfloat16,
                    block_h: int = HOST_BLOCK_H, directory: str | None = None) -> str:
        """Create the zero-filled shared file (in /dev/shm when present); returns its path."""
        directory = directory or ("/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir())
        fd, path = tempfile.mkstemp(prefix="lowlat_comm_", dir=directory)
        with os.fdopen(fd, "wb") as f:
            f.truncate(sum(cls.layout(world, hidden, max_rows, dtype, block_h)))
        return path

    @classmethod
    def from_process_group(cls, hidden: int, group: dist.ProcessGroup | None = None, **kw: Any) -> "HostGroup":
        """Collective over the (gloo) group: every rank's (world, hidden, dtype, block_h, max_rows,
        confirm) are gathered and compared with rank 0's; rank 0 creates the file, every rank maps
        it, every rank unlinks it once all have (nothing is left behind, even if a process dies later).

        Raises, on every rank: `UnsupportedConfigError` naming the first rank and field that differ
        from rank 0's (before anything is created); when the set-up fails on some rank (a bad
        argument, a LOWLAT_FAULT only it has, the file), that rank raises its own error and every
        other rank `UnsupportedConfigError` naming that rank, field and value. Every step is a gloo
        collective, so no rank waits for a rank that already gave up (bounded by the gloo timeout
        only when a rank dies mid-set-up). A process killed between rank 0's file creation and the
        gather leaves the file (`lowlat_comm_*` in /dev/shm) behind."""
        rank, world = dist.get_rank(group), dist.get_world_size(group)
        src0 = dist.get_global_rank(group, 0) if group else 0
        probe = dict(max_rows=kw.get("max_rows", 48), dtype=kw.get("dtype", torch.bfloat16),
                     block_h=kw.get("block_h", HOST_BLOCK_H))
        mine = dict(world=world, hidden=hidden, dtype=str(probe["dtype"]), block_h=probe["block_h"],
                    max_rows=probe["max_rows"], confirm=kw.get("confirm", True))
        every: list = [None] * world
        dist.all_gather_object(every, mine, group=group)
        for r, theirs in enumerate(every):
            for field in AGREED_FIELDS:
                if theirs[field] != every[0][field]:
                    raise UnsupportedConfigError(
                        field, theirs[field], f"rank {r} builds the HostGroup with {field}={theirs[field]!r}, "
                        f"rank 0 with {every[0][field]!r} (seen on rank {rank}); every rank must pass the same")
        box: list = [None]
        if rank == 0:
            try:
                box = [cls.create_file(world, hidden, **probe)]
            except Exception as e:  # noqa: BLE001 - every rank raises below
                box = [_setup_failure(e)]
        dist.broadcast_object_list(box, src=src0, group=group)
        if isinstance(box[0], dict):
            raise _setup_error(rank, 0, box[0])
        path, g, err = box[0], None, None
        try:
            try:
                g = cls(rank, world, path, hidden, **kw)
            except Exception as e:  # noqa: BLE001 - reported to every rank, re-raised below
                err = e
            status: list = [None] * world
            dist.all_gather_object(status, None if err is None else _setup_failure(err), group=group)
        finally:   # every rank mapped it (or set-up failed): never leave the file behind
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        if err is not None:
            raise err
        bad = next((r for r, s in enumerate(status) if s is not None), None)
        if bad is not None:
            raise _setup_error(rank, bad, status[bad])
        return g

    # ------------------------------------------------------------------------------------------
    def _flag(self, owner: int, parity: int, src: int, tile: int, done: bool = False) -> tuple[int, int]:
        return owner, flag_index(parity, src, tile, self.world, self.n_tiles, done=done)

    def _abort_all(self, epoch: int, stage: int, missing: int) -> None:
        word = pack_abort(epoch, stage, self.rank, missing)
        for p in range(self.world):
            if unpack_abort(int(self.ctrl[p, 0]))[0] < epoch:   # keep the first cause
                self.ctrl[p, 0] = word

    def _wait(self, idx: int, tag: int, epoch: int, stage: int, src: int, clock: list, *,
              read_abort: bool = True) -> None:
        """Poll own flag `idx` until it holds `tag` up to its rows field (the step descriptors, checked
        after tile 0, name a call of other rows or a refused one); deadline from the first miss (clock[0]).
        read_abort False (a refused call's wait): an abort word of this step does not end it."""
        polls = 0
        not_rows = ~(MAX_TAG_ROWS << ROWS_SHIFT)
        while (int(self.ctrl[self.rank, idx]) ^ tag) & not_rows:
            now = time.monotonic_ns()
            if clock[0] is None:
                clock[0] = now + self.deadline.ns
            err = error_from_word(self.rank, int(self.ctrl[self.rank, 0]), epoch, self.deadline.seconds,
                                  self.stage_names) if read_abort else None
            if err is not None:
                raise err
            if now > clock[0]:
                self._abort_all(epoch, stage, src)
                err = CollectiveTimeout(self.rank, epoch, stage_label(stage, self.stage_names), src,
                                        self.deadline.seconds)
                err.origin_rank = self.rank
                raise err
            polls += 1
            if polls > SPIN_POLLS:
                time.sleep(POLL_SLEEP_S)

    def _publish_refusal(self, epoch: int, step_id: int, stage: Any = 0) -> None:
        """A refused call still takes part in its step: REFUSED descriptor + every tile's flag (no
        data), so every peer raises `StepContractError` for this step at once instead of timing out
        (stage: the call's, for the abort word of a wait that misses the deadline; 0 when invalid);
        then it waits for every peer's tile-0 flag of the step (a peer pushes it only after its previous
        call returned), so this rank's next call cannot overwrite what a peer still reads (on a deadline
        miss it writes the abort word and returns: the caller raises its refusal)."""
        par, r = epoch % 2, self.rank
        for p in range(self.world):
            self.desc[p, par, r] = (REFUSED, step_id)
        for t in range(self.n_tiles):
            for p in range(self.world):
                self.ctrl[self._flag(p, par, r, t)] = make_tag(epoch, t, 0)
        clock: list = [None]
        valid_stage = stage if is_stage(stage) else 0
        try:
            for src in range(self.world):
                self._wait(self._flag(r, par, src, 0)[1], make_tag(epoch, 0, 0), epoch, valid_stage, src, clock,
                           read_abort=False)
        except CollectiveTimeout:
            pass

    def _check_descriptors(self, epoch: int, m: int, step_id: int) -> None:
        """Every rank's descriptor of this step against rank 0's (call once all tile-0 flags are in):
        every rank reads the same descriptors, so every rank raises the same error."""
        d = self.desc[self.rank, epoch % 2]
        for src in range(self.world):
            if int(d[src, 0]) == REFUSED:
                raise step_error(self.rank, epoch, "partial", REFUSED, src,
                                  f"rank {src} refused its call of this step (see its error); the step is "
                                  "aborted on every rank")
        for field, col in (("rows", 0), ("step_id", 1)):
            ref = int(d[0, col])
            for src in range(1, self.world):
                if int(d[src, col]) != ref:
                    v = int(d[src, col])
                    raise step_error(
                        self.rank, epoch, field, v, src,
                        f"rank {src} passed {field}={v}, rank 0 {field}={ref} (-1: none) to the same "
                        f"collective call; the step is aborted on every rank"
                        + ("; the ranks' call sequences differ: rebuild the group" if field == "step_id" else ""))

    def all_reduce(self, partial: torch.Tensor, *, stage: int = 0, delay_s: float = 0.0,
                   fault: Fault | None = None, step_id: int | None = None) -> torch.Tensor:
        """This rank's part of the rank-ordered all-reduce.

        partial: [M, H] (group dtype, CPU), this rank's partial; M must be the same on every rank.
        stage: id of the call in error messages (0..MAX_STAGE). delay_s: wait before pushing (to
        randomise arrival order). fault: overrides the group's fault for this call. step_id: the
        caller's step number (>= 0, the same on every rank for the same call; optional): a rank
        whose call sequence drifted (an extra or a missing call) is then detected.
        Returns [M, H] = ordered_sum(partials of ranks 0..N-1), identical on every rank.
        Raises `CollectiveTimeout` (every surviving rank) when a wait misses the deadline;
        `StepContractError` on a bad partial or stage (this rank, `UnsupportedConfigError` for the
        stage) and then on every other rank for the same step (the refused call consumes its step,
        so the ranks stay aligned), and on every rank when the ranks' M or step_id differ.
        An `exit` fault ends this process (EXIT_CODE).
        Every rank must make the same sequence of calls (see the module docstring).
        """
        self.epoch += 1          # first: a refused call consumes its step, as on every other rank
        epoch, par, r = self.epoch, self.epoch % 2, self.rank
        if epoch > MAX_EPOCH:
            raise UnsupportedConfigError("epoch", epoch, "exhausted")
        if step_id is None:
            sid = NO_STEP_ID
        elif isinstance(step_id, bool) or not isinstance(step_id, int) or not 0 <= step_id < 1 << 62:
            self._publish_refusal(epoch, NO_STEP_ID, stage)
            raise UnsupportedConfigError("step_id", step_id, f"must be an int in 0..2**62 (rank {r}, step {epoch})")
        else:
            sid = step_id
        if not is_stage(stage):
            self._publish_refusal(epoch, sid, stage)
            check_stage(stage, f" (rank {r}, step {epoch})")
        if not isinstance(partial, torch.Tensor) or partial.dim() != 2 or partial.shape[1] != self.hidden \
                or partial.dtype != self.dtype or partial.device.type != "cpu":
            self._publish_refusal(epoch, sid, stage)
            got = (f"{tuple(partial.shape)} {partial.dtype} on {partial.device}" if isinstance(partial, torch.Tensor)
                   else type(partial).__name__)
            raise step_error(r, epoch, "partial", got, r, f"partial must be [M, {self.hidden}] {self.dtype} "
                              f"on the CPU, got {got}")
        m = partial.shape[0]
        if not 1 <= m <= self.max_rows:
            self._publish_refusal(epoch, sid, stage)
            raise step_error(r, epoch, "rows", m, r, f"rows M={m} must be in 1..max_rows={self.max_rows}")
        fault = self.fault if fault is None else fault
        kind = fault.kind_at(epoch) if fault.rank == r else FaultKind.NONE
        if kind == FaultKind.LATE:
            delay_s = max(delay_s, fault.delay_s)
        if delay_s > 0:
            time.sleep(delay_s)
        tiles = [slice(t * self.block_h, min(self.hidden, (t + 1) * self.block_h)) for t in range(self.n_tiles)]
        # push
        if kind != FaultKind.NEVER:
            for t, cols in enumerate(tiles):
                if kind == FaultKind.EXIT and t >= self.n_tiles // 2:
                    os._exit(EXIT_CODE)
                for p in range(self.world):
                    self.data[p, par, r, :m, cols].copy_(partial[:, cols])
                if t == 0:      # before the first flag: a peer that sees it sees this too (TSO)
                    for p in range(self.world):
                        self.desc[p, par, r] = (m, sid)
                tag = make_tag(epoch - 1 if kind == FaultKind.WRONG_EPOCH else epoch, t, m)
                for p in range(self.world):
                    self.ctrl[self._flag(p, par, r, t)] = tag
        # wait + rank-ordered sum
        out = torch.empty_like(partial)
        clock: list = [None]
        for t, cols in enumerate(tiles):
            for src in range(self.world):
                self._wait(self._flag(r, par, src, t)[1], make_tag(epoch, t, m), epoch, stage, src, clock)
            if t == 0:
                self._check_descriptors(epoch, m, sid)
            acc = self.data[r, par, 0, :m, cols].float()
            for src in range(1, self.world):
                acc = acc + self.data[r, par, src, :m, cols].float()
            out[:, cols] = acc.to(self.dtype)
        if self.confirm:
            done = make_tag(epoch, 0, m, done=True)
            for p in range(self.world):
                self.ctrl[self._flag(p, par, r, 0, done=True)] = done
            for src in range(self.world):
                self._wait(self._flag(r, par, src, 0, done=True)[1], done, epoch, stage | CONFIRM_STAGE_BIT,
                           src, clock)
        return out


def _setup_failure(e: BaseException) -> dict:
    """A picklable summary of a set-up error (exceptions with custom __init__ do not pickle)."""
    if isinstance(e, UnsupportedConfigError):
        value = e.value if isinstance(e.value, (int, float, str, type(None))) else repr(e.value)
        return {"field": e.field, "value": value, "why": e.why, "type": type(e).__name__}
    return {"field": "setup", "value": str(e), "why": "", "type": type(e).__name__}


def _setup_error(rank: int, bad: int, f: dict) -> LowlatError:
    why = f"{f['type']} on rank {bad}" + (f": {f['why']}" if f["why"] else "")
    return UnsupportedConfigError(f["field"], f["value"], f"HostGroup set-up failed ({why}), so it failed on every "
                                  f"rank (this is rank {rank})")


# ----------------------------------------------------------------------------------------------
# running ranks as processes


@dataclass
class RankOutcome:
    """What one rank process did: exitcode (None if it had to be killed), its return value, or
    the traceback of the exception that escaped it."""

    rank: int
    exitcode: int | None
    value: Any = None
    error: str | None = None

    @property
    def hung(self) -> bool:
        return self.exitcode is None


def _child(fn: Callable, rank: int, world: int, host: str, port: int, timeout_s: float, queue, args) -> None:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    try:
        store = dist.TCPStore(host, port, world, is_master=False, timeout=timedelta(seconds=timeout_s))
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                                timeout=timedelta(seconds=timeout_s))
        value = fn(rank, world, *args)
        queue.put((rank, value, None))
    except BaseException:  # noqa: BLE001 - reported to the parent, which fails the run
        queue.put((rank, None, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_ranks(fn: Callable, world: int, *args: Any, timeout_s: float = 60.0,
              start_method: str = "spawn") -> list[RankOutcome]:
    """Run fn(rank, world, *args) in `world` processes joined in a gloo group (TCPStore on
    127.0.0.1, served by this process). Returns one `RankOutcome` per rank, in rank order. A process
    still alive after timeout_s is killed (by its handle) and reported hung: nothing outlives this
    call. fn (module level) and its return value must be picklable.

    start_method "spawn" (default): a fresh interpreter per rank. "fork" starts faster but forks a
    parent that already runs threads (torch's pools, pytest-xdist's execnet): in CI that left ranks
    deadlocked at start-up now and then, so it is for single-threaded parents only.
    """
    import multiprocessing as mp

    ctx = mp.get_context(start_method)
    store = dist.TCPStore("127.0.0.1", 0, world, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=timeout_s))
    queue = ctx.Queue()
    procs = [ctx.Process(target=_child, args=(fn, r, world, "127.0.0.1", store.port, timeout_s, queue, args),
                         daemon=True) for r in range(world)]
    for p in procs:
        p.start()
    results: dict[int, tuple] = {}
    end = time.monotonic() + timeout_s
    while len(results) < world and time.monotonic() < end:
        try:
            rank, value, err = queue.get(timeout=0.05)
            results[rank] = (value, err)
        except Exception:  # queue.Empty
            if all(not p.is_alive() for p in procs) and queue.empty():
                break
    outcomes = []
    for r, p in enumerate(procs):
        p.join(max(0.0, end - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join()
            code = None
        else:
            code = p.exitcode
        value, err = results.get(r, (None, None))
        outcomes.append(RankOutcome(r, code, value, err))
    del store
    return outcomes


def collect_timeout(err: CollectiveTimeout) -> dict:
    """A picklable summary of a CollectiveTimeout (exceptions with custom __init__ do not pickle)."""
    return {"rank": err.rank, "step": err.step, "stage": err.stage, "missing_peer": err.missing_peer,
            "deadline_s": err.deadline_s, "origin_rank": getattr(err, "origin_rank", None)}


__all__ = ["HostGroup", "run_ranks", "RankOutcome", "collect_timeout", "HOST_BLOCK_H"]
