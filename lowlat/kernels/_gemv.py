"""Shared pieces of lowlat's GEMV kernels (out_proj, mlp, lm_head): tile plans, main loops, workspaces.

Every GEMV here computes  y[M, N] = x[M, K] @ W[N, K]^T  for M <= 48 rows with bf16 operands and fp32
accumulation, in the "swap AB" form  y^T[BN, 16] = W[BN, BK] @ x^T[BK, 16]: the weight tile is the
large MMA operand and the rows are padded to 16, the smallest `tl.dot` width (wgmma m64 on Hopper
when BN >= 64, mma.sync for BN = 16 / 32).

Two ways to stream the weights (a plan picks one; see `GemvPlan`):

* preload (latency regime, small weights: SmolLM2's layers). Each program owns BN rows x one K range
  and issues the loads of all of it at once, BEFORE `gdc_wait` (a tuple of BK-column tiles, staged
  through shared memory for the MMA): with PDL the weight loads overlap the previous kernel, so
  after the wait only the activations (L2-resident, one round trip) are loaded, then one `tl.dot`
  per chunk and the epilogue. The weights do not depend on the previous kernel; nothing else is
  read before the wait.
* stream (bandwidth regime, large weights: LM heads, Llama's MLP). A software-pipelined loop of BK
  chunks (cp.async, `stages` deep); with PDL an optional L2 prefetch of the first `pf_k` columns of
  the program's slice is issued before `gdc_wait` (bounded so the prefetches of many programs cannot
  thrash L2).

Row invariance by construction: rows are processed in blocks of 16 (up to 3 blocks, M <= 48), each
block its own `tl.dot` with the same instruction shape, and the plan (mode, BN, BK, split-K)
is a function of (kind, N, K) only, never of M. So a row's output depends neither on M nor on the
other rows. Tensor cores are used for every M (a single row is padded to 16): a GEMV is memory-bound,
the padded MMA costs nothing, and one arithmetic path for all M is what makes the bitwise
row-invariance hold.

Split-K (grid too small otherwise) is reduced deterministically: every split writes its fp32 partial
tile to a workspace, raises a per-tile counter, and the program that sees the counter reach SPLIT-1
(the last to arrive) sums the partials in split order 0..SPLIT-1 and runs the epilogue. It resets the
counter to 0 for the next launch with a plain store (the residual kernel after its output store, gate/up
right after reading the partials; no other program touches that counter again in this launch, and the next
launch reaches it only after `gdc_wait` or the kernel boundary; an acq_rel `atomic_xchg` there put one more
round trip before the output store). The result is bitwise independent of arrival order.

Where the time goes (2026-12-01, bench/results/session3/explore5b_h200.json; the down projection
[2048, 8192] at 1 row, TMA weight stream): 12.21 us with the split-K finisher, 10.32 us when every split
only stores its partial (no arrival, no finisher), against 9.5 us for a pure read of the same 34 MB with
every load after `gdc_wait` and 8.2 us with every load before it (session3/stream_floor_h200.json). The
finisher's chain of round trips (partial store -> release -> counter -> partial loads -> output store) is
the largest cost beyond the weight stream itself.

PDL (programmatic dependent launch, Hopper): with USE_PDL a program first issues its weight loads
(preload) or L2 prefetches (stream), then `gdc_wait` (the previous kernel's output and every earlier
write become visible), then `gdc_launch_dependents` so the next kernel's programs can start their
own weight loads. Everything that reads activations or touches a workspace runs after `gdc_wait`.
Under the Triton CPU interpreter PDL and inline asm are off and every bf16 load is upcast to fp32
(the interpreter's bf16 arithmetic is wrong); `tl.dot` then runs in fp32.

Measured on an H200 (bench/results/perf_step_h200.json, per launch in PDL-chained graphs, cold L2):
an L2 prefetch of each program's whole slice, harmless for small weights, thrashes L2 when hundreds
of programs of a large weight issue it (SmolLM2's 57 MB LM head: 53 us; two chunks: 24 us; no
prefetch, bn 128 with 8 warps: 20.6 us); Llama-3.2-1B's 525 MB LM head went from 179 us to 134 us
(bk 64, 6 stages, no prefetch); SmolLM2's 0.66 MB output projection from 3.3 us (bn 64, split-K 5)
to 2.1 us (bn 16, no split, all nine chunks in flight).

Second tuning round (bench/results/perf2_step_h200.json, `_wide_candidates`), predictions vs measured:
SmolLM2's LM head with bn 128 runs faster with 4 warps than 8 (19.1 vs 20.5 us; predicted slower: one
warpgroup issues both m64 halves and leaves room for more programs); stages 3 (to let the next
PDL launch's programs co-reside and prefetch) was slower (22.4 us), stages 5 too (23.4 us), and a
whole-slice prefetch thrashed L2 again (49 us). Llama's down projection [2048, 8192] did not move:
the default (bn 64, bk 128, split 8, 4 stages, pf 256) stays fastest at 11.8 us; stages 3 was
14.4-16.8 us, stages 5 12.3 us, bk 256 12.7 us, split 4 12.7 us, bn 32 15.4 us, bn 128 13.4 us.

Third round on the down projection (bench/results/perf3_step_h200.json; tried and reverted), predicted
vs measured. (1) Split-K partials written / read only for the rows m < M that exist (masked, same
[slot, n, m] layout; a [slot, m, n] layout spilled SmolLM2's preload gate/up at 3 row blocks):
predicted -0.1..-0.4 us at 1 row (the finisher reads 8 x 256 B instead of 8 x 4 KB); measured the
default plan at 12.62 us at 1 row and 14.27 us at 6 rows (round two: 11.79 / 12.12; the LM head,
which has no partials, moved 135.5 -> 137.6 us in the same run), slower at both row counts; the likely
cause (not verified in the PTX) is that a per-row mask with a runtime M prevents 16-byte vector stores
and loads of the partial tiles. (2) Split-K
16 (MAX_SPLIT 16, finisher loading 8 partials at a time): predicted one wave of 512 programs at 2-3
stages starting the weight stream sooner; measured 16.3-17.6 us at 1 row for stages 2 / 3 / 4 and
block_k 64 / 128 (more programs per SM, each with a short K range: more partial traffic and tail, no
faster ramp). No plan beat 12.6 us there; the split-8 default remains.

Fourth round on the down projection (2026-12-01, bench/results/tune4_moe_layer_h200.json; copy bandwidth
4188 GB/s, floor 8.02 us): predicted that a deeper L2 prefetch before `gdc_wait` (pf 512 / the whole
1024-column slice at 4 stages), 8 warps at bn 64, 8 stages of 64-column chunks, or bn 128 with one
warpgroup would start the weight stream sooner; measured at 1 row 12.38 / 13.78 (legacy plan, same
plan as pf-all) / 12.47 / 12.20 / 13.58 us against the default's 12.00 us (66.8% of copy bandwidth).
None helped: the default stays, and the 70% target (<= 11.46 us here) is still 0.5 us away. What is
left to try: a TMA (tensor-descriptor) weight stream, and a finisher that does not re-read the partial
tiles through L2 (e.g. a cluster / distributed-shared-memory reduction of the 8 splits).

Fifth round (2026-12-01, bench/results/session3/: explore5*_h200.json, tune5*_down_h200.json,
stream_floor_h200.json, ncu_probe_h200.txt; the scripts under bench/explore/), measured instead of swept.
A pure read of the same 34 MB in this timing method takes 9.5 us with every load after `gdc_wait` (10.0
without PDL) and 8.2 us with every load before it, so the kernel's ~12 us was ~2.5 us above what a
kernel that must wait can reach. Taking pieces out of a TMA copy of the kernel: 12.21 us as is, 10.32 us
without the split-K arrival and finisher, so the finisher's chain of L2 round trips (partial store ->
release fence -> counter -> partial loads -> output store) costs ~1.9 us, the largest part. The chain
lost one trip (the counter reset is now a plain store after the output, not an acq_rel exchange before
it), and split 4 (one 80 KB program per SM, so the next PDL launch's programs fit beside them) won the
tuner's sum over 1 and 6 rows in both runs (11.63 / 11.70 and 11.72 / 11.74 us against the split-8 plan's
11.95 / 11.78 and 11.68 / 12.04): at 1 row alone the two are within run-to-run noise, at 6 rows split 4 is
0.1-0.3 us faster. Tried and slower, with numbers in those files: TMA weight loads
(12.0-12.2 us), tile-contiguous ("packed") weights (no change: the access pattern is not the cost),
bn 16 / 32 plans without or with little split-K (14-20 us: one 4-warp program per SM cannot pull the
bandwidth), a fence-free finisher on self-validating partials (a relaxed arrival and a last program that
polls for an empty-marker NaN, then re-empties the tiles: 12.5 us, the resets and volatile loads cost more
than the fence). The target (70%, <= 11.46 us at 4188 GB/s) stays ~0.2 us away.

Sixth round (session 4, 2026-12-01, bench/results/session4/; scripts at commit 002f097 / 235d9f0 / 1377b5a,
bench/explore/README.md). Predicted from round five that a deeper L2 prefetch lost because the next
launch's prefetched lines were evicted by this launch's stream before use; an evict-last prefetch
(`prefetch.global.L2::evict_last`, set back with `applypriority.global.L2::evict_normal` after the loop;
Triton's cp.async takes no L2 policy, so the stream itself cannot be evict-first) measured slower at every
depth (split 4: pf 256 11.78 vs 11.58 us, pf 1024 14.7 vs 13.2; the whole slice 19.6; explore6_h200.json).
Predicted next that the prefetch should be issued during this launch's split-K tail rather than its start
(`gdc_launch_dependents` after the main loop): no gain (11.5-12.4 us at pf 0-1024; explore7_h200.json).
Measured a shorter prefetch instead: pf 128 and pf 64 beat pf 256 by 0.2-0.4 us in three interleaved
rounds (explore8_h200.json); the plan is now pf 128, and the per-kernel section of `lowlat bench` reads
11.20-11.59 us = 70.6-71.3% of copy bandwidth at 1 row in four runs (session4/call6, call7; 70.5-71.0% at
6 rows), while explore8's timing (the tuner's `_GemvCase` launches, 41 graph replays) reads 68.1-70.2%
for the same plan; the cause of that 1-2 point gap between the two methods is not known. SmolLM2's LM
head gained from a prefetch too: pf 64, 17.7-18.0 us vs 18.5-18.8 (75-76% of copy bandwidth, was 72-73%).

Session 16 (bench/results/session16/): a preload's tiles are staged to shared memory right after their loads,
before `gdc_wait`, so ptxas keeps only as many loads in flight as its registers allow (the Llama prologue's bn 64
programs: 72 registers, ~9 of a thread's 32 loads); narrower programs with all loads in flight were faster there
in the step but not per kernel (bn 32, see TUNED_PLANS), holding every tile in registers across the wait slower
(255 / 128 registers: two programs an SM). Streaming the whole slice from L2 after the wait (prefetched before
it, bn 16, split 1 / 2) was slower than the preload on every shape tried. A plan's weight stream may depend on
the row-block count (`by_row_blocks`).

Session 17 (bench/results/session17/): for the residual and qkv kinds bn may depend on the row-block count too
(`BN_BY_ROW_BLOCKS_KINDS`: mma.sync and wgmma gave a row the same bits), and a stream loop 3 stages deep at 2-3
row blocks (`stages_for`) cost Llama-3.2-1B's gate/up 34 against 25 us a layer at 24 rows in the step. The tuner
proposes `by_row_blocks` streams from per-kernel timings at 24 / 48 rows; the step can disagree (SmolLM2's down:
the tuner's 2-row-block stream was 13 us a step slower at 24 rows than the committed preload), so check a proposal
in the step (`bench/explore/explore26.py` with a `plan_table.py` table) before committing it.

Plans measured on an H200 (`python -m lowlat.bench --sections tune`, which times the candidates of
`candidate_plans` and keeps the fastest correct one; the tuner knows the residual, gate_up and lm_head
kinds, and the "qkv" entries come from session 5's A/B scripts, bench/explore/README.md) are recorded
in `TUNED_PLANS`; `plan_gemv` uses
them for exactly those (kind, N, K) and falls back to `default_plan` elsewhere. The environment
variable LOWLAT_GEMV_PLANS may name a JSON table (the tuner's output) that replaces `TUNED_PLANS`
for experiments; the plan decides the split-K order and the MMA instruction (wgmma or mma.sync), hence
the bits, so a table is part of the numerics of every GEMV it covers (on every machine alike).
"""

