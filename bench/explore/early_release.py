"""Session 23: move `gdc_launch_dependents()` of a production kernel from right after its `gdc_wait()` to the start of
the kernel (explore31's EARLY), in place, for a timing experiment on the device only (never committed applied).

Why: explore31's no-split-K GEMV went from 59% to 71% of copy bandwidth at 1 row (Llama out_proj, per kernel) when
its dependents were released at its start: the next launch's programs become resident and issue their weight
loads while this launch still waits. The production rule releases after the wait so that a launch may read,
before its own wait, anything written two or more launches back. Releasing L at its start lets L's successor S
start once L's predecessor P has passed its wait, so S must not read before its wait anything P (or L) writes.
For the dense fused step:
  residual  (`out_proj._residual_gemv_kernel`: out_proj, P attention, S gate/up, which reads only weights before
            its wait; the down projection, P gate/up, S the next prologue, which reads only weights before its
            wait)
  prologue  (`attn_prologue._attn_prologue_kernel`: P down, S the decode attention, which reads before its wait
            the page table, positions and KV slots written by earlier steps only, never the step's own slots)
Not for MoE layers (the router after out_proj is not checked here).
Session 23's call 4 ran both edits. The residual one is now the kernel's own EARLY_RELEASE constexpr
(`residual_gemv(..., early_release=True)`, `FusedModel(early_release=...)`), so only the prologue edit is left here.

    python bench/explore/early_release.py apply prologue     # edits lowlat/kernels/*.py, keeps *.orig
    python bench/explore/early_release.py revert
"""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

KERNELS = Path(__file__).resolve().parents[2] / "lowlat" / "kernels"

#: kind -> (file, anchor the release is inserted before (once), the wait + release to drop the release from (once))
EDITS = {
    "prologue": ("attn_prologue.py",
                 "    w2_off = HALF * stride_wn                          # the upper rotary half",
                 "        gdc_wait()\n        gdc_launch_dependents()\n    rm = m0 + tl.arange(0, 16)"),
}


def apply(kind: str) -> None:
    name, anchor, wait_release = EDITS[kind]
    path = KERNELS / name
    src = path.read_text()
    for text in (anchor, wait_release):
        if src.count(text) != 1:
            raise SystemExit(f"{kind}: {text!r} occurs {src.count(text)} times in {path}")
    shutil.copy(path, path.with_suffix(".py.orig"))
    src = src.replace(anchor, "    if USE_PDL:\n        gdc_launch_dependents()\n" + anchor)
    src = src.replace(wait_release, wait_release.replace("        gdc_launch_dependents()\n", ""))
    path.write_text(src)
    print(f"{kind}: dependents released at the start of {path.name}")


def revert() -> None:
    for name, _, _ in EDITS.values():
        orig = (KERNELS / name).with_suffix(".py.orig")
        if orig.exists():
            shutil.move(orig, KERNELS / name)
            print(f"reverted {name}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["apply"]:
        for kind in sys.argv[2:]:
            apply(kind)
    elif sys.argv[1:2] == ["revert"]:
        revert()
    else:
        raise SystemExit(__doc__)
