"""The attention prologue with QK-norm (Qwen3) held in registers across the PDL wait, a head's programs launched as
one thread-block cluster (Gluon, sm_90, GPU only).

Matches `lowlat.reference.attn_prologue.attn_prologue` with q_norm / k_norm and no QKV bias (numerics policy of
lowlat/numerics.py):

    rstd     = 1 / sqrt(sum_k x[m, k]^2 / H + eps)                               fp32
    y        = rstd * sum_k bf16(W[row, k] g[k]) x[m, k]                          fp32 (mma.sync, bf16 operands)
    rstd_h   = 1 / sqrt(sum over head h's D rows of y^2 / D + eps)                q and k heads
    lo, hi   = y rstd_h q_norm|k_norm of the head's two RoPE partners             (v heads: y)
    q, k     = (lo cos - hi sin, hi cos + lo sin)

(RMSNorm: Zhang & Sennrich 2019; RoPE: Su et al. 2021; the per-head QK RMSNorm: Qwen3's technical report, 2025;
thread-block clusters and `barrier.cluster`: the CUDA C++ Programming Guide and PTX ISA for sm_90.)

The kernel is `attn_prologue_held._held_prologue_kernel` with QK_NORM: the held prologue's tiling (a program holds
the 16 weight rows of 8 RoPE pairs of one head over the whole H, 4 warps over 4 K slices, `fold_attn_norm`'s
weights), so a head's norm needs the sums of its D / 16 programs: those are launched as one cluster
(`launch_as_clusters`), each stores its rows' partial sum of squares (fp32, .cg) to a scratch, syncs the cluster
(`barrier.cluster`, release / acquire) and adds the head's partials in program order (every program of a head the
same bits). The weights are loaded in CHUNK_COLUMNS-column chunks of each K slice, at most WINDOW in flight a thread
(the paced stream of `attn_prologue_held(pace=True)`), and the mma runs chunk after chunk at EVERY width (the chunks'
mma gives other bits than one call over the slice, so one form at every M keeps a row's output independent of M:
row invariant); x's statistic is summed chunk by chunk; maxnreg MAXNREG (three programs an SM: Qwen3-30B-A3B's 320
programs in one wave); the next launch is released after the wait.

Measured (this form is bench/explore/explore57.py's `cluster_c16w4_late`; bench/results/session41, H200, per kernel,
PDL-chained over rotated cold copies, `bench/bench_attn_prologue.py --models Qwen3-30B-A3B`): 7.03-7.07 us at 1 row
(70.9-73.0% of copy bandwidth, three runs), 7.50 / 16.03 / 50.64 us at 6 / 16 / 48 rows, against FusedModel's split-K
prologue's 9.67-9.73 and 9.84 / 9.92 / 24.66: it wins at 1-6 rows and loses from 16 (every program reads all of x).
In Qwen3-30B-A3B's decode step (4 layers, bench/explore/explore26.py, one run each) it saves 13 / 19 us at 1 / 6
rows and costs 9.5 / 51 us at 16 / 48. Row invariance forbids choosing the prologue by width, so FusedModel runs it
only when asked (`FusedModel(cluster_prologue=True)`, or "auto": on for MoE models whose every width is at most 6
rows); its default Qwen3 prologue stays the split-K one.

The cluster launch: Triton 3.6 launches clusters only for kernels compiled with num_ctas > 1 (CGA layouts, which
Gluon's mma_v2 refuses); `launch_as_clusters` compiles the kernel as usual (`JITFunction.warmup`, no launch), sets
num_ctas in the compiled kernel's packed launch metadata to the cluster size (Triton's launcher then asks
cuLaunchKernelEx for that cluster dimension over grid x size CTAs, the PDL attribute kept; CUDA-graph capturable:
bench/explore/explore44.py, session 28) and launches; the kernel traps if its clusters are not of that size.
"""

from __future__ import annotations

import torch
import triton

from lowlat.config import ModelConfig
from lowlat.errors import StepContractError
from lowlat.kernels._attn_common import gluon_sm90_reason, pdl_supported
from lowlat.kernels.attn_prologue_held import (MAX_HIDDEN, ROW_BLOCK, SLICES, WARPS, _held_prologue_kernel,
                                               checked_inputs)

CHUNK_COLUMNS = 32      # columns of a K slice a weight chunk (explore57's c16: 16 chunks a slice at H 2048)
WINDOW = 4              # chunks in flight a thread
MAXNREG = 168           # three programs an SM
MIN_HIDDEN = 1024       # H / 4 / CHUNK_COLUMNS > WINDOW chunks a slice: a paced stream
#: the Triton versions whose launcher reads num_ctas from `CompiledKernel.packed_metadata` (num_warps, num_ctas,
#: shared memory) at every launch
CLUSTER_LAUNCH_TRITON = ("3.6.",)


