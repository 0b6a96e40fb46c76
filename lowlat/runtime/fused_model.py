"""The fused decode step: every layer in five Triton launches, one CUDA graph per step width.

    x = embed[input_ids]                                           (torch index_select)
    per layer:
        q     = attn_prologue(x)      RMSNorm, fused QKV, QK-norm, RoPE, KV write   (kernels/attn_prologue; the
                                      weights held in registers across the wait where the model allows it:
                                      kernels/attn_prologue_held, `FusedModel(held_prologue=...)`)
        attn  = decode_attention(q)   split-KV flash-decoding over the page table  (kernels/decode_attention)
        x     = residual_gemv(attn)   x + attn Wo^T                                 (kernels/out_proj)
        act   = gate_up_act(x)        FFN RMSNorm in-kernel, gate/up + SiLU*mul     (kernels/mlp)
        x     = residual_gemv(act)    x + act Wd^T                                  (kernels/out_proj)
                (dense layers at 1 row with a split-K out_proj plan: out_proj stores its split partials and
                 gate/up reduces them, writing x: `residual_gemv_deferred`, `FusedModel.defers`; the down
                 projection's, at the widths where the next layer's prologue reduces few partial bytes, by that
                 prologue: `FusedModel.defers_down`)
                (MoE layers, `FusedModel(moe_out_proj=...)`: on an sm_90 GPU by default ("auto" -> "held") x =
                 residual_gemv_held(attn), the weights held in registers across the wait, writing x's sums of
                 squares in H / 16 parts, then kernels/moe.moe_forward whose router launch computes h =
                 rms_norm(x) from them for the experts; elsewhere ("norm_epilogue") out_proj writes x and h; or
                 "split_k": x = residual_gemv(attn), the router computing h from whole rows of x)
    logits, tokens = lm_head(x)        final RMSNorm, LM head, greedy argmax        (kernels/lm_head)

A self-speculation draft position (`draft_position`) runs embed + layers 0..n-1, then
    h      = rms_norm(x)              final RMSNorm                                 (kernels/rms_norm)
    sample = draft_sample(h)          LM head + temperature / top-k / top-p + draw  (kernels/draft_sampling)
as one graph per (width, n, sampler launch flags), every launch chained by PDL like the full step's.

It computes what `lowlat.reference.model.ReferenceModel.forward` computes (logits [M, V] fp32,
padding rows 0), within the numerics policy. Consecutive launches are chained with PDL on Hopper,
so each GEMV loads its weights (or prefetches them into L2) while the previous kernel finishes; the
GEMV tile plans are `lowlat.kernels._gemv.plan_gemv`'s for each (kind, N, K).

`FusedModel` satisfies the engine's Backend protocol (`forward(step, pool) -> logits`), so
`Engine(cfg, FusedModel(cfg, weights, device=...), pool)` runs. Build repacks the weights once (QKV
and gate/up fused, contiguous bf16 on the device) and preallocates every buffer for the largest
width; each width's buffers are views of those. On a GPU with `use_cuda_graphs`, the first step of a
width runs eagerly (compiling the kernels), then is captured; later steps copy their tensors into the
static inputs and replay. On the CPU (Triton interpreter) the same kernels run eagerly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple, Sequence

import torch

from lowlat.config import ModelConfig
from lowlat.errors import StepContractError, UnsupportedConfigError
from lowlat.kernels._gemv import GemvPlan, GemvWorkspace, pdl_available, plan_gemv, row_blocks
from lowlat.kernels.attn_combine import DeferredAttention
from lowlat.kernels.attn_prologue import (make_prologue_workspace, pack_qkv, pack_qkv_bias, rope_table)
from lowlat.kernels.attn_prologue_cluster import attn_prologue_cluster, cluster_prologue_supported
from lowlat.kernels.attn_prologue_held import attn_prologue_held, fold_attn_norm, held_prologue_supported
from lowlat.kernels.decode_attention import make_decode_workspace
from lowlat.kernels.draft_sampling import DraftSample, check_sampling_args, draft_sample_into, empty_draft_sample
from lowlat.kernels.lm_head import lm_head
from lowlat.kernels.mlp import gate_up_act, pack_gate_up
from lowlat.kernels.out_proj import DeferredX, out_proj, residual_gemv, residual_gemv_deferred
from lowlat.kernels.residual_gemv_held import BLOCK_N as HELD_BLOCK_N, held_residual_supported, residual_gemv_held
from lowlat.kernels.rms_norm import MAX_HIDDEN as RMS_MAX_HIDDEN
from lowlat.kernels.rms_norm import rms_norm_into
from lowlat.step import MAX_ROWS, StepBatch
from lowlat.weights import LayerWeights, ModelWeights

#: Step widths captured by default (the engine's; see lowlat/runtime/engine.py).
DEFAULT_WIDTHS = (1, 2, 4, 6, 8, 12, 16, 24, 32, 48)
#: steps of up to this many rows (their width) defer out_proj's split-K reduction to gate/up (`FusedModel.defers`):
#: measured to pay at 1 row only (Llama-3.2-1B, session 20 call 5: -17 us a step at 1 row, +29 / +84 at 6 / 16)
DEFER_MAX_WIDTH = 1
#: by default (`FusedModel(defer_down=None)`) a step defers the down projection's split-K reduction to the next layer's
#: attention prologue while that prologue's pre-pass reads at most this many bytes of partials per SM
#: (`down_prepass_sm_bytes`: every prologue column tile re-reads the whole [rows, H] block of S fp32 partials, and
#: the prologue's programs share the SMs). Fitted to the 21 widths of four models measured in sessions 21-22
#: (bench/results/session21, session22; explore26 alternated twice; us a step, deferral on minus off, KiB per SM):
#: SmolLM2-135M -35 / -30 / -7 / -52 / -54 / -66 at 1 / 6 / 16 / 24 / 32 / 48 rows (2.7-43.2 KiB: all defer);
#: Llama-3.2-1B -17 / -13 at 1 / 2 (11.6 / 23.3), +0.8 / +12 / +61 at 4 / 6 / 16 (46.5 / 70 / 186); Qwen2.5-0.5B
#: -28 / -23 / -15 at 1 / 6 / 8 (4-32), +1.7 / +10 at 12 / 16 (48 / 64), -17 at 24 (48, forgone); Qwen3-0.6B -31 /
#: -34 / -36 at 1 / 2 / 4 (7.8-31), -27 at 6 (46.5, forgone). Every measured loss lies above it, every deferring
#: width measured pays. (Session 21's bound on the total bytes, 3.5 MiB, had to forgo SmolLM2 at 48 rows and Qwen3
#: past 2 and still lost at Qwen2.5's 12: the total does not say how much of it each SM waits for.)
DEFER_DOWN_MAX_SM_BYTES = 44 << 10      # 44 KiB
#: SMs assumed where the model is not on a CUDA device (the CPU interpreter): an H100 / H200 SXM's 132
ASSUMED_SMS = 132
#: steps of up to this many rows (their width) fold the decode attention's split combine into the output projection
#: (`FusedModel.folds`, `lowlat.kernels.attn_combine`): never by default, measured slower at every width and model
#: tried (session 22, bench/results/session22/call2, explore26 fold 16 / 0 alternated twice, us a step): Llama-3.2-1B
#: +18 / +35 / +80 / +241 at 1 / 2 / 6 / 16 rows (at 1 row the attention 6.59 -> 2.77 us a layer, out_proj 1.44 ->
#: 6.37), SmolLM2-135M +60 / +336 / +948 at 1 / 6 / 16 (its split-1 out_proj: 36 column tiles each combining all 9
#: heads of every row), Qwen3-0.6B +41 / +98 at 1 / 6, Qwen2.5-0.5B +35 / +42 at 1 / 6.
FOLD_MAX_WIDTH = 0
#: FusedModel's default early_release: "auto", the dense layers' residual GEMVs ("out_proj", "down") whose weights
#: exceed EARLY_RELEASE_MIN_BYTES release the next launch at their start instead of after their wait
#: (`out_proj.residual_gemv`'s early_release; safe there: their successors, gate/up, the next prologue, the final
#: RMSNorm and the LM head, read before their waits only weights and, the held prologue, the step inputs (positions,
#: KV slots, num_valid_rows), which are copied in before the step and no launch writes; MoE layers never do). Per kernel it takes
#: Llama-3.2-1B's deferred out_proj from 3.53 to 2.71 us at 1 row (57.5% -> 74.9% of copy bandwidth, session 23's
#: call 5). In the step the sign depends on the launch: one launch alone, once each at 1 / 6 rows (session 23's
#: call 6, explore26, us a step against none): out_proj SmolLM2-135M (0.66 MB) +3.4 / +2.3, Qwen2.5-0.5B (1.6 MB)
#: +15 / +6, Qwen3-0.6B (4.2 MB) -11 / -4, Llama-3.2-1B (8.4 MB) -1.4 / -0.7; down SmolLM2 (1.8 MB) +7.3 / +7.7,
#: Qwen3-0.6B (6.3 MB) +3 / +2, Qwen2.5-0.5B (8.7 MB) -16 / -19, Llama (33.6 MB) -4.5 / -3.6. The size rule enables
#: only launches that gained there; alternated four times at 1 / 6 / 16 / 48 rows (session 24's call 2,
#: bench/explore/session24b.sh, median us a step, rule against none): Llama (both launches) -2.9 / -2.7 / -0.7 /
#: +1.5 (the last two within the runs' spread), Qwen2.5-0.5B (down) -12.3 / -21.3 / -9.8 / -3.8 (every run apart).
#: SmolLM2-135M and Qwen3-0.6B have no launch over the bound (it forgoes Qwen3's out_proj gain, one run).
EARLY_RELEASE = "auto"
#: bytes of bf16 weights a dense residual GEMV must exceed to release early under "auto": the issue's 8 MB (10^6)
EARLY_RELEASE_MIN_BYTES = 8_000_000
#: the launches `FusedModel(early_release=...)` may name ("attn_prologue": the held prologue, `attn_prologue_held`'s
#: early_release; its successor, the decode attention, reads before its wait only step inputs and KV slots of
#: earlier steps). "auto" never names "attn_prologue": measured slower (session 28 call 2, bench/explore/explore39.py
#: per kernel, Llama-3.2-1B: 5.26 / 5.83 / 10.4 / 29.3 us at 1 / 6 / 16 / 48 rows against 4.39 / 4.58 / 6.29 / 13.4;
#: explore26, 16 layers, A B B A: the step +3.1 / +16.4 / +59 / +0.9 us)
EARLY_RELEASE_LAUNCHES = ("out_proj", "down", "attn_prologue")
#: The attention prologue with its weights held in registers across the PDL wait (`attn_prologue_held`): "auto" runs
#: it wherever `held_prologue_supported` allows (the Llama family: no QKV bias or QK-norm, H a power of two in
#: 256..2048, on sm_90) and no explicit defer_down > 0 asks for the down's deferral. Per kernel, Llama-3.2-1B, g
#: multiplied in registers (HELD_FOLD "registers", session 26 call 2, bench_attn_prologue.py, two runs): 4.49-4.51 /
#: 4.67-4.68 / 6.56-6.59 / 13.90-13.91 us at 1 / 6 / 16 / 48 rows against the split-K prologue's 7.74-7.75 / 8.01-8.02 /
#: 8.12-8.17 / 16.05-16.06. In the step (session 25, explore26, ABBA, on folded weights): -37.6 / -53.8 / -46.6 / -64.4
#: us; HELD_FOLD "registers" a further -10.0 / -15.2 / +1.4 / -16.1 (session 26 call 4). It takes no deferred
#: input, so a model running it never defers the down projection's reduction (`defers_down`).
HELD_PROLOGUE = "auto"
#: Where a held-prologue model applies the attention RMSNorm weight g to its QKV weights (read at build): "registers"
#: (the kernel multiplies g into its held weights before its wait, FOLD_G) or "build" (`fold_attn_norm` once; since
#: session 39 launched with pace=True: g = 1 in the FOLD_G form, or the paced form, see below). The same bits either way
#: (`fold_attn_norm`'s rounding; GPU tests of the kernel and of the step). Per kernel (session 26 call 2,
#: bench_attn_prologue.py twice, us at 1 / 6 / 16 / 48 rows): registers 4.49-4.51 / 4.67-4.68 / 6.56-6.59 / 13.90-13.91,
#: build 4.66-4.67 / 5.58-5.59 / 6.38-6.42 / 13.92-13.96. In the step (call 4, explore26 --held-fold, Llama-3.2-1B 16
#: layers, two runs each alternated, us): registers 861.6 / 942.4 / 1068.5 / 1636.4, build 871.6 / 957.6 / 1067.1 /
#: 1652.5 at 1 / 6 / 16 / 48 rows (down 13.0 against 14.3 us a layer at 1-6 rows). Since session 39 a "build" model
#: launches the prologue with pace=True: with "attn_prologue" in early_release it runs the paced form at width 1
#: (`attn_prologue_held`'s PACE_COLUMNS), the g-multiplied form with g = 1 released after the wait elsewhere (the same
#: bits as "registers"). In the step (session 40 call 1, explore26, Llama-3.2-1B 16 layers, H100) "build" with the
#: prologue's early release took 1134.3 / 1210.0 / 1338.2 us at 1 / 6 / 16 rows against the default's 1125.3 /
#: 1212.9 / 1340.0: no gain, "registers" kept.
HELD_FOLD = "registers"
#: The MoE layers' output projection. "norm_epilogue": `out_proj.out_proj` writes x and h = rms_norm(x) (a
#: cross-program reduction chain after the GEMV: Qwen3-30B-A3B 9.37 us per kernel at 1 row, 43% of copy bandwidth), the
#: MoE reads h. "held": `residual_gemv_held` (weights held in registers across the PDL wait), which also writes x's
#: sums of squares in H / 16 parts (`sum_sq_out`: 5.66-5.69 us per kernel at 1 row, 71.2-71.6%; 5.60-5.62 without
#: them, session 27 call 3, explore35), and the MoE's router launch computes the RMSNorm from those parts
#: (`moe_forward(norm_weight=..., sum_sq_parts=...)`). "split_k": `out_proj.residual_gemv` (7.36 us, 54.5%), the
#: router computing the norm from whole rows of x. "auto" (the default): "held" where `held_residual_supported` allows
#: (an sm_90 GPU) and the router takes H / 16 parts (MAX_SUM_SQ_PARTS), else "norm_epilogue".
#: In the step (session 27 call 3, explore26, Qwen3-30B-A3B 4 layers, us, two runs each alternated A B B A) "held" is
#: 435.2 / 434.8, 792.4 / 789.8, 1264.6 / 1259.5, 1937.5 / 1936.6 against norm_epilogue's 454.4 / 452.1, 800.0 /
#: 797.7, 1262.4 / 1260.1, 1959.9 / 1954.3 at 1 / 6 / 16 / 48 rows: -18.3 / -7.8 / +0.8 / -20.0, level at 16 (the
#: router 6.1-6.8 us a layer against 4.3-5.6; session 26's router, reading whole rows for the statistic, took 7.0-15.2
#: and made "held" slower at 6-48). A row's bits must not depend on the width, so one form runs every width.
MOE_OUT_PROJ = "auto"
#: the values `FusedModel(moe_out_proj=...)` takes
MOE_OUT_PROJ_FORMS = ("auto", "held", "split_k", "norm_epilogue")
#: Whether QK-norm models run `attn_prologue_cluster` (a head's programs one thread-block cluster) instead of the
#: split-K prologue: False (default), True, or "auto": MoE models where `cluster_prologue_supported` allows and whose
#: widest width is at most CLUSTER_AUTO_MAX_WIDTH. Measured (session 41, H200, bench/results/session41): per kernel at
#: Qwen3-30B-A3B's 1 / 6 / 16 / 48 rows 7.03-7.07 / 7.50 / 16.03 / 50.64 us against the split-K prologue's 9.67-9.73 /
#: 9.84 / 9.92 / 24.66 (every program reads all of x: it loses from 16 rows); in the step (explore26, 4 layers) 419.8
#: / 774.2 / 1276.8 / 1927.2 us against 433.0 / 793.5 / 1267.3 / 1876.5. A row's bits must not depend on the width,
#: so one prologue runs every width a model has: it pays only for a model whose widths all lie where it wins. The
#: step numbers are one run each (16 rows: +9.5 us, 0.75%, within earlier sessions' spread). "auto" takes MoE models
#: only: a dense model running it gives up the down projection's deferral (-31 to -36 us a step at 1-4 rows, see
#: DEFER_DOWN_MAX_SM_BYTES) for a prologue gain not measured on a dense QK-norm model. The default stays False: the
#: serving default widths reach 48, and the TP paths (`runtime/contract.py`, multi-GPU) have not run it on several
#: GPUs.
CLUSTER_PROLOGUE = False
#: the widest step "auto" runs the cluster prologue at: 6 rows, the widest measured faster (8 rows is the same 8-row
#: block as 6 but was not measured)
CLUSTER_AUTO_MAX_WIDTH = 6
#: Longest RoPE table built (positions beyond it are refused): 128 Ki positions.
MAX_ROPE_POSITIONS = 1 << 17


def releases_early(n: int, k: int) -> bool:
    """Whether a dense residual GEMV with a [n, k] bf16 weight releases the next launch at its start under
    `early_release="auto"`: its weights exceed EARLY_RELEASE_MIN_BYTES (2 n k bytes, compared when called)."""
    return 2 * n * k > EARLY_RELEASE_MIN_BYTES


def early_release_launches(cfg: ModelConfig) -> tuple[str, ...]:
    """The launches `FusedModel(cfg, ..., early_release="auto")` releases at their start: among "out_proj"
    ([hidden_size, q_size] weights) and "down" ([hidden_size, intermediate_size]) those whose bf16 weights exceed
    EARLY_RELEASE_MIN_BYTES (`releases_early`); () for MoE models (their layers never release early). Measured
    basis: EARLY_RELEASE's comment."""
    if cfg.is_moe:
        return ()
    h = cfg.hidden_size
    big = {"out_proj": releases_early(h, cfg.q_size), "down": releases_early(h, cfg.intermediate_size)}
    return tuple(n for n, over in big.items() if over)


