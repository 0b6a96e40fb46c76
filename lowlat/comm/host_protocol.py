"""Host-level reference protocol: the push / tagged flag / rank-ordered sum / deadline / abort
semantics of lowlat/comm/ordered_reduce.py, run by real processes on the CPU, so CI tests the
protocol with separate processes, crashes included.

Processes form a `torch.distributed` gloo group over a TCPStore on 127.0.0.1 (loopback only);
the gloo group carries set-up and rank agreement, and the data path is a shared-memory file that
every rank maps (the stand-in for peer memory): per rank a receive buffer [2][N][max_rows][H] and a
control block laid out exactly as on the GPU (flags [2][N][T] and done flags tagged
`epoch << 20 | tile`, abort word at 0). A rank copies each tile of its partial into slot
[parity][rank] of every rank, then stores the tag into every rank's flag; each rank polls its own
flags (one at a time, backing off with short sleeps), and sums slots in rank order 0..N-1 in fp32.
Ordering relies on x86-64's total store order (data stores land before the flag store; loads are
not reordered with loads); on weaker machines this module would need fences.

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

from lowlat.comm.deadline import (CONFIRM_STAGE_BIT, MAX_EPOCH, Deadline, pack_abort, stage_label,
                                  timeout_from_word, unpack_abort)
from lowlat.comm.fault import EXIT_CODE, Fault, FaultKind
from lowlat.comm.ordered_reduce import check_group_shape, ctrl_len, flag_index, make_tag
from lowlat.errors import CollectiveTimeout, StepContractError, UnsupportedConfigError

#: columns per tile of the host protocol
HOST_BLOCK_H = 512
#: polls before the poll loop starts sleeping, and the sleep (s)
SPIN_POLLS, POLL_SLEEP_S = 200, 50e-6


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
        n_data, n_ctrl = self.layout(world, hidden, max_rows, dtype, block_h)
        raw = torch.from_file(path, shared=True, size=n_data + n_ctrl, dtype=torch.uint8)
        exact = world * 2 * world * max_rows * hidden
        self.data = raw[:n_data].view(dtype)[:exact].view(world, 2, world, max_rows, hidden)
        self.ctrl = raw[n_data:].view(torch.int64).view(world, -1).numpy()   # shared, no copy
        self.epoch = 0

    @staticmethod
    def layout(world: int, hidden: int, max_rows: int, dtype: torch.dtype,
               block_h: int = HOST_BLOCK_H) -> tuple[int, int]:
        """(data bytes, control bytes) of the shared file."""
        elem = torch.empty((), dtype=dtype).element_size()
        n_data = world * 2 * world * max_rows * hidden * elem
        n_data = -(-n_data // 128) * 128
        return n_data, world * ctrl_len(world, -(-hidden // block_h)) * 8

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
        """Collective over the (gloo) group: rank 0 creates the file, every rank maps it, rank 0
        unlinks it once all have (nothing is left behind, even if a process dies later)."""
        rank, world = dist.get_rank(group), dist.get_world_size(group)
        probe = dict(max_rows=kw.get("max_rows", 48), dtype=kw.get("dtype", torch.bfloat16),
                     block_h=kw.get("block_h", HOST_BLOCK_H))
        box = [cls.create_file(world, hidden, **probe) if rank == 0 else None]
        dist.broadcast_object_list(box, src=dist.get_global_rank(group, 0) if group else 0, group=group)
        try:
            g = cls(rank, world, box[0], hidden, **kw)
            dist.barrier(group)
        finally:
            if rank == 0:       # also when set-up failed somewhere: never leave the file behind
                os.unlink(box[0])
        return g

    # ------------------------------------------------------------------------------------------
    def _flag(self, owner: int, parity: int, src: int, tile: int, done: bool = False) -> tuple[int, int]:
        return owner, flag_index(parity, src, tile, self.world, self.n_tiles, done=done)

    def _abort_all(self, epoch: int, stage: int, missing: int) -> None:
        word = pack_abort(epoch, stage, self.rank, missing)
        for p in range(self.world):
            if unpack_abort(int(self.ctrl[p, 0]))[0] < epoch:   # keep the first cause
                self.ctrl[p, 0] = word

    def _wait(self, idx: int, tag: int, epoch: int, stage: int, src: int, clock: list) -> None:
        """Poll own flag `idx` until it holds `tag`; deadline from the first miss (clock[0])."""
        polls = 0
        while int(self.ctrl[self.rank, idx]) != tag:
            now = time.monotonic_ns()
            if clock[0] is None:
                clock[0] = now + self.deadline.ns
            err = timeout_from_word(self.rank, int(self.ctrl[self.rank, 0]), epoch, self.deadline.seconds,
                                    self.stage_names)
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

    def all_reduce(self, partial: torch.Tensor, *, stage: int = 0, delay_s: float = 0.0,
                   fault: Fault | None = None) -> torch.Tensor:
        """This rank's part of the rank-ordered all-reduce.

        partial: [M, H] (group dtype, CPU), this rank's partial. delay_s: wait before pushing (to
        randomise arrival order). fault: overrides the group's fault for this call.
        Returns [M, H] = ordered_sum(partials of ranks 0..N-1), identical on every rank.
        Raises `CollectiveTimeout` (every surviving rank) when a wait misses the deadline;
        `StepContractError` on a bad partial. An `exit` fault ends this process (EXIT_CODE).
        """
        if partial.dim() != 2 or partial.shape[1] != self.hidden or partial.dtype != self.dtype:
            raise StepContractError(f"partial must be [M, {self.hidden}] {self.dtype}, got "
                                    f"{tuple(partial.shape)} {partial.dtype}")
        m = partial.shape[0]
        if not 1 <= m <= self.max_rows:
            raise StepContractError(f"rows M={m} must be in 1..max_rows={self.max_rows}")
        fault = self.fault if fault is None else fault
        self.epoch += 1
        epoch, par, r = self.epoch, self.epoch % 2, self.rank
        if epoch > MAX_EPOCH:
            raise UnsupportedConfigError("epoch", epoch, "exhausted")
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
                tag = make_tag(epoch - 1 if kind == FaultKind.WRONG_EPOCH else epoch, t)
                for p in range(self.world):
                    self.ctrl[self._flag(p, par, r, t)] = tag
        # wait + rank-ordered sum
        out = torch.empty_like(partial)
        clock: list = [None]
        for t, cols in enumerate(tiles):
            for src in range(self.world):
                self._wait(self._flag(r, par, src, t)[1], make_tag(epoch, t), epoch, stage, src, clock)
            acc = self.data[r, par, 0, :m, cols].float()
            for src in range(1, self.world):
                acc = acc + self.data[r, par, src, :m, cols].float()
            out[:, cols] = acc.to(self.dtype)
        if self.confirm:
            done = make_tag(epoch, 0, done=True)
            for p in range(self.world):
                self.ctrl[self._flag(p, par, r, 0, done=True)] = done
            for src in range(self.world):
                self._wait(self._flag(r, par, src, 0, done=True)[1], done, epoch, stage | CONFIRM_STAGE_BIT,
                           src, clock)
        return out


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
