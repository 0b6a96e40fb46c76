"""An emulated group: N ranks' receive buffers and control blocks on ONE device, driven by the same
Triton kernel as real peers (lowlat/comm/ordered_reduce.py), so the protocol runs and is tested on a
single H200 (and under the CPU interpreter at tiny sizes).

Co-residency: N ranks spinning on one GPU for each other's flags need all their blocks resident at
once. All ranks' work is launched as ONE kernel grid (tiles, N) with rank = program_id(1), and the
tile plan keeps the grid at most one block per SM (tiles per rank <= SMs // N), so every block is
resident whatever the per-SM limits. Under the CPU interpreter programs run one after another, so
the launcher runs the push, the sum and the confirm round as separate launches (flags are then
already set when a program polls them); the spin loops and the deadline run there with a spin count
instead of `%globaltimer`.
"""

from __future__ import annotations

import torch

from lowlat.comm.deadline import MAX_EPOCH, Deadline, error_from_word
from lowlat.comm.fault import Fault, FaultKind
from lowlat.comm.ordered_reduce import (ReduceBuffers, TilePlan, check_call, check_group_shape, ctrl_len,
                                        interpreting, launch_all_reduce, max_tiles_for)
from lowlat.errors import CollectiveTimeout, UnsupportedConfigError

#: tiles per rank under the CPU interpreter (no SM count to size against)
INTERPRETER_TILES_CAP = 4


