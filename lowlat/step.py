"""The step contract: the tensors every decode / verify / prefill-chunk step hands to a forward.

A step has M rows (token rows), B requests and a page table of C columns (page size 1):

    input_ids      [M]     int64  token of each row
    positions      [M]     int64  position of each row in its request
    out_cache_loc  [M]     int32  KV slot each row writes (0, the dummy slot, for padding rows; distinct for valid rows)
    req_indices    [M]     int32  request of each row, in 0..B-1
    seq_lens       [B]     int32  tokens in each request's KV cache after this step
    page_table     [B, C]  int32  KV slot of each position of each request
    num_valid_rows         int    rows >= this are padding (CUDA-graph width)

Row i attends to positions 0..positions[i] of request req_indices[i]: that one rule covers decode
(1 row per request), verify (k+1 consecutive rows, row j sees the cache and draft rows <= j) and
chunked prefill. Padding rows never change a valid row's output and never write a real KV slot.
This is the shape SGLang's FA3 backend holds (`page_table` + `cache_seqlens`), see
../shared/sglang-contract.md.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import torch

from lowlat.errors import StepContractError

#: Largest number of rows a fused step takes (design.md: 1..48 token rows).
MAX_ROWS = 48


@dataclass
class StepBatch:
    input_ids: torch.Tensor
    positions: torch.Tensor
    out_cache_loc: torch.Tensor
    req_indices: torch.Tensor
    seq_lens: torch.Tensor
    page_table: torch.Tensor
    num_valid_rows: int

    @property
    def num_rows(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_requests(self) -> int:
        return int(self.seq_lens.shape[0])

    def to(self, device: torch.device | str) -> "StepBatch":
        return StepBatch(*(getattr(self, f).to(device) for f in _TENSOR_FIELDS), self.num_valid_rows)

    def validate(self, *, vocab_size: int, num_slots: int, max_rows: int | None = None) -> None:
        """Check every contract fact; raise `StepContractError` naming the first offending value.

        vocab_size: V (input_ids in 0..V-1); num_slots: KV slots S of the pool (slot 0 the dummy slot, never
        part of a valid row's context; a slot a valid row writes appears in a read context only at that row's
        own request and position); max_rows: the most rows M a step may have (None: unchecked).
        num_valid_rows must be an int in 1..M (bool / float refused). Host-side (syncs on the tensors):
        call before any write, never inside a captured graph.
        """
        m = self.num_rows
        for name in _TENSOR_FIELDS:
            t = getattr(self, name)
            if not isinstance(t, torch.Tensor):
                raise StepContractError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
            want = _DTYPES[name]
            if t.dtype != want:
                raise StepContractError(f"{name} must be {want}, got {t.dtype}")
            ndim = 2 if name == "page_table" else 1
            if t.dim() != ndim:
                raise StepContractError(f"{name} must be {ndim}-D, got shape {tuple(t.shape)}")
        for name in ("positions", "out_cache_loc", "req_indices"):
            if getattr(self, name).shape[0] != m:
                raise StepContractError(
                    f"{name} has {getattr(self, name).shape[0]} rows, input_ids has M={m}")
        b, c = self.page_table.shape
        if self.seq_lens.shape[0] != b:
            raise StepContractError(f"seq_lens has {self.seq_lens.shape[0]} requests, page_table has B={b}")
        if m == 0:
            raise StepContractError("a step needs at least one row (M=0)")
        if max_rows is not None and m > max_rows:
            raise StepContractError(f"M={m} rows exceeds max_rows={max_rows}")
        n = _count(self.num_valid_rows)
        if not 0 < n <= m:
            raise StepContractError(f"num_valid_rows={self.num_valid_rows} must be in 1..M={m}")
        ids, pos = self.input_ids[:n].cpu(), self.positions[:n].cpu()
        req, loc = self.req_indices[:n].cpu().long(), self.out_cache_loc[:n].cpu().long()
        seq = self.seq_lens.cpu().long()
        _in_range("input_ids", ids, 0, vocab_size)
        _in_range("req_indices", req, 0, b)
        _in_range("seq_lens", seq, 0, c + 1, hint=f"page table has C={c} columns")
        _in_range("out_cache_loc", loc, 1, num_slots, hint="slot 0 is the dummy slot")
        slots, counts = loc.unique(return_counts=True)
        if (counts > 1).any():
            slot = int(slots[counts > 1][0])
            raise StepContractError(f"out_cache_loc rows {(loc == slot).nonzero().flatten().tolist()} all write KV "
                                    f"slot {slot}: each valid row needs its own")
        if (pos < 0).any():
            raise StepContractError(f"positions[{_first(pos < 0)}]={int(pos[_first(pos < 0)])} is negative")
        beyond = pos >= seq[req]
        if beyond.any():
            i = _first(beyond)
            raise StepContractError(
                f"positions[{i}]={int(pos[i])} is beyond request {int(req[i])}'s "
                f"seq_len={int(seq[req[i]])} (page table has C={c} columns)")
        own = self.page_table.cpu()[req, pos].long()
        if (own != loc).any():
            i = _first(own != loc)
            raise StepContractError(
                f"out_cache_loc[{i}]={int(loc[i])} differs from page_table[{int(req[i])}, {int(pos[i])}]"
                f"={int(own[i])}")
        cols = torch.arange(c)[None, :] < seq[:, None]
        used = self.page_table.cpu()[cols].long()
        _in_range("page_table", used, 0, num_slots)
        live = torch.zeros(b, dtype=torch.bool)
        live[req] = True                    # requests a valid row reads
        dummy = (self.page_table.cpu() == 0) & cols & live[:, None]
        if dummy.any():
            r, p = (int(x) for x in dummy.nonzero()[0])
            raise StepContractError(f"page_table[{r}, {p}]=0 is the dummy slot (padding rows write it), inside "
                                    f"request {r}'s seq_len={int(seq[r])}: a valid row would attend to it")
        # a slot a valid row writes may sit in a live request's context only at that row's own place:
        # anywhere else a valid row would read K/V that this step overwrites (in whichever order it runs)
        owner_req = torch.full((num_slots,), -1, dtype=torch.long)
        owner_pos = torch.full((num_slots,), -1, dtype=torch.long)
        owner_req[loc], owner_pos[loc] = req, pos
        slot_at = self.page_table.cpu().long().clamp(0, num_slots - 1)
        written = owner_req[slot_at] >= 0
        elsewhere = (owner_req[slot_at] != torch.arange(b)[:, None]) | (owner_pos[slot_at] != torch.arange(c)[None, :])
        clash = cols & live[:, None] & written & elsewhere
        if clash.any():
            r, p = (int(x) for x in clash.nonzero()[0])
            slot = int(slot_at[r, p])
            i = _first(loc == slot)
            raise StepContractError(f"page_table[{r}, {p}]={slot} is the KV slot valid row {i} writes (request "
                                    f"{int(req[i])}, position {int(pos[i])}): request {r} would read K/V this step "
                                    "overwrites")
        pad_loc = self.out_cache_loc[n:].cpu()
        if (pad_loc != 0).any():
            i = n + _first(pad_loc != 0)
            raise StepContractError(f"padding row {i} has out_cache_loc={int(pad_loc[i - n])}; must be 0")


_TENSOR_FIELDS = ("input_ids", "positions", "out_cache_loc", "req_indices", "seq_lens", "page_table")
_DTYPES = {
    "input_ids": torch.int64, "positions": torch.int64, "out_cache_loc": torch.int32,
    "req_indices": torch.int32, "seq_lens": torch.int32, "page_table": torch.int32,
}


def as_int(x: object) -> int | None:
    """x as a Python int when it is an integer (int, NumPy integer, 0-d integer tensor), else None (bool,
    float, str, a float or multi-element tensor)."""
    if isinstance(x, bool) or (isinstance(x, torch.Tensor) and (x.dim() or x.is_floating_point())):
        return None
    try:
        return operator.index(x)
    except TypeError:
        return None


def _count(value: object) -> int:
    """num_valid_rows as an int (`as_int`); StepContractError naming it otherwise."""
    n = as_int(value)
    if n is None:
        raise StepContractError(f"num_valid_rows must be an int, got {type(value).__name__} {value!r}")
    return n


def _first(mask: torch.Tensor) -> int:
    return int(mask.nonzero()[0, 0])


def _in_range(name: str, t: torch.Tensor, lo: int, hi: int, hint: str = "") -> None:
    bad = (t < lo) | (t >= hi)
    if bad.any():
        i = _first(bad.reshape(-1))
        extra = f" ({hint})" if hint else ""
        raise StepContractError(f"{name}[{i}]={int(t.reshape(-1)[i])} outside [{lo}, {hi}){extra}")
