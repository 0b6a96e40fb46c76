"""KV-cache pool in SGLang's layout (MHATokenToKVPool + ReqToTokenPool), page size 1.

    k_caches[l], v_caches[l]   [num_slots, Hkv, D]   slot 0 is the dummy slot padding rows write to
    req_to_token               [max_reqs, max_ctx] int32  KV slot of each position of each request

A step's page table is `req_to_token[req_pool_indices]` (lowlat/step.py).
"""

from __future__ import annotations

import torch

from lowlat.config import ModelConfig
from lowlat.errors import KVCacheError, StepContractError, UnsupportedConfigError
from lowlat.step import as_int


class KVCachePool:
    def __init__(self, cfg: ModelConfig, *, num_slots: int, max_reqs: int, max_ctx: int,
                 dtype: torch.dtype = torch.bfloat16, device: str | torch.device = "cpu",
                 num_layers: int | None = None) -> None:
        for name, value, lo in (("num_slots", num_slots, 2), ("max_reqs", max_reqs, 1), ("max_ctx", max_ctx, 1)):
            if as_int(value) is None or value < lo:
                raise UnsupportedConfigError(name, value, f"must be an int >= {lo}"
                                             + (" (slot 0 is the dummy slot)" if name == "num_slots" else ""))
        shape = (num_slots, cfg.num_kv_heads, cfg.head_dim)
        layers = cfg.num_layers if num_layers is None else num_layers
        self.k_caches = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.v_caches = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.req_to_token = torch.zeros((max_reqs, max_ctx), dtype=torch.int32, device=device)
        self.num_slots, self.max_reqs, self.max_ctx = num_slots, max_reqs, max_ctx
        self._free_slots = list(range(num_slots - 1, 0, -1))   # pop() hands out 1, 2, 3, ...
        self._free_reqs = list(range(max_reqs - 1, -1, -1))
        self.seq_lens: dict[int, int] = {}                     # req_pool_idx -> tokens held

    @property
    def free_slots(self) -> int:
        return len(self._free_slots)

    def _held(self, req: object) -> int:
        """req as an allocated request row; KVCacheError otherwise (a bool, a freed or unknown row)."""
        idx = as_int(req)
        if idx is None or idx not in self.seq_lens:
            raise KVCacheError(f"request row {req!r} is not allocated (allocated: {sorted(self.seq_lens)}); "
                               "was it freed already?")
        return idx

    def alloc_request(self) -> int:
        """A free row of req_to_token (its sequence empty). Raises KVCacheError (a RuntimeError) when all
        max_reqs rows are in use."""
        if not self._free_reqs:
            raise KVCacheError(f"all {self.max_reqs} request rows are in use")
        idx = self._free_reqs.pop()
        self.seq_lens[idx] = 0
        return idx

    def extend(self, req: int, n: int) -> torch.Tensor:
        """Give request `req` slots for its next n positions; returns them as [n] int32.

        Raises StepContractError past max_ctx; KVCacheError (a RuntimeError) when slots run out, for an
        unallocated request row and for n not an int >= 0. Nothing is allocated when it raises.
        """
        req = self._held(req)
        start, n_in, n = self.seq_lens[req], n, as_int(n)
        if n is None or n < 0:
            raise KVCacheError(f"request {req}: n={n_in!r} positions must be an int >= 0")
        if start + n > self.max_ctx:
            raise StepContractError(f"request {req}: position {start + n - 1} beyond max_ctx={self.max_ctx}")
        if n > len(self._free_slots):
            raise KVCacheError(f"KV cache full: {n} slots wanted, {len(self._free_slots)} free")
        slots = torch.tensor([self._free_slots.pop() for _ in range(n)], dtype=torch.int32)
        self.req_to_token[req, start:start + n] = slots.to(self.req_to_token.device)
        self.seq_lens[req] = start + n
        return slots

    def truncate(self, req: int, new_len: int) -> None:
        """Drop positions >= new_len of request `req` (speculative rollback); their slots are freed.
        Entries of earlier positions are untouched. Raises KVCacheError (nothing changed) for an
        unallocated request row or new_len not an int in 0..seq_len."""
        req = self._held(req)
        old, asked, new_len = self.seq_lens[req], new_len, as_int(new_len)
        if new_len is None or not 0 <= new_len <= old:
            raise KVCacheError(f"request {req}: new_len={asked!r} must be an int in 0..{old}")
        freed = self.req_to_token[req, new_len:old].tolist()
        self._free_slots.extend(reversed(freed))
        self.req_to_token[req, new_len:old] = 0
        self.seq_lens[req] = new_len

    def free_request(self, req: int) -> None:
        """Free request row `req` and every slot it holds. Raises KVCacheError (nothing changed) when the
        row is not allocated, e.g. freed twice."""
        req = self._held(req)
        self.truncate(req, 0)
        del self.seq_lens[req]
        self._free_reqs.append(req)

