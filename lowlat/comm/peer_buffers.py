"""Peer buffers from PyTorch symmetric memory: one process per GPU, each rank's receive buffer and
control block allocated with `torch.distributed._symmetric_memory.empty` and exchanged with
`rendezvous`, so the Triton kernel (lowlat/comm/ordered_reduce.py) stores straight into peers'
memory over NVLink peer-to-peer. NVLink multicast is never used: construction refuses unless
NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1 and NVSHMEM_DISABLE_NVLS=1 are set.

Flags and abort words live in a symmetric int64 control block (64-bit tags), not in PyTorch's
uint32 signal pads. Flags are released and acquired at system scope (`.sys`), and the confirm round
is on, so a rank whose own waits succeeded still raises when a peer timed out.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from lowlat.comm.deadline import MAX_EPOCH, Deadline, timeout_from_word
from lowlat.comm.fault import Fault, FaultKind
from lowlat.comm.ordered_reduce import (ReduceBuffers, check_group_shape, ctrl_len, launch_all_reduce,
                                        max_tiles_for)
from lowlat.errors import CollectiveTimeout, UnsupportedConfigError

#: environment that keeps NVLink multicast off (device/KINDS.md: multicast can take a host's GPUs down)
NO_MULTICAST_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def check_no_multicast() -> None:
    """Raise `UnsupportedConfigError` naming the first variable that does not keep multicast off."""
    for k, v in NO_MULTICAST_ENV.items():
        if os.environ.get(k) != v:
            raise UnsupportedConfigError(k, os.environ.get(k), f"must be {v!r}: NVLink multicast must stay off")


class PeerGroup:
    """This process's rank of a TP group whose buffers are symmetric memory on one GPU per rank.

    hidden, max_rows, dtype: H, largest M, partials' dtype. group: the NCCL (device) process group
    (default: world). deadline: `Deadline` (serving: >= 5 s) or test seconds. fault: default
    LOWLAT_FAULT's. Construction is collective over `group`.
    """

    def __init__(self, hidden: int, *, group: dist.ProcessGroup | None = None, max_rows: int = 48,
                 dtype: torch.dtype = torch.bfloat16, deadline: Deadline | float | None = None,
                 fault: Fault | None = None, confirm: bool = True,
                 stage_names: dict[int, str] | None = None) -> None:
        import torch.distributed._symmetric_memory as symm_mem

        check_no_multicast()
        self.group = group or dist.group.WORLD
        self.rank, self.world = dist.get_rank(self.group), dist.get_world_size(self.group)
        check_group_shape(self.world, max_rows, hidden, dtype)
        self.hidden, self.max_rows, self.dtype = hidden, max_rows, dtype
        self.deadline = Deadline.coerce(deadline)
        self.fault = Fault.from_env() if fault is None else fault
        self.fault.check_world(self.world)
        self.confirm = confirm
        self.stage_names = {0: "all_reduce"} if stage_names is None else stage_names
        dev = torch.device("cuda", torch.cuda.current_device())
        self.max_tiles = max_tiles_for(hidden)
        self.data = symm_mem.empty(2 * self.world * max_rows * hidden, dtype=dtype, device=dev)
        self.ctrl = symm_mem.empty(ctrl_len(self.world, self.max_tiles), dtype=torch.int64, device=dev)
        self.data.zero_()
        self.ctrl.zero_()
        h_data = symm_mem.rendezvous(self.data, self.group)
        h_ctrl = symm_mem.rendezvous(self.ctrl, self.group)
        torch.cuda.synchronize(dev)
        dist.barrier(self.group)        # every control block is zeroed before anyone publishes
        i64 = dict(dtype=torch.int64, device=dev)
        self.bufs = ReduceBuffers(
            self.world, max_rows, hidden, dtype, data_ptrs=torch.tensor(list(h_data.buffer_ptrs), **i64),
            ctrl_ptrs=torch.tensor(list(h_ctrl.buffer_ptrs), **i64), epoch=torch.zeros(1, **i64),
            delays=torch.zeros(self.world, **i64), max_tiles=self.max_tiles, scope="sys")
        self._handles = (h_data, h_ctrl)
        self.tiles_cap = torch.cuda.get_device_properties(dev).multi_processor_count
        self.epoch = 0

    def all_reduce(self, partial: torch.Tensor, out: torch.Tensor | None = None, *, stage: int = 0,
                   fault: Fault | None = None, check: bool = True) -> torch.Tensor:
        """partial [M, H] on this rank's GPU -> out [M, H] = ordered_sum over ranks (identical on
        every rank). Raises `CollectiveTimeout` when the step was aborted (check=True)."""
        out = torch.empty_like(partial) if out is None else out
        fault = self.fault if fault is None else fault
        epoch = self.epoch + 1
        if epoch > MAX_EPOCH:
            raise UnsupportedConfigError("epoch", epoch, "exhausted: rebuild the group")
        kind = fault.kind_at(epoch)
        has_delay = kind == FaultKind.LATE and fault.rank == self.rank
        if has_delay:
            self.bufs.delays[self.rank] = int(fault.delay_s * 1e9)
        self.epoch = epoch
        self.bufs.epoch.add_(1)
        launch_all_reduce(self.bufs, partial[None], out[None], rank_base=self.rank, ranks=1, stage=stage,
                          deadline_ns=self.deadline.ns, fault_kind=kind, fault_rank=fault.rank,
                          tiles_cap=self.tiles_cap, confirm=self.confirm, has_delay=has_delay)
        if check:
            self.check()
        return out

    def status(self) -> CollectiveTimeout | None:
        word = int(self.ctrl[0].item())
        return timeout_from_word(self.rank, word, self.epoch, self.deadline.seconds, self.stage_names)

    def check(self) -> None:
        err = self.status()
        if err is not None:
            raise err
