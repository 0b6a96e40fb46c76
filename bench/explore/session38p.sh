#!/usr/bin/env bash
# Session 38, call 18 (one GPU, no carry, ends by END, default 120 s): explore52 --probe with the first graphs kept and
# timed again at the end (call 17: tma1 fast in the first three fresh graphs, slow from the fourth, SM clock 1980 MHz
# throughout): is the slow mode a graph's own or the process's state? nvidia-smi sampled beside it.
# (explore52 keeps the first graphs itself; this is session38o.sh with 8 graphs)
PROBE=8 exec bash "$(dirname "$0")/session38o.sh"
