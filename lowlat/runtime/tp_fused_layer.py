"""A tensor-parallel fused decoder layer over emulated ranks (`lowlat.comm.EmulatedGroup`).

Computes what `lowlat.reference.tp.tp_decoder_layer` specifies (and, within the numerics policy,
what the TP-1 `lowlat.reference.layer.decoder_layer` computes), on N ranks whose buffers live on one
device, every rank ending with bitwise the same output:

    per rank r (launched per rank: no cross-rank waits)
        q_r    = attn_prologue(x, Wqkv_r)       RMSNorm, QKV of r's heads, RoPE, KV write (r's cache)
        attn_r = decode_attention(q_r)          over r's KV heads
    one launch over all ranks                   (lowlat/kernels/tp_layer.py)
        push   bf16(attn_r Wo_r^T) tiles to every rank, tagged flags           collective 1
    one launch over all ranks (PDL dependent of the push when `overlap`)
        x1, h  = per tile: wait, rank-ordered sum, + x; then RMSNorm(mlp_norm)
    per rank r
        act_r  = gate_up_act(h, Wgu_r)          SiLU(gate) * up of r's FFN slice
    one launch over all ranks
        push   bf16(act_r Wd_r^T) tiles, tagged flags                          collective 2
    one launch over all ranks (PDL dependent of the push when `overlap`)
        x2     = per tile: wait, rank-ordered sum, + x1

Each collective is one epoch of the group (double-buffered slots and flags by parity), bumped on the
device (`add_`) before its push. With `overlap` (default on Hopper, compiled Triton) each reduce is
launched with programmatic dependent launch: its programs spin on the per-tile flags while the push
GEMV still runs, so within a rank the reduction overlaps the GEMV (why this cannot deadlock, and why
every other input is visible: lowlat/kernels/tp_layer.py). Every per-rank kernel, and the epoch
bump, is a normal launch, so it starts after the reduce (and, through the reduce's final
`gdc_wait`, the push) completed. Without `overlap` (and always under the CPU interpreter) the reduce
starts after the whole push grid finished. Both modes compute bitwise the same outputs.

After the layer the host reads every rank's abort word and raises `CollectiveTimeout` on a fault;
the next call is correct without a reset (its epoch's tags ignore what the aborted step left).

Rank r's KV cache holds its KV heads only: [S, Hkv/N, D] (`shard_kv_cache`), as each GPU's pool
would. Dense (SwiGLU) layers only.
"""

from __future__ import annotations

import torch

from lowlat.comm.deadline import MAX_EPOCH, error_from_word
from lowlat.comm.emulated import EmulatedGroup
from lowlat.comm.fault import Fault
from lowlat.config import ModelConfig
from lowlat.errors import CollectiveTimeout, StepContractError, UnsupportedConfigError
from lowlat.kernels.attn_prologue import attn_prologue, make_prologue_workspace, pack_qkv, pack_qkv_bias, rope_table
from lowlat.kernels.decode_attention import decode_attention, make_decode_workspace
from lowlat.kernels.mlp import gate_up_act, pack_gate_up
from lowlat.kernels._gemv import pdl_available
from lowlat.kernels.tp_layer import SUPPORTED_FAULTS, partial_gemv_push, reduce_residual_norm
from lowlat.reference.tp import shard_layer
from lowlat.step import MAX_ROWS, StepBatch
from lowlat.weights import LayerWeights

#: stage ids written into abort words
STAGE_OUT_PROJ, STAGE_DOWN_PROJ = 1, 2
STAGE_NAMES = {STAGE_OUT_PROJ: "out_proj all-reduce", STAGE_DOWN_PROJ: "down_proj all-reduce"}


def shard_kv_cache(cache: torch.Tensor, world: int) -> list[torch.Tensor]:
    """Full cache [S, Hkv, D] -> per-rank contiguous copies [S, Hkv/world, D] (rank r: heads of r)."""
    if cache.dim() != 3 or cache.shape[1] % world:
        raise UnsupportedConfigError("tp_size", world, f"must divide the cache's KV heads ({list(cache.shape)})")
    per = cache.shape[1] // world
    return [cache[:, r * per:(r + 1) * per].contiguous() for r in range(world)]