def down_prepass_bytes(cfg: ModelConfig, prologue_plan: GemvPlan, down_plan: GemvPlan, width: int) -> int:
    """Bytes of fp32 partials the attention prologue's pre-pass reads in all when a step of `width` rows defers the
    down projection's reduction to it: each of the prologue's column tiles (at the launch's row-block count) reads
    its K slices of every row's S = down_plan.split partials, i.e. tiles x width x H x S x 4."""
    return prologue_plan.at(row_blocks(width)).n_tiles * width * cfg.hidden_size * down_plan.split * 4


def down_prepass_sm_bytes(cfg: ModelConfig, prologue_plan: GemvPlan, down_plan: GemvPlan, width: int,
                          num_sms: int) -> float:
    """Bytes of that pre-pass each SM reads: `down_prepass_bytes` over the SMs the prologue's grid (column tiles x K
    slices x row blocks) occupies, min(programs, num_sms). Each program reduces its slice before its GEMV, so this
    is the pre-pass's share of the prologue's critical path (the rule `DEFER_DOWN_MAX_SM_BYTES`)."""
    if num_sms < 1:
        raise ValueError(f"num_sms={num_sms} must be >= 1")
    nmb = row_blocks(width)
    tiles = prologue_plan.at(nmb)
    programs = tiles.n_tiles * tiles.split * nmb
    return down_prepass_bytes(cfg, prologue_plan, down_plan, width) / min(programs, num_sms)


