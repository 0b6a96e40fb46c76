"""Session 34: why two ranks sharing one process timed out on the GPU (tests/multi_gpu/test_peer_rank_agreement.py's
GPU tests, session 34's first call: "peer 1 did not arrive within 20 s").

Two `PeerRank`s on one GPU, each on its own stream (`ranks_on_one_device`). Both ranks' whole calls run twice (their
kernel variant loaded), then rank 0's call is launched (it spins until rank 1 arrives) and rank 1 refuses its call:
the refusal's kernel variant (REFUSAL on) is compiled and loaded at that moment unless `PeerRank.preload` loaded it
at construction. If loading a module waits for the context's running kernels (CUDA lazy loading), rank 1's refusal
reaches the GPU only once rank 0's launch has given up at its deadline: rank 0 reports a CollectiveTimeout and the
refusal takes about the deadline; with the variant preloaded rank 0 reports the refusal (StepContractError) at once.

    python3 bench/explore/lazy_load_deadlock.py --arm no_preload|preload [--deadline-s 3] [--out f.json]

Run each arm in a fresh process (a variant once loaded stays loaded); CUDA_MODULE_LOADING=EAGER in the environment
is the third case. Prints and writes one JSON line: the arm, CUDA_MODULE_LOADING, the seconds rank 1's refusal call
took on the host, the seconds until both streams were done, and each rank's status.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--arm", choices=("no_preload", "preload"), required=True)
    ap.add_argument("--deadline-s", type=float, default=3.0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    from lowlat.comm.peer_buffers import PeerRank
    from lowlat.comm.testing import make_partials, ranks_on_one_device
    from lowlat.errors import StepContractError

    if args.arm == "no_preload":
        PeerRank.preload = lambda self, rows=(): None       # construction no longer loads the refusal's variant
    ranks = ranks_on_one_device(2, 4096, max_rows=8, device="cuda", deadline=args.deadline_s, tiles_cap=8)
    parts = make_partials(2, 8, 4096, seed=1, device="cuda")
    streams = [torch.cuda.Stream() for _ in ranks]
    for _ in range(2):
        for r, pr in enumerate(ranks):
            with torch.cuda.stream(streams[r]):
                pr.all_reduce(parts[r], check=False)
        torch.cuda.synchronize()
    warm = [repr(pr.status()) for pr in ranks]
    t0 = time.perf_counter()
    with torch.cuda.stream(streams[0]):
        ranks[0].all_reduce(parts[0], check=False)
    with torch.cuda.stream(streams[1]):
        t1 = time.perf_counter()
        try:
            ranks[1].all_reduce(parts[1][:, :100])
        except StepContractError:
            pass
        refusal_s = time.perf_counter() - t1
    torch.cuda.synchronize()
    res = dict(arm=args.arm, cuda_module_loading=os.environ.get("CUDA_MODULE_LOADING"), deadline_s=args.deadline_s,
               warm_status=warm, refusal_call_s=round(refusal_s, 3), done_s=round(time.perf_counter() - t0, 3),
               status=[repr(pr.status()) for pr in ranks], device=torch.cuda.get_device_name())
    print(json.dumps(res))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