class EmulatedGroup:
    """`world` emulated TP ranks on one device, each with a receive buffer and a control block.

    Parameters
    ----------
    world: number of ranks N (1..255).
    hidden: H, columns of the reduced tensors.
    max_rows: largest M of a call (default 48, the step contract's max_rows).
    dtype: partials' dtype (bf16, fp16 or fp32); sums are fp32, rounded once to it.
    device: where the buffers live (default: the current CUDA device, else CPU under the interpreter).
    deadline: `Deadline` or seconds (a bare number is a test deadline, serving=False); default 60 s.
    fault: injected fault (default: LOWLAT_FAULT's, normally none).
    confirm: run the confirm round (not needed in one launch; available to test and time it).
    spin_limit: the interpreter's deadline, in spins.
    stage_names: names of stage ids for error messages.

    Memory: receive buffers world * 2 * world * max_rows * H elements, control blocks
    world * (16 + 4 * world * ceil(H / 128)) int64.
    """

    def __init__(self, world: int, hidden: int, *, max_rows: int = 48, dtype: torch.dtype = torch.bfloat16,
                 device: torch.device | str | None = None, deadline: Deadline | float | None = None,
                 fault: Fault | None = None, confirm: bool = False, spin_limit: int = 64,
                 stage_names: dict[int, str] | None = None) -> None:
        check_group_shape(world, max_rows, hidden, dtype)
        if device is None:
            device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
        device = torch.device(device)
        if device.type == "cpu" and not interpreting():
            raise UnsupportedConfigError("device", device, "a CPU group needs TRITON_INTERPRET=1")
        self.world, self.hidden, self.max_rows, self.dtype, self.device = world, hidden, max_rows, dtype, device
        self.deadline = Deadline.coerce(deadline)
        self.fault = Fault.from_env() if fault is None else fault
        self.fault.check_world(world)
        self.confirm, self.spin_limit = confirm, spin_limit
        self.stage_names = {0: "all_reduce"} if stage_names is None else stage_names
        self.max_tiles = max_tiles_for(hidden)
        # (owner rank, parity, src rank, row, col) and (owner rank, control block)
        self.data = torch.zeros(world, 2, world, max_rows, hidden, dtype=dtype, device=device)
        self.ctrl = torch.zeros(world, ctrl_len(world, self.max_tiles), dtype=torch.int64, device=device)
        i64 = dict(dtype=torch.int64, device=device)
        self.bufs = ReduceBuffers(
            world, max_rows, hidden, dtype,
            data_ptrs=torch.tensor([self.data[p].data_ptr() for p in range(world)], **i64),
            ctrl_ptrs=torch.tensor([self.ctrl[p].data_ptr() for p in range(world)], **i64),
            epoch=torch.zeros(1, **i64), delays=torch.zeros(world, **i64), max_tiles=self.max_tiles,
            scope="gpu")
        if device.type == "cuda":
            sms = torch.cuda.get_device_properties(device).multi_processor_count
            self.tiles_cap = max(1, sms // world)
        else:
            self.tiles_cap = INTERPRETER_TILES_CAP
        self.epoch = 0
        self.last_plan: TilePlan | None = None

    def all_reduce(self, partials: torch.Tensor, out: torch.Tensor | None = None, *, stage: int = 0,
                   delays_s: list[float] | None = None, fault: Fault | None = None, check: bool = True,
                   use_deadline: bool = True) -> torch.Tensor:
        """Rank-ordered all-reduce of partials [N, M, H] (rank r's partial at [r]).

        Returns out [N, M, H] (partials' dtype): out[r] = ordered_sum(partials) on every rank r.
        delays_s: per-rank delay before pushing (s; GPU only), to randomise arrival order.
        fault: overrides the group's fault for this call. check: read the status and raise.
        Raises `CollectiveTimeout` (of the lowest rank; `.per_rank` lists every rank's) when the step
        was aborted; before anything is launched or the epoch taken: `StepContractError` on bad
        tensors (`check_call`: not a tensor, shapes, dtype, device, layout, overlaps), and
        `UnsupportedConfigError` on a stage outside 0..MAX_STAGE, a delays_s of the wrong length or a
        delay under the CPU interpreter (no clock there).
        Mutates: out, the group's receive buffers, control blocks and epoch.
        """
        if out is None and isinstance(partials, torch.Tensor):
            out = torch.empty_like(partials)
        fault = self.fault if fault is None else fault
        fault.check_world(self.world)
        epoch = self.epoch + 1
        if epoch > MAX_EPOCH:
            raise UnsupportedConfigError("epoch", epoch, "exhausted: call reset() on every rank")
        kind = fault.kind_at(epoch)
        delays = [0.0] * self.world if delays_s is None else list(delays_s)
        if len(delays) != self.world:
            raise UnsupportedConfigError("delays_s", delays_s, f"needs one delay per rank ({self.world})")
        if kind == FaultKind.LATE:
            delays[fault.rank] = max(delays[fault.rank], fault.delay_s)
        has_delay = any(d > 0 for d in delays)
        if has_delay and interpreting():
            raise UnsupportedConfigError("delays_s", delays_s, "needs %globaltimer: not under the CPU interpreter")
        check_call(self.bufs, partials, out, self.world, stage)
        if has_delay:
            self.bufs.delays.copy_(torch.tensor([int(d * 1e9) for d in delays], dtype=torch.int64))
        self.epoch = epoch
        self.bufs.epoch.add_(1)
        self.last_plan = launch_all_reduce(
            self.bufs, partials, out, rank_base=0, ranks=self.world, stage=stage, deadline_ns=self.deadline.ns,
            fault_kind=kind, fault_rank=fault.rank, tiles_cap=self.tiles_cap, confirm=self.confirm,
            use_deadline=use_deadline, has_delay=has_delay, spin_limit=self.spin_limit)
        if check:
            self.check()
        return out

    def sync_epoch(self) -> int:
        """Re-read the device epoch into the host's copy (after CUDA-graph replays, which bump the
        device counter without the host seeing it); returns it."""
        self.epoch = int(self.bufs.epoch.item())
        return self.epoch

    def status(self) -> list[CollectiveTimeout | None]:
        """Per rank: the `CollectiveTimeout` that rank raises for the last step, or None (reads the
        abort words: a device sync)."""
        words = self.ctrl[:, 0].tolist()
        return [error_from_word(r, w, self.epoch, self.deadline.seconds, self.stage_names)
                for r, w in enumerate(words)]

    def check(self) -> None:
        """Raise the lowest rank's `CollectiveTimeout` when the last step was aborted; the error's
        `per_rank` attribute holds every rank's (None where a rank did not raise)."""
        errs = self.status()
        first = next((e for e in errs if e is not None), None)
        if first is not None:
            first.per_rank = errs
            raise first

    def reset(self) -> None:
        """Clear every flag and abort word (the epoch keeps counting). Not needed after an abort for
        launches made from the host (each passes its own abort floor, and the next epoch's tags ignore
        everything an earlier step left); NEEDED after an abort before replaying a captured CUDA graph
        of a layer (`TPFusedLayer.launch`): the graph keeps the abort floor of its capture, so the stale
        abort word would stop every later replay (each replay's `check` raising again)."""
        self.ctrl.zero_()
