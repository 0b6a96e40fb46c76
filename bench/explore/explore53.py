"""Session 38: Qwen3-30B-A3B's attention prologue (QK-norm, D 128) with its weights held in SHARED MEMORY by TMA and
each head's 8 programs launched as one thread-block cluster that exchanges the rows' partial sums of squares.

explore51 (session 38, H100) measured the chain's structure at Qwen3's packed QKV shape (21 MB) with a stand-in
kernel: weights held in shared memory by TMA 7.73-7.82 us a launch (7.40-7.48 released at the start), in registers
8.50-8.76, against a floor of 7.07 (70% needs 10.10 on that card); the production split-K prologue takes 11.1-11.6
there. explore52 put the Llama prologue's work on the TMA structure (`kernel_source`: weights `tma_weight`'s, x in
chunks all loaded first); this applies explore44's QK-norm edits (the norm weights before the wait; after the
slices' sum and x's rstd a q / k program stores its rows' partial sums of squares, the cluster syncs, the head's 8
partials are added in program order, y rstd_head q_norm|k_norm before RoPE) to that kernel and launches it as
clusters of 8 (explore44's `launch_clustered`: a prototype's patch of Triton's launch metadata, not production's).
320 programs of 64 KB shared memory and 136-140 registers (`--sm90`): 3 an SM, one wave.

Variants (1 / 6 / 16 rows, per kernel as the bench times it: rotated cold weight copies, PDL, A B .. B A):
    split_k      the production split-K prologue (FusedModel's for Qwen3)
    reg_cluster  explore44's one-wave form: weights in registers (folded, maxnreg 168), the same exchange
    tma_late     this kernel, the next launch released after the wait
    tma_early    released at the program's start
Each is checked against the float64 reference at the numerics policy (explore44's `accuracy_verdict`) with every
element written (NaN-filled before).

Measured (session 38 call 7 H100, call 13 H200): not taken. 1 row H200 tma_late 8.43-8.55 against split_k 9.71-9.89
and reg_cluster 7.97-8.07 (7.20 needed); H100 10.08-10.15 / 11.14-11.47 / 9.86-9.89; 16 rows (H100) 16.7 against 11.5.

    python bench/explore/explore53.py --rows 1,6,16 --out e53.json
    env -u TRITON_INTERPRET .venv/bin/python bench/explore/explore53.py --sm90     # CPU: sm_90 compile
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from explore44 import EDITS, HELPERS  # noqa: E402
from explore52 import BK, kernel_source, sm90_spec, tma_descriptor, tma_weight  # noqa: E402

VARIANTS = ("split_k", "reg_cluster", "tma_late", "tma_early")
NS = 2048 // (4 * BK)          # K 2048, 4 slices


def qk_tma_source() -> str:
    """explore52's kernel (production's statistic: x's whole block, 4 slices) with explore44's QK-norm edits."""
    src = kernel_source(NS, True)
    head = "\n\n@gluon.jit\ndef _tma_prologue_kernel("
    edits = [(head, HELPERS.replace("def _held_prologue_kernel(", "def _tma_prologue_kernel("))] + EDITS[1:]
    for old, new in edits:
        assert src.count(old) == 1, f"explore52's kernel changed: {old!r}"
        src = src.replace(old, new)
    return src


_MOD = []


def qk_tma_kernel():
    if not _MOD:
        from _common import module_from_source

        _MOD.append(module_from_source("e53_qk_tma", qk_tma_source()))
    return _MOD[0]._tma_prologue_kernel


class TmaClusterProlog:
    """The QK-norm TMA kernel launched as clusters of 8 (`explore44.launch_clustered`)."""

    def __init__(self, rel: int):
        self.rel, self.clustered = rel, set()

    def __call__(self, x, desc, qn, kn, pos, loc, m, kc, vc, table, cfg, out_q, scratch):
        from explore44 import launch_clustered

        n = desc.shape[1]
        args = (x, desc, table, pos, loc, loc, m, out_q, out_q.stride(0), out_q.stride(1), kc, kc.stride(0),
                kc.stride(1), vc, vc.stride(0), vc.stride(1), m, out_q.shape[1], kc.shape[1], table.shape[0],
                float(cfg.rms_eps), qn, kn, scratch)
        kw = dict(K=x.shape[1], D=cfg.head_dim, NMB=(m + 7) // 8, NVR_FROM_PTR=False, USE_PDL=True, REL=self.rel,
                  Q=4, S=4, RB=8, BK=BK, num_warps=4, launch_pdl=True)
        launch_clustered(qk_tma_kernel(), n // 16, m, self.clustered, args, kw)
        return out_q


def device_run(rows: list, rounds: int, out: str | None) -> None:
    from _common import prologue_rows, times_line, write_results
    from explore44 import ClusterProlog, checked_times, nan_outputs, qwen3_copies
    from lowlat.kernels.attn_prologue import attn_prologue

    dev = torch.device("cuda")
    cfg, lw, w0, table, inv, r, ws, wfs, pws = qwen3_copies(dev)
    n, d, h = w0.shape[0], cfg.head_dim, cfg.hidden_size
    tws = [tma_weight(w, lw.attn_norm, d) for w in ws]
    descs = [tma_descriptor(w) for w in tws]
    reg = ClusterProlog(fold_g=False, maxnreg=168)
    tma = {"tma_late": TmaClusterProlog(1), "tma_early": TmaClusterProlog(0)}
    scratch = torch.full((n // 16 * 6 * 8,), float("nan"), device=dev)
    results = []
    for m in rows:
        xs, pos, locs = prologue_rows(m, h, r, dev)
        kcs, vcs, qs = nan_outputs(VARIANTS, r, m, cfg, dev)
        fns = {"split_k": lambda i: attn_prologue(xs[i % r], ws[i % r], None, lw.attn_norm, lw.q_norm, lw.k_norm,
                                                  pos, locs[i % r], m, kcs["split_k"], vcs["split_k"], table,
                                                  cfg=cfg, out_q=qs["split_k"][i % r], workspace=pws, use_pdl=True),
               "reg_cluster": lambda i: reg(xs[i % r], wfs[i % r], lw.attn_norm, lw.q_norm, lw.k_norm, pos,
                                            locs[i % r], m, kcs["reg_cluster"], vcs["reg_cluster"], table, cfg,
                                            qs["reg_cluster"][i % r], scratch)}
        for v, prolog in tma.items():
            fns[v] = (lambda i, v=v, prolog=prolog: prolog(xs[i % r], descs[i % r], lw.q_norm, lw.k_norm, pos,
                                                           locs[i % r], m, kcs[v], vcs[v], table, cfg, qs[v][i % r],
                                                           scratch))
        written, verdict, times = checked_times(fns, r, m, kcs, vcs, qs, (xs, pos), w0, lw, inv, cfg, rounds)
        print(f"  r{m:<3} us (min/max of {2 * rounds}) {times_line(times)} | every element written "
              + " ".join(f"{v} {w}" for v, w in written.items()) + " | " + "; ".join(
                  f"{v} {x}" for v, x in verdict.items()), flush=True)
        results.append(dict(rows=m, us=times, every_element_written=written, accuracy=verdict))
        torch.cuda.empty_cache()
    write_results(out, results, explore="explore53", model=cfg.name, rounds=rounds,
                  launch="per-kernel bench (rotated cold weight copies, num_valid_rows int M, PDL on)")


def sm90_report(rows: list) -> list:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "unit"))
    from compile_sm90 import compile_for_sm90

    out = []
    for m in rows:
        for rel in (1, 0):
            spec = sm90_spec(m, rel, d=128, qn_ptr="*bf16", kn_ptr="*bf16", xs_ptr="*fp32")
            r = compile_for_sm90(qk_tma_kernel(), spec)
            out.append(dict(rows=m, rel=rel, registers=r["registers"], spill_bytes=r["spill_bytes"],
                            shared=r["shared"]))
            print(out[-1], flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1,6,16")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--sm90", action="store_true")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    rows = [int(x) for x in a.rows.split(",")]
    if a.sm90:
        sm90_report(rows)
    else:
        device_run(rows, a.rounds, a.out)


if __name__ == "__main__":
    main()