def cluster_prologue_model_reason(cfg: ModelConfig) -> str | None:
    """None where `attn_prologue_cluster` takes this model's prologue, else why not: it needs QK-norm, no QKV bias, a
    head_dim of 64 or 128 (a head's D / 16 programs one cluster of at most 8, the portable size) and a hidden size H
    that is a power of two in 1024..2048."""
    if cfg.qkv_bias:
        return "QKV bias: not in this kernel"
    if not cfg.qk_norm:
        return "no QK-norm: the Llama family's held prologue is attn_prologue_held"
    if cfg.head_dim not in (64, 128):
        return f"head_dim {cfg.head_dim}: needs 64 or 128 (a head's D / 16 programs are one cluster of at most 8)"
    h = cfg.hidden_size
    if h & (h - 1) or not MIN_HIDDEN <= h <= MAX_HIDDEN:
        return f"hidden_size {h}: needs a power of two in {MIN_HIDDEN}..{MAX_HIDDEN} (weights held in registers)"
    return None


def cluster_prologue_supported(cfg: ModelConfig, device: torch.device | str) -> str | None:
    """None where `attn_prologue_cluster` runs this model's prologue on `device`, else why not (the model's reason
    first, `cluster_prologue_model_reason`; then the device's: a CUDA device of compute capability >= 9.0, not the
    Triton interpreter; then a Triton whose launcher `launch_as_clusters` knows)."""
    return cluster_prologue_model_reason(cfg) or gluon_sm90_reason(device) or _triton_reason()


def _triton_reason() -> str | None:
    if not triton.__version__.startswith(CLUSTER_LAUNCH_TRITON):
        return (f"Triton {triton.__version__} is not among {CLUSTER_LAUNCH_TRITON}, whose launcher takes the cluster "
                "size from the compiled kernel's metadata")
    return None


