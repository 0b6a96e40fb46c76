"""explore48 (session 35, prepared without a device): the draft sampler's final reduction with its NaN-row marking
moved late ("nan_late"), for the +1.4 us at 8 temperature rows that session 30's non-finite handling cost (session 32,
bench/results/session32: fused 29.96 -> 31.37 us, A B A; 1 row unchanged).

What session 35 read off the sm_90 build on the CPU (tests/unit/compile_sm90.py, SmolLM2's V 49152 / H 576, 8 rows,
need_noise, maxnreg 168), before session 30 against now: registers 112 -> 100 (occupancy is bound by the 72 KB of
shared memory, 3 programs an SM, either way), static SASS 4712 -> 4792 instructions, BAR 44 -> 47 / STS 25 -> 28 / LDS
65 -> 68 (the per-tile NaN id reduction, whose fold into best_id's gained nothing in session 32). What else session 30
changed is in the last program's final: `big_m = where(tok < 0, NaN, big_m)` right after pass 1 makes pass 2's
sum-exp (and the top-k block's probabilities) wait for the token's reduction chain, where before they waited only for
the maximum. nan_late keeps pass 2 and the top-k block on pass 1's maximum and marks the NaN rows' big_m after them:
every output is the same (a NaN row's lse / cut value / cut id / token are set by the non-finite selects from the
marked big_m, which follow), tested bitwise against production on finite and non-finite rows
(tests/unit/test_explore_draft_nanlate.py). Its sm_90 build (same compile): 109 / 139 registers at 8 rows with
need_noise and k_cap 0 / 64 (production 100 / 113), no spills, the same 72 KB of shared memory.

    nanlate_source(src)  production's text with the edit (each edit must apply exactly once)
    load_nanlate()       the edited module, imported from a file of its own
    python bench/explore/explore48.py --write PATH [--source FILE]   write the edited module to PATH
        (bench/explore/draft_aba.sh's `nanlate` form times it in place of the tree's)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCTION = ROOT / "lowlat" / "kernels" / "draft_sampling.py"

#: (production's text, the edited text): each must occur once in production
EDITS = [
    ('''            # a NaN x: the greedy token is the lowest NaN id (torch.argmax's), and the max NaN (tested below)
            big_m = tl.where(tok < 0, float("nan"), big_m)
            tok = tl.where(tok < 0, tok + _NAN_SHIFT, tok)
''', '''            # nan_late (explore48): a NaN row's big_m is marked after pass 2 and the top-k block
            nan_row = tok < 0
            tok = tl.where(nan_row, tok + _NAN_SHIFT, tok)
'''),
    ('''            greedy = temp <= 0.0                     # greedy: q = one-hot(argmax)
            lse = tl.where(greedy, big_m, lse)
''', '''            big_m = tl.where(nan_row, float("nan"), big_m)
            greedy = temp <= 0.0                     # greedy: q = one-hot(argmax)
            lse = tl.where(greedy, big_m, lse)
'''),
]


def nanlate_source(src: str) -> str:
    """`src` (lowlat/kernels/draft_sampling.py's text) with the nan_late edits; ValueError naming the edit that does
    not occur exactly once (production changed: update EDITS)."""
    for old, new in EDITS:
        n = src.count(old)
        if n != 1:
            raise ValueError(f"explore48 edit occurs {n} times in draft_sampling.py (needs 1): {old.strip()[:80]!r}")
        src = src.replace(old, new)
    return src


def load_nanlate():
    """The nan_late form of lowlat.kernels.draft_sampling as module `draft_sampling_nanlate`."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _common import module_from_source

    return module_from_source("draft_sampling_nanlate", nanlate_source(PRODUCTION.read_text()))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--write", required=True, help="write the nan_late module's text to this path")
    p.add_argument("--source", default=str(PRODUCTION), help="production's text to edit (default: the tree's)")
    a = p.parse_args()
    Path(a.write).write_text(nanlate_source(Path(a.source).read_text()))


if __name__ == "__main__":
    main()
