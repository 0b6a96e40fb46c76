"""Session 27: the held attention prologue's sum of squares without its own cross-warp reduction.

Until session 27 `lowlat/kernels/attn_prologue_held.py` reduced each row block's sum of squares of x over its 4 K
slices (one a warp) with `gl.sum` across warps (shared memory and barriers of its own), then stored the mma partials
to shared memory, waited on a barrier and added the slices. "ss_smem" stores each warp's partial sum of squares beside
its mma partials and adds the 4 in slice order after the same barrier: one cross-warp pass instead of two after the
wait (NOTES session 25's hypothesis for the last ~0.2 us at 1 row). Session 27's call 4 ran this script when the
production kernel was the two-pass form ("production" in bench/results/session27/call4/explore36.json) and
"ss_smem" was made from it by text replacement; the kernel has been "ss_smem" since, and the script now makes
"two_pass" from it by the reverse replacement (`two_pass_source`). Timed at Llama-3.2-1B's shapes per kernel like
`bench/bench_attn_prologue.py` (a CUDA graph over rotated cold copies, PDL on, g multiplied in registers as FusedModel
runs it), A B B A; the q outputs compared (bitwise in call 4).

    python bench/explore/explore36.py --out results.json
"""

from __future__ import annotations

import argparse
import json

import torch

from _common import module_from_source  # noqa: E402 (puts the repository on sys.path)
from lowlat.benchmarking import graph_time_us, rotation_copies
from lowlat.config import preset
from lowlat.kernels import attn_prologue_held as prod
from lowlat.kernels.attn_prologue import pack_qkv, rope_table
from lowlat.weights import random_layer_weights

OLD_SS = '''        ss = gl.sum(gl.sum(xf * xf, axis=1), axis=0)                                # [RB]
'''
NEW_SS = '''        ssw = gl.sum(xf * xf, axis=1)
'''
OLD_STORE = '''        part.store(acc)
        gl.thread_barrier()
'''
NEW_STORE = '''        part.store(acc)
        ssp.store(ssw)
        gl.thread_barrier()
'''
OLD_RSTD = '''        rstd = gl.expand_dims(gl.convert_layout(1.0 / gl.sqrt(ss / K + eps), gl.SliceLayout(0, LE)), 0)
'''
NEW_RSTD = '''        ss2 = ssp.slice(0, 1, dim=0).load(LE)
        for sl in gl.static_range(1, S):                                            # the slices in order
            ss2 += ssp.slice(sl, 1, dim=0).load(LE)
        rstd = 1.0 / gl.sqrt(ss2 / K + eps)                                         # [1, RB]
'''
OLD_ALLOC = '''    part = gl.allocate_shared_memory(gl.float32, [S, 16, RB], gl.SwizzledSharedLayout(1, 1, 1, [2, 1, 0]))
'''
NEW_ALLOC = OLD_ALLOC + '''    ssp = gl.allocate_shared_memory(gl.float32, [S, RB], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
'''
EDITS = ((OLD_SS, NEW_SS), (OLD_STORE, NEW_STORE), (OLD_RSTD, NEW_RSTD), (OLD_ALLOC, NEW_ALLOC))
ADOPTED_COMMENT = '''        # each warp's share of the statistic [S, RB], stored beside its mma partials and added in slice order after
        # the same barrier: one cross-warp pass after the wait, not a reduction of its own first (session 27,
        # explore36: q observed bitwise equal to the two-pass form's, -0.05 / -0.1 / -0.3 us at 1 / 6 / 16 rows; its
        # slice order need not be the cross-warp gl.sum's, so equal bits are not guaranteed, and nothing relies on them)
'''


def ss_smem_source(src: str) -> str:
    """The two-pass source with the edits applied (what call 4 measured and session 27 adopted)."""
    for old, new in EDITS:
        assert src.count(old) == 1, f"not the two-pass source: {old!r}"
        src = src.replace(old, new)
    return src


def two_pass_source(src: str) -> str:
    """The session-27 production source with the edits undone (the comment above `ssw` dropped with them)."""
    src = src.replace(ADOPTED_COMMENT, "")
    for old, new in EDITS:
        assert src.count(new) == 1, f"the production source changed: {new!r}"
        src = src.replace(new, old)
    return src


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1,6,16")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    mods = {"two_pass": module_from_source("aph_two_pass", two_pass_source(open(prod.__file__).read())), "ss_smem": prod}
    dev = torch.device("cuda")
    cfg = preset("Llama-3.2-1B")
    lw = random_layer_weights(cfg.replace(intermediate_size=16), generator=torch.Generator().manual_seed(0), device=dev)
    w0 = pack_qkv(lw)
    table = rope_table(cfg, 4096, dev)
    hq, hkv, d, h = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.hidden_size
    r = rotation_copies(w0.numel() * 2)
    ws = [w0.clone() for _ in range(r)]
    results = []
    for m in [int(x) for x in args.rows.split(",")]:
        xs = [torch.randn(m, h, device=dev).bfloat16() for _ in range(r)]
        kc = torch.zeros(r * m + 1, hkv, d, dtype=torch.bfloat16, device=dev)
        vc = torch.zeros_like(kc)
        locs = [torch.arange(1 + i * m, 1 + (i + 1) * m, dtype=torch.int32, device=dev) for i in range(r)]
        pos = torch.randint(0, 4096, (m,), device=dev)
        qs = {v: [torch.empty(m, hq, d, dtype=torch.bfloat16, device=dev) for _ in range(r)] for v in mods}

        def fn(v):
            return lambda i: mods[v].attn_prologue_held(xs[i % r], ws[i % r], lw.attn_norm, pos, locs[i % r], m, kc,
                                                        vc, table, cfg=cfg, out_q=qs[v][i % r], use_pdl=True)

        for v in mods:
            fn(v)(0)
        torch.cuda.synchronize()
        a, b = qs["two_pass"][0].float(), qs["ss_smem"][0].float()
        rel = ((a - b).abs() / a.abs().clamp_min(1e-3)).max().item()
        times = {v: [] for v in mods}
        for v in ["two_pass", "ss_smem", "ss_smem", "two_pass"]:
            times[v].append(graph_time_us(fn(v), max(r, 8)))
        line = " ".join(f"{v} {min(t):.2f}/{max(t):.2f}" for v, t in times.items())
        print(f"  r{m:<3} us (min/max of 2) {line} | q bitwise {torch.equal(a, b)} max rel diff {rel:.3g}", flush=True)
        results.append(dict(rows=m, us=times, q_bitwise=torch.equal(a, b), q_max_rel_diff=rel))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, model=cfg.name,
                           results=results), f, indent=1)


if __name__ == "__main__":
    main()