from __future__ import annotations

import json
import math
import numbers
import os
from dataclasses import asdict, dataclass, replace

import torch
import triton
import triton.language as tl

from lowlat.errors import StepContractError, UnsupportedConfigError
from lowlat.kernels._attn_common import cuda_props, overlap
from lowlat.kernels._attn_common import interpreting  # noqa: F401  (re-exported: launchers import it from here)
from lowlat.kernels._attn_common import to_bf16  # noqa: F401  (fp32 -> bf16, RNE; integer ops when interpreting)

#: The largest number of rows a GEMV here takes (three row blocks of 16).
MAX_ROWS = 48
ROW_BLOCK = 16
#: Output columns per program of the stream mode's default plan (one wgmma m64 tile per warpgroup).
BLOCK_N = 64
#: The narrowest tile a plan may use (the smallest `tl.dot` M); workspaces are sized for it.
MIN_BLOCK_N = 16
#: Split-K is capped so the finishing program can hold every partial of a tile in flight at once.
MAX_SPLIT = 8
#: Programs the stream plan aims for: two per SM of an H200 (132 SMs). A constant, so that the plan
#: (and hence the bits of every result) is the same on every machine, the CPU interpreter included.
TARGET_PROGRAMS = 264
#: Launches whose weights are at most this many bytes default to the preload (latency) mode.
LATENCY_BYTES = 16 << 20
#: Weight bytes one preload program may hold (they are staged through shared memory for the MMA).
PRELOAD_MAX_BYTES = 160 << 10
#: Weight bytes per program the default preload plan aims for (the smallest split within it).
PRELOAD_TARGET_BYTES = 32 << 10
#: Shared memory a preload program may use at three row blocks (weights + x tiles of every chunk).
PRELOAD_MAX_SMEM = 200 << 10
#: GEMV kinds, the keys of plans: out_proj (+ RMSNorm statistics), residual (x + a W^T: the fused
#: step's out_proj and the MLP's down projection), gate_up (pairs of weight rows), lm_head (split 1),
#: qkv (the attention prologue: pairs of rotary half-rows, N = heads * head_dim / 2).
KINDS = ("out_proj", "residual", "gate_up", "lm_head", "qkv")
#: kinds whose programs multiply two weight rows per output (their plans count both rows' bytes)
PAIR_KINDS = ("gate_up", "qkv")
#: Plan fields that may differ with a launch's row-block count (`GemvPlan.by_row_blocks`): how the weights are
#: streamed, never what is summed in which order (tiles, split-K order and MMA instruction are block_k / split /
#: bn's; warps may change the MMA's layout, so it is not one of them). A row's bits are then the same at every width.
ROW_BLOCK_FIELDS = ("preload", "stages", "pf_k")
#: Kinds whose plans may also set bn per row-block count (session 17). bn moves no summation either: block_k,
#: split and the K order of the k16 products are the same, only the tile height and with it the MMA instruction
#: change (mma.sync for bn 16 / 32, wgmma for 64 / 128 in the "swap AB" form). On the H200 the two gave the same
#: bits in every comparison made (bench/results/session17/call1: the Llama prologue at bn 32 / 64 / 128 and the
#: residual GEMV at bn 16-128, 1-48 rows, 96 of 96 comparisons across bn equal; call5: gate/up, down, out_proj at 48
#: rows), and the GPU row-invariance tests check the committed entries. Not for the kinds whose epilogue reduces
#: over a tile (out_proj's row statistics are summed per tile, the QK-norm over a head's tile rows) or that nothing
#: measured (gate_up, lm_head): `refuse_bn_by_width`, the one gate of table entries and launchers, refuses such a plan.
#: Every launcher launches the grid of `plan.at(nmb)`.
BN_BY_ROW_BLOCKS_KINDS = ("residual", "qkv")


def pdl_available(device: torch.device) -> bool:
    """PDL needs a Hopper-or-newer GPU and the compiled (not interpreted) Triton path."""
    return not interpreting() and device.type == "cuda" and cuda_props(device).major >= 9


def row_blocks(m: int) -> int:
    """Row blocks of 16 covering m rows (1..3)."""
    if not 1 <= m <= MAX_ROWS:
        raise StepContractError(f"M={m} rows: the fused GEMVs take 1..{MAX_ROWS} rows")
    return triton.cdiv(m, ROW_BLOCK)


def _pow2(x: int) -> bool:
    return x > 0 and x & (x - 1) == 0


@dataclass(frozen=True)
class GemvPlan:
    """Tiling of one GEMV of N outputs over K inputs (a function of kind, N and K only).

    n_tiles programs along N (bn columns each) x `split` programs along K; split s covers the
    block_k-chunks [s * chunks_per_split, (s + 1) * chunks_per_split) of K, i.e. `span` columns.
    preload: the span is loaded at once, chunk by chunk into a tuple of tiles (before the PDL wait);
    else a pipelined loop of block_k chunks, `stages` deep, after an L2 prefetch of the first `pf_k`
    columns (0: none; under PDL only). warps: num_warps of the launch. Either way the chunks are
    accumulated in K order; none of preload, stages, warps or pf_k changes the arithmetic of a tile.
    by_row_blocks: ((row blocks, ((field, value), ...)), ...), the ROW_BLOCK_FIELDS a launch of that many row
    blocks (1..3; M = 1-16, 17-32, 33-48 rows) runs with instead (`at`); a dict {row blocks: {field: value}}
    is accepted and normalised. Session 16 measured two shapes where the best weight stream depends on the
    width (TUNED_PLANS). bn may be overridden too, for the kinds of BN_BY_ROW_BLOCKS_KINDS only (`bn_by_width`;
    `plan_gemv` and the launchers refuse it elsewhere). Raises StepContractError for a field outside
    ROW_BLOCK_FIELDS + ("bn",) or a count outside 1..3.
    """

    n: int
    k: int
    block_k: int
    split: int
    chunks_per_split: int
    bn: int = BLOCK_N
    preload: bool = False
    warps: int = 4
    stages: int = 4
    pf_k: int = 1024
    by_row_blocks: tuple = ()

    def __post_init__(self) -> None:
        # normal form; fields equal to this plan's own values and counts left with none are dropped, so plans that
        # launch alike compare equal
        norm = ((nmb, tuple((f, v) for f, v in fields if getattr(self, f) != v))
                for nmb, fields in _row_block_fields(self.by_row_blocks))
        object.__setattr__(self, "by_row_blocks", tuple((nmb, fields) for nmb, fields in norm if fields))

    def at(self, nmb: int) -> GemvPlan:
        """The plan a launch of nmb row blocks runs: this one with its `by_row_blocks` fields for nmb (if any)
        and no `by_row_blocks` left."""
        if not self.by_row_blocks:
            return self
        fields = dict(self.by_row_blocks).get(nmb, ())
        return replace(self, by_row_blocks=(), **dict(fields))

    @property
    def bn_by_width(self) -> bool:
        """True when `by_row_blocks` changes bn at some row-block count (allowed for BN_BY_ROW_BLOCKS_KINDS)."""
        return any(f == "bn" for _, fields in self.by_row_blocks for f, _ in fields)

    @property
    def n_tiles(self) -> int:
        return triton.cdiv(self.n, self.bn)

    @property
    def grid(self) -> tuple[int, int]:
        return (self.n_tiles, self.split)

    @property
    def span(self) -> int:
        return self.block_k * self.chunks_per_split

    @property
    def even_n(self) -> bool:
        return self.n % self.bn == 0

    @property
    def even_k(self) -> bool:
        """Every column a program touches lies inside its K range (no K masks needed)."""
        chunks = triton.cdiv(self.k, self.block_k)
        return self.k % self.block_k == 0 and chunks == self.split * self.chunks_per_split

    @property
    def prefetch_k(self) -> int:
        """Columns of the weight slice each program prefetches into L2 before `gdc_wait` (stream mode;
        0 = none, else a power of two >= 64: one prefetch per 128-byte line)."""
        if self.preload or self.pf_k <= 0:
            return 0
        span = min(self.span, self.pf_k)
        return max(64, triton.next_power_of_2(span))

    def stages_for(self, row_blocks: int) -> int:
        """Pipeline depth of the stream loop (one less for 2-3 row blocks: their x tiles need room)."""
        return self.stages if row_blocks == 1 else max(2, self.stages - 1)

    def weight_bytes_per_program(self, pair: bool = False) -> int:
        return (2 if pair else 1) * self.bn * self.span * 2

    def preload_smem(self, pair: bool = False, row_blocks: int = 3) -> int:
        """Shared memory a preload program stages: its weight tiles and the x tiles of every chunk."""
        return self.weight_bytes_per_program(pair) + row_blocks * ROW_BLOCK * self.span * 2

    def describe(self) -> dict:
        return dict(asdict(self), n_tiles=self.n_tiles, programs=self.n_tiles * self.split)