def gather_kv_cache(shards: list[torch.Tensor]) -> torch.Tensor:
    """Inverse of `shard_kv_cache`: [S, Hkv, D]."""
    return torch.cat(shards, dim=1)


class TPFusedLayer:
    """One dense decoder layer sharded over the ranks of an `EmulatedGroup`.

    Parameters:
        cfg       model config (dense; world must divide num_kv_heads and intermediate_size)
        lw        the layer's full (TP-1) weights, any device / float dtype (copied as bf16 shards)
        world     N ranks (ignored when `group` is given: its world is used)
        device    where the group and weights live (CUDA, or CPU under the Triton interpreter)
        group     an existing `EmulatedGroup(world, cfg.hidden_size, dtype=bf16)`; default: a new one
        deadline  seconds (test deadline) or `Deadline` for a new group; fault: its injected fault
        max_rows  largest M (<= 48)
        overlap   launch each reduce as the push GEMV's PDL dependent (reduction overlaps the GEMV
                  within a rank); default (None): on where PDL is available (sm_90+, compiled Triton).
                  True where PDL is unavailable (CPU interpreter, older GPUs) falls back to the serial
                  order. `self.overlap` holds the effective mode and may be reassigned between calls
                  (a CUDA graph keeps the mode it was captured with).
    Raises UnsupportedConfigError (MoE, world not dividing heads / FFN width), StepContractError.
    Memory: weights once (sharded), the group's buffers (see EmulatedGroup), activations [N, M, *].
    """

    def __init__(self, cfg: ModelConfig, lw: LayerWeights, world: int, *, device: torch.device | str,
                 group: EmulatedGroup | None = None, deadline=None, fault: Fault | None = None,
                 max_rows: int = MAX_ROWS, spin_limit: int = 64, overlap: bool | None = None) -> None:
        if cfg.is_moe or lw.router is not None:
            raise UnsupportedConfigError("num_experts", cfg.num_experts, "the TP fused layer is dense-only")
        if not 1 <= max_rows <= MAX_ROWS:
            raise StepContractError(f"max_rows={max_rows} must be in 1..{MAX_ROWS}")
        self.device = torch.device(device)
        self._pdl_ok = pdl_available(self.device)
        self.overlap = overlap
        if group is None:
            group = EmulatedGroup(world, cfg.hidden_size, max_rows=max_rows, dtype=torch.bfloat16,
                                  device=self.device, deadline=deadline, fault=fault, spin_limit=spin_limit,
                                  stage_names=STAGE_NAMES)
        if group.hidden != cfg.hidden_size or group.dtype != torch.bfloat16 or group.max_rows < max_rows:
            raise UnsupportedConfigError("group", (group.hidden, group.dtype, group.max_rows),
                                         f"needs hidden {cfg.hidden_size}, bf16, max_rows >= {max_rows}")
        if group.fault.kind not in SUPPORTED_FAULTS:
            raise UnsupportedConfigError("fault", group.fault.kind.name,
                                         f"the TP layer injects {[f.name for f in SUPPORTED_FAULTS]}")
        self.cfg, self.group, self.world, self.max_rows = cfg, group, group.world, max_rows
        self.group.stage_names = {**group.stage_names, **STAGE_NAMES}
        n = self.world
        dev, bf = self.device, torch.bfloat16

        def put(t):
            return None if t is None else t.to(device=dev, dtype=bf).contiguous()

        shards = [s.map(put) for s in shard_layer(cfg, lw, n)]
        self.attn_norm, self.mlp_norm = put(lw.attn_norm), put(lw.mlp_norm)
        self.qkv = [pack_qkv(s) for s in shards]
        self.qkv_bias = [pack_qkv_bias(s) for s in shards]
        self.q_norm, self.k_norm = put(lw.q_norm), put(lw.k_norm)
        self.wo = torch.stack([s.wo for s in shards]).contiguous()            # [N, H, Hq/N*D]
        self.gate_up = [pack_gate_up(s.w_gate, s.w_up) for s in shards]      # [2I/N, H] each
        self.w_down = torch.stack([s.w_down for s in shards]).contiguous()    # [N, H, I/N]
        self.heads_local = cfg.num_heads // n
        self.kv_local = cfg.num_kv_heads // n
        self.ffn_local = cfg.intermediate_size // n
        self.rope = rope_table(cfg, min(cfg.max_position_embeddings, 1 << 17), dev)
        self.pro_ws = [make_prologue_workspace(q, cfg.head_dim) for q in self.qkv]
        self.dec_ws = [make_decode_workspace(max_rows, self.heads_local, self.kv_local, cfg.head_dim, dev)
                       for _ in range(n)]
        h, d = cfg.hidden_size, cfg.head_dim
        z = dict(dtype=bf, device=dev)
        self._q = torch.zeros(n, max_rows, self.heads_local, d, **z)
        self._attn = torch.zeros(n, max_rows, self.heads_local, d, **z)
        self._act = torch.zeros(n, max_rows, self.ffn_local, **z)
        self._x1 = torch.zeros(n, max_rows, h, **z)
        self._h = torch.zeros(n, max_rows, h, **z)

    @property
    def overlap(self) -> bool:
        """Effective mode: True = each reduce is the push GEMV's PDL dependent (overlapped)."""
        return self._overlap

    @overlap.setter
    def overlap(self, value: bool | None) -> None:
        self._overlap = self._pdl_ok if value is None else (bool(value) and self._pdl_ok)

    def forward(self, x: torch.Tensor, step: StepBatch, k_caches: list[torch.Tensor], v_caches: list[torch.Tensor],
                *, out: torch.Tensor | None = None, check: bool = True, use_deadline: bool = True) -> torch.Tensor:
        """One layer on every rank.

        Parameters:
            x         [M, H] bf16 (the same rows on every rank) or [N, M, H] (rank r's copy at [r])
            step      the step (lowlat.step.StepBatch) on this device; M = step.num_rows
            k_caches, v_caches  per rank [S, Hkv/N, D] bf16 (`shard_kv_cache`)
            out       optional [N, M, H] bf16 output (must not alias x)
            check     read the abort words after the layer and raise (a device sync)
        Returns out [N, M, H] bf16: rank r's layer output at [r] (identical on every rank).
        Mutates: each rank's KV cache at the valid rows' out_cache_loc; the group's buffers / epoch.
        Raises StepContractError (shapes; before any launch), CollectiveTimeout (a rank did not
        arrive within the deadline: `.per_rank` lists every rank's error; `out` then is not valid,
        x and KV entries of earlier steps are untouched).
        """
        cfg, n, g = self.cfg, self.world, self.group
        m, hdim = step.num_rows, cfg.hidden_size
        if not 1 <= m <= self.max_rows:
            raise StepContractError(f"step has M={m} rows; this layer was built for 1..{self.max_rows}")
        if x.dim() == 2:
            x = x.unsqueeze(0).expand(n, -1, -1)
        if tuple(x.shape) != (n, m, hdim) or x.dtype != torch.bfloat16 or x.device != self.device:
            raise StepContractError(f"x must be [{m}, {hdim}] or [{n}, {m}, {hdim}] bf16 on {self.device}, "
                                    f"got {list(x.shape)} {x.dtype} on {x.device}")
        if len(k_caches) != n or len(v_caches) != n:
            raise StepContractError(f"need one K and one V cache per rank ({n}), got {len(k_caches)}, {len(v_caches)}")
        top = int(step.positions[: step.num_valid_rows].max()) if step.num_valid_rows else 0
        if top >= self.rope.shape[0]:
            raise StepContractError(f"position {top} beyond the RoPE table ({self.rope.shape[0]} positions)")
        out = torch.empty(n, m, hdim, dtype=torch.bfloat16, device=self.device) if out is None else out
        if tuple(out.shape) != (n, m, hdim) or out.dtype != torch.bfloat16:
            raise StepContractError(f"out must be [{n}, {m}, {hdim}] bf16, got {list(out.shape)} {out.dtype}")
        if out.data_ptr() == x.data_ptr():
            raise StepContractError("out must not alias x")
        if g.epoch + 2 > MAX_EPOCH:
            raise UnsupportedConfigError("epoch", g.epoch + 2, "exhausted: reset the group on every rank")
        first = self.launch(x, step, k_caches, v_caches, out, use_deadline=use_deadline)
        if check:
            self.check(first)
        return out

    def launch(self, x: torch.Tensor, step: StepBatch, k_caches: list[torch.Tensor], v_caches: list[torch.Tensor],
               out: torch.Tensor, *, use_deadline: bool = True) -> int:
        """The layer's launches only: no validation, no host sync, no status read (capturable in a
        CUDA graph). x [M, H] or [N, M, H], out [N, M, H]: as `forward` checks
        them. Returns the epoch of the layer's first collective (for `check`). Graph replays bump the
        device epoch only: call `group.sync_epoch()` before `group`'s own checks; the abort floor
        and the injected fault are those of the capture, so after a replay that aborted, call
        `group.reset()` before the next replay (otherwise the old abort word stops every later replay,
        and every `check` raises it again: loud, not silent, but no step completes)."""
        cfg, n = self.cfg, self.world
        m = step.num_rows
        nv = step.num_valid_rows
        if x.dim() == 2:
            x = x.unsqueeze(0).expand(n, -1, -1)
        for r in range(n):
            q = attn_prologue(x[r], self.qkv[r], self.qkv_bias[r], self.attn_norm, self.q_norm, self.k_norm,
                              step.positions, step.out_cache_loc, nv, k_caches[r], v_caches[r], self.rope, cfg=cfg,
                              out_q=self._q[r, :m], workspace=self.pro_ws[r])
            decode_attention(q, k_caches[r], v_caches[r], step.page_table, step.req_indices, step.positions, nv,
                             out=self._attn[r, :m], workspace=self.dec_ws[r])
        x1, h = self._x1[:, :m], self._h[:, :m]
        first = self._collective(self._attn[:, :m].reshape(n, m, -1), self.wo, x, x1, STAGE_OUT_PROJ, None,
                                 use_deadline, norm=True, h_out=h)
        for r in range(n):
            gate_up_act(h[r], self.gate_up[r], out=self._act[r, :m])
        self._collective(self._act[:, :m], self.w_down, x1, out, STAGE_DOWN_PROJ, first, use_deadline)
        return first

    def _collective(self, a, w, residual, out, stage, floor, use_deadline, *, norm=False, h_out=None) -> int:
        g = self.group
        epoch = g.epoch + 1
        kind = g.fault.kind_at(epoch)
        g.epoch = epoch
        g.bufs.epoch.add_(1)
        floor = epoch if floor is None else floor
        # push then reduce, always in this order (the interpreter runs programs one after another);
        # with overlap the reduce is the push's PDL dependent. Its residual (x, or x1 of this layer's
        # first reduce) and norm weight come from kernels before the push: see kernels/tp_layer.py.
        pdl = self._overlap
        partial_gemv_push(g.bufs, a, w, fault_kind=kind, fault_rank=g.fault.rank, use_pdl=pdl)
        reduce_residual_norm(g.bufs, residual, out, stage=stage, abort_floor=floor, deadline_ns=g.deadline.ns,
                             spin_limit=g.spin_limit, norm_weight=self.mlp_norm if norm else None,
                             eps=self.cfg.rms_eps if norm else None, h_out=h_out, use_deadline=use_deadline,
                             use_pdl=pdl)
        return epoch

    def status(self, first_epoch: int) -> list[CollectiveTimeout | None]:
        """Per rank: the `CollectiveTimeout` it raises for the layer whose first collective had epoch
        `first_epoch`, or None (reads the abort words: a device sync)."""
        words = self.group.ctrl[:, 0].tolist()
        return [error_from_word(r, w, first_epoch, self.group.deadline.seconds, self.group.stage_names)
                for r, w in enumerate(words)]

    def check(self, first_epoch: int) -> None:
        """Raise the lowest rank's `CollectiveTimeout` (with `.per_rank`) if the layer was aborted."""
        errs = self.status(first_epoch)
        err = next((e for e in errs if e is not None), None)
        if err is not None:
            err.per_rank = errs
            raise err

