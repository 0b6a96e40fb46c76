"""Triton side of lowlat's counter-based random numbers; matches `lowlat.reference.philox` bit for bit.

Key = the row's 64-bit seed, counter = (index, offset lo, offset hi, stream) through Philox4x32-10
(`tl.philox_impl`); uniforms are 52-bit float64 fractions in (0, 1); exponentials are -log(u) in float64.
"""

import triton
import triton.language as tl


@triton.jit
def philox_uniform52(seed, offset, index, stream: tl.constexpr):
    """u float64 in (0, 1), shaped like `index`; seed, offset: int64 scalars; index: int tensor."""
    c0 = index.to(tl.uint32)
    zero = c0 * 0
    c1 = zero + offset.to(tl.uint32)
    c2 = zero + (offset >> 32).to(tl.uint32)
    c3 = zero + stream
    k0 = zero + seed.to(tl.uint32)
    k1 = zero + (seed >> 32).to(tl.uint32)
    o0, o1, _o2, _o3 = tl.philox_impl(c0, c1, c2, c3, k0, k1, 10)
    num = (o0 >> 6).to(tl.int64) * 67108864 + (o1 >> 6).to(tl.int64)      # < 2^52
    return (num.to(tl.float64) + 0.5) * 2.220446049250313e-16              # * 2^-52


@triton.jit
def philox_exponential(seed, offset, index, stream: tl.constexpr):
    """E = -log(u) float64 > 0, standard exponential variates shaped like `index`."""
    return -tl.log(philox_uniform52(seed, offset, index, stream))