def _row_block_fields(spec) -> tuple:
    """`GemvPlan.by_row_blocks` in its normal form (sorted tuples) from a dict or pairs (JSON gives lists, or an object
    with string keys). Raises StepContractError naming the offending part of `spec`."""
    try:
        items = [(nmb, dict(f.items() if isinstance(f, dict) else f))
                 for nmb, f in (spec.items() if isinstance(spec, dict) else spec)]
    except (TypeError, ValueError) as e:
        raise StepContractError(f"by_row_blocks={spec!r} must map row-block counts to {{field: value}}") from e
    out = []
    for nmb, fields in items:
        if isinstance(nmb, str) and nmb.isdigit():                   # a JSON object's key
            nmb = int(nmb)
        if isinstance(nmb, bool) or not isinstance(nmb, int) or not 1 <= nmb <= 3:
            raise StepContractError(f"by_row_blocks: {nmb!r} row blocks (a launch has 1..3)")
        bad = sorted(map(str, set(fields) - set(ROW_BLOCK_FIELDS + ("bn",))))
        if bad:
            raise StepContractError(f"by_row_blocks[{nmb}] sets {bad}: only {ROW_BLOCK_FIELDS} and bn may depend on "
                                    "the row-block count (the others move the arithmetic)")
        for f, v in fields.items():
            if not (isinstance(v, bool) if f == "preload" else isinstance(v, int) and not isinstance(v, bool)):
                raise StepContractError(f"by_row_blocks[{nmb}][{f!r}]={v!r}: must be "
                                        f"{'a bool' if f == 'preload' else 'an int'}")
        out.append((nmb, tuple(sorted(fields.items()))))
    if len({n for n, _ in out}) != len(out):
        raise StepContractError(f"by_row_blocks names a row-block count twice: {spec!r}")
    return tuple(sorted(out))


def refuse_bn_by_width(plan: GemvPlan, kind: str | None, what: str) -> None:
    """Raise StepContractError if `plan` changes bn with the row-block count and `kind` is not one of
    BN_BY_ROW_BLOCKS_KINDS (None: a launch no kind covers, the QK-norm prologue): `what` (named in the error) would
    then give a row different bits at different widths. The one gate for table entries (`plan_gemv`) and
    launchers, so BN_BY_ROW_BLOCKS_KINDS alone says which kinds may."""
    if plan.bn_by_width and kind not in BN_BY_ROW_BLOCKS_KINDS:
        raise StepContractError(f"{what} cannot take a plan whose bn depends on the row-block count (by_row_blocks="
                                f"{plan.by_row_blocks}); only the kinds {BN_BY_ROW_BLOCKS_KINDS} may")


def _check_plan(p: GemvPlan, pair: bool) -> GemvPlan:
    for nmb, _ in p.by_row_blocks:
        try:
            _check_plan(p.at(nmb), pair)
        except StepContractError as e:
            raise StepContractError(f"by_row_blocks[{nmb}]: {e}") from None
    if p.bn not in (16, 32, 64, 128):
        raise StepContractError(f"bn={p.bn} must be 16, 32, 64 or 128")
    if p.block_k < 16 or not _pow2(p.block_k):
        raise StepContractError(f"block_k={p.block_k} must be a power of two >= 16")
    if not 1 <= p.split <= MAX_SPLIT:
        raise StepContractError(f"split={p.split} must be in 1..{MAX_SPLIT}")
    if p.warps not in (4, 8):
        raise StepContractError(f"warps={p.warps} must be 4 or 8")
    if not p.preload and p.stages < 2:
        raise StepContractError(f"stages={p.stages} must be >= 2")
    if p.preload and (p.weight_bytes_per_program(pair) > PRELOAD_MAX_BYTES
                      or p.preload_smem(pair) > PRELOAD_MAX_SMEM):
        raise StepContractError(f"preload plan stages {p.weight_bytes_per_program(pair)} weight bytes and "
                                f"{p.preload_smem(pair)} shared-memory bytes per program (limits "
                                f"{PRELOAD_MAX_BYTES}, {PRELOAD_MAX_SMEM}): raise split or lower bn")
    return p


def _split_for(chunks: int, split: int) -> tuple[int, int]:
    """(split, chunks_per_split) with no empty split."""
    split = max(1, min(split, chunks))
    cps = triton.cdiv(chunks, split)
    return triton.cdiv(chunks, cps), cps


def default_block_k(k: int) -> int:
    """128 when K is a multiple of 128, else 64 (K = 576 in SmolLM2), else the next power of two of K
    (16..128) for tiny test shapes."""
    return 128 if k % 128 == 0 else 64 if k % 64 == 0 else max(16, min(128, triton.next_power_of_2(k)))


