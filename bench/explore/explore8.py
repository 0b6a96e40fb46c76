"""Session-4 exploration, third round. (1) Where the greedy tail's time goes, in the TMA copy of the greedy launch
(bench/explore/tma_gemv.py): EPI 0 (no reduction, no logits), EPI 6 (the logits and one key per program stored,
no cross-program step), EPI 3 (the production tail: relaxed atomic_max, acq_rel arrival, relaxed exchange) and
EPI 7 (EPI 3 with no fence: the arrival waits for the max's returned value instead; a timing study, not a
memory-model-correct tail). (2) The down projection's L2 prefetch depth below pf 256 at split 4.

    python bench/explore/explore8.py --out $OUT/explore8.json [--budget-s 150] [--reps 3] [--greedy-reps 2]
"""
from __future__ import annotations

import argparse
import time

from _common import Recorder, time_gemv_plans, time_greedy_tails

S4 = dict(split=4, block_k=128, bn=64, stages=4, preload=False)
# "tuned" was pf 256 when this ran (explore8_h200.json); the table's plan is pf 128 since
DOWN = [("tuned", {}), ("s4_pf256", dict(S4, pf_k=256)), ("s4_pf128", dict(S4, pf_k=128)),
        ("s4_pf64", dict(S4, pf_k=64))]


def greedy_tails(rec, deadline, reps):
    """Tails EPI 0 (none), 6, 3 (production's), 7 at 1 and 8 rows (tokens checked for 3 and 7)."""
    time_greedy_tails(rec, deadline, reps, rows=(1, 8), epis=(0, 6, 3, 7), checked=(3, 7))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=None)
    p.add_argument("--budget-s", type=float, default=150)
    p.add_argument("--reps", type=int, default=3, help="rounds over the down-projection plans")
    p.add_argument("--greedy-reps", type=int, default=2, help="rounds over the greedy tails")
    a = p.parse_args()
    deadline = time.time() + a.budget_s
    rec = Recorder(a.out)
    rec.guard("greedy", lambda: greedy_tails(rec, deadline, a.greedy_reps), op="greedy")
    rec.guard("down", lambda: time_gemv_plans(rec, deadline, "residual", 2048, 8192, 1e-5, DOWN, a.reps),
              op="down")


if __name__ == "__main__":
    main()