class DraftKey(NamedTuple):
    """The CUDA graph of one self-speculation draft position (`FusedModel.draft_position`)."""

    width: int          # step width the rows are padded to
    num_layers: int     # n: layers 0..n-1 run
    k_cap: int          # the draft sampler's launch flags (`draft_sampling.launch_flags`)
    need_noise: bool


@dataclass
class _Layer:
    attn_norm: torch.Tensor
    qkv: torch.Tensor               # pack_qkv; fold_attn_norm of it with the held prologue and HELD_FOLD "build" or
    #                                 with the cluster prologue
    qkv_bias: torch.Tensor | None
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    wo: torch.Tensor
    mlp_norm: torch.Tensor
    gate_up: torch.Tensor | None
    w_down: torch.Tensor | None
    moe: LayerWeights | None


@dataclass
class _Buffers:
    """Static tensors of one width w (views of the max-width allocations)."""

    width: int
    input_ids: torch.Tensor     # [w] int64
    positions: torch.Tensor     # [w] int64
    out_cache_loc: torch.Tensor  # [w] int32
    req_indices: torch.Tensor   # [w] int32
    nvalid: torch.Tensor        # [1] int32
    x: torch.Tensor             # [w, H] bf16 residual stream (where the last layer a graph runs writes it)
    x2: torch.Tensor | None     # [w, H] bf16 the other residual stream buffer when a reduction is deferred (a
    #                             deferred x is written by its consumer, so never over the residual it reads)
    deferred: torch.Tensor | None  # [S, w, H] fp32 out_proj's split-K partials then (S = its split); else None
    deferred_down: torch.Tensor | None  # [S, w, H] fp32 the down projection's then (S = its split); else None
    q: torch.Tensor             # [w, Hq, D] bf16
    attn: torch.Tensor          # [w, Hq, D] bf16
    rstd: torch.Tensor          # [w] fp32
    h: torch.Tensor             # [w, H] bf16 (MoE layers only)
    sum_sq: torch.Tensor        # [w, H / 16] fp32 the held out_proj's partial sums of squares of x, which the MoE's
    #                             router adds for its RMSNorm (moe_out_proj "held"; else [w, 1] unused)
    act: torch.Tensor           # [w, I] bf16
    logits: torch.Tensor        # [w, V] fp32
    tokens: torch.Tensor        # [w] int64
    hn: torch.Tensor            # [w, H] bf16 final-normed x of a draft (early exit) position
    # a draft position's sampling parameters (padding rows: temperature 0, top_k 0, top_p 1, seed 0, offset 0)
    temperature: torch.Tensor   # [w] fp32
    top_k: torch.Tensor         # [w] int32
    top_p: torch.Tensor         # [w] fp32
    seeds: torch.Tensor         # [w] int64 Philox keys
    offsets: torch.Tensor       # [w] int64 Philox step counters


