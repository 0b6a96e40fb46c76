"""Counter-based random numbers shared by the sampling references and kernels (Salmon et al. 2011).

Philox4x32-10, the generator `triton.language.philox` implements, reproduced here with int64 torch
arithmetic so a kernel and its reference draw the very same bits from the same counters:

    (o0, o1, o2, o3) = philox4x32_10(counter = (c0, c1, c2, c3), key = (seed lo 32 bits, seed hi 32 bits))

lowlat's counter layout (every sampling op uses it, so streams never collide):

    c0 = index inside the stream (token id t, or draft position i)
    c1, c2 = low / high 32 bits of the row's `offset` (a per-request step counter the caller advances)
    c3 = stream tag (STREAM_DRAFT, STREAM_ACCEPT, STREAM_FINAL)

Uniforms are 52-bit fractions in float64, strictly inside (0, 1):

    u = ((o0 >> 6) * 2^26 + (o1 >> 6) + 0.5) / 2^52

and the exponential variate is E = -log(u) (float64). Sampling from weights w >= 0 by the
exponential race, argmax_t w_t / E_t, picks t with probability w_t / sum(w) (the Gumbel-max trick,
Gumbel 1954; Papandreou & Yuille 2011, written without the second log); in logit space the same
draw is argmax_t x_t - log(E_t). Both sides take float64 logs of identical bits, so a kernel and its
reference differ only where the float64 logs differ by an ulp (probability ~1e-16 per token).
"""

from __future__ import annotations

import torch

MASK32 = 0xFFFFFFFF
PHILOX_KEY_A = 0x9E3779B9
PHILOX_KEY_B = 0xBB67AE85
PHILOX_ROUND_A = 0xD2511F53
PHILOX_ROUND_B = 0xCD9E8D57
N_ROUNDS = 10

#: stream tags (counter word c3)
STREAM_DRAFT = 0    # draft sampling: Gumbel noise per token id
STREAM_ACCEPT = 1   # rejection sampling: acceptance uniform per draft position
STREAM_FINAL = 2    # rejection sampling: exponential race noise per token id (residual / bonus token)


def _umul32(a: torch.Tensor, b: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(high 32 bits, low 32 bits) of a * b for a int64 tensor of uint32 values and b a uint32 constant.

    Computed with 16-bit limbs so no intermediate leaves int64."""
    a1, a0 = a >> 16, a & 0xFFFF
    b1, b0 = b >> 16, b & 0xFFFF
    mid = a1 * b0 + a0 * b1                        # < 2^33
    lo_full = (mid << 16) + a0 * b0                # < 2^50
    hi = a1 * b1 + (lo_full >> 32)
    return hi & MASK32, lo_full & MASK32


def philox4x32(c0, c1, c2, c3, k0, k1, n_rounds: int = N_ROUNDS):
    """Philox4x32 on int64 tensors holding uint32 values (broadcasting); returns four such tensors.

    Bit-identical to `triton.language.philox_impl` on uint32 inputs."""
    args = (c0, c1, c2, c3, k0, k1)
    dev = next((v.device for v in args if isinstance(v, torch.Tensor) and v.device.type != "cpu"), "cpu")
    c0, c1, c2, c3, k0, k1 = (torch.as_tensor(v, dtype=torch.int64, device=dev) & MASK32 for v in args)
    c0, c1, c2, c3, k0, k1 = torch.broadcast_tensors(c0, c1, c2, c3, k0, k1)
    for _ in range(n_rounds):
        hi_b, lo_b = _umul32(c2, PHILOX_ROUND_B)
        hi_a, lo_a = _umul32(c0, PHILOX_ROUND_A)
        c0, c1, c2, c3 = hi_b ^ c1 ^ k0, lo_b, hi_a ^ c3 ^ k1, lo_a
        k0 = (k0 + PHILOX_KEY_A) & MASK32
        k1 = (k1 + PHILOX_KEY_B) & MASK32
    return c0, c1, c2, c3


def uniform52(o0: torch.Tensor, o1: torch.Tensor) -> torch.Tensor:
    """float64 uniforms strictly inside (0, 1) from two uint32 words (int64 tensors)."""
    num = (o0 >> 6) * (1 << 26) + (o1 >> 6)        # < 2^52, exact in float64
    return (num.double() + 0.5) * (2.0 ** -52)


def uniforms(seeds: torch.Tensor, offsets: torch.Tensor, index: torch.Tensor, stream: int) -> torch.Tensor:
    """u [broadcast shape] float64 in (0, 1) for counters (index, offset, stream) under key seed.

    seeds, offsets: int64 (any broadcastable shapes, e.g. [R, 1]); index: int64 (e.g. [1, V])."""
    seeds = torch.as_tensor(seeds, dtype=torch.int64)
    offsets = torch.as_tensor(offsets, dtype=torch.int64)
    o0, o1, _, _ = philox4x32(index, offsets, offsets >> 32, stream, seeds, seeds >> 32)
    return uniform52(o0, o1)


def exponentials(seeds: torch.Tensor, offsets: torch.Tensor, index: torch.Tensor, stream: int) -> torch.Tensor:
    """E = -log(u) [broadcast shape] float64, standard exponential variates (> 0)."""
    return -torch.log(uniforms(seeds, offsets, index, stream))
