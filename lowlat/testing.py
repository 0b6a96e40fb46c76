"""Test-input builders shared by tests and benchmarks (not used by the library itself).

`random_step` lays out a step of the step contract (lowlat/step.py) over a KV cache whose slots are
drawn at random (so tests cover shuffled, non-contiguous page tables), with the cached positions
filled with random values and every slot no request owns filled with NaN (so a kernel that reads a
slot it must not read produces NaN and fails).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lowlat.step import StepBatch


@dataclass
class StepCase:
    step: StepBatch
    k_cache: torch.Tensor      # [S, Hkv, D]
    v_cache: torch.Tensor      # [S, Hkv, D]
    ctx_lens: list[int]        # tokens cached per request before the step
    new_rows: list[int]        # rows per request in this step


def split_rows(m: int) -> list[int]:
    """m rows as requests of 1, 2, 3, 1, 2, 3, ... rows (decode and verify rows mixed), the last one cut to fit."""
    rows = []
    while sum(rows) < m:
        rows.append(min(1 + len(rows) % 3, m - sum(rows)))
    return rows


def random_step(*, ctx_lens: list[int], new_rows: list[int], num_kv_heads: int, head_dim: int,
                pad_to: int | None = None, num_slots: int | None = None, max_ctx: int | None = None,
                vocab_size: int = 1000, dtype: torch.dtype = torch.bfloat16, device="cpu",
                generator: torch.Generator | None = None, contiguous: bool = False) -> StepCase:
    """A step of B = len(ctx_lens) requests; request b has ctx_lens[b] cached tokens and new_rows[b] rows.

    Rows of one request are consecutive (decode: 1 row; verify: k+1 rows). `pad_to` adds padding rows
    (out_cache_loc 0). Slots are a random permutation of 1..S-1 unless `contiguous`. Cached K/V are
    random normal; slot 0 and unowned slots are NaN, so reading them poisons the output.
    """
    g = generator or torch.Generator().manual_seed(0)
    b = len(ctx_lens)
    totals = [c + n for c, n in zip(ctx_lens, new_rows)]
    max_ctx = max_ctx or max(max(totals), 1)
    need = sum(totals) + 1
    num_slots = num_slots or need + 7
    if num_slots < need:
        raise ValueError(f"num_slots={num_slots} < {need} needed")
    pool = torch.arange(1, num_slots) if contiguous else torch.randperm(num_slots - 1, generator=g) + 1
    page_table = torch.zeros((b, max_ctx), dtype=torch.int32)
    k_cache = torch.full((num_slots, num_kv_heads, head_dim), float("nan"), dtype=dtype)
    v_cache = torch.full_like(k_cache, float("nan"))
    ids, pos, loc, req = [], [], [], []
    used = 0
    for r, (c, n) in enumerate(zip(ctx_lens, new_rows)):
        slots = pool[used:used + c + n]
        used += c + n
        page_table[r, : c + n] = slots.to(torch.int32)
        k_cache[slots[:c]] = torch.randn(c, num_kv_heads, head_dim, generator=g).to(dtype)
        v_cache[slots[:c]] = torch.randn(c, num_kv_heads, head_dim, generator=g).to(dtype)
        ids += torch.randint(0, vocab_size, (n,), generator=g).tolist()
        pos += list(range(c, c + n))
        loc += slots[c:].tolist()
        req += [r] * n
    m = len(ids)
    width = pad_to or m
    if width < m:
        raise ValueError(f"pad_to={pad_to} < {m} rows")
    pad = width - m
    step = StepBatch(
        input_ids=torch.tensor(ids + [0] * pad, dtype=torch.int64),
        positions=torch.tensor(pos + [0] * pad, dtype=torch.int64),
        out_cache_loc=torch.tensor(loc + [0] * pad, dtype=torch.int32),
        req_indices=torch.tensor(req + [0] * pad, dtype=torch.int32),
        seq_lens=torch.tensor(totals, dtype=torch.int32),
        page_table=page_table,
        num_valid_rows=m,
    ).to(device)
    return StepCase(step, k_cache.to(device), v_cache.to(device), list(ctx_lens), list(new_rows))


def tiny_config(**overrides):
    """A small Llama-family config for fast CPU tests (H 64, 4 query / 2 KV heads, D 16, I 96, 2 layers)."""
    from lowlat.config import ModelConfig

    base = dict(name="tiny", architecture="LlamaForCausalLM", hidden_size=64, num_layers=2, num_heads=4,
                num_kv_heads=2, head_dim=16, intermediate_size=96, vocab_size=256, rope_theta=10000.0,
                rms_eps=1e-6, eos_token_ids=())
    base.update(overrides)
    return ModelConfig(**base)


def pad_step(step: StepBatch, width: int) -> StepBatch:
    """The same step with padding rows appended up to `width` rows (dummy slot 0, token 0)."""
    pad = width - step.num_rows
    if pad < 0:
        raise ValueError(f"width={width} < {step.num_rows} rows")

    def ext(t: torch.Tensor) -> torch.Tensor:
        return torch.cat([t, torch.zeros(pad, dtype=t.dtype, device=t.device)])

    return StepBatch(ext(step.input_ids), ext(step.positions), ext(step.out_cache_loc), ext(step.req_indices),
                     step.seq_lens, step.page_table, step.num_valid_rows)


def spy_launch_constexprs(monkeypatch, module) -> list[dict]:
    """Record, in the returned list, the tiling constexprs and launch options of each GEMV launch of `module` (a
    launcher module of lowlat.kernels): `module.launch_constexprs` is wrapped (pytest's `monkeypatch`). For tests of
    width-dependent plans (`GemvPlan.by_row_blocks`)."""
    from lowlat.kernels._gemv import launch_constexprs

    seen: list[dict] = []

    def spy(plan, nmb, **kw):
        lc = launch_constexprs(plan, nmb, **kw)
        seen.append(lc)
        return lc
    monkeypatch.setattr(module, "launch_constexprs", spy)
    return seen


def reverse_interpreter_grid(monkeypatch) -> None:
    """Make the Triton CPU interpreter run every launch's programs in reverse grid order (the last program id on each
    axis first), for the rest of the test. The interpreter otherwise runs them in order, pid 0 of axis 0 first, so a
    kernel that wrongly relies on another program of the same launch having run (e.g. one program per K slice
    writing what the others read) passes under it by luck; a test run in both orders catches that."""
    from triton.runtime import interpreter

    builder = interpreter.interpreter_builder
    forward = type(builder).set_grid_idx

    def reversed_idx(self, x, y, z):
        nx, ny, nz = self.grid_dim
        return forward(self, nx - 1 - x, ny - 1 - y, nz - 1 - z)

    monkeypatch.setattr(type(builder), "set_grid_idx", reversed_idx)