def launch_as_clusters(kernel, programs: int, size: int, args: tuple, kwargs: dict) -> None:
    """Launch `programs` programs of the Gluon kernel `kernel` as clusters of `size` consecutive programs (see the
    module docstring): compiled by `kernel.warmup` (nothing launched), its compiled kernel's packed metadata given
    num_ctas `size`, then launched on grid (programs / size,) (Triton's launcher: programs CTAs). Raises
    StepContractError, nothing launched, for a Triton version whose launcher is not known to take num_ctas from that
    metadata, metadata of another shape (or no compiled kernel: a cache hook, async compile mode), programs not a
    multiple of size, a kernel already compiled for other clusters, or one that needs global / profile scratch (the
    launcher sizes it for grid x 1 CTAs)."""
    why = _triton_reason()
    if why is not None:
        raise StepContractError(f"cluster launch: {why}")
    if programs % size:
        raise StepContractError(f"cluster launch: {programs} programs are not a multiple of the cluster size {size}")
    grid = (programs // size,)
    compiled = kernel.warmup(*args, grid=grid, **kwargs)
    md = getattr(compiled, "packed_metadata", None)       # None / a future: a cache hook or async compile mode
    meta = getattr(compiled, "metadata", None)
    if getattr(meta, "global_scratch_size", 0) or getattr(meta, "profile_scratch_size", 0):
        raise StepContractError("cluster launch: the kernel needs global / profile scratch, which Triton's launcher "
                                "sizes for grid x 1 CTAs, not grid x the cluster size")
    if not (isinstance(md, tuple) and len(md) == 3 and all(isinstance(v, int) for v in md)):
        raise StepContractError(f"cluster launch: the compiled kernel's packed metadata {md!r} is not (num_warps, "
                                "num_ctas, shared memory)")
    if md[1] != size:
        if md[1] != 1:
            raise StepContractError(f"cluster launch: the kernel is compiled for clusters of {md[1]}, not {size}")
        compiled.packed_metadata = (md[0], size, md[2])
    kernel[grid](*args, **kwargs)


def attn_prologue_cluster(x: torch.Tensor, qkv_weight: torch.Tensor, q_norm: torch.Tensor, k_norm: torch.Tensor,
                          positions: torch.Tensor, out_cache_loc: torch.Tensor, num_valid_rows: int | torch.Tensor,
                          k_cache: torch.Tensor, v_cache: torch.Tensor, cos_sin_table: torch.Tensor, *,
                          cfg: ModelConfig, out_q: torch.Tensor | None = None, use_pdl: bool = False,
                          check_values: bool = False) -> torch.Tensor:
    """RMSNorm -> QKV projection -> QK-norm -> RoPE -> KV write in one launch, the weights held in registers across the
    PDL wait and a head's programs one cluster (module docstring).

    Matches `lowlat.reference.attn_prologue.attn_prologue` with q_norm / k_norm (numerics policy of
    lowlat/numerics.py) for models `cluster_prologue_supported` takes (Qwen3).

    Parameters (as `attn_prologue_held.attn_prologue_held` with attn_norm None):
        x             [M, H] bf16 (M = 1..48), contiguous: the layer's input rows (pre-norm)
        qkv_weight    [N, H] bf16 contiguous, N = (Hq + 2 Hkv) D: `fold_attn_norm(pack_qkv(...), attn_norm)` (the
                      RMSNorm weight multiplied in; the kernel cannot tell an unfolded weight, which drops the norm)
        q_norm, k_norm  [D] bf16: the per-head QK-norm weights
        positions     [M] int64; out_cache_loc [M] int32; num_valid_rows int in 0..M or a 1-element int32 tensor
        k_cache, v_cache [S, Hkv, D] bf16, last dim contiguous; cos_sin_table [P, D] float32 (`rope_table`)
        cfg           head_dim (D), rms_eps (both norms' eps); head counts from the shapes (TP shards work)
        out_q         optional preallocated [M, Hq, D] bf16 output
        use_pdl       wait for the previous launch after the weight loads, release the next right after the wait;
                      before the wait the launch reads positions, out_cache_loc, a device num_valid_rows, the
                      cos / sin table and q_norm / k_norm (the previous launch must not write them)
        check_values  also check positions / out_cache_loc values (host sync; not under capture)
    Returns: q [M, Hq, D] bf16, post-QK-norm and RoPE, every row.
    Mutates: k_cache, v_cache at out_cache_loc[:num_valid_rows]; padding rows write nothing. A scratch of
        (Hq + 2 Hkv) D / 16 x ceil(M / 8) x 8 fp32 is allocated each call (stream-ordered; under graph capture
        the graph's own).
    Raises: StepContractError naming the offending tensor / value, nothing launched (out_q allocated at most): as
        `attn_prologue_held` (shapes, dtypes, devices, overlaps, values), q_norm / k_norm not [D] bf16, then a model
        or device the kernel does not take (`cluster_prologue_supported`), then `launch_as_clusters`' refusals.
    """
    for name, t in (("q_norm", q_norm), ("k_norm", k_norm)):
        if t is None:
            raise StepContractError(f"{name} is None: this prologue applies QK-norm")
    nvr_int, nvr_t, out_q, hq, hkv = checked_inputs(x, qkv_weight, {"q_norm": q_norm, "k_norm": k_norm}, positions,
                                                    out_cache_loc, num_valid_rows, k_cache, v_cache, cos_sin_table,
                                                    cfg, out_q, check_values)
    m, hidden = x.shape
    d = cfg.head_dim
    why = cluster_prologue_supported(cfg, x.device)
    if why is not None:
        raise StepContractError(f"the cluster prologue cannot run here: {why}")
    pdl = bool(use_pdl) and pdl_supported(x.device)
    nmb = (m + ROW_BLOCK - 1) // ROW_BLOCK
    programs = qkv_weight.shape[0] // 16
    hsum = torch.empty(programs * nmb * ROW_BLOCK, dtype=torch.float32, device=x.device)
    # the held launcher's arguments, written again: bench/explore's scripts edit that launcher's text by anchors
    args = (x, qkv_weight, qkv_weight, cos_sin_table, positions, out_cache_loc,
            nvr_t if nvr_t is not None else out_cache_loc, nvr_int, out_q, out_q.stride(0), out_q.stride(1),
            k_cache, k_cache.stride(0), k_cache.stride(1), v_cache, v_cache.stride(0), v_cache.stride(1),
            m, hq, hkv, cos_sin_table.shape[0], float(cfg.rms_eps))
    kwargs = dict(K=hidden, D=d, NMB=nmb, NVR_FROM_PTR=nvr_t is not None, USE_PDL=pdl, FOLD_G=False, Q=WARPS, S=SLICES,
                  RB=ROW_BLOCK, PACE=hidden // SLICES // CHUNK_COLUMNS, PACE_WIN=WINDOW, zero=0, EARLY_RELEASE=False,
                  QK_NORM=True, qnorm_ptr=q_norm, knorm_ptr=k_norm, hsum_ptr=hsum, CHUNK_STAT=True,
                  num_warps=WARPS, maxnreg=MAXNREG, launch_pdl=pdl)
    launch_as_clusters(_held_prologue_kernel, programs, d // 16, args, kwargs)
    return out_q
