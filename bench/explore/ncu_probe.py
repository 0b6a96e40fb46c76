"""Launch each kernel of interest once between cudaProfilerStart/Stop (after warm-up launches compiled them),
for `ncu --profile-from-start off`: the down projection (default plan, 1 row), SmolLM2's LM-head kernel and
the draft sampler's greedy launch (1 row), the TMA variants, and the pure read of the down projection's bytes."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import torch  # noqa: E402

from bench_stream_floor import read_launcher  # noqa: E402
from explore.tma_gemv import TmaGreedy, TmaResidual  # noqa: E402
from lowlat.bench import _GemvCase  # noqa: E402
from lowlat.kernels import draft_sampling as ds  # noqa: E402
from lowlat.kernels._gemv import plan_gemv  # noqa: E402

dev = torch.device("cuda")
down = _GemvCase("residual", 2048, 8192, 1e-5, dev, copies=2)
head = _GemvCase("lm_head", 49152, 576, 1e-5, dev, copies=2)
v, hd = 49152, 576
w = (torch.randn(v, hd, device=dev) * hd ** -0.5).to(torch.bfloat16)
h = torch.randn(1, hd, device=dev).to(torch.bfloat16)
z = torch.zeros(1, device=dev)
k0 = torch.zeros(1, dtype=torch.int32, device=dev)
one = torch.ones(1, device=dev)
s1 = torch.ones(1, dtype=torch.int64, device=dev)
o0 = torch.zeros(1, dtype=torch.int64, device=dev)
out = ds.empty_draft_sample(1, v, dev)
tr = TmaResidual(2048, 8192)
tg = TmaGreedy(v, hd)
xo, to = torch.empty(1, v, device=dev), torch.empty(1, dtype=torch.int64, device=dev)
rd = read_launcher([down.w[0].view(-1)], torch.empty(4096, device=dev), 512, 0)
d = down.inputs(1)
alt = plan_gemv(2048, 8192, bn=16, split=1, block_k=256, stages=6, pf_k=256, preload=False)
calls = [lambda: down.launch(plan_gemv(2048, 8192), 1, 1),
         lambda: down.launch(alt, 1, 1),
         lambda: head.launch(plan_gemv(49152, 576, kind="lm_head"), 1, 1),
         lambda: ds.draft_sample_into(h, w, z, k0, one, s1, o0, out, k_cap=0, need_noise=False),
         lambda: tr(d["x"], down.w[1], d["res"], d["out"]),
         lambda: tg(h, w, xo, to),
         lambda: rd(0)]
for c in calls:
    c()
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStart()
for c in calls:
    c()
    torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStop()
print("probe done")
