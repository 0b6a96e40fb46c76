"""Session 25: the attention prologue (RMSNorm -> QKV -> RoPE -> KV write) as explore33's register-held mma GEMV.

The 70% target's last 1-row misses are the attention prologues (NOTES "Left"): production's prologue (a split-K pair
GEMV of `_gemv`) takes ~7.4-7.8 us for Llama-3.2-1B's 12.6 MB of QKV weights (~40% of copy bandwidth), its split-K
arrival, partial loads and epilogue chained after the wait. Explore33 (session 24) held a residual GEMV's weights in
registers across the wait as mma.sync A operands (Gluon) and reached 65-72% at 1 row with one round trip after the
wait. This is the same GEMV with the prologue's epilogue, so that a whole prologue is measured, not a bare GEMV.

Per program: 8 RoPE pairs of one head (pair rows p0..p0+7, p0 = 8 program_id; head hd = p0 // (D/2), rotary index j0 +
i), i.e. 16 weight rows: tile row t < 8 is the lower-half row hd D + j0 + t of the packed QKV weight (`pack_qkv`:
Wq | Wk | Wv), tile row t + 8 its upper-half partner D/2 rows further. In the mma.sync accumulator a thread holds rows
r and r + 8 together, so each RoPE pair meets in one program (the epilogue moves the [16, RB] tile through 1 KB of
shared memory to split it into its halves). The GEMV is explore33's: Q warps, K cut into S slices held as A [S, 16,
K / S] (k_width 8: 16-byte loads), after the wait x^T as B [S, K / S, RB] per block of RB rows, one batched mma_v2,
the slices' sum (`gl.sum`), then

    rstd = 1 / sqrt(sum_k x^2 / K + eps)                         (fp32, from the same x registers)
    lo, hi = rstd * sum_k W'[lo | hi row, k] x[k]                W' = bf16(W g) (FOLD 1) or the dot of W with bf16(x g)
    q, k heads: (lo cos - hi sin, hi cos + lo sin)               cos / sin: `attn_prologue.rope_table` rows at positions
    q -> out_q [M, Hq, D] (every row); k, v -> k_cache / v_cache [out_cache_loc] (rows < num_valid_rows)

FOLD 1 multiplies the RMSNorm weight g into the held weights before the wait (no register cost after it; one more
bf16 rounding of W g where production rounds x g); FOLD 0 loads g with x after the wait and rounds x g to bf16 as
production does (`kernels/attn_prologue.py`). No bias, no QK-norm: the Llama family's prologue. Qwen3's QK-norm needs
a whole head's 2 D outputs in one program (D 128: 512 KB of weights at H 2048, twice a register file), so it is not
expressible with one round trip this way. The same instructions for every M: a row's output is independent of M
(row invariant; GPU test), not production's bits.

MODE / EARLY as explore31's `pdl_point` (2: weights loaded before the wait; EARLY 1: dependents released at the start).
Timed as the per-kernel benches time the prologue (`bench_attn_prologue.py`'s "fused_pdl": PDL-chained over rotating
cold copies, its `bytes_moved` floor) beside the production prologue in the same run; every variant first compared
with the float64 reference (`reference.attn_prologue`), outputs poisoned.

Measured (session 25, H200, best of two rounds, us; bench/results/session25/call2-3, session25b.sh / session25c.sh):
Llama-3.2-1B at 1 / 6 / 16 / 48 rows, the production prologue 7.83 / 8.15 / 8.27 / 16.16 (38.4% of copy bandwidth
at 1 row) in call 3's run.

    | tiling (warps, slices, FOLD, INP, EPI) | 1 row | 6 rows | 16 rows | 48 rows |
    | --- | --- | --- | --- | --- |
    | 4, 4, 1, 0, 0 (call 2's best)          | 4.75  | 5.06   | 7.02    | 15.08   |
    | 4, 4, 1, 1, 1                          | 4.47 (67.2%) | 4.75 | 6.58 | 13.75 |
    | 4, 8, 1, 1, 1                          | 6.17  | 6.12   | 6.43    | 13.92   |
    | 4, 4, 0, 1, 1 (x g rounded, as production) | 4.78 | 4.95 | 7.31  | 16.52   |

Call 2: 8 warps 6.9-8.4 us at 1 row (174 registers: one program an SM, two waves of 192 programs); dependents
released at the start slower (5.52 against 4.66). The 4 / 4 / 1 / 1 / 1 form became `lowlat/kernels/
attn_prologue_held.py` (FusedModel's default where the model allows it).

    python bench/explore/explore34.py --out $OUT/explore34.json [--budget-s 240] [--rows 1 6 16 48]
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))          # _common, also when imported as explore.explore34
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))      # bench_attn_prologue
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from _common import explore_main, t_us  # noqa: E402
from explore31 import pdl_point  # noqa: E402

import torch  # noqa: E402
from triton.experimental import gluon  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402
from triton.experimental.gluon.language.nvidia.ampere import mma_v2  # noqa: E402

from lowlat.kernels._gemv import _pow2  # noqa: E402

PAIRS = 8       # RoPE pairs a program: 16 weight rows, the mma's m
MAX_POS = 4096
#: (warps, K slices, rows a block, FOLD, INP, EPI) per K. Call 2 (session 25, INP 0 / EPI 0): best 4 / 4 (4.66 us at
#: 1 row, 64%) and 4 / 8 (4.81); 8 warps slower everywhere (174 registers: one program an SM, and 192 programs take two
#: waves), FOLD 0 ~1 us slower at 1 row (4 / 8: 255 registers, 56 bytes spilled), dependents released at the start
#: slower (5.52). Call 3: the first two again beside the epilogue's inputs before the wait (INP) and one barrier fewer
#: (EPI); FOLD 0 with both fits 250 registers, no spill.
CONFIGS = {2048: [(4, 4, 8, 1, 0, 0), (4, 8, 8, 1, 0, 0), (4, 4, 8, 1, 1, 0), (4, 4, 8, 1, 0, 1), (4, 4, 8, 1, 1, 1),
                  (4, 8, 8, 1, 1, 1), (4, 4, 8, 0, 1, 1)]}


@gluon.jit
def _rope_inputs(pos_ptr, loc_ptr, tab_ptr, erow, M, nvr, j, D: gl.constexpr, HALF: gl.constexpr):
    """Rows erow's KV slots (int64, 0 past M or num_valid_rows) and the cos / sin [8, RB] of rotary indices j at their
    positions (0 past M)."""
    emok = erow < M
    pos = gl.load(pos_ptr + erow, mask=emok, other=0)
    loc = gl.load(loc_ptr + erow, mask=emok & (erow < nvr), other=0).to(gl.int64)
    emask = gl.expand_dims(emok, 0) & gl.expand_dims(j >= 0, 1)
    tab = tab_ptr + gl.expand_dims(pos, 0) * D + gl.expand_dims(j, 1)
    return loc, gl.load(tab, mask=emask, other=0.0), gl.load(tab + HALF, mask=emask, other=0.0)


@gluon.jit
def _held_prologue_kernel(x_ptr, w_ptr, g_ptr, tab_ptr, pos_ptr, loc_ptr, q_ptr, kc_ptr, vc_ptr, M, nvr, Hq, Hkv,
                          eps, K: gl.constexpr, D: gl.constexpr, Q: gl.constexpr, S: gl.constexpr,
                          NMB: gl.constexpr, RB: gl.constexpr, MODE: gl.constexpr, EARLY: gl.constexpr,
                          FOLD: gl.constexpr, INP: gl.constexpr = 0, EPI: gl.constexpr = 0):
    """See the module docstring. x [M, K] bf16, w [(Hq + 2 Hkv) D, K] bf16 (`pack_qkv`), g [K] bf16, tab [P, D] fp32
    (`rope_table`), pos [M] int64, loc [M] int32, q [M, Hq, D] bf16, k / v caches [slots, Hkv, D] bf16, all contiguous;
    grid (Hq + 2 Hkv) D / 16 programs of Q warps; S K slices (a multiple of Q), RB rows a block (8 / 16), NMB = ceil(M
    / RB) row blocks (a launch constexpr). INP 1: the first row block's positions, slots and cos / sin loaded before
    the wait (step inputs no launch of the step writes). EPI 0: the slices summed by `gl.sum`, the [16, RB] sum split
    into its RoPE halves through shared memory; 1: every slice's [16, RB] partial to shared memory and each half
    summed from there in slice order (one barrier fewer)."""
    HALF: gl.constexpr = D // 2
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[Q, 1, 1], instr_shape=[1, 16, 8])
    LA: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=8)
    LB: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=MMA, k_width=8)
    LE3: gl.constexpr = gl.BlockedLayout([1, 1, 1], [1, 4, 8], [1, Q, 1], [2, 1, 0])   # [1, 8, RB]: a half
    LE: gl.constexpr = gl.SliceLayout(0, LE3)                                       # [8, RB]
    KQ: gl.constexpr = K // S
    p0 = gl.program_id(0) * 8
    hd = p0 // HALF                                   # head of the packed weight: q heads, then k, then v
    j0 = p0 % HALF
    aq = gl.arange(0, S, layout=gl.SliceLayout(1, gl.SliceLayout(2, LA)))
    at = gl.arange(0, 16, layout=gl.SliceLayout(0, gl.SliceLayout(2, LA)))
    ak = gl.arange(0, KQ, layout=gl.SliceLayout(0, gl.SliceLayout(1, LA)))
    wrow = hd * D + j0 + at % 8 + (at // 8) * HALF
    acol = gl.expand_dims(gl.expand_dims(aq, 1), 2) * KQ + gl.expand_dims(gl.expand_dims(ak, 0), 1)   # [S, 1, KQ]
    aoff = gl.expand_dims(gl.expand_dims(wrow, 0), 2) * K + acol
    bq = gl.arange(0, S, layout=gl.SliceLayout(1, gl.SliceLayout(2, LB)))
    bk = gl.arange(0, KQ, layout=gl.SliceLayout(0, gl.SliceLayout(2, LB)))
    bm = gl.arange(0, RB, layout=gl.SliceLayout(0, gl.SliceLayout(1, LB)))
    bcol = gl.expand_dims(gl.expand_dims(bq, 1), 2) * KQ + gl.expand_dims(gl.expand_dims(bk, 0), 2)   # [S, KQ, 1]
    boff = gl.expand_dims(gl.expand_dims(bm, 0), 1) * K + bcol
    ti = gl.arange(0, 8, layout=gl.SliceLayout(1, LE))
    tm = gl.arange(0, RB, layout=gl.SliceLayout(0, LE))
    jj = gl.expand_dims(j0 + ti, 1)
    if EPI:
        part = gl.allocate_shared_memory(gl.float32, [S, 16, RB], gl.SwizzledSharedLayout(1, 1, 1, [2, 1, 0]))
    else:
        part = gl.allocate_shared_memory(gl.float32, [1, 16, RB], gl.SwizzledSharedLayout(1, 1, 1, [2, 1, 0]))
    is_q = hd < Hq
    is_v = hd >= Hq + Hkv
    pdl_point(MODE, EARLY, 1)
    w = gl.load(w_ptr + aoff)                                                       # held: [S, 16, KQ] in LA
    if FOLD:
        w = (w.to(gl.float32) * gl.load(g_ptr + acol + 0 * aoff).to(gl.float32)).to(gl.bfloat16)
    if INP:
        loc0, cos0, sin0 = _rope_inputs(pos_ptr, loc_ptr, tab_ptr, tm, M, nvr, j0 + ti, D, HALF)
    pdl_point(MODE, EARLY, 2)
    for b in gl.static_range(NMB):
        brow = b * RB + bm
        bmask = gl.expand_dims(gl.expand_dims(brow < M, 0), 1) & (boff >= 0)
        xb = gl.load(x_ptr + b * RB * K + boff, mask=bmask, other=0.0)
        erow = b * RB + tm
        if INP and b == 0:
            loc, cos, sin = loc0, cos0, sin0
        else:
            loc, cos, sin = _rope_inputs(pos_ptr, loc_ptr, tab_ptr, erow, M, nvr, j0 + ti, D, HALF)
        xf = xb.to(gl.float32)
        ss = gl.sum(gl.sum(xf * xf, axis=1), axis=0)                                # [RB]
        if FOLD:
            xg = xb
        else:
            xg = (xf * gl.load(g_ptr + bcol + 0 * boff).to(gl.float32)).to(gl.bfloat16)
        acc = mma_v2(w, xg, gl.zeros([S, 16, RB], gl.float32, MMA))
        if b > 0:
            gl.thread_barrier()                                                     # the last block's reads done
        if EPI:
            part.store(acc)
        else:
            part.store(gl.expand_dims(gl.sum(acc, axis=0), 0))                      # [1, 16, RB]: lo rows, then hi
        gl.thread_barrier()
        lo3 = gl.zeros([1, 8, RB], gl.float32, LE3)
        hi3 = gl.zeros([1, 8, RB], gl.float32, LE3)
        for sl in gl.static_range(S if EPI else 1):
            lo3 += part.slice(sl, 1, dim=0).slice(0, 8, dim=1).load(LE3)
            hi3 += part.slice(sl, 1, dim=0).slice(8, 8, dim=1).load(LE3)
        rstd = gl.expand_dims(gl.convert_layout(1.0 / gl.sqrt(ss / K + eps), gl.SliceLayout(0, LE)), 0)
        lo = gl.sum(lo3, axis=0) * rstd                                             # (a size-1 axis: exact)
        hi = gl.sum(hi3, axis=0) * rstd
        rlo = gl.where(is_v, lo, lo * cos - hi * sin).to(gl.bfloat16)
        rhi = gl.where(is_v, hi, hi * cos + lo * sin).to(gl.bfloat16)
        emask = gl.expand_dims(erow < M, 0) & gl.expand_dims(ti >= 0, 1)
        qp = q_ptr + gl.expand_dims(erow, 0).to(gl.int64) * (Hq * D) + hd * D + jj
        gl.store(qp, rlo, mask=emask & is_q)
        gl.store(qp + HALF, rhi, mask=emask & is_q)
        wmask = emask & gl.expand_dims(erow < nvr, 0) & (hd >= Hq)
        kvh = gl.where(is_v, hd - Hq - Hkv, hd - Hq)
        kvp = gl.where(is_v, vc_ptr, kc_ptr) + gl.expand_dims(loc, 0) * (Hkv * D) + kvh * D + jj
        gl.store(kvp, rlo, mask=wmask)
        gl.store(kvp + HALF, rhi, mask=wmask)


def launch_held_prologue(x, w, g, table, positions, out_cache_loc, num_valid_rows: int, q, k_cache, v_cache, *,
                         eps: float, warps: int, slices: int, rb: int = 8, fold: int = 1, inp: int = 0, epi: int = 0,
                         mode: int = 2, early: int = 0):
    """The attention prologue of the Llama family (no bias, no QK-norm) on explore33's register-held mma GEMV.

    x [M, H] bf16 (M 1..48), w [N, H] bf16 (`attn_prologue.pack_qkv`, N = (Hq + 2 Hkv) D), g [H] bf16 (the RMSNorm
    weight), table [P, D] fp32 (`attn_prologue.rope_table`), positions [M] int64 in 0..P-1, out_cache_loc [M] int32,
    num_valid_rows 0..M, q [M, Hq, D] bf16 (written, every row), k_cache / v_cache [slots, Hkv, D] bf16 (written at
    out_cache_loc[:num_valid_rows]); all contiguous on one CUDA device. H cut into `slices` K slices (a power of two,
    a multiple of `warps`) of a power of two >= 16 columns; rows in blocks of rb (8 / 16); fold 1: g multiplied into
    the held weights before the wait, 0: x g rounded to bf16 after it; inp 1: the first row block's positions, slots
    and cos / sin loaded before the wait; epi 0 / 1: the kernel's EPI; mode / early as explore31's `pdl_point`. Follows
    `lowlat.reference.attn_prologue.attn_prologue` (HF Llama's RMSNorm, rotate_half RoPE).

    Raises ValueError naming the value for: M outside 1..48; warps / slices not powers of two or slices not a multiple
    of warps; H / slices not a power of two >= 16; D not a power of two in 16..256; N not (Hq + 2 Hkv) D; rb, fold,
    inp, epi, mode, early out of range; num_valid_rows outside 0..M; a tensor of another shape, dtype or device, or not
    contiguous. Values of positions / out_cache_loc are not checked (a device read)."""
    m, hidden = x.shape
    hkv, d = k_cache.shape[1], k_cache.shape[2]
    hq = q.shape[1] if q.dim() == 3 else -1
    n = w.shape[0]
    checks = [
        (1 <= m <= 48, f"M {m} must lie in 1..48"),
        (_pow2(warps), f"warps {warps} must be a power of two"),
        (_pow2(slices) and slices % warps == 0, f"slices {slices} must be a power of two and a multiple of {warps} "
                                                f"warps"),
        (hidden % slices == 0 and _pow2(hidden // slices) and hidden // slices >= 16,
         f"H {hidden} must be {slices} slices of a power of two >= 16 columns"),
        (_pow2(d) and 16 <= d <= 256, f"head_dim {d} must be a power of two in 16..256"),
        (n == (hq + 2 * hkv) * d, f"N {n} must be (Hq {hq} + 2 Hkv {hkv}) x head_dim {d}"),
        (rb in (8, 16), f"rb {rb} must be 8 or 16"),
        (fold in (0, 1) and inp in (0, 1) and epi in (0, 1), f"fold {fold}, inp {inp}, epi {epi} must be 0 or 1"),
        (mode in (0, 1, 2) and early in (0, 1), f"mode {mode} must be 0 / 1 / 2 and early {early} 0 / 1"),
        (0 <= num_valid_rows <= m, f"num_valid_rows {num_valid_rows} must lie in 0..{m}"),
    ]
    slots = k_cache.shape[0]
    for t, name, shape, dtype in ((x, "x", (m, hidden), torch.bfloat16), (w, "w", (n, hidden), torch.bfloat16),
                                  (g, "g", (hidden,), torch.bfloat16), (table, "table", (table.shape[0], d),
                                                                       torch.float32),
                                  (positions, "positions", (m,), torch.int64),
                                  (out_cache_loc, "out_cache_loc", (m,), torch.int32),
                                  (q, "q", (m, hq, d), torch.bfloat16), (k_cache, "k_cache", (slots, hkv, d),
                                                                          torch.bfloat16),
                                  (v_cache, "v_cache", (slots, hkv, d), torch.bfloat16)):
        checks.append((tuple(t.shape) == shape and t.dtype == dtype and t.is_contiguous() and t.device == w.device,
                       f"{name} {tuple(t.shape)} {t.dtype} on {t.device} must be a contiguous {dtype} {shape} on "
                       f"{w.device}"))
    for ok, msg in checks:
        if not ok:
            raise ValueError(f"held prologue: {msg}")
    _held_prologue_kernel[(n // 16,)](x, w, g, table, positions, out_cache_loc, q, k_cache, v_cache, m,
                                      num_valid_rows, hq, hkv, eps, K=hidden, D=d, Q=warps, S=slices,
                                      NMB=(m + rb - 1) // rb, RB=rb, MODE=mode, EARLY=early, FOLD=fold, INP=inp, EPI=epi,
                                      num_warps=warps, launch_pdl=mode > 0)


def oracle(x, w, g, positions, out_cache_loc, nvr, hkv, d, slots, cfg):
    """The float64 reference (`reference.attn_prologue`): q [M, Hq, D] and the k / v caches [slots, Hkv, D]."""
    from lowlat.reference.attn_prologue import attn_prologue as ref
    from lowlat.reference.rope import rope_inv_freq

    inv = rope_inv_freq(d, cfg.rope_theta, cfg.rope_scaling, torch.float64).to(x.device)
    kc = torch.zeros(slots, hkv, d, dtype=torch.float64, device=x.device)
    vc = torch.zeros_like(kc)
    q = ref(x.double(), w.double(), None, g.double(), None, None, positions, out_cache_loc, nvr, kc, vc, inv,
            eps=cfg.rms_eps)
    return q, kc, vc


def close(got, want) -> tuple[float, bool]:
    """(max |got - want|, ok): a bf16 output within 2^-7 of the largest |want| (explore's `check_and_time` bound:
    one bf16 rounding plus fp32 sums); NaN fails."""
    err = (got.double() - want).abs().max().item()
    return err, bool(err <= 2 ** -7 * want.abs().max().item()) and not got.isnan().any().item()


def prologue(rec, deadline, reps: int, rows):
    """Llama-3.2-1B's prologue: production (`attn_prologue`, PDL) and each held tiling, same run, same inputs."""
    from bench_attn_prologue import bytes_moved

    from lowlat.benchmarking import rotation_copies
    from lowlat.config import preset
    from lowlat.kernels.attn_prologue import attn_prologue, make_prologue_workspace, pack_qkv, rope_table
    from lowlat.weights import random_layer_weights

    dev = torch.device("cuda")
    name = "Llama-3.2-1B"
    cfg = preset(name)
    hq, hkv, d, h = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.hidden_size
    gen = torch.Generator().manual_seed(34)
    lw = random_layer_weights(cfg.replace(intermediate_size=16, num_experts=0, top_k=0, moe_intermediate_size=0),
                              generator=gen, device=dev)
    w0 = pack_qkv(lw)
    g = lw.attn_norm
    table = rope_table(cfg, MAX_POS, dev)
    nc = rotation_copies(w0.numel() * 2)
    ws = [w0.clone() for _ in range(nc)]
    wsp = make_prologue_workspace(w0, d)
    for r in rows:
        xs = [torch.randn(r, h, device=dev).bfloat16() for _ in range(nc)]
        pos = torch.randint(0, MAX_POS, (r,), device=dev)
        slots = nc * r + 1
        kc = torch.zeros(slots, hkv, d, dtype=torch.bfloat16, device=dev)
        vc = torch.zeros_like(kc)
        locs = [torch.arange(1 + i * r, 1 + (i + 1) * r, dtype=torch.int32, device=dev) for i in range(nc)]
        qs = [torch.empty(r, hq, d, dtype=torch.bfloat16, device=dev) for _ in range(nc)]
        nbytes = bytes_moved(cfg, r)
        wq, wk, wv = oracle(xs[0], w0, g, pos, locs[0], r, hkv, d, slots, cfg)
        loc0 = locs[0].long()

        def check(entry, launch):
            qs[0].fill_(float("nan"))
            kc[loc0] = float("nan")
            vc[loc0] = float("nan")
            launch(0)
            torch.cuda.synchronize()
            errs = [close(qs[0], wq), close(kc[loc0], wk[loc0]), close(vc[loc0], wv[loc0])]
            return dict(entry, max_err=round(max(e for e, _ in errs), 5), ok=all(ok for _, ok in errs)), qs[0].clone()

        def production(i):
            attn_prologue(xs[i], ws[i], None, g, None, None, pos, locs[i], r, kc, vc, table, cfg=cfg, out_q=qs[i],
                          workspace=wsp, use_pdl=True)
        variants = [None] + CONFIGS[h]
        prod_q = None
        for rep in range(reps):
            for tiling in variants:
                if time.time() > deadline:
                    return

                def one(tiling=tiling):
                    nonlocal prod_q
                    base = dict(op="prologue", model=name, rows=r, rep=rep)
                    if tiling is None:
                        launch = production
                        base.update(variant="production", plan=wsp.plan.describe())
                    else:
                        qq, sl, rb, fold, inp, epi = tiling

                        def launch(i):
                            launch_held_prologue(xs[i], ws[i], g, table, pos, locs[i], r, qs[i], kc, vc,
                                                 eps=cfg.rms_eps, warps=qq, slices=sl, rb=rb, fold=fold, inp=inp,
                                                 epi=epi, mode=2, early=0)
                        base.update(variant="held", warps=qq, slices=sl, rb=rb, fold=fold, inp=inp, epi=epi, mode=2,
                                    early=0)
                    entry, q0 = check(base, launch)
                    if tiling is None:
                        prod_q = q0
                    elif prod_q is not None:
                        entry["max_diff_from_production_q"] = round((q0.double() - prod_q.double()).abs().max()
                                                                    .item(), 5)
                    us = t_us(launch, nc, 41)
                    rec(dict(entry, us=us, floor_us=round(nbytes / rec.bw * 1e6, 2),
                             pct_of_copy=round(100 * nbytes / rec.bw / (us * 1e-6), 1)))
                rec.guard(f"{name}/r{r}/{tiling}", one, op="prologue", rows=r)
        del xs, kc, vc, qs
        torch.cuda.empty_cache()


def main():
    explore_main([1, 6, 16, 48], [("prologue", prologue)])


if __name__ == "__main__":
    main()