class FusedModel:
    """Fused decode / verify / prefill-chunk step of one model (rows 1..48).

    Parameters:
        cfg, weights     the model (bf16 weights; any device: they are copied to `device` once)
        device           where it runs: a CUDA device (Hopper for PDL) or "cpu" (Triton interpreter)
        widths           step widths (rows are padded up to the next one); each gets a CUDA graph
        use_cuda_graphs  capture one graph per width on CUDA (ignored on the CPU)
        use_pdl          chain launches with PDL (default: on for sm_90+ when not interpreting)
        validate         check each step's contract on the host first (syncs; raises
                         StepContractError before any KV write)
        defer            dense layers: leave the output projection's split-K reduction to the gate/up launch
                         (`out_proj.residual_gemv_deferred`) at widths of up to this many rows (0: never; at most
                         48) when its plan splits K; the same bits either way (default DEFER_MAX_WIDTH = 1)
        defer_down       the same for the down projection's reduction, left to the next layer's attention
                         prologue (never the last layer a graph runs): at widths of up to this many rows, or by
                         default (None) at the widths whose prologue pre-pass reads at most
                         DEFER_DOWN_MAX_SM_BYTES per SM (`down_prepass_sm_bytes`; fitted to four measured models)
        fold             fold the decode attention's split combine into the output projection
                         (`decode_attention(fold_combine=True)`, `lowlat.kernels.attn_combine`) at widths of up to
                         this many rows (0: never; at most 48) where out_proj's plan slices K by whole heads (dense
                         models); the same bits either way (default FOLD_MAX_WIDTH)
        early_release    "auto" (default EARLY_RELEASE: the launches `early_release_launches(cfg)` names, those
                         over EARLY_RELEASE_MIN_BYTES of weights) or a tuple / list / set of the dense layers'
                         launches among "out_proj" and "down" that release the next launch at their start, not
                         after their PDL wait (`out_proj.residual_gemv`), and "attn_prologue" (the held prologue:
                         `attn_prologue_held`'s early_release; StepContractError where the model runs the split-K
                         or the cluster prologue); the same bits either way; MoE layers ignore out_proj / down
        held_prologue    "auto" (default HELD_PROLOGUE: where `held_prologue_supported(cfg, device)` allows), True
                         (required: UnsupportedConfigError with the reason where it is not supported) or False: every
                         layer's attention prologue is `attn_prologue_held` (weights held in registers across the PDL
                         wait, its own bits: every width runs it, so rows stay invariant; the norm weight multiplied
                         into the held weights in registers, or at build where HELD_FOLD says so) instead of the
                         split-K `attn_prologue`;
                         with it the down projection never defers (`defers_down`), so an explicit defer_down > 0
                         turns "auto" off and is refused with True
        cluster_prologue False (default CLUSTER_PROLOGUE), "auto" (MoE models where `cluster_prologue_supported(cfg,
                         device)` allows, no defer_down > 0 is asked for and every width is at most
                         CLUSTER_AUTO_MAX_WIDTH rows; else the split-K prologue) or True (QK-norm models:
                         UnsupportedConfigError with the reason where `cluster_prologue_supported` names one;
                         StepContractError with a defer_down > 0): every layer's attention prologue is
                         `attn_prologue_cluster` (the held prologue with QK-norm, a head's programs one thread-block
                         cluster, its own bits at every width) on weights folded at build; the down projection never
                         defers. On the H200 (session 41) Qwen3-30B-A3B's step is 13 / 19 us faster at 1 / 6 rows and
                         9.5 / 51 us slower at 16 / 48 (4 layers, one run each): hence "auto"'s width bound
        moe_out_proj     MoE layers' output projection (MOE_OUT_PROJ_FORMS; dense models ignore it):
                         "auto" (default MOE_OUT_PROJ): "held" where `held_residual_supported` allows and
                         H / 16 <= moe.MAX_SUM_SQ_PARTS, else "norm_epilogue"; "norm_epilogue": `out_proj`
                         writes x and h; "held" (`residual_gemv_held` writing x and its sums of squares in H / 16
                         parts; UnsupportedConfigError with the reason where not supported) or "split_k"
                         (`residual_gemv`): the MoE's router launch computes h = rms_norm(x) (from the parts, or
                         from whole rows of x)
    Raises UnsupportedConfigError for configs the fused kernels do not implement (MoE when
    lowlat.kernels.moe is missing, head_dim not in the attention kernels' set, held_prologue=True where
    `held_prologue_supported` names a reason, ...), StepContractError for a defer / defer_down / fold outside 0..48,
    an early_release other than "auto" or a tuple / list / set of launch names, a held_prologue or cluster_prologue
    other than "auto", True or False, a moe_out_proj not in MOE_OUT_PROJ_FORMS, or widths outside 1..48.

    `forward` returns a view of a static buffer, valid until the next `forward` (clone to keep).
    `last_tokens` holds the greedy tokens of the last step ([M] int64, argmax of the logits).
    Self-speculation drafts: `early_exit_hidden` (final-normed hidden states after n layers) and
    `draft_position` (those, then the draft sampler, as one graph).
    """

    name = "fused"

    def __init__(self, cfg: ModelConfig, weights: ModelWeights, *, device: torch.device | str,
                 widths: Sequence[int] = DEFAULT_WIDTHS, use_cuda_graphs: bool = True,
                 use_pdl: bool | None = None, validate: bool = True, defer: int = DEFER_MAX_WIDTH,
                 defer_down: int | None = None, fold: int = FOLD_MAX_WIDTH,
                 early_release: str | Sequence[str] = EARLY_RELEASE,
                 held_prologue: str | bool = HELD_PROLOGUE, moe_out_proj: str = MOE_OUT_PROJ,
                 cluster_prologue: str | bool = CLUSTER_PROLOGUE) -> None:
        self.cfg = cfg
        if not (cluster_prologue is True or cluster_prologue is False
                or (isinstance(cluster_prologue, str) and cluster_prologue == "auto")):
            raise StepContractError(f"cluster_prologue={cluster_prologue!r} must be 'auto', True or False")
        if not isinstance(moe_out_proj, str) or moe_out_proj not in MOE_OUT_PROJ_FORMS:
            raise StepContractError(f"moe_out_proj={moe_out_proj!r} must be one of {MOE_OUT_PROJ_FORMS}")
        if not (held_prologue is True or held_prologue is False
                or (isinstance(held_prologue, str) and held_prologue == "auto")):
            raise StepContractError(f"held_prologue={held_prologue!r} must be 'auto', True or False")
        if isinstance(early_release, str) and early_release == "auto":
            names = early_release_launches(cfg)
        else:
            names = tuple(early_release) if isinstance(early_release, (tuple, list, set, frozenset)) else None
        if names is None or not all(isinstance(n, str) and n in EARLY_RELEASE_LAUNCHES for n in names):
            raise StepContractError(f"early_release={early_release!r} must be 'auto' or a sequence of names in "
                                    f"{EARLY_RELEASE_LAUNCHES}")
        self.early_release = tuple(n for n in EARLY_RELEASE_LAUNCHES if n in names)   # fixed at build
        for name, v in (("defer", defer), ("defer_down", defer_down), ("fold", fold)):
            if name == "defer_down" and v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_ROWS:
                raise StepContractError(f"{name}={v!r} must be an int in 0..{MAX_ROWS} (the widest width it applies to)"
                                        + (" or None (by DEFER_DOWN_MAX_SM_BYTES)" if name == "defer_down" else ""))
        self._defer = defer               # fixed at build: the graphs are captured per width
        self._defer_down = defer_down
        self._fold = fold
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.widths = tuple(sorted(set(int(w) for w in widths)))
        if not self.widths or self.widths[0] < 1 or self.widths[-1] > MAX_ROWS:
            raise StepContractError(f"widths {widths} must lie in 1..{MAX_ROWS}")
        if len(weights.layers) != cfg.num_layers:
            raise UnsupportedConfigError("num_hidden_layers", cfg.num_layers,
                                         f"weights have {len(weights.layers)} layers")
        self._check_config(cfg)
        why = held_prologue_supported(cfg, self.device)
        if held_prologue is True and why is not None:
            raise UnsupportedConfigError("held_prologue", True, why)
        if defer_down and why is None:            # the down's deferral needs the split-K prologue (a DeferredX input)
            if held_prologue is True:
                raise StepContractError(f"held_prologue=True cannot take defer_down={defer_down}: the held prologue "
                                        "takes no deferred input")
            why = f"defer_down={defer_down} asks for the split-K prologue"
        #: whether every layer's prologue is `attn_prologue_held` (fixed at build)
        self.held_prologue = held_prologue is not False and why is None
        why_cluster = cluster_prologue_supported(cfg, self.device) if cluster_prologue is not False else None
        if cluster_prologue is True:
            if why_cluster is not None:
                raise UnsupportedConfigError("cluster_prologue", True, why_cluster)
            if defer_down:
                raise StepContractError(f"cluster_prologue=True cannot take defer_down={defer_down}: the cluster "
                                        "prologue takes no deferred input")
        #: whether every layer's prologue is `attn_prologue_cluster` (QK-norm models; fixed at build)
        self.cluster_prologue = cluster_prologue is True or (
            cluster_prologue == "auto" and cfg.is_moe and why_cluster is None and not defer_down
            and self.widths[-1] <= CLUSTER_AUTO_MAX_WIDTH)
        if HELD_FOLD not in ("build", "registers"):
            raise StepContractError(f"fused_model.HELD_FOLD={HELD_FOLD!r} must be 'build' or 'registers'")
        #: whether the stored QKV weights have the attention norm weight multiplied in (`fold_attn_norm`, HELD_FOLD)
        self._held_folded = self.held_prologue and HELD_FOLD == "build"
        #: whether the held prologue may release the next launch at its start (early_release names "attn_prologue"; on
        #: folded weights, pace=True, it does so only in the paced form: width 1)
        self._held_early = "attn_prologue" in self.early_release
        if self._held_early and not self.held_prologue:
            runs = ("the cluster prologue" if self.cluster_prologue else
                    f"the split-K prologue ({why or 'held_prologue=False'})")
            raise StepContractError(f"early_release names 'attn_prologue', which only the held prologue does; this "
                                    f"model runs {runs}")
        self._moe = None
        if cfg.is_moe:
            try:
                from lowlat.kernels import moe as moe_kernels
            except ImportError as e:     # pragma: no cover - depends on the tree
                raise UnsupportedConfigError("num_experts", cfg.num_experts,
                                             f"MoE needs lowlat.kernels.moe ({e})") from e
            self._moe = moe_kernels
        #: the MoE layers' output projection, resolved: "held", "split_k" or "norm_epilogue" (None: a dense model)
        self.moe_out_proj = self._resolve_moe_out_proj(cfg, moe_out_proj)
        self.use_graphs = bool(use_cuda_graphs) and self.device.type == "cuda"
        self.use_pdl = pdl_available(self.device) if use_pdl is None else (bool(use_pdl) and pdl_available(self.device))
        self.validate = validate
        #: SMs of the device (the default down-deferral rule divides its pre-pass by them); ASSUMED_SMS on the CPU
        self.num_sms = (torch.cuda.get_device_properties(self.device).multi_processor_count
                        if self.device.type == "cuda" else ASSUMED_SMS)
        self._build_weights(weights)
        self._build_buffers()
        self._graphs: dict = {}           # width -> graph of the step; (width, n) -> early exit after n layers;
        #                                   DraftKey -> a draft position
        self._kv_key: tuple | None = None
        self.last_tokens: torch.Tensor | None = None

    # ------------------------------------------------------------------------------------ build
    def _resolve_moe_out_proj(self, cfg: ModelConfig, form: str) -> str | None:
        if not cfg.is_moe:
            return None
        why = held_residual_supported(cfg.hidden_size, cfg.q_size, self.device)
        parts = cfg.hidden_size // HELD_BLOCK_N   # the held out_proj's partial sums of squares a row
        if why is None and parts > self._moe.MAX_SUM_SQ_PARTS:
            why = (f"hidden_size {cfg.hidden_size}: {parts} partial sums of squares a row, the MoE router adds at most "
                   f"{self._moe.MAX_SUM_SQ_PARTS}")
        if form == "held" and why is not None:
            raise UnsupportedConfigError("moe_out_proj", form, why)
        if form == "auto":
            return "held" if why is None else "norm_epilogue"
        return form

    @staticmethod
    def _check_config(cfg: ModelConfig) -> None:
        if cfg.head_dim % 32 or cfg.head_dim & (cfg.head_dim - 1):
            raise UnsupportedConfigError("head_dim", cfg.head_dim, "the fused attention kernels take a power "
                                         "of two that is a multiple of 32")
        if cfg.hidden_size % 16:
            raise UnsupportedConfigError("hidden_size", cfg.hidden_size, "must be a multiple of 16")

    def _build_weights(self, w: ModelWeights) -> None:
        dev, bf = self.device, torch.bfloat16

        def put(t):
            return None if t is None else t.to(device=dev, dtype=bf).contiguous()

        self.embed = put(w.embed)
        self.lm_head_w = self.embed if w.lm_head is w.embed else put(w.lm_head)
        self.final_norm = put(w.final_norm)
        self.layers: list[_Layer] = []
        for lw in w.layers:
            lw_dev = lw.map(put)
            dense = lw.router is None
            qkv = pack_qkv(lw_dev)
            self.layers.append(_Layer(
                attn_norm=lw_dev.attn_norm,
                qkv=fold_attn_norm(qkv, lw_dev.attn_norm) if self._held_folded or self.cluster_prologue else qkv,
                qkv_bias=pack_qkv_bias(lw_dev),
                q_norm=lw_dev.q_norm, k_norm=lw_dev.k_norm, wo=lw_dev.wo, mlp_norm=lw_dev.mlp_norm,
                gate_up=pack_gate_up(lw_dev.w_gate, lw_dev.w_up) if dense else None,
                w_down=lw_dev.w_down if dense else None, moe=None if dense else lw_dev))
        cfg = self.cfg
        h, i = cfg.hidden_size, cfg.intermediate_size
        self.plan_o = plan_gemv(h, cfg.q_size,
                                kind="out_proj" if self.moe_out_proj == "norm_epilogue" else "residual")
        self.plan_gu = plan_gemv(i, h, kind="gate_up") if not cfg.is_moe else None
        self.plan_down = plan_gemv(h, i, kind="residual") if not cfg.is_moe else None
        self.plan_lm = plan_gemv(cfg.vocab_size, h, kind="lm_head")
        self.rope = rope_table(cfg, min(cfg.max_position_embeddings, MAX_ROPE_POSITIONS), dev)

    def _build_buffers(self) -> None:
        cfg, dev, wmax = self.cfg, self.device, self.widths[-1]
        bf = torch.bfloat16
        self.gemv_ws = GemvWorkspace.create(max(cfg.hidden_size, cfg.intermediate_size if not cfg.is_moe else 0),
                                            dev)
        self.pro_ws = make_prologue_workspace(self.layers[0].qkv, cfg.head_dim)
        self.dec_ws = make_decode_workspace(wmax, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, dev)
        # the normed rows go to bufs.h (h_out): the workspace needs no buffer of its own for them
        self.moe_ws = (self._moe.MoEWorkspace.for_config(cfg, wmax, dev, normed_rows=False) if self._moe is not None
                       else None)
        z = dict(device=dev)
        self._full = dict(
            input_ids=torch.zeros(wmax, dtype=torch.int64, **z),
            positions=torch.zeros(wmax, dtype=torch.int64, **z),
            out_cache_loc=torch.zeros(wmax, dtype=torch.int32, **z),
            req_indices=torch.zeros(wmax, dtype=torch.int32, **z),
            x=torch.zeros(wmax, cfg.hidden_size, dtype=bf, **z),
            q=torch.zeros(wmax, cfg.num_heads, cfg.head_dim, dtype=bf, **z),
            attn=torch.zeros(wmax, cfg.num_heads, cfg.head_dim, dtype=bf, **z),
            rstd=torch.zeros(wmax, dtype=torch.float32, **z),
            h=torch.zeros(wmax, cfg.hidden_size if cfg.is_moe else 1, dtype=bf, **z),
            sum_sq=torch.zeros(wmax, cfg.hidden_size // HELD_BLOCK_N if self.moe_out_proj == "held" else 1,
                               dtype=torch.float32, **z),
            act=torch.zeros(wmax, max(cfg.intermediate_size, 1) if not cfg.is_moe else 1, dtype=bf, **z),
            logits=torch.zeros(wmax, cfg.vocab_size, dtype=torch.float32, **z),
            tokens=torch.zeros(wmax, dtype=torch.int64, **z),
            hn=torch.zeros(wmax, cfg.hidden_size, dtype=bf, **z),
            temperature=torch.zeros(wmax, dtype=torch.float32, **z),
            top_k=torch.zeros(wmax, dtype=torch.int32, **z),
            top_p=torch.ones(wmax, dtype=torch.float32, **z),
            seeds=torch.zeros(wmax, dtype=torch.int64, **z),
            offsets=torch.zeros(wmax, dtype=torch.int64, **z),
        )
        # the draft sampler's outputs ([wmax, V] fp32 logits among them): made by the first draft_position
        self._draft_out: dict[int, DraftSample] | None = None
        self._draft_one_hot: dict[DraftKey, bool] = {}
        self._nvalid = torch.ones(1, dtype=torch.int32, device=dev)
        self._page_table: torch.Tensor | None = None      # [wmax, C] int32, C from the first step
        # the deferred reductions (`defers`, `defers_down`): x2 and the partials, for the deferring widths only
        h = cfg.hidden_size
        omax = max((w for w in self.widths if self.defers(w)), default=0)
        dmax = max((w for w in self.widths if self.defers_down(w)), default=0)
        s_o, s_d = self.plan_o.split, (self.plan_down.split if dmax else 0)
        self._x2 = torch.zeros(max(omax, dmax), h, dtype=bf, device=dev)
        self._deferred = torch.zeros(s_o * omax * h, dtype=torch.float32, device=dev)
        self._deferred_down = torch.zeros(s_d * dmax * h, dtype=torch.float32, device=dev)
        self._bufs = {w: _Buffers(width=w, nvalid=self._nvalid, x2=self._x2[:w] if w <= max(omax, dmax) else None,
                                  deferred=self._deferred[:s_o * w * h].view(s_o, w, h) if w <= omax else None,
                                  deferred_down=self._deferred_down[:s_d * w * h].view(s_d, w, h) if w <= dmax
                                  else None, **{k: v[:w] for k, v in self._full.items()})
                      for w in self.widths}

    # ------------------------------------------------------------------------------------ run
    def width_for(self, rows: int) -> int:
        """The captured width a step of `rows` rows is padded to."""
        for w in self.widths:
            if w >= rows:
                return w
        raise StepContractError(f"{rows} rows exceed the largest width {self.widths[-1]}")

    def forward(self, step: StepBatch, pool: Any) -> torch.Tensor:
        """Logits [M, V] fp32 of one step (padding rows 0); writes the step's K/V into `pool`.

        pool: anything with `k_caches` / `v_caches` lists ([S, Hkv, D] bf16 per layer, on this
        device), e.g. `lowlat.runtime.kv_cache.KVCachePool`. Raises StepContractError (nothing
        written) for a step that breaks the contract when `validate`.
        """
        bufs, m, kc, vc = self._prepare(step, pool)
        self._launch(bufs.width, bufs, kc, vc)
        self.last_tokens = bufs.tokens[:m]
        return bufs.logits[:m]

    def early_exit_hidden(self, step: StepBatch, pool: Any, num_layers: int) -> torch.Tensor:
        """Final-normed hidden states [M, H] bf16 after the first `num_layers` layers: the early-exit
        draft model of self-speculation (`ReferenceModel.hidden_states(..., num_layers)` is its spec;
        Elhoushi et al. 2024, LayerSkip). Runs the same fused launches for layers 0..n-1 (their K/V
        written into `pool`, layers >= n untouched), no LM head, then the final RMSNorm
        (`kernels.rms_norm`), in its own CUDA graph per (width, n). Returns a new tensor; padding rows
        are 0. Raises ValueError for n outside 1..N, StepContractError as `forward`."""
        self._check_num_layers(num_layers)
        bufs, m, kc, vc = self._prepare(step, pool)
        self._launch((bufs.width, num_layers), bufs, kc, vc, include_lm_head=False, num_layers=num_layers,
                     final_norm=True)
        h = bufs.hn[:m].clone()
        h[step.num_valid_rows:] = 0
        return h

    def draft_position(self, step: StepBatch, pool: Any, num_layers: int, temperature: torch.Tensor,
                       top_k: torch.Tensor, top_p: torch.Tensor, seeds: torch.Tensor, offsets: torch.Tensor, *,
                       k_cap: int, need_noise: bool) -> DraftSample:
        """One self-speculation draft position, every launch of it chained by PDL in ONE CUDA graph per
        `DraftKey` (width, n, k_cap, need_noise): embed, layers 0..n-1 (as `early_exit_hidden`: their K/V
        written into `pool`, layers >= n untouched), the final RMSNorm (`kernels.rms_norm`), then the
        single-launch draft sampler (`kernels.draft_sampling.draft_sample_into`: LM head, temperature,
        top-k / top-p, Philox draw) on the normed rows. Its spec: `ReferenceModel.hidden_states(...,
        num_layers)` followed by `lowlat.reference.draft_sampling.draft_sample`. On the CPU (no graphs)
        the same launches run eagerly.

        Parameters:
            step, pool   as `forward`; M = step.num_valid_rows valid rows (padded to a captured width)
            num_layers   n in 1..N
            temperature [M] float32, top_k [M] int32, top_p [M] float32, seeds [M] int64, offsets [M] int64
                         the valid rows' sampling parameters and Philox counters (any device); copied into
                         the width's static buffers, whose padding rows get temperature 0, top_k 0, top_p 1,
                         seed 0, offset 0. Values are not checked (no host sync): a row outside what k_cap /
                         need_noise compile for gets token -1 (see `draft_sample_into`).
            k_cap, need_noise  the sampler's launch flags for these rows (`draft_sampling.launch_flags`)
        Returns: a `DraftSample` of the M valid rows (tokens [M] int64, logits [M, V] fp32 unless one_hot,
            lse / cut_value [M] fp32, cut_id [M] int32; q via `.probs()`): views of static buffers shared
            by every width, valid until the next draft_position call (at any width). `one_hot` is the flag
            the launch set (on a replay, the one recorded when the graph was captured).
        Raises ValueError for n not an int in 1..N; UnsupportedConfigError / StepContractError as
        `draft_sampling.check_sampling_args` (k_cap, need_noise, the sampling tensors' shapes and dtypes),
        UnsupportedConfigError for a model the draft kernels do not take; StepContractError as `forward`.
        Nothing is written then.
        """
        self._check_num_layers(num_layers)
        nv = step.num_valid_rows
        check_sampling_args(nv, temperature, top_k, top_p, seeds, offsets, k_cap=k_cap, need_noise=need_noise)
        if self.cfg.vocab_size * self.cfg.hidden_size >= 2 ** 31:
            raise UnsupportedConfigError("vocab_size", self.cfg.vocab_size, f"V x H = {self.cfg.vocab_size} x "
                                         f"{self.cfg.hidden_size}: the draft sampler indexes the LM head with int32")
        if self.cfg.hidden_size > RMS_MAX_HIDDEN:
            raise UnsupportedConfigError("hidden_size", self.cfg.hidden_size,
                                         f"the draft position's RMSNorm kernel takes H <= {RMS_MAX_HIDDEN}")
        bufs, m, kc, vc = self._prepare(step, pool)
        self._load_sampling(bufs, nv, temperature, top_k, top_p, seeds, offsets)
        out = self._draft_sample_out(bufs.width)
        key = DraftKey(bufs.width, num_layers, k_cap, bool(need_noise))
        replay = self.use_graphs and key in self._graphs
        self._launch(key, bufs, kc, vc, include_lm_head=False, num_layers=num_layers,
                     sample=(out, k_cap, bool(need_noise)))
        if not replay:                    # the launch set out.one_hot; a replay runs no launch
            self._draft_one_hot[key] = out.one_hot
        return DraftSample(out.tokens[:nv], out.logits[:nv], out.lse[:nv], out.cut_value[:nv], out.cut_id[:nv],
                           one_hot=self._draft_one_hot[key])

    def _check_num_layers(self, num_layers: int) -> None:
        if type(num_layers) is not int or not 1 <= num_layers <= self.cfg.num_layers:
            raise ValueError(f"num_layers={num_layers!r} must be an int in 1..{self.cfg.num_layers}")

    def _draft_sample_out(self, width: int) -> DraftSample:
        """The draft sampler's static outputs at `width` (views of max-width buffers made on first use)."""
        if self._draft_out is None:
            f = empty_draft_sample(self.widths[-1], self.cfg.vocab_size, self.device)
            self._draft_out = {w: DraftSample(f.tokens[:w], f.logits[:w], f.lse[:w], f.cut_value[:w], f.cut_id[:w])
                               for w in self.widths}
        return self._draft_out[width]

    def _load_sampling(self, bufs: _Buffers, nv: int, *values: torch.Tensor) -> None:
        """Copy the valid rows' sampling tensors into the width's static buffers, padding rows' values after
        them (one copy per tensor: the padding is appended on the source's device)."""
        pad = bufs.width - nv
        for dst, src, fill in zip((bufs.temperature, bufs.top_k, bufs.top_p, bufs.seeds, bufs.offsets), values,
                                  (0, 0, 1, 0, 0)):
            if pad:
                src = torch.cat([src, src.new_full((pad,), fill)])
            dst.copy_(src, non_blocking=True)

    def _prepare(self, step: StepBatch, pool: Any):
        """Check the step (when `validate`), pick its width, load its tensors into the static inputs."""
        cfg = self.cfg
        kc, vc = pool.k_caches, pool.v_caches
        if len(kc) != cfg.num_layers or len(vc) != cfg.num_layers:
            raise StepContractError(f"pool has {len(kc)} layers of K cache, model has {cfg.num_layers}")
        if kc[0].device != self.device or kc[0].dtype != torch.bfloat16:
            raise StepContractError(f"KV cache is {kc[0].dtype} on {kc[0].device}; the fused step needs "
                                    f"bfloat16 on {self.device}")
        if self.validate:
            step.validate(vocab_size=cfg.vocab_size, num_slots=kc[0].shape[0], max_rows=self.widths[-1])
            top = int(step.positions[: step.num_valid_rows].max())
            if top >= self.rope.shape[0]:
                raise StepContractError(f"position {top} beyond the RoPE table ({self.rope.shape[0]} positions)")
        m, b = step.num_rows, step.num_requests
        w = self.width_for(m)
        if b > self.widths[-1]:
            raise StepContractError(f"{b} requests exceed the largest width {self.widths[-1]}")
        c = step.page_table.shape[1]
        key = (c, tuple((k.data_ptr(), v.data_ptr()) for k, v in zip(kc, vc)))
        if self._kv_key != key:           # another cache or page-table width: new buffers, new graphs
            for i, (k, v) in enumerate(zip(kc, vc)):     # every layer as layer 0 (checked above), once per cache
                for name, t in (("K", k), ("V", v)):
                    if t.device != self.device or t.dtype != torch.bfloat16 or t.shape != kc[0].shape:
                        raise StepContractError(f"layer {i}'s {name} cache is {t.dtype} {tuple(t.shape)} on "
                                                f"{t.device}; the fused step needs bfloat16 {tuple(kc[0].shape)} "
                                                f"on {self.device} in every layer")
            self._graphs.clear()
            self._page_table = torch.zeros(self.widths[-1], c, dtype=torch.int32, device=self.device)
            self._kv_key = key
        bufs = self._bufs[w]
        self._load_inputs(step, bufs, m, b)
        return bufs, m, kc, vc

    def _launch(self, key, bufs: _Buffers, kc, vc, **run_kw) -> None:
        """Run the step's launches: eagerly, by replaying graph `key`, or capturing it first."""
        if not self.use_graphs:
            self._run(bufs, kc, vc, **run_kw)
        elif key in self._graphs:
            self._graphs[key].replay()
        else:
            self._capture(key, bufs, kc, vc, **run_kw)

    def _load_inputs(self, step: StepBatch, bufs: _Buffers, m: int, b: int) -> None:
        w = bufs.width
        for name in ("input_ids", "positions", "out_cache_loc", "req_indices"):
            dst = getattr(bufs, name)
            dst[:m].copy_(getattr(step, name), non_blocking=True)
            if w > m:
                dst[m:].zero_()                       # padding rows: token 0, position 0, dummy slot 0
        self._page_table[:b].copy_(step.page_table, non_blocking=True)
        self._nvalid.fill_(step.num_valid_rows)

    def _capture(self, key, bufs: _Buffers, kc, vc, **run_kw) -> None:
        # The eager run computes this step (and compiles the kernels); the capture records the same
        # launches; replays recompute it idempotently (same inputs, same KV writes).
        s = torch.cuda.Stream(self.device)
        s.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(s):
            self._run(bufs, kc, vc, **run_kw)
        torch.cuda.current_stream(self.device).wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            self._run(bufs, kc, vc, **run_kw)
        self._graphs[key] = g
        g.replay()

    def defers(self, width: int) -> bool:
        """Whether a step of this width leaves the dense layers' output-projection reduction to the gate/up
        launch: a dense model, an out_proj plan with split-K, and width <= `defer` (each gate/up program first
        reduces S fp32 partials per element of its x slice, which delays its weight stream: with one row that is
        one round trip; measured to pay at 1 row only, NOTES session 20)."""
        return not self.cfg.is_moe and self.plan_o.split > 1 and width <= self._defer

    def defers_down(self, width: int) -> bool:
        """Whether a step of this width leaves the dense layers' down-projection reduction to the next layer's
        attention prologue (not the last layer a graph runs): a dense model, a down plan with split-K, and width
        <= `defer_down`, or with defer_down None a pre-pass of at most DEFER_DOWN_MAX_SM_BYTES per SM
        (`down_prepass_sm_bytes` on this device's SMs); never with the held or cluster prologue (they take no
        deferred input). The prologue preloads its weights before its wait, so its
        pre-pass runs beside their loads; what it costs grows with the partials each SM's programs re-read (NOTES
        sessions 21-22)."""
        if self.cfg.is_moe or self.plan_down.split < 2 or self.held_prologue or self.cluster_prologue:
            return False
        if self._defer_down is not None:
            return width <= self._defer_down
        return (down_prepass_sm_bytes(self.cfg, self.pro_ws.plan, self.plan_down, width, self.num_sms)
                <= DEFER_DOWN_MAX_SM_BYTES)

    def folds(self, width: int) -> bool:
        """Whether a step of this width folds the decode attention's split combine into the output projection: a
        dense model (the MoE layers' out_proj with its RMSNorm epilogue is not tested folding), width <= `fold` and
        out_proj's plan (at the width's row blocks) slices K by whole heads. Each out_proj program then combines its
        K slice's splits after its wait (re-read by every column tile) instead of the attention's arrival counter and
        combining program (NOTES session 22)."""
        return (not self.cfg.is_moe and width <= self._fold
                and self.plan_o.at(row_blocks(width)).span % self.cfg.head_dim == 0)

    @property
    def fold(self) -> int:
        """The widest width (rows) whose steps fold the attention's combine into out_proj (fixed at build)."""
        return self._fold

    @property
    def defer(self) -> int:
        """The widest width (rows) whose steps defer out_proj's reduction (the `defer` argument; fixed at build)."""
        return self._defer

    @property
    def defer_down(self) -> int | None:
        """The `defer_down` argument: the widest width (rows) whose steps defer the down projection's reduction, or
        None (by DEFER_DOWN_MAX_SM_BYTES); fixed at build."""
        return self._defer_down

    def _ffn(self, L: _Layer, bufs: _Buffers, attn: torch.Tensor | DeferredAttention, xs: torch.Tensor | None = None,
             defer_down: bool = False) -> torch.Tensor | DeferredX:
        """x = xs + attn Wo^T, then x + FFN(rms_norm(x)): three launches (dense) or out_proj + MoE. xs is the residual
        stream buffer the layer's prologue read (bufs.x or bufs.x2; default bufs.x); a deferred reduction writes its
        x into the other buffer, never over the residual it reads. Returns the next layer's input: bufs.x, or with
        `defer_down` (dense layers of a deferring width) the down projection's `DeferredX`, whose out the next
        prologue writes."""
        cfg, pdl, w = self.cfg, self.use_pdl, bufs.width
        early_o, early_d = "out_proj" in self.early_release, "down" in self.early_release
        xs = bufs.x if xs is None else xs

        def other(t):                             # a deferred x is written beside the residual it is reduced from
            return bufs.x2 if t.data_ptr() == bufs.x.data_ptr() else bufs.x

        if not isinstance(attn, DeferredAttention):
            attn = attn.view(w, -1)
        if L.moe is not None:                     # MoE models never defer: the stream stays in bufs.x
            if self.moe_out_proj == "norm_epilogue":
                out_proj(attn, L.wo, xs, L.mlp_norm, cfg.rms_eps, out=xs, h_out=bufs.h,
                         rstd_out=bufs.rstd, write_h=True, workspace=self.gemv_ws, plan=self.plan_o, use_pdl=pdl)
                self._moe.moe_forward(bufs.h, xs, L.moe, cfg, bufs.nvalid, out=xs, workspace=self.moe_ws,
                                      use_pdl=pdl)
                return xs
            ss = None
            if self.moe_out_proj == "held":       # with x's sums of squares in H / 16 parts for the router's norm
                ss = bufs.sum_sq
                residual_gemv_held(attn, L.wo, xs, out=xs, sum_sq_out=ss, use_pdl=pdl)
            else:
                residual_gemv(attn, L.wo, xs, out=xs, workspace=self.gemv_ws, plan=self.plan_o, use_pdl=pdl)
            # the router launch normalises x (h = rms_norm(x, mlp_norm), written to bufs.h for the experts)
            self._moe.moe_forward(xs, xs, L.moe, cfg, bufs.nvalid, norm_weight=L.mlp_norm, eps=cfg.rms_eps,
                                  h_out=bufs.h, sum_sq_parts=ss, out=xs, workspace=self.moe_ws, use_pdl=pdl)
            return xs
        if self.defers(w):                        # out_proj's reduction done by the gate/up launch (same bits)
            xa = other(xs)
            d = residual_gemv_deferred(attn, L.wo, xs, xa, partials=bufs.deferred,
                                       workspace=self.gemv_ws, plan=self.plan_o, use_pdl=pdl, early_release=early_o)
            gate_up_act(d, L.gate_up, norm_weight=L.mlp_norm, eps=cfg.rms_eps, out=bufs.act,
                        workspace=self.gemv_ws, plan=self.plan_gu, use_pdl=pdl)
        else:
            xa = xs
            residual_gemv(attn, L.wo, xs, out=xs, workspace=self.gemv_ws, plan=self.plan_o, use_pdl=pdl,
                          early_release=early_o)
            gate_up_act(xs, L.gate_up, norm_weight=L.mlp_norm, eps=cfg.rms_eps, out=bufs.act,
                        workspace=self.gemv_ws, plan=self.plan_gu, use_pdl=pdl)
        if defer_down and self.defers_down(w):    # down's reduction done by the next prologue (same bits)
            return residual_gemv_deferred(bufs.act, L.w_down, xa, other(xa), partials=bufs.deferred_down,
                                          workspace=self.gemv_ws, plan=self.plan_down, use_pdl=pdl,
                                          early_release=early_d)
        residual_gemv(bufs.act, L.w_down, xa, out=bufs.x, workspace=self.gemv_ws, plan=self.plan_down, use_pdl=pdl,
                      early_release=early_d)
        return bufs.x

    def _run(self, bufs: _Buffers, kc, vc, *, include_lm_head: bool = True, num_layers: int | None = None,
             final_norm: bool = False, sample: tuple[DraftSample, int, bool] | None = None) -> None:
        """The launches of one step on the static buffers of one width: layers 0..num_layers-1 (all by
        default), then the LM head (benchmarks time the layers alone: not `include_lm_head`). A draft
        position: `final_norm` writes bufs.hn = rms_norm(x); `sample` = (out, k_cap, need_noise) does too,
        then draws from it into out with the static sampling buffers."""
        from lowlat.kernels.attn_prologue import attn_prologue
        from lowlat.kernels.decode_attention import decode_attention

        cfg, pdl, w = self.cfg, self.use_pdl, bufs.width
        x = bufs.x
        torch.index_select(self.embed, 0, bufs.input_ids, out=x)
        page_table = self._page_table[:w]
        layers = self.layers[:num_layers]
        xin: torch.Tensor | DeferredX = x         # the layer's input: a stream buffer or the down's DeferredX
        for i, L in enumerate(layers):
            if self.held_prologue:                # never a DeferredX: defers_down is False
                g = None if self._held_folded else L.attn_norm                  # None: folded at build
                q = attn_prologue_held(xin, L.qkv, g, bufs.positions, bufs.out_cache_loc, bufs.nvalid,
                                       kc[i], vc[i], self.rope, cfg=cfg, out_q=bufs.q, use_pdl=pdl,
                                       early_release=self._held_early, pace=self._held_folded)
            elif self.cluster_prologue:           # never a DeferredX either
                q = attn_prologue_cluster(xin, L.qkv, L.q_norm, L.k_norm, bufs.positions, bufs.out_cache_loc,
                                          bufs.nvalid, kc[i], vc[i], self.rope, cfg=cfg, out_q=bufs.q, use_pdl=pdl)
            else:
                q = attn_prologue(xin, L.qkv, L.qkv_bias, L.attn_norm, L.q_norm, L.k_norm, bufs.positions,
                                  bufs.out_cache_loc, bufs.nvalid, kc[i], vc[i], self.rope, cfg=cfg, out_q=bufs.q,
                                  workspace=self.pro_ws, use_pdl=pdl)
            attn = decode_attention(q, kc[i], vc[i], page_table, bufs.req_indices, bufs.positions, bufs.nvalid,
                                    out_cache_loc=bufs.out_cache_loc, out=bufs.attn, workspace=self.dec_ws,
                                    use_pdl=pdl, fold_combine=self.folds(w))
            xin = self._ffn(L, bufs, attn, xin.out if isinstance(xin, DeferredX) else xin, i + 1 < len(layers))
        if xin is not x:                          # the last layer's down writes the stream into bufs.x
            raise RuntimeError("the last layer run left the residual stream outside bufs.x")
        if final_norm or sample is not None:
            rms_norm_into(x, self.final_norm, cfg.rms_eps, bufs.hn, use_pdl=pdl)
        if sample is not None:
            out, k_cap, need_noise = sample
            draft_sample_into(bufs.hn, self.lm_head_w, bufs.temperature, bufs.top_k, bufs.top_p, bufs.seeds,
                              bufs.offsets, out, k_cap=k_cap, need_noise=need_noise, use_pdl=pdl)
        if include_lm_head:
            lm_head(x, self.final_norm, self.lm_head_w, bufs.nvalid, cfg.rms_eps, logits_out=bufs.logits,
                    tokens_out=bufs.tokens, workspace=self.gemv_ws, plan=self.plan_lm, use_pdl=pdl)
