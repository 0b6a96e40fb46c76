"""Session 39: explore56's paced weight stream in Qwen3-30B-A3B's held prologue with the cluster QK-norm (explore44's
one-wave form: `fold_attn_norm`'s weights, maxnreg 168, 320 programs in 396 slots, a head's 8 programs one cluster).

explore44's form is Qwen3's fastest prologue at 1 row (7.97-8.07 us on the H200, 9.86-9.89 on the H100; 70% of copy
bandwidth needs 7.20 / 10.10) and the split-K prologue FusedModel runs takes 9.71-9.89 / 11.14-11.47. explore56
paced the Llama prologue's weight loads (a window of K chunks in flight a thread) and released the next launch at
the start: x's loads, issued after the wait, then queue behind fewer weight requests. Here the same edits
(`explore56.paced_source`) on explore44's kernel (`explore44.qk_norm_source`). Every variant is checked against the
float64 reference at the numerics policy (`explore44.accuracy_verdict`), every element written.

    split_k              FusedModel's prologue for Qwen3 (kernels/attn_prologue.py)
    cluster              explore44's held_cluster_folded_r168 (released after the wait)
    cluster_early        the same released at the start
    cluster_c{CH}w{WIN}_{early|late}[_x2]   paced (explore56's variant names)

    python bench/explore/explore57.py --rows 1,6 --out e57.json
    env -u TRITON_INTERPRET .venv/bin/python bench/explore/explore57.py --sm90     # CPU: registers / spills
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from lowlat.kernels import attn_prologue_held as aph  # noqa: E402

DEFAULT_VARIANTS = ("split_k,cluster,cluster_early,cluster_c8w2_early,cluster_c8w2_late,cluster_c16w4_early,"
                    "cluster_c16w4_late")


def source(v: str) -> tuple[str, bool]:
    """(the kernel module's source, released early) of a held variant."""
    from explore44 import qk_norm_source
    from explore56 import CAP, paced_source, parse_variant

    src = qk_norm_source(open(aph.__file__).read())
    if v in ("cluster", "cluster_early"):
        return src, v == "cluster_early"
    ch, win, early, whole_x, fold_g, capped = parse_variant(v[len("cluster_"):])
    assert not fold_g and capped, "folded weights under maxnreg 168 only (explore44's one-wave form)"
    return paced_source(src, ch, win, whole_x, False, CAP), early


def prologs(variants: list) -> dict:
    """{held variant: an explore44 ClusterProlog on folded weights, maxnreg 168, running the variant's source}."""
    from _common import module_from_source
    from explore44 import ClusterProlog

    out = {}
    for v in variants:
        if v == "split_k":
            continue
        src, early = source(v)
        p = ClusterProlog(fold_g=False, maxnreg=168, release="early" if early else "late")
        p.mod = module_from_source(f"e57_{v}", src)
        out[v] = p
    return out


def device_run(rows: list, rounds: int, out: str | None, variants: list) -> None:
    from _common import prologue_rows, times_line, write_results
    from explore44 import checked_times, nan_outputs, qwen3_copies, split_k_launch

    dev = torch.device("cuda")
    cfg, lw, w0, table, inv, r, ws, wfs, pws = qwen3_copies(dev)
    n, h = w0.shape[0], cfg.hidden_size
    held = prologs(variants)
    scratch = torch.full((n // 16 * 6 * 8,), float("nan"), device=dev)
    results = []
    for m in rows:
        xs, pos, locs = prologue_rows(m, h, r, dev)
        kcs, vcs, qs = nan_outputs(variants, r, m, cfg, dev)
        fns = {}
        for v in variants:
            if v == "split_k":
                fns[v] = split_k_launch((xs, pos, locs), ws, lw, m, kcs, vcs, qs, table, cfg, pws)
            else:
                fns[v] = (lambda p, v: lambda i: p(xs[i % r], wfs[i % r], None, lw.q_norm, lw.k_norm, pos,
                                                   locs[i % r], m, kcs[v], vcs[v], table, cfg, qs[v][i % r],
                                                   scratch))(held[v], v)
        written, verdict, times = checked_times(fns, r, m, kcs, vcs, qs, (xs, pos), w0, lw, inv, cfg, rounds)
        print(f"  r{m:<3} us (min/max of {2 * rounds}) {times_line(times)} | every element written {written} | "
              f"{verdict}", flush=True)
        results.append(dict(rows=m, us=times, every_element_written=written, accuracy=verdict))
        torch.cuda.empty_cache()
    write_results(out, results, explore="explore57", model=cfg.name, rounds=rounds,
                  launch="per-kernel bench (rotated cold copies, PDL on; held forms as clusters of 8)")


def sm90_rows(variants: list, rows: list) -> None:
    """sm_90 compile (CPU) of each held variant at each width (explore46's Qwen3 spec with the QK-norm arguments;
    `zero` 16-divisible as 0 is): registers and spills."""
    import os
    import tempfile

    from _common import module_from_source
    from explore46 import sm90_spec
    from llama_prologue_sm90 import compiled_row

    tmp = tempfile.mkdtemp()
    for v in variants:
        if v == "split_k":
            continue
        src, early = source(v)
        mod = module_from_source(f"e57s_{v}", src)
        for m in rows:
            spec = sm90_spec(m, True)
            spec["constexprs"]["EARLY_RELEASE"] = early
            if v.startswith("cluster_c"):
                spec["divisible"].append("zero")
            compiled_row(mod._held_prologue_kernel, spec, os.path.join(tmp, f"{v}_{m}"), variant=v, rows=m)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1,6")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--variants", default=DEFAULT_VARIANTS)
    ap.add_argument("--sm90", action="store_true")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    rows = [int(x) for x in a.rows.split(",")]
    if a.sm90:
        sm90_rows(a.variants.split(","), rows)
    else:
        device_run(rows, a.rounds, a.out, a.variants.split(","))


if __name__ == "__main__":
    main()