def legacy_split(n: int, k: int, block_k: int, bn: int, pair: bool) -> int:
    """Enough K-splits that n_tiles * split reaches TARGET_PROGRAMS (halved for gate/up pairs), capped
    at MAX_SPLIT and the chunk count, preferring a divisor of the chunk count when nearly as good."""
    chunks = triton.cdiv(k, block_k)
    n_tiles = triton.cdiv(n, bn)
    target = TARGET_PROGRAMS // (2 if pair else 1)
    split = max(1, min(MAX_SPLIT, chunks, target // n_tiles))
    divisor = max(d for d in range(1, split + 1) if chunks % d == 0)
    if 2 * divisor >= split:                      # an even split (no masked chunk) when nearly as good
        split = divisor
    return split


def default_plan(n: int, k: int, *, kind: str = "residual", pair: bool = False) -> GemvPlan:
    """The plan used where `TUNED_PLANS` has no entry.

    Weights of at most LATENCY_BYTES per launch (not lm_head): preload, bn 64 (wgmma: both operands
    from shared memory, few registers), 4 warps, the smallest split that keeps a program's weights
    within PRELOAD_TARGET_BYTES (enough programs to spread the weight reads over the SMs). (Preload
    with bn 16 / 32, i.e. mma.sync, would avoid split-K, but Triton 3.6 then keeps the weight
    operands in registers and spills at 2-3 row blocks; narrow tiles go through the stream loop.)
    Larger: stream, bn 64, block_k `default_block_k`, split `legacy_split`, 4 stages, an L2
    prefetch of two chunks per program (bounded: many programs prefetching whole slices of a large
    weight evict each other's lines from L2).
    """
    block_k = default_block_k(k)
    chunks = triton.cdiv(k, block_k)
    wbytes = n * k * 2 * (2 if pair else 1)
    if kind != "lm_head" and wbytes <= LATENCY_BYTES:
        for s in range(1, MAX_SPLIT + 1):
            split, cps = _split_for(chunks, s)
            plan = GemvPlan(n=n, k=k, block_k=block_k, split=split, chunks_per_split=cps, bn=BLOCK_N,
                            preload=True, warps=4, stages=1, pf_k=0)
            if (plan.weight_bytes_per_program(pair) <= PRELOAD_TARGET_BYTES
                    and plan.preload_smem(pair) <= PRELOAD_MAX_SMEM) or split == chunks:
                return _check_plan(plan, pair)
    split = 1 if kind == "lm_head" else legacy_split(n, k, block_k, BLOCK_N, pair)
    split, cps = _split_for(chunks, split)
    return _check_plan(GemvPlan(n=n, k=k, block_k=block_k, split=split, chunks_per_split=cps, bn=BLOCK_N,
                                preload=False, warps=4, stages=4, pf_k=2 * block_k), pair)


def legacy_plan(n: int, k: int, *, kind: str = "residual", pair: bool = False) -> GemvPlan:
    """The plan of lowlat's first GEMV kernels (bn 64 stream everywhere, two programs per SM via
    split-K, whole-slice L2 prefetch up to 1024 columns): kept as a tuning candidate and baseline."""
    block_k = default_block_k(k)
    chunks = triton.cdiv(k, block_k)
    split = 1 if kind == "lm_head" else legacy_split(n, k, block_k, BLOCK_N, pair)
    split, cps = _split_for(chunks, split)
    return GemvPlan(n=n, k=k, block_k=block_k, split=split, chunks_per_split=cps, bn=BLOCK_N, preload=False,
                    warps=4, stages=4, pf_k=1024)


#: Plans measured fastest on an H200 by `python -m lowlat.bench --sections tune` (see the module
#: docstring), keyed by (kind, N, K); values are GemvPlan fields other than n and k. Measured
#: 2026-11-29 (bench/results/perf_step_h200.json, its "tuned_plans" and "tune" entries: every
#: candidate's time); the GPU tests of out_proj / mlp / lm_head / fused_model passed with this table.
TUNED_PLANS: dict[tuple[str, int, int], dict] = {
    # SmolLM2-135M: stream_bn16_split1_deep, 2.08 us at 1 row (default plan 3.02 us). Session 18 (call 7,
    # `bench/explore/session18g.sh`, explore26 alternated twice): bn 64 at 3 row blocks (33-48 rows) took the step
    # from 1221.2-1221.9 to 1133.8-1134.7 us at 48 rows (out_proj 3.93 against 5.57 us a layer): a bn 16 program
    # re-reads the rows' x tiles per 16 columns, three times the weight bytes at 3 row blocks. bn 32 at 2 row blocks
    # lost 55-58 us at 24-32 rows, so 1-2 row blocks keep bn 16. The same bits (bn moves no arithmetic here).
    ('residual', 576, 576): dict(
        block_k=64, split=1, chunks_per_split=9, bn=16, preload=False, warps=4, stages=8, pf_k=1024,
        by_row_blocks={3: dict(bn=64)}),
    # SmolLM2-135M: default, 4.3 us at 1 row
    ('gate_up', 1536, 576): dict(
        block_k=64, split=5, chunks_per_split=2, bn=64, preload=True, warps=4, stages=1, pf_k=0),
    # SmolLM2-135M: the stream plan (no preload, 4 stages, L2 prefetch of 256 columns) since session 15. In the fused
    # step (`bench/explore/explore26.py --plan-d`, fresh processes, a server's widths; session 13 call 6, session 14
    # call 1 twice alternated, session 15 call 1) against the preload plan (block_k 128, split 6, bn 64, preload,
    # stages 1, pf_k 0; "default, 3.33 us at 1 row" in 2026-11-29's tune): 3-7 us a step faster at 1-16 rows,
    # 60-95 us faster at 48 (down 7.6 against 10.0-10.3 us a layer: the preload plan's 54 programs pack 5 an SM
    # by their 40 KB of shared memory there), 3-12 us slower at 24-32. Same arithmetic (block_k / split unchanged)
    # Session 16: the preload plan at 2 row blocks (17-32 rows), where it was 3-12 us a step faster in those runs
    # (same arithmetic: the GPU row-invariance tests compare 17 and 33 rows with 48 bitwise).
    ('residual', 576, 1536): dict(
        block_k=128, split=6, chunks_per_split=2, bn=64, preload=False, warps=4, stages=4, pf_k=256,
        by_row_blocks={2: dict(preload=True, stages=1, pf_k=0)}),
    # SmolLM2-135M: w_bn128_bk64_w4_st4_pf64 (session 4, 2026-12-01): 17.67-17.95 / 18.06-18.26 us at 1 / 6
    # rows against pf 0's 18.52-18.77 / 18.82-19.04 in the same runs (bench/results/session4/explore6_h200.json,
    # explore7_h200.json: 75-76% of copy bandwidth, was 72-73%); pf 128 within noise of pf 64. Before:
    # w_bn128_bk64_w4_st4_pf0, 19.10 us at 1 row (stream_bn128_w8_pf0: 20.51 us; default plan 24.08 us;
    # bench/results/perf2_step_h200.json)
    ('lm_head', 49152, 576): dict(
        block_k=64, split=1, chunks_per_split=9, bn=128, preload=False, warps=4, stages=4, pf_k=64),
    # Llama-3.2-1B: stream_bn64_bk64_st6_pf0, 134.14 us at 1 row (default plan 159.12 us). Session 18: bn 128 (one
    # warpgroup, two m64 halves; the same bits as bn 64: bench/results/session18/call5, explore28 --bits at 48 rows,
    # logits equal). Per kernel 123.7-123.8 / 142.6-142.8 / 168.3 us against 129.9-130.6 / 159.2-159.6 / 225.5-226.4 at
    # 1 / 24 / 48 rows (each program reads its x tiles once per 128 columns, not 64: at 3 row blocks those reads were
    # 0.75 of the weight bytes); in the step (explore26, alternated twice) 940.8-941.2 against 948.2-950.5 us at 1
    # row, 1014.5-1015.1 / 1020.5-1021.7 at 6, 1350.4-1350.8 / 1367.2-1367.9 at 24, 1785.2-1787.9 / 1835.9-1841.2 at
    # 48. Stages 8 at 2-3 row blocks were slower (179 against 159 us at 24 rows).
    ('lm_head', 128256, 2048): dict(
        block_k=64, split=1, chunks_per_split=32, bn=128, preload=False, warps=4, stages=6, pf_k=0),
    # Llama-3.2-1B: stream_bn128_bk64_w8_pf0, 21.32 us at 1 row (default plan 27.62 us)
    # Session 17: 6 stages at 2-3 row blocks (5 in flight, `stages_for`; 3 before): in the step (call 6, explore26,
    # alternated twice) gate/up 25.1 against 33.6 us a layer at 24 rows, 29.8 against 44.6 at 48; the step 1456.7-
    # 1458.3 against 1596.3-1597.3 us at 24 rows, 1528.2-1528.8 against 1666.0-1672.6 at 32, 1955.3-1957.5 against
    # 2196.2-2197.3 at 48, equal at 1-16 (per kernel, call 5: 25.0 / 30.0 against 25.9 / 30.7 us at 24 / 48 rows;
    # 21.7 against 21.3 at 1 row, hence 4 stages there). Same bits (call 5, explore28 --bits).
    ('gate_up', 8192, 2048): dict(
        block_k=64, split=2, chunks_per_split=16, bn=128, preload=False, warps=8, stages=4, pf_k=0,
        by_row_blocks={2: dict(stages=6), 3: dict(stages=6)}),
    # Llama-3.2-1B: w_bn64_bk128_s4_st4_pf128 (round six, session 4, 2026-12-01): 11.44 / 11.63 / 11.78 us at
    # 1 row and 11.50 / 11.70 / 11.80 at 6 rows in three interleaved rounds against pf 256's 11.71 / 12.03 /
    # 12.00 and 11.73 / 12.00 / 12.23 (pf 64: 11.48 / 11.55 / 11.70 and 11.71 / 11.70 / 11.78; bench/results/
    # session4/explore8_h200.json): 68.1-70.2% of copy bandwidth at 1 row there; 70.6-71.3% in four runs of
    # the per-kernel section (session4/call6, call7). Before, w_bn64_bk128_s4_st4_pf256 (round five,
    # 2026-12-01, after the finisher lost its counter-reset round trip): 11.63 / 11.70 us at 1 / 6 rows vs the
    # split-8 default's 11.95 / 11.78 (bench/results/session3/tune5_down_h200.json), 11.72 / 11.74 vs
    # 11.68 / 12.04 in a second run (tune5b_down_h200.json): 69.0-69.3% of copy bandwidth at 1 row. Before:
    # the split-8 default, fastest of 13 candidates in perf2_step_h200.json (11.79 us) and of 17 in round four
    # (12.00 us).
    # Session 17: 6 stages (was 4). Per kernel (call 5, explore28, twice) 11.00-11.06 / 12.34-12.37 / 14.10-14.12
    # against 11.28-11.29 / 13.79-13.86 / 15.34-15.41 us at 1 / 24 / 48 rows (72.6-73.0% of copy bandwidth at 1 row);
    # in the step (call 6, alternated twice) down 12.77-12.80 against 13.92 us a layer at 1 row (the next prologue
    # +0.5 us), the step 955.1-955.9 against 970.7-971.7 us at 1 row, 1029.5 against 1040.5-1040.7 at 6, 1125.8-
    # 1126.7 against 1140.4-1140.5 at 16, 1516.8-1518.8 against 1596.3-1597.3 at 24, 2147.1-2147.4 against 2196.2-
    # 2197.3 at 48. Same bits (call 5 --bits).
    ('residual', 2048, 8192): dict(
        block_k=128, split=4, chunks_per_split=16, bn=64, preload=False, warps=4, stages=6, pf_k=128),
    # Llama-3.2-1B out_proj: the default plan (preload bn 64, split 8) at 1 row block; session 17: bn 32 at 2 row blocks
    # (mma.sync: the same bits as bn 64's wgmma, `BN_BY_ROW_BLOCKS_KINDS`) and streamed (4 stages, pf_k 256) at 3.
    # Per kernel (call 5) 6.68-6.71 against 7.55-7.69 us at 24 rows, 8.83-8.86 against 9.61-9.82 at 48; in the step
    # (call 6, alternated twice) out_proj 6.59 against 7.39-7.45 us a layer at 24 rows, 9.70-9.73 against 10.91-10.94
    # at 48; the step 1551.7-1553.6 against 1596.3-1597.3 us at 24 rows, 1629.7-1630.2 against 1666.0-1672.6 at 32,
    # 2167.6-2168.0 against 2196.2-2197.3 at 48, equal at 1-16.
    ('residual', 2048, 2048): dict(
        block_k=128, split=8, chunks_per_split=2, bn=64, preload=True, warps=4, stages=1, pf_k=0,
        by_row_blocks={2: dict(bn=32), 3: dict(preload=False, stages=4, pf_k=256)}),
    # Llama-3.2-1B attention prologue (session 5, bench/results/session5/): preload bn 64, split 8 (192 programs of
    # 64 KB). call1/explore12.json: 7.87 / 8.07 us at 1 row against the default plan (stream, split 4) 10.4-10.8 us
    # and the session-4 prologue kernel 9.8-10.2 us in the same runs; call3/explore14.json (one row block per
    # program, epilogue inputs loaded where used): 8.04-8.11 us at 1 / 6 rows, 16.1-16.2 at 48 (bn 128: 8.1-8.2,
    # 19.2-19.4; stream bn 64 split 8: 8.9-9.1, 17.3-17.5)
    # Session 16 (call 5, `bench/explore/session16e.sh`): bn 32 (one rotary half a tile, mma.sync), 384 programs of
    # 32 KB with 124 registers (all 16 weight loads a thread in flight before the wait; the bn 64 plan's 72-register
    # programs interleave their 32 loads with the shared-memory stores: ~9 in flight). In the step
    # (explore26, alternated twice): the prologue 6.24-6.27 against 7.42 us a layer at 1 row; the step 962.2-962.3
    # against 977.4 us at 1 row, 1033.2-1033.7 against 1052.8-1055.0 at 6, 1133.8-1134.1 against 1149.8-1151.0 at 16,
    # but 2276.4-2280.0 against 2209.2-2213.4 at 48 (bn may not depend on the width: whether mma.sync (bn 32) and
    # wgmma (bn 64) give the same bits is untested; the 48-row logits checksums of both were equal). Per kernel
    # (PDL-chained) 7.81 / 8.11 / 17.50 against 7.84 / 7.98 / 16.02 us at 1 / 6 / 48 rows. Before, bn 64 split 8:
    # see above. Session 17: bn 64 again at 2-3 row blocks (17-48 rows). bn 32 and bn 64 gave the same bits in every
    # comparison (call 1, explore27 --bits: 1 / 6 / 17 / 48 rows, three seeds; see BN_BY_ROW_BLOCKS_KINDS), and in the
    # step (call 1, explore26, widths 1-48) bn 32 cost 15.3 against 9.3 us a layer at 24 rows (1707.6 against
    # 1598.1 us a step), 15.4 against 9.4 at 32 (1772.5 / 1674.5), 19.3 against 15.0 at 48 (2281.2 / 2212.2);
    # streaming at 2-3 row blocks instead was slower still (22.5 / 30.1 us a layer at 24 / 48 rows).
    ('qkv', 1536, 2048): dict(
        block_k=128, split=8, chunks_per_split=2, bn=32, preload=True, warps=4, stages=1, pf_k=0,
        by_row_blocks={2: dict(bn=64), 3: dict(bn=64)}),
    # Qwen3-30B-A3B out_proj with its RMSNorm epilogue (MoE layers): the default stream plan (bn 64, split 8), preloaded
    # at 1 row block (1-16 rows). Per kernel (the tuner, `preload_bn64_maxsplit`; session 12 call 3 and session 16
    # call 1): 8.97-9.14 against 10.74 us at 1 row, 9.31-9.33 against 10.88-10.89 at 6. In the step (session 16 call
    # 2, explore26, 4 layers, alternated twice): out_proj 7.98 against 10.83-10.99 us a layer at 1 row, but the decode
    # attention before it 9.25-9.34 against 6.90-7.07 (out_proj's preloading programs load beside its combine):
    # the step 455.4-455.7 against 459.3-460.7 us at 1 row, 799.1-799.5 against 803.0-803.9 at 6, equal at 16,
    # 5-10 us slower at 48 (so stream there). Same arithmetic (block_k / split / bn; equal logits checksums).
    ('out_proj', 2048, 4096): dict(
        block_k=128, split=8, chunks_per_split=4, bn=64, preload=False, warps=4, stages=4, pf_k=256,
        by_row_blocks={1: dict(preload=True, stages=1, pf_k=0)}),
    # Qwen3-30B-A3B attention prologue (session 5, same files): preload bn 64, split 8: 10.07-10.20 us at 1 / 6 rows,
    # 24.9-25.0 at 48 (call3), against the default (stream, split 2) 17.2-17.6 and the session-4 kernel 11.7-12.1 us
    # (23.3-23.5 at 48 rows: one row block per program too); block_k 64: 10.2-10.6 / 24.4-24.6
    ('qkv', 2560, 2048): dict(
        block_k=128, split=8, chunks_per_split=2, bn=64, preload=True, warps=4, stages=1, pf_k=0),
}

_ENV_TABLE = "LOWLAT_GEMV_PLANS"
_env_cache: dict[str, dict] = {}


def plans_from_json(doc) -> dict[tuple[str, int, int], dict]:
    """A plan table from the tuner's JSON: a list of {"kind", "n", "k", "plan": {fields}}."""
    table = {}
    for e in doc:
        fields = {f: e["plan"][f] for f in ("block_k", "split", "chunks_per_split", "bn", "preload", "warps",
                                            "stages", "pf_k")}
        fields["by_row_blocks"] = _row_block_fields(e["plan"].get("by_row_blocks", ()))
        table[(e["kind"], int(e["n"]), int(e["k"]))] = fields
    return table


def tuned_table() -> dict[tuple[str, int, int], dict]:
    """TUNED_PLANS, or the JSON table named by $LOWLAT_GEMV_PLANS (read once per path).

    Raises `UnsupportedConfigError` (field LOWLAT_GEMV_PLANS, the path) when the file cannot be read or
    is not a plan table (`plans_from_json`'s format)."""
    path = os.environ.get(_ENV_TABLE, "")
    if not path:
        return TUNED_PLANS
    if path not in _env_cache:
        try:
            with open(path) as f:
                _env_cache[path] = plans_from_json(json.load(f))
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise UnsupportedConfigError(_ENV_TABLE, path, f"not a readable GEMV plan table (the tuner's JSON: a "
                                         f"list of {{kind, n, k, plan}}): {type(e).__name__}: {e}") from None
    return _env_cache[path]


def plan_gemv(n: int, k: int, *, block_k: int | None = None, split: int | None = None, pair: bool = False,
              kind: str | None = None, bn: int | None = None, preload: bool | None = None,
              warps: int | None = None, stages: int | None = None, pf_k: int | None = None,
              table: dict | None = None) -> GemvPlan:
    """The plan of a GEMV of N outputs over K inputs.

    kind: one of KINDS (default "gate_up" when `pair`, else "residual"). With no field forced: the
    tuned table's entry for (kind, N, K) if any, else `default_plan`. Forced fields (block_k, split,
    bn, preload, warps, stages, pf_k) replace the default plan's; what is not forced is re-derived:
    the split of a preload plan is the smallest within the preload limits, a stream plan's
    `legacy_split` (lm_head: always 1); chunks are recounted so that no split is empty. Tests use
    this to exercise split-K and both modes at tiny shapes. table: a plan table to use instead of
    `tuned_table()`. Raises StepContractError for non-positive shapes or invalid fields.
    """
    if n <= 0 or k <= 0:
        raise StepContractError(f"GEMV shape N={n}, K={k} must be positive")
    kind = kind or ("gate_up" if pair else "residual")
    if kind not in KINDS:
        raise StepContractError(f"GEMV kind {kind!r} is not one of {KINDS}")
    pair = pair or kind in PAIR_KINDS
    forced = dict(block_k=block_k, split=split, bn=bn, preload=preload, warps=warps, stages=stages, pf_k=pf_k)
    forced = {f: v for f, v in forced.items() if v is not None}
    if not forced:
        entry = (tuned_table() if table is None else table).get((kind, n, k))
        if entry is not None:
            plan = _check_plan(GemvPlan(n=n, k=k, **entry), pair)
            refuse_bn_by_width(plan, kind, f"the {kind} GEMV {n}x{k}")
            return plan
        return default_plan(n, k, kind=kind, pair=pair)
    base = default_plan(n, k, kind=kind, pair=pair)
    pre = forced.get("preload", base.preload)
    bk = forced.get("block_k", base.block_k)
    if bk < 16 or not _pow2(bk):
        raise StepContractError(f"block_k={bk} must be a power of two >= 16")
    tile_n = forced.get("bn", base.bn)
    fields = dict(block_k=bk, bn=tile_n, preload=pre,
                  warps=forced.get("warps", base.warps if pre == base.preload else 4),
                  stages=forced.get("stages", 1 if pre else (4 if base.preload else base.stages)),
                  pf_k=forced.get("pf_k", 0 if pre else (base.pf_k if not base.preload else 2 * bk)))
    chunks = triton.cdiv(k, bk)
    if "split" in forced:
        if not 1 <= forced["split"] <= MAX_SPLIT:
            raise StepContractError(f"split={forced['split']} must be in 1..{MAX_SPLIT}")
        candidates = [forced["split"]]
    elif kind == "lm_head":
        candidates = [1]
    elif pre:
        candidates = list(range(1, MAX_SPLIT + 1))
    else:
        candidates = [legacy_split(n, k, bk, tile_n, pair)]
    for s_want in candidates:
        sp, cps = _split_for(chunks, s_want)
        plan = GemvPlan(n=n, k=k, split=sp, chunks_per_split=cps, **fields)
        if not pre or (plan.weight_bytes_per_program(pair) <= PRELOAD_MAX_BYTES
                       and plan.preload_smem(pair) <= PRELOAD_MAX_SMEM):
            break
    return _check_plan(plan, pair)


def candidate_plans(kind: str, n: int, k: int) -> list[tuple[str, GemvPlan]]:
    """Plans the tuner times for (kind, N, K), labelled, default first, without duplicates or plans
    that cannot run (preload beyond its limits, more than ~200 KB of pipelined shared memory)."""
    pair = kind in PAIR_KINDS
    out: list[tuple[str, GemvPlan]] = []

    def add(label, fn):
        try:
            p = fn()
        except StepContractError:
            return
        if not p.preload:
            smem = p.stages * ((2 if pair else 1) * p.bn * p.block_k * 2 + ROW_BLOCK * p.block_k * 2)
            if smem > 200 << 10:
                return
        if all(p != q for _, q in out):
            out.append((label, p))

    add("default", lambda: default_plan(n, k, kind=kind, pair=pair))
    add("legacy", lambda: legacy_plan(n, k, kind=kind, pair=pair))
    wbytes = n * k * 2 * (2 if pair else 1)
    kw = dict(kind=kind, pair=pair)
    if kind != "lm_head" and wbytes <= LATENCY_BYTES:
        add("preload_bn64_split1", lambda: plan_gemv(n, k, preload=True, bn=64, split=1, **kw))
        add("preload_bn64_maxsplit", lambda: plan_gemv(n, k, preload=True, bn=64, split=min(
            MAX_SPLIT, triton.cdiv(k, default_block_k(k))), **kw))
        add("stream_bn16_split1_deep", lambda: plan_gemv(n, k, preload=False, bn=16, split=1, stages=min(
            8, triton.cdiv(k, default_block_k(k)) + 1), pf_k=1024, **kw))
        add("stream_bn32_split1_deep", lambda: plan_gemv(n, k, preload=False, bn=32, split=1, stages=min(
            6, triton.cdiv(k, default_block_k(k)) + 1), pf_k=1024, **kw))
        # session 16: the whole slice into L2 before the wait, no split-K (split 1) or one arrival (split 2)
        for sp in (1, 2):
            add(f"stream_bn16_split{sp}_pfall", lambda sp=sp: plan_gemv(
                n, k, preload=False, bn=16, split=sp, stages=min(8, triton.cdiv(k, default_block_k(k)) + 1), pf_k=k,
                **kw))
    elif kind == "lm_head":
        add("stream_bn64_pf0", lambda: plan_gemv(n, k, preload=False, bn=64, pf_k=0, **kw))
        add("stream_bn128_w8_pf0", lambda: plan_gemv(n, k, preload=False, bn=128, warps=8, pf_k=0, **kw))
        add("stream_bn64_bk64_st6_pf0", lambda: plan_gemv(n, k, preload=False, bn=64, block_k=64, stages=6, pf_k=0,
                                                          **kw))
        add("preload_bn64", lambda: plan_gemv(n, k, preload=True, bn=64, **kw))
    else:
        add("stream_bn64_pf0", lambda: plan_gemv(n, k, preload=False, bn=64, pf_k=0, **kw))
        add("stream_bn128_bk64_w8_pf0", lambda: plan_gemv(n, k, preload=False, bn=128, block_k=64, warps=8,
                                                          pf_k=0, **kw))
    add("tuned", lambda: plan_gemv(n, k, **kw))              # the committed table's plan, timed in the same run
    if wbytes > LATENCY_BYTES:
        for label, fields in _wide_candidates(kind):
            add(label, lambda f=fields: plan_gemv(n, k, **f, **kw))
    return out


def _wide_candidates(kind: str) -> list[tuple[str, dict]]:
    """Extra stream-mode plans the tuner times for weights above LATENCY_BYTES (bandwidth regime).

    Shallower pipelines (stages 3) leave room on each SM for the next PDL-chained launch's programs,
    which then issue their L2 prefetch (pf_k) before `gdc_wait` while this launch drains; deeper ones
    keep more bytes in flight per program. lm_head: bn 128 with 4 or 8 warps, block_k 64 / 128.
    Others (split-K GEMVs such as Llama's down projection, K = 8192): bn 32 / 64 / 128, block_k
    64 / 128 / 256, split 4 / 8.
    """
    def f(bn, bk, warps, stages, pf_k, split=None):
        d = dict(preload=False, bn=bn, block_k=bk, warps=warps, stages=stages, pf_k=pf_k)
        if split is not None:
            d["split"] = split
        return d
    if kind == "lm_head":
        return [("w_bn128_bk64_w8_st3_pf0", f(128, 64, 8, 3, 0)),
                ("w_bn128_bk64_w8_st3_pf128", f(128, 64, 8, 3, 128)),
                ("w_bn128_bk64_w8_st3_pfall", f(128, 64, 8, 3, 1024)),
                ("w_bn128_bk64_w8_st4_pf64", f(128, 64, 8, 4, 64)),
                ("w_bn128_bk64_w8_st5_pf0", f(128, 64, 8, 5, 0)),
                ("w_bn128_bk128_w8_st2_pf0", f(128, 128, 8, 2, 0)),
                ("w_bn128_bk64_w4_st4_pf0", f(128, 64, 4, 4, 0)),
                ("w_bn64_bk64_w4_st3_pfall", f(64, 64, 4, 3, 1024)),
                # session 4: the 4-warp plan with a short L2 prefetch (one or two 64-column chunks per tile)
                ("w_bn128_bk64_w4_st4_pf64", f(128, 64, 4, 4, 64)),
                ("w_bn128_bk64_w4_st4_pf128", f(128, 64, 4, 4, 128))]
    return [("w_bn64_bk128_s8_st3_pf256", f(64, 128, 4, 3, 256, 8)),
            ("w_bn64_bk128_s8_st3_pfall", f(64, 128, 4, 3, 1024, 8)),
            ("w_bn64_bk128_s8_st3_pf0", f(64, 128, 4, 3, 0, 8)),
            ("w_bn64_bk128_s8_st5_pf256", f(64, 128, 4, 5, 256, 8)),
            ("w_bn64_bk256_s8_st2_pf256", f(64, 256, 4, 2, 256, 8)),
            ("w_bn64_bk64_s8_st6_pf256", f(64, 64, 4, 6, 256, 8)),
            ("w_bn128_bk128_w8_s8_st3_pf256", f(128, 128, 8, 3, 256, 8)),
            ("w_bn32_bk128_s8_st4_pf256", f(32, 128, 4, 4, 256, 8)),
            ("w_bn64_bk128_s4_st4_pf256", f(64, 128, 4, 4, 256, 4)),
            # round four (2026-12-01): deeper L2 prefetch before gdc_wait at the default depth (a third /
            # all of each program's 1024-column slice: 11 / 34 MB in flight while the previous launch
            # drains, within the 60 MB L2), 8 warps at bn 64, a deeper pipeline of smaller chunks, and
            # bn 128 with one warpgroup (what won on SmolLM2's LM head)
            ("w_bn64_bk128_s8_st4_pf512", f(64, 128, 4, 4, 512, 8)),
            ("w_bn64_bk128_s8_st4_pfall", f(64, 128, 4, 4, 1024, 8)),
            ("w_bn64_bk128_s8_w8_st4_pf256", f(64, 128, 8, 4, 256, 8)),
            ("w_bn64_bk64_s8_st8_pf256", f(64, 64, 4, 8, 256, 8)),
            ("w_bn128_bk64_s8_w4_st4_pf256", f(128, 64, 4, 4, 256, 8)),
            # round five (2026-12-01): split 4 (128 programs, one per SM at 80 KB of shared memory, so the
            # next PDL launch's programs fit beside them and issue their L2 prefetch early) measured fastest
            # once the finisher lost its counter-reset round trip (11.63 us); around it: deeper prefetch,
            # one more stage, 8 warps, other chunk widths
            ("w_bn64_bk128_s4_st4_pf512", f(64, 128, 4, 4, 512, 4)),
            ("w_bn64_bk128_s4_st4_pf1024", f(64, 128, 4, 4, 1024, 4)),
            ("w_bn64_bk128_s4_st5_pf256", f(64, 128, 4, 5, 256, 4)),
            ("w_bn64_bk128_s4_w8_st4_pf256", f(64, 128, 8, 4, 256, 4)),
            ("w_bn64_bk64_s4_st8_pf256", f(64, 64, 4, 8, 256, 4)),
            ("w_bn64_bk256_s4_st2_pf256", f(64, 256, 4, 2, 256, 4)),
            ("w_bn64_bk128_s4_st3_pf512", f(64, 128, 4, 3, 512, 4)),
            # round six (session 4): a shorter L2 prefetch than round five's pf 256 (deeper ones were slower)
            ("w_bn64_bk128_s4_st4_pf128", f(64, 128, 4, 4, 128, 4)),
            ("w_bn64_bk128_s4_st4_pf64", f(64, 128, 4, 4, 64, 4))]


@dataclass
class GemvWorkspace:
    """Scratch of the GEMV kernels, preallocated once (CUDA-graph capturable). Tiles are counted at
    the narrowest plan width (MIN_BLOCK_N), so one workspace serves every plan up to max_n columns.

    partials [MAX_SPLIT * 2 * max_n * 48] fp32  split-K partial tiles
    row_ss   [max_tiles * 48] fp32              per-tile sums of squares (out_proj's RMSNorm)
    split_ss [MAX_SPLIT * max_tiles * 48] fp32  per-(tile, split) sums of squares (gate/up's in-kernel norm)
    counters [3 * max_tiles + 2] int32          arrival counters, per tile (or per tile and row block: the
                                                attention prologue); every launch leaves them at 0
    keys     [48] int64                          argmax keys (lm_head); every launch leaves them at INT64_MIN
    """

    partials: torch.Tensor
    row_ss: torch.Tensor
    split_ss: torch.Tensor
    counters: torch.Tensor
    keys: torch.Tensor
    max_n: int

    @classmethod
    def create(cls, max_n: int, device: torch.device | str) -> "GemvWorkspace":
        tiles = triton.cdiv(max_n, MIN_BLOCK_N)
        return cls(partials=torch.empty(MAX_SPLIT * 2 * max_n * MAX_ROWS, dtype=torch.float32, device=device),
                   row_ss=torch.empty(tiles * MAX_ROWS, dtype=torch.float32, device=device),
                   split_ss=torch.empty(MAX_SPLIT * tiles * MAX_ROWS, dtype=torch.float32, device=device),
                   counters=torch.zeros(MAX_ROWS // ROW_BLOCK * tiles + 2, dtype=torch.int32, device=device),
                   keys=torch.full((MAX_ROWS,), torch.iinfo(torch.int64).min, dtype=torch.int64, device=device),
                   max_n=max_n)

    def check(self, n: int, what: str) -> None:
        if n > self.max_n:
            raise StepContractError(f"{what}: workspace made for N <= {self.max_n}, got N={n}")


def check_tensor(name: str, t: torch.Tensor, shape: tuple, dtype: torch.dtype, device: torch.device,
                 *, inner_contiguous: bool = True) -> None:
    """Raise StepContractError naming `name` unless t has this shape (None = any), dtype and device."""
    if not isinstance(t, torch.Tensor):
        raise StepContractError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != len(shape) or any(s is not None and s != ts for s, ts in zip(shape, t.shape)):
        want = "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
        raise StepContractError(f"{name} has shape {tuple(t.shape)}, expected {want}")
    if t.dtype != dtype:
        raise StepContractError(f"{name} must be {dtype}, got {t.dtype}")
    if t.device != device:
        raise StepContractError(f"{name} is on {t.device}, expected {device}")
    if inner_contiguous and t.dim() >= 1 and t.shape[-1] > 1 and t.stride(-1) != 1:
        raise StepContractError(f"{name} must be contiguous in its last dim (stride {t.stride()})")


def gemv_workspace(workspace, max_n: int, device: torch.device) -> "GemvWorkspace":
    """`workspace`, or a new `GemvWorkspace.create(max_n, device)` when it is None; raises StepContractError naming
    it when it is something else (a launcher reads its buffers' attributes)."""
    if workspace is None:
        return GemvWorkspace.create(max_n, device)
    if not isinstance(workspace, GemvWorkspace):
        raise StepContractError(f"workspace must be a GemvWorkspace or None, got {type(workspace).__name__}")
    return workspace


def require_plan(plan) -> None:
    """Raise StepContractError naming it unless `plan` is a GemvPlan (a launcher reads its fields)."""
    if not isinstance(plan, GemvPlan):
        raise StepContractError(f"plan must be a GemvPlan (`plan_gemv`) or None, got {type(plan).__name__}")


def check_plan_for(plan: GemvPlan, n: int, k: int, what: str) -> None:
    """Raise StepContractError unless `plan` is a GemvPlan made for N = n, K = k."""
    require_plan(plan)
    if (plan.n, plan.k) != (n, k):
        raise StepContractError(f"plan is for N={plan.n}, K={plan.k}; {what} is N={n}, K={k}")


def launch_constexprs(plan: GemvPlan, nmb: int, *, program_row_blocks: int | None = None) -> dict:
    """Tiling constexprs and launch options every GEMV kernel here takes for `plan` at a launch of nmb row blocks
    (`plan.at(nmb)`'s: the weight stream may depend on the row-block count, the arithmetic never does).
    program_row_blocks: row blocks one program computes, which set the stream loop's depth (default nmb; the
    attention prologue's programs take one row block each)."""
    plan = plan.at(nmb)
    stage_blocks = nmb if program_row_blocks is None else program_row_blocks
    return dict(SPLIT=plan.split, CPS=plan.chunks_per_split, BN=plan.bn, BK=plan.block_k, NUM_MB=nmb,
                EVEN_N=plan.even_n, EVEN_K=plan.even_k, PF_K=plan.prefetch_k, PRELOAD=plan.preload,
                num_warps=plan.warps, num_stages=1 if plan.preload else plan.stages_for(stage_blocks))


def valid_rows_tensor(num_valid_rows, m: int, device: torch.device) -> torch.Tensor:
    """num_valid_rows as a [1] int32 device tensor: a one-element int32 tensor on `device` is taken as is (read on
    the device), a Python int (not a bool) is checked against 1..M and converted. Raises StepContractError naming
    num_valid_rows and the value otherwise (a float, a string, a bool or a numpy integer is not an int)."""
    if isinstance(num_valid_rows, torch.Tensor):
        if num_valid_rows.numel() != 1 or num_valid_rows.dtype != torch.int32 or num_valid_rows.device != device:
            raise StepContractError(f"num_valid_rows tensor must be one int32 on {device}, got "
                                    f"{num_valid_rows.numel()} x {num_valid_rows.dtype} on {num_valid_rows.device}")
        return num_valid_rows.reshape(1)
    if isinstance(num_valid_rows, bool) or not isinstance(num_valid_rows, int):
        raise StepContractError(f"num_valid_rows must be an int or a one-element int32 tensor, got "
                                f"{num_valid_rows!r} ({type(num_valid_rows).__name__})")
    if not 1 <= num_valid_rows <= m:
        raise StepContractError(f"num_valid_rows={num_valid_rows} must be in 1..M={m}")
    return torch.tensor([num_valid_rows], dtype=torch.int32, device=device)


def require_tensors(**named) -> None:
    """Raise StepContractError naming the first argument (name=value) that is not a torch.Tensor. Launchers call it
    before they read any attribute (.shape, .device) of those arguments."""
    for name, t in named.items():
        if not isinstance(t, torch.Tensor):
            raise StepContractError(f"{name} must be a torch.Tensor, got {type(t).__name__}")


def check_eps(eps, name: str = "eps") -> float:
    """eps as a float; raises StepContractError naming it unless it is a real number (not a bool) with
    0 < eps < inf (NaN refused)."""
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real) or not 0 < eps < math.inf:
        raise StepContractError(f"{name}={eps!r} must be > 0 and finite (a float; got {type(eps).__name__})")
    return float(eps)


def check_rows_apart(name: str, t: torch.Tensor) -> None:
    """Raise StepContractError naming the output `name` when t ([M, N], stride 1 along N, as `check_tensor`
    requires) has M > 1 rows that share memory: a row stride below N (0 for a broadcast `expand`), where the rows
    of a kernel's output would overwrite one another."""
    if t.dim() == 2 and t.shape[0] > 1 and t.stride(0) < t.shape[1]:
        raise StepContractError(f"{name}'s rows overlap (row stride {t.stride(0)} < N={t.shape[1]}): every row of "
                                "an output needs memory of its own")


def same_view(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether a and b address the same elements at the same indices: one device, data_ptr, dtype and shape, and
    equal strides along every dim of size > 1 (e.g. `out is residual`, or another view of exactly its memory)."""
    return (a.device == b.device and a.data_ptr() == b.data_ptr() and a.dtype == b.dtype and a.shape == b.shape
            and all(sa == sb for n, sa, sb in zip(a.shape, a.stride(), b.stride()) if n > 1))


def refuse_aliasing(writes: dict, reads: dict, why: str, *, in_place: dict | None = None) -> None:
    """Raise StepContractError naming both tensors when a tensor a launch writes (writes: name -> tensor) overlaps
    (`_attn_common.overlap`: byte spans, strides included) a tensor it reads (reads: name -> tensor) or another
    tensor it writes; None entries are skipped. why: the reason, formatted with {a} (the written tensor) and {b}.
    in_place: {written name: (read names, ...)} pairs allowed where the two are the same view (`same_view`: each
    element read and then written by the program that owns it); any other overlap of such a pair is refused."""
    allowed = in_place or {}
    outs = [(a, ta) for a, ta in writes.items() if ta is not None]
    for i, (a, ta) in enumerate(outs):
        for b, tb in reads.items():
            if tb is None or not overlap(ta, tb):
                continue
            if b in allowed.get(a, ()):
                if same_view(ta, tb):
                    continue
                raise StepContractError(f"{a} overlaps {b} without being the same view of it: {a} may be {b} "
                                        f"itself (an in-place update), no other overlap")
            raise StepContractError(f"{a} overlaps {b}: " + why.format(a=a, b=b))
        for b, tb in outs[i + 1:]:
            if overlap(ta, tb):
                raise StepContractError(f"{a} overlaps {b}: both are outputs of this call")


# ---------------------------------------------------------------------------------------------- device
@triton.jit
def weight_rows(rn, HALF_ROWS: tl.constexpr = 0):
    """Weight row of each output row rn of a tile. HALF_ROWS 0: rn itself. HALF_ROWS > 0 (rotary pairs,
    the attention prologue): output row rn is rotary index rn % HALF_ROWS of head rn // HALF_ROWS in a
    weight whose heads are 2 * HALF_ROWS consecutive rows, so its row is the lower half's,
    rn + (rn // HALF_ROWS) * HALF_ROWS, and the partner row (the upper half) lies HALF_ROWS rows further."""
    if HALF_ROWS == 0:
        return rn
    else:
        return rn + (rn // HALF_ROWS) * HALF_ROWS


@triton.jit
def prefetch_l2(w_ptr, stride_wn, n0, N, k_begin, K, BN: tl.constexpr, PF_K: tl.constexpr,
                HALF_ROWS: tl.constexpr = 0):
    """Prefetch rows n0..n0+BN (`weight_rows`), columns k_begin..min(k_begin+PF_K, K) of a bf16 weight
    into L2: one `prefetch.global.L2` per 128-byte line, PREDICATED off for the lines outside the weight
    (rows >= N, columns >= K). GPU only (inline asm): call under USE_PDL.

    Session 10 (bench/results/session10/call7, `bench/explore/explore21.py`): the masked lanes used to
    prefetch `w_ptr` itself, so with PF_K above K (SmolLM2's out_proj: PF_K 1024, K 576, 7 of 16 lines
    masked) every program hammered one L2 line; in the step at 6 rows that launch cost 7.9 us instead of
    2.7 (the whole step 854 -> 716 us without its prefetch)."""
    rn = n0 + tl.arange(0, BN)
    rk = k_begin + tl.arange(0, PF_K // 64) * 64
    ok = (rn < N)[:, None] & (rk < K)[None, :]
    ptrs = w_ptr + weight_rows(rn, HALF_ROWS)[:, None] * stride_wn + rk[None, :]      # masked lanes: never read
    tl.inline_asm_elementwise("{ .reg .pred p; setp.ne.b32 p, $2, 0; @p prefetch.global.L2 [$1]; } // $0",
                              "=r,l,r", [ptrs, ok.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def prep_x(xt, nw, rstd, XMODE: tl.constexpr, UPCAST: tl.constexpr):
    """The dot operand from a raw x^T tile [BK, 16] (bf16) and its per-row sum of squares.

    XMODE 0: x as is.  XMODE 1: exact RMSNorm on load with a known rstd [16]: nw * bf16(x * rstd),
    rounded to bf16 (reference rms_norm's rounding order).  XMODE 2: bf16(nw * x) and the partial sum
    of squares of x (the caller scales its accumulator by rstd afterwards: the factored RMSNorm).
    Returns (operand [BK, 16] bf16, or fp32 under UPCAST; ss [16] fp32, zeros unless XMODE 2).
    """
    ss = tl.zeros((16,), dtype=tl.float32)
    if XMODE == 0:
        if UPCAST:
            op = xt.to(tl.float32)
        else:
            op = xt
    else:
        xf = xt.to(tl.float32)
        if XMODE == 1:
            y = to_bf16(xf * rstd[None, :], UPCAST).to(tl.float32)
            o = to_bf16(nw[:, None] * y, UPCAST)
        else:
            ss = tl.sum(xf * xf, axis=0)
            o = to_bf16(nw[:, None] * xf, UPCAST)
        if UPCAST:
            op = o.to(tl.float32)
        else:
            op = o
    return op, ss


@triton.jit
def x_operand(x_ptr, stride_xm, m0, M, rk, kmask, nw, rstd,
              XMODE: tl.constexpr, EVEN_K: tl.constexpr, UPCAST: tl.constexpr):
    """Load x^T [BK, 16] of rows m0..m0+15 at columns rk (masked by kmask unless EVEN_K) and make the
    dot operand (`prep_x`). Returns (operand, ss)."""
    rm = m0 + tl.arange(0, 16)
    if EVEN_K:
        msk = (rm < M)[None, :]
    else:
        msk = kmask[:, None] & (rm < M)[None, :]
    xt = tl.load(x_ptr + rm[None, :] * stride_xm + rk[:, None], mask=msk, other=0.0)
    return prep_x(xt, nw, rstd, XMODE, UPCAST)


@triton.jit
def mma(w, xop, acc, UPCAST: tl.constexpr):
    if UPCAST:
        return tl.dot(w, xop, acc, input_precision="ieee")
    else:
        return tl.dot(w, xop, acc)


@triton.jit
def gemv_loop(w_ptr, w2_off, stride_wn, x_ptr, stride_xm, M, N, n0, k_begin, K,
              nw_ptr, rstd0, rstd1, rstd2,
              BN: tl.constexpr, BK: tl.constexpr, CPS: tl.constexpr, NUM_MB: tl.constexpr, TWO_W: tl.constexpr,
              XMODE: tl.constexpr, EVEN_N: tl.constexpr, EVEN_K: tl.constexpr, UPCAST: tl.constexpr,
              HALF_ROWS: tl.constexpr = 0):
    """Stream mode. acc_j[BN, 16] = W[n0:n0+BN, kr] @ x[16j:16j+16, kr]^T, kr = the CPS chunks of BK
    columns from k_begin (columns >= K masked unless EVEN_K), for row blocks j < NUM_MB; with TWO_W
    also the same for the weight rows at w_ptr + w2_off (gate/up pairs, rotary halves). Weight rows
    are `weight_rows(n0 + i, HALF_ROWS)`. The trip count is a compile-time constant (Triton pipelines
    the loop `num_stages` deep).

    Returns (a0, a1, a2, b0, b1, b2, s0, s1, s2): a = first weight, b = second weight, s = sums of
    squares of each row block (XMODE 2); unused ones are zeros and are optimised away.
    """
    rn = n0 + tl.arange(0, BN)
    nmask = rn < N
    wr = weight_rows(rn, HALF_ROWS)
    a0 = tl.zeros((BN, 16), dtype=tl.float32)
    a1 = tl.zeros((BN, 16), dtype=tl.float32)
    a2 = tl.zeros((BN, 16), dtype=tl.float32)
    b0 = tl.zeros((BN, 16), dtype=tl.float32)
    b1 = tl.zeros((BN, 16), dtype=tl.float32)
    b2 = tl.zeros((BN, 16), dtype=tl.float32)
    s0 = tl.zeros((16,), dtype=tl.float32)
    s1 = tl.zeros((16,), dtype=tl.float32)
    s2 = tl.zeros((16,), dtype=tl.float32)
    for c in range(CPS):
        rk = k_begin + c * BK + tl.arange(0, BK)
        kmask = rk < K
        wp = w_ptr + wr[:, None] * stride_wn + rk[None, :]
        if EVEN_N and EVEN_K:
            w = tl.load(wp)
            if TWO_W:
                w2 = tl.load(wp + w2_off)
        else:
            wm = nmask[:, None] & kmask[None, :]
            w = tl.load(wp, mask=wm, other=0.0)
            if TWO_W:
                w2 = tl.load(wp + w2_off, mask=wm, other=0.0)
        if UPCAST:
            w = w.to(tl.float32)
            if TWO_W:
                w2 = w2.to(tl.float32)
        nw = tl.zeros((BK,), dtype=tl.float32)
        if XMODE != 0:
            if EVEN_K:
                nw = tl.load(nw_ptr + rk).to(tl.float32)
            else:
                nw = tl.load(nw_ptr + rk, mask=kmask, other=0.0).to(tl.float32)
        x0, q0 = x_operand(x_ptr, stride_xm, 0, M, rk, kmask, nw, rstd0, XMODE, EVEN_K, UPCAST)
        a0 = mma(w, x0, a0, UPCAST)
        if TWO_W:
            b0 = mma(w2, x0, b0, UPCAST)
        s0 += q0
        if NUM_MB > 1:
            x1, q1 = x_operand(x_ptr, stride_xm, 16, M, rk, kmask, nw, rstd1, XMODE, EVEN_K, UPCAST)
            a1 = mma(w, x1, a1, UPCAST)
            if TWO_W:
                b1 = mma(w2, x1, b1, UPCAST)
            s1 += q1
        if NUM_MB > 2:
            x2, q2 = x_operand(x_ptr, stride_xm, 32, M, rk, kmask, nw, rstd2, XMODE, EVEN_K, UPCAST)
            a2 = mma(w, x2, a2, UPCAST)
            if TWO_W:
                b2 = mma(w2, x2, b2, UPCAST)
            s2 += q2
    return a0, a1, a2, b0, b1, b2, s0, s1, s2


@triton.jit
def _load_w_chunk(w_ptr, stride_wn, rn, nmask, rk, k_end, EVEN_N: tl.constexpr, EVEN_K: tl.constexpr,
                  UPCAST: tl.constexpr, HALF_ROWS: tl.constexpr):
    ptrs = w_ptr + weight_rows(rn, HALF_ROWS)[:, None] * stride_wn + rk[None, :]
    if EVEN_N and EVEN_K:
        w = tl.load(ptrs)
    else:
        w = tl.load(ptrs, mask=nmask[:, None] & (rk < k_end)[None, :], other=0.0)
    if UPCAST:
        w = w.to(tl.float32)
    return w


@triton.jit
def preload_weights(w_ptr, stride_wn, n0, N, k_begin, k_end, BN: tl.constexpr, BK: tl.constexpr,
                    CPS: tl.constexpr, EVEN_N: tl.constexpr, EVEN_K: tl.constexpr, UPCAST: tl.constexpr,
                    HALF_ROWS: tl.constexpr = 0):
    """Preload mode: weight rows of outputs n0..n0+BN (`weight_rows`) over the program's CPS chunks of
    BK columns from k_begin (columns >= k_end masked unless EVEN_K), as a tuple of CPS tiles [BN, BK].
    Every load is issued at once; call it before `gdc_wait` (weights never depend on the previous kernel)."""
    rn = n0 + tl.arange(0, BN)
    nmask = rn < N
    ws = ()
    for c in tl.static_range(CPS):
        rk = k_begin + c * BK + tl.arange(0, BK)
        ws = ws + (_load_w_chunk(w_ptr, stride_wn, rn, nmask, rk, k_end, EVEN_N, EVEN_K, UPCAST, HALF_ROWS),)
    return ws


@triton.jit
def _load_x_chunks(x_ptr, stride_xm, m0, M, k_begin, k_end, BK: tl.constexpr, CPS: tl.constexpr,
                   EVEN_K: tl.constexpr):
    """Raw x^T tiles [BK, 16] (bf16) of rows m0..m0+15 over the CPS chunks, as a tuple."""
    rm = m0 + tl.arange(0, 16)
    xs = ()
    for c in tl.static_range(CPS):
        rk = k_begin + c * BK + tl.arange(0, BK)
        if EVEN_K:
            msk = (rm < M)[None, :]
        else:
            msk = (rk < k_end)[:, None] & (rm < M)[None, :]
        xs = xs + (tl.load(x_ptr + rm[None, :] * stride_xm + rk[:, None], mask=msk, other=0.0),)
    return xs


@triton.jit
def _load_nw_chunks(nw_ptr, k_begin, k_end, BK: tl.constexpr, CPS: tl.constexpr, XMODE: tl.constexpr,
                    EVEN_K: tl.constexpr):
    nws = ()
    for c in tl.static_range(CPS):
        rk = k_begin + c * BK + tl.arange(0, BK)
        nw = tl.zeros((BK,), dtype=tl.float32)
        if XMODE != 0:
            if EVEN_K:
                nw = tl.load(nw_ptr + rk).to(tl.float32)
            else:
                nw = tl.load(nw_ptr + rk, mask=rk < k_end, other=0.0).to(tl.float32)
        nws = nws + (nw,)
    return nws


@triton.jit
def _sum_squares(xs, CPS: tl.constexpr):
    """Per-row sum of squares of x over the chunks of a row block, chunk by chunk in K order."""
    ss = tl.zeros((16,), dtype=tl.float32)
    for c in tl.static_range(CPS):
        xf = xs[c].to(tl.float32)
        ss += tl.sum(xf * xf, axis=0)
    return ss


@triton.jit
def _chunk_dots(ws, vs, xs, nws, rstd, a, b, CPS: tl.constexpr, TWO_W: tl.constexpr, XMODE: tl.constexpr,
                UPCAST: tl.constexpr):
    """One row block: a += W x^T (and b += V x^T with TWO_W) chunk by chunk in K order."""
    for c in tl.static_range(CPS):
        op, q = prep_x(xs[c], nws[c], rstd, XMODE, UPCAST)
        a = mma(ws[c], op, a, UPCAST)
        if TWO_W:
            b = mma(vs[c], op, b, UPCAST)
    return a, b


@triton.jit
def _row_block(ws, vs, nws, x_ptr, stride_xm, m0, M, k_begin, k_end, rstd, BN: tl.constexpr, BK: tl.constexpr,
               CPS: tl.constexpr, TWO_W: tl.constexpr, XMODE: tl.constexpr, EVEN_K: tl.constexpr,
               UPCAST: tl.constexpr):
    xs = _load_x_chunks(x_ptr, stride_xm, m0, M, k_begin, k_end, BK, CPS, EVEN_K)
    ss = tl.zeros((16,), dtype=tl.float32)
    if XMODE == 2:          # the statistic first: it uses every chunk, so all the loads issue together
        ss = _sum_squares(xs, CPS)
    a = tl.zeros((BN, 16), dtype=tl.float32)
    b = tl.zeros((BN, 16), dtype=tl.float32)
    a, b = _chunk_dots(ws, vs, xs, nws, rstd, a, b, CPS, TWO_W, XMODE, UPCAST)
    return a, b, ss


@triton.jit
def preload_product(ws, vs, x_ptr, stride_xm, M, k_begin, k_end, nw_ptr, r0, r1, r2,
                    BN: tl.constexpr, BK: tl.constexpr, CPS: tl.constexpr, NUM_MB: tl.constexpr,
                    TWO_W: tl.constexpr, XMODE: tl.constexpr, EVEN_K: tl.constexpr, UPCAST: tl.constexpr):
    """Preload mode, after `gdc_wait`: the preloaded weight chunks `ws` (and `vs` with TWO_W) times x
    over the program's K range, row block by row block. A row block's activation loads (all chunks)
    are issued before its first dot, so they cost one round trip; with XMODE 2 its sum of squares is
    taken over the raw chunks first, in chunk order. Chunks are accumulated in K order, as the stream
    loop does. Returns what `gemv_loop` returns."""
    nws = _load_nw_chunks(nw_ptr, k_begin, k_end, BK, CPS, XMODE, EVEN_K)
    z = tl.zeros((BN, 16), dtype=tl.float32)
    zs = tl.zeros((16,), dtype=tl.float32)
    a1, a2, b1, b2, s1, s2 = z, z, z, z, zs, zs
    a0, b0, s0 = _row_block(ws, vs, nws, x_ptr, stride_xm, 0, M, k_begin, k_end, r0, BN, BK, CPS, TWO_W, XMODE,
                            EVEN_K, UPCAST)
    if NUM_MB > 1:
        a1, b1, s1 = _row_block(ws, vs, nws, x_ptr, stride_xm, 16, M, k_begin, k_end, r1, BN, BK, CPS, TWO_W,
                                XMODE, EVEN_K, UPCAST)
    if NUM_MB > 2:
        a2, b2, s2 = _row_block(ws, vs, nws, x_ptr, stride_xm, 32, M, k_begin, k_end, r2, BN, BK, CPS, TWO_W,
                                XMODE, EVEN_K, UPCAST)
    return a0, a1, a2, b0, b1, b2, s0, s1, s2


@triton.jit
def store_partial(ws_ptr, acc, slot, N, MP: tl.constexpr, n0, m0, BN: tl.constexpr, EVEN_N: tl.constexpr):
    """ws[slot, n, m] = acc[n - n0, m - m0] for a [BN, 16] tile (workspace rows of MP = 16*NUM_MB). Unless
    EVEN_N, only the columns n < N: a last tile past N would otherwise write its (zero) columns into the
    next slot, over another split's (or gate/up's up) partial of tile 0."""
    rn = n0 + tl.arange(0, BN)
    rm = m0 + tl.arange(0, 16)
    ptrs = ws_ptr + slot * N * MP + rn[:, None] * MP + rm[None, :]
    if EVEN_N:
        tl.store(ptrs, acc)
    else:
        tl.store(ptrs, acc, mask=(rn < N)[:, None])


@triton.jit
def sum_partials(ws_ptr, first_slot, N, MP: tl.constexpr, n0, m0, BN: tl.constexpr, SPLIT: tl.constexpr,
                 SLOT_STRIDE: tl.constexpr, EVEN_N: tl.constexpr):
    """sum over s = 0..SPLIT-1, in that order, of ws[first_slot + s * SLOT_STRIDE, tile] (read from L2;
    unless EVEN_N, columns n >= N, never written, read as 0)."""
    rn = n0 + tl.arange(0, BN)
    rm = m0 + tl.arange(0, 16)
    offs = rn[:, None] * MP + rm[None, :]
    tot = tl.zeros((BN, 16), dtype=tl.float32)
    for s in tl.static_range(SPLIT):
        if EVEN_N:
            tot += tl.load(ws_ptr + (first_slot + s * SLOT_STRIDE) * N * MP + offs, cache_modifier=".cg")
        else:
            tot += tl.load(ws_ptr + (first_slot + s * SLOT_STRIDE) * N * MP + offs, mask=(rn < N)[:, None],
                           other=0.0, cache_modifier=".cg")
    return tot


@triton.jit
def rstd_of(ss, K, eps, EXACT: tl.constexpr = False):
    """1 / sqrt(mean(x^2) + eps) from a row's sum of squares over its K columns (K an int or int constexpr).

    EXACT: every step correctly rounded (div.rn mean, sqrt.rn, div.rn reciprocal), as torch's mean / rsqrt on
    the CPU: `kernels/rms_norm.py`, whose output is compared bit for bit with the bf16 reference, uses it.
    Otherwise the mean is Triton's `ss / K`, an approximate divide on sm_90 (div.full.f32, <= 2 ulp): the
    norm-folding GEMVs (the prologue and its QK-norm, gate/up, LM head, out_proj's h, the TP layer) use it,
    because their outputs are judged by the numerics policy (one bf16 rounding dominates) and the correctly
    rounded mean cost those launches 0.2-1.0 us each in the SmolLM2 step (session 11,
    bench/results/session11/call2: 605 -> 648 us a step at 1 row).
    """
    if EXACT:
        mean = tl.div_rn(ss, tl.zeros_like(ss) + K)
    else:
        mean = ss / K
    return tl.div_rn(1.0, tl.sqrt_rn(mean + eps))


@triton.jit
def store_split_ss(sss_ptr, ss, pid_n, pid_k, m0, SPLIT: tl.constexpr):
    """Store this (tile, split)'s per-row sums of squares; the finisher reads every split's."""
    rm = m0 + tl.arange(0, 16)
    tl.store(sss_ptr + (pid_n * SPLIT + pid_k) * 48 + rm, ss)


@triton.jit
def sum_split_ss(sss_ptr, pid_n, m0, SPLIT: tl.constexpr):
    """sum over s = 0..SPLIT-1, in that order, of the stored sums of squares of tile pid_n."""
    rm = m0 + tl.arange(0, 16)
    tot = tl.zeros((16,), dtype=tl.float32)
    for s in tl.static_range(SPLIT):
        tot += tl.load(sss_ptr + (pid_n * SPLIT + s) * 48 + rm, cache_modifier=".cg")
    return tot


# ---------------------------------------------------------------------------------------------- argmax keys
@triton.jit
def float_order_bits(x):
    """The monotone int32 image of fp32 x: for non-NaN a, b, a < b iff image(a) < image(b), with -0.0 canonicalised
    to +0.0 first (the zeros are equal). The high half of `argmax_key`, and of the MoE route's int32 keys
    (`moe._route_key32`)."""
    b = tl.where(x == 0.0, 0.0, x).to(tl.int32, bitcast=True)
    return tl.where(b < 0, b ^ 0x7FFFFFFF, b)


@triton.jit
def argmax_key(x, ids):
    """int64 keys that sort like (value descending, token id ascending), unique per token: (order-preserving
    int32 image of the fp32 value) << 32 | (2^32 - 1 - id). The max over a set is its largest value with
    the lowest id (-0.0 is canonicalised to +0.0 first, so the zeros tie as in torch.argmax); max is
    order-free, so an argmax across programs by `atomic_max` or by merging is exact whatever the arrival
    order (the LM head's and the draft sampler's epilogues). NaN logits are not given torch.argmax's meaning:
    a NaN with the sign bit clear sorts above +inf, one with it set below -inf (the interpreter's default
    NaN is negative; the GPU's is positive)."""
    s = float_order_bits(x)
    low = (ids.to(tl.uint32) ^ 0xFFFFFFFF).to(tl.int64)      # larger for smaller ids
    return (s.to(tl.int64) << 32) | low


@triton.jit
def key_value(key):
    """The fp32 value an `argmax_key` encodes."""
    s = (key >> 32).to(tl.int32)
    b = tl.where(s < 0, s ^ 0x7FFFFFFF, s)
    return b.to(tl.float32, bitcast=True)


@triton.jit
def key_id(key):
    """The token id (int32) an `argmax_key` encodes."""
    return (key.to(tl.uint32) ^ 0xFFFFFFFF).to(tl.int32)
