"""Session 28: the held prologue at 8 warps a program (8 or 16 K slices: mma chains of 16 or 8 a warp, 64 weight
registers a thread instead of 128).

explore40 / explore42 (session 28 calls 3 and 5): 16 slices at 4 warps 4.23-4.28 us at 1 row against 4.36-4.41 for 4
slices, +0.1 / +0.4 us at 6 / 16 rows. At 8 warps the sm_90 build takes 142-152 registers with g multiplied in
registers (one program an SM: 192 programs in two waves) and 102-140 on folded weights (HELD_FOLD "build": two an SM
at <= 128, i.e. 8 slices). Variants, Llama-3.2-1B per kernel as explore40, A B C D D C B A: s4 (production), q8s8,
q8s8_build, q8s16_build; the outputs' largest relative difference from production printed.

    python bench/explore/explore43.py --out results.json
"""

from __future__ import annotations

import argparse

import torch

from _common import LlamaPrologueCase, module_from_source  # noqa: E402 (puts the repository on sys.path)
from explore42 import compare
from lowlat.kernels import attn_prologue_held as aph


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1,6,16,48")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    base = open(aph.__file__).read()
    assert base.count("WARPS = 4 ") == 1 and base.count("SLICES = 4 ") == 1, "the production source changed"
    q8 = {s: module_from_source(f"aph_q8s{s}", base.replace("WARPS = 4 ", "WARPS = 8").replace("SLICES = 4 ",
                                                                                            f"SLICES = {s}"))
          for s in (8, 16)}
    case = LlamaPrologueCase(torch.device("cuda"))
    g = case.lw.attn_norm
    wfs = [aph.fold_attn_norm(w, g) for w in case.ws]
    compare(case, {"s4": (aph, case.ws, g), "q8s8": (q8[8], case.ws, g), "q8s8_build": (q8[8], wfs, None),
                   "q8s16_build": (q8[16], wfs, None)}, [int(x) for x in args.rows.split(",")], args.out)


if __name__ == "__main__":
    main()
