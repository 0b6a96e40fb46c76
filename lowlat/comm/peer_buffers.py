"""Peer buffers from PyTorch symmetric memory: one process per GPU, each rank's receive buffer and
control block allocated with `torch.distributed._symmetric_memory.empty` and exchanged with
`rendezvous`, so the Triton kernel (lowlat/comm/ordered_reduce.py) stores straight into peers'
memory over NVLink peer-to-peer. NVLink multicast is never used: construction refuses unless
NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1 and NVSHMEM_DISABLE_NVLS=1 are set.

Flags and abort words live in a symmetric int64 control block (64-bit tags), not in PyTorch's
uint32 signal pads. Flags are released and acquired at system scope (`.sys`), and the confirm round
is on by default (`confirm=True`), so a rank whose own waits succeeded still raises when a peer timed
out. Construction compares its arguments (hidden, max_rows, dtype, confirm, the SM count) across
ranks first, as `HostGroup.from_process_group` does (`lowlat.comm.agreement.agree`).

The ranks' calls are agreed on the device, not by an extra collective: a flag's tag carries the
call's rows M, so a peer that passed another M (or refused its call on the host: its flags carry
rows 0, `publish_refusal`) turns every rank's wait into `StepContractError` once every peer pushed
the step, instead of a rank summing rows its peer never pushed or waiting out the deadline. `PeerRank` is that per-rank
logic over any `ReduceBuffers` (`PeerGroup` gives it symmetric memory; the tests also run it over
one device's buffers, `lowlat.comm.testing.ranks_on_one_device`).
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from lowlat.comm.agreement import agree
from lowlat.comm.deadline import MAX_EPOCH, MAX_STAGE, Deadline, error_from_word, is_stage, step_error, unpack_abort
from lowlat.comm.fault import Fault, FaultKind
from lowlat.comm.ordered_reduce import (FAILED_WORD, PUSH, ReduceBuffers, check_call, check_group_shape, ctrl_len,
                                        interpreting, launch_all_reduce, max_tiles_for, publish_refusal, rows_by_rank)
from lowlat.errors import LowlatError, StepContractError, UnsupportedConfigError

#: environment that keeps NVLink multicast off (device/KINDS.md: multicast can take a host's GPUs down)
NO_MULTICAST_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def check_no_multicast() -> None:
    """Raise `UnsupportedConfigError` naming the first variable that does not keep multicast off."""
    for k, v in NO_MULTICAST_ENV.items():
        if os.environ.get(k) != v:
            raise UnsupportedConfigError(k, os.environ.get(k), f"must be {v!r}: NVLink multicast must stay off")


class PeerRank:
    """One rank's calls of the rank-ordered all-reduce over a group's buffers (the host side of
    `PeerGroup`, independent of how the buffers were allocated).

    bufs: `ReduceBuffers` with THIS rank's device epoch counter (one per rank) and the group's pointer
    tables. ctrl: this rank's control block (int64 [ctrl_len], the one `bufs.ctrl_ptrs[rank]` points
    to). rank: this rank's index. deadline: `Deadline` or test seconds. fault: injected fault.
    confirm: the confirm round (on for separate processes). tiles_cap: most tiles a call is cut into
    (every rank must pass the same). spin_limit: the interpreter's deadline in spins. stage_names:
    stage ids' names in errors.
    """

    def __init__(self, bufs: ReduceBuffers, ctrl: torch.Tensor, rank: int, *, deadline: Deadline | float | None,
                 fault: Fault, confirm: bool, tiles_cap: int, spin_limit: int = 64,
                 stage_names: dict[int, str] | None = None) -> None:
        check_group_shape(bufs.world, bufs.max_rows, bufs.hidden, bufs.dtype)
        if bufs.data_ptrs.device.type == "cpu" and not interpreting():
            raise UnsupportedConfigError("device", "cpu", "a group on the CPU needs TRITON_INTERPRET=1 (set before "
                                         "triton is imported)")
        if not 0 <= rank < bufs.world:
            raise UnsupportedConfigError("rank", rank, f"must be in 0..{bufs.world - 1}")
        want = (ctrl_len(bufs.world, bufs.max_tiles),)
        if not isinstance(ctrl, torch.Tensor) or tuple(ctrl.shape) != want or ctrl.dtype != torch.int64:
            raise UnsupportedConfigError("ctrl", getattr(ctrl, "shape", ctrl),
                                         f"must be an int64 tensor of shape {want}")
        self.bufs, self.ctrl, self.rank, self.world = bufs, ctrl, rank, bufs.world
        self.deadline = Deadline.coerce(deadline)
        self.fault = fault
        self.fault.check_world(self.world)
        for name, v in (("tiles_cap", tiles_cap), ("spin_limit", spin_limit)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:     # preload uses them (GPU) before a call does
                raise UnsupportedConfigError(name, v, "must be an int >= 1")
        self.confirm, self.tiles_cap, self.spin_limit = confirm, tiles_cap, spin_limit
        self.stage_names = {0: "all_reduce"} if stage_names is None else stage_names
        self.max_tiles = bufs.max_tiles
        self.epoch = 0
        self.preload()

    def preload(self, rows: tuple[int, ...] | list[int] = ()) -> None:
        """Compile and load into this process's CUDA context, launching nothing, the kernel variants of
        this rank's refusal and of its calls of each M in `rows` (contiguous [M, H] partial and out, this
        rank's fault), so that no later call compiles or loads one while a peer's launch spins. Ranks that
        share one process (`lowlat.comm.testing.ranks_on_one_device`) need it: loading a module waits for
        every running kernel of the context (lazy or eager module loading alike), and a spinning peer's
        launch ends only at its deadline (session 34 measured a 20 s timeout so). In a
        process of its own it takes the first refusal's compile (~1 s) out of the step. Construction
        preloads the refusal; a no-op under the CPU interpreter. Raises UnsupportedConfigError for an M
        outside 1..max_rows."""
        b = self.bufs
        if isinstance(rows, (str, bytes)) or not hasattr(rows, "__iter__"):
            raise UnsupportedConfigError("rows", rows, f"must be a sequence of ints in 1..{b.max_rows}")
        rows = tuple(rows)          # iterated twice below: a generator would preload no call variant on a GPU
        for m in rows:
            if isinstance(m, bool) or not isinstance(m, int) or not 1 <= m <= b.max_rows:
                raise UnsupportedConfigError("rows", m, f"must be an int in 1..{b.max_rows}")
        if interpreting():
            return
        with torch.cuda.device(b.data_ptrs.device):
            publish_refusal(b, self.rank, stage=0, tiles_cap=self.tiles_cap, deadline_ns=self.deadline.ns,
                            spin_limit=self.spin_limit, load_only=True)
            kinds = {FaultKind.NONE, self.fault.kind}
            for m in rows:
                part = torch.empty(1, m, b.hidden, dtype=b.dtype, device=b.data_ptrs.device)
                out = torch.empty_like(part)
                for kind in kinds:
                    launch_all_reduce(b, part, out, rank_base=self.rank, ranks=1, stage=0, deadline_ns=self.deadline.ns,
                                      fault_kind=kind, fault_rank=self.fault.rank, tiles_cap=self.tiles_cap,
                                      confirm=self.confirm, spin_limit=self.spin_limit, load_only=True,
                                      has_delay=kind == FaultKind.LATE and self.fault.rank == self.rank)

    def _refusal(self, epoch: int, partial, out, stage, has_delay: bool) -> LowlatError | None:
        """Why this rank refuses the call (the error it raises, naming rank, step and value), or None."""
        r, h = self.rank, self.bufs.hidden
        where = f" (rank {r}, step {epoch})"
        if not is_stage(stage):
            return UnsupportedConfigError("stage", stage, f"must be an int in 0..{MAX_STAGE}{where}")
        for name, t in (("partial", partial), ("out", out)):     # 2-D here, so that errors name [M, H]
            if not isinstance(t, torch.Tensor) or t.dim() != 2 or t.shape[1] != h:
                got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
                return step_error(r, epoch, name, got, r, f"{name} must be a [M, {h}] tensor, got {got}")
        if has_delay and interpreting():
            return UnsupportedConfigError("fault", "late", f"needs %globaltimer: not under the CPU interpreter{where}")
        try:        # the launcher's own checks: dtype, device, layout, M, overlaps
            check_call(self.bufs, partial[None], out[None], 1, stage)
        except StepContractError as e:
            msg = str(e)
            field = "rows" if msg.startswith("rows M=") else "out" if msg.startswith("out") else "partial"
            return step_error(r, epoch, field, partial.shape[0] if field == "rows" else None, r, msg)
        return None

    def all_reduce(self, partial: torch.Tensor, out: torch.Tensor | None = None, *, stage: int = 0,
                   fault: Fault | None = None, check: bool = True, phases: int | None = None) -> torch.Tensor:
        """partial [M, H] (group dtype, on the group's device) -> out [M, H] = ordered_sum over ranks
        (identical on every rank; out: given or new, the partial itself allowed, no other overlap).

        Every rank must make the same sequence of calls with the same M. A call refused here (bad
        partial / out: `StepContractError` "rank R, step S: ..." with field / value; stage outside
        0..MAX_STAGE or a late fault under the interpreter: `UnsupportedConfigError`) still takes its
        step: it publishes rows-0 flags and then waits on the device for its peers' flags of the step
        (`publish_refusal`), so every peer raises `StepContractError` (field "partial") for this step at
        once and the next step is aligned. Ranks passing different M raise `StepContractError` (field
        "rows", value {rank: rows}) on every rank, nothing written.
        Raises `CollectiveTimeout` when a wait missed the deadline (check=True; else read `status`).
        phases: None, the whole call. Tests under the CPU interpreter (whose programs run one after
        another) split a call across ranks: first `phases=PUSH` on each rank (takes the step, pushes),
        then the same call with `phases=SUM` (| CONFIRM_*: one launch of exactly those), which
        continues that step (a refused call too: its push, then its wait).
        Mutates: out, the group's receive buffers and control blocks, this rank's epoch counter."""
        fault = self.fault if fault is None else fault
        fault.check_world(self.world)
        epoch = self.epoch + 1 if phases is None or phases & PUSH else self.epoch
        if epoch > MAX_EPOCH:
            raise UnsupportedConfigError("epoch", epoch, "exhausted: rebuild the group")
        if epoch != self.epoch:
            self.epoch = epoch          # a refused call consumes its step too, as on every other rank
            self.bufs.epoch.add_(1)
        if out is None and isinstance(partial, torch.Tensor):
            out = torch.empty_like(partial)
        kind = fault.kind_at(epoch)
        has_delay = kind == FaultKind.LATE and fault.rank == self.rank
        err = self._refusal(epoch, partial, out, stage, has_delay)
        if err is not None:
            publish_refusal(self.bufs, self.rank, stage=stage, tiles_cap=self.tiles_cap, deadline_ns=self.deadline.ns,
                            spin_limit=self.spin_limit, phases=phases)
            raise err
        if has_delay:
            self.bufs.delays[self.rank] = int(fault.delay_s * 1e9)
        launch_all_reduce(self.bufs, partial[None], out[None], rank_base=self.rank, ranks=1, stage=stage,
                          deadline_ns=self.deadline.ns, fault_kind=kind, fault_rank=fault.rank,
                          tiles_cap=self.tiles_cap, confirm=self.confirm, has_delay=has_delay,
                          spin_limit=self.spin_limit, phases=phases)
        if check:
            self.check()
        return out

    def status(self) -> LowlatError | None:
        """The error this rank raises for its last step (`CollectiveTimeout`, or `StepContractError`
        naming each rank's rows when the calls disagreed), or None. An abort of a LATER step (a peer
        already went on) fails this step too, unless the confirm round is on and none of this rank's
        programs failed this step or since (the control block's failed-epoch word is older): only the
        confirm round guarantees that no peer could reach a later step, and push into this step's slots,
        before this rank had read them; without it a late read reports the later abort (never a silent
        wrong result). Reads the control block: a device sync."""
        word, failed = (int(v) for v in self.ctrl[:FAILED_WORD + 1].tolist())
        w_epoch = unpack_abort(word)[0]
        rows = rows_by_rank(self.ctrl, w_epoch, self.world, self.max_tiles) if w_epoch >= self.epoch > 0 else None
        return error_from_word(self.rank, word, self.epoch, self.deadline.seconds, self.stage_names, rows,
                               completed=self.confirm and failed < self.epoch)

    def check(self) -> None:
        err = self.status()
        if err is not None:
            raise err


class PeerGroup(PeerRank):
    """This process's rank of a TP group whose buffers are symmetric memory on one GPU per rank.

    hidden, max_rows, dtype: H, largest M, partials' dtype. group: the NCCL (device) process group
    (default: world). deadline: `Deadline` (serving: >= 5 s) or test seconds. fault: default
    LOWLAT_FAULT's. Construction is collective over `group`: the ranks' hidden, max_rows, dtype, confirm
    and SM counts (the tile plan) are compared first (`agree`: `RankDisagreement` on every rank). Calls:
    `PeerRank.all_reduce`.
    """

    def __init__(self, hidden: int, *, group: dist.ProcessGroup | None = None, max_rows: int = 48,
                 dtype: torch.dtype = torch.bfloat16, deadline: Deadline | float | None = None,
                 fault: Fault | None = None, confirm: bool = True,
                 stage_names: dict[int, str] | None = None) -> None:
        import torch.distributed._symmetric_memory as symm_mem

        check_no_multicast()
        self.group = group or dist.group.WORLD
        rank, world = dist.get_rank(self.group), dist.get_world_size(self.group)
        dev = torch.device("cuda", torch.cuda.current_device())
        sms = torch.cuda.get_device_properties(dev).multi_processor_count
        # ranks built with other shapes would push at other offsets and cut other tiles: refused on every rank
        agree({"hidden": hidden, "max_rows": max_rows, "dtype": str(dtype), "confirm": bool(confirm),
               "tiles_cap": sms}, self.group, name="PeerGroup's construction arguments")
        check_group_shape(world, max_rows, hidden, dtype)
        self.hidden, self.max_rows, self.dtype = hidden, max_rows, dtype
        max_tiles = max_tiles_for(hidden)
        self.data = symm_mem.empty(2 * world * max_rows * hidden, dtype=dtype, device=dev)
        ctrl = symm_mem.empty(ctrl_len(world, max_tiles), dtype=torch.int64, device=dev)
        self.data.zero_()
        ctrl.zero_()
        h_data = symm_mem.rendezvous(self.data, self.group)
        h_ctrl = symm_mem.rendezvous(ctrl, self.group)
        torch.cuda.synchronize(dev)
        dist.barrier(self.group)        # every control block is zeroed before anyone publishes
        i64 = dict(dtype=torch.int64, device=dev)
        bufs = ReduceBuffers(
            world, max_rows, hidden, dtype, data_ptrs=torch.tensor(list(h_data.buffer_ptrs), **i64),
            ctrl_ptrs=torch.tensor(list(h_ctrl.buffer_ptrs), **i64), epoch=torch.zeros(1, **i64),
            delays=torch.zeros(world, **i64), max_tiles=max_tiles, scope="sys")
        self._handles = (h_data, h_ctrl)
        super().__init__(bufs, ctrl, rank, deadline=deadline, fault=Fault.from_env() if fault is None else fault,
                         confirm=confirm, tiles_cap=sms, stage_names=stage_names)
