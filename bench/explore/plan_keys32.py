"""Session 29 (prepared for session 30, not yet timed): the MoE route / plan kernel's top-k on int32 keys.

`_route_plan_kernel` picks each row's top-k experts by TOP_K maxima over int64 keys (`_gemv.argmax_key`: the fp32
logit's order-preserving int32 image above the expert index). Its logits are bf16-rounded (the reference's bf16
router product), so the image's upper 16 bits already order them: an int32 key (those 16 bits above 0xFFFF - e)
orders the same way, ties included (lower index first), and a max over int32 is one shuffle a level where int64 takes
two plus a 64-bit compare. Each 16-row program's chain is ~5 us in the step (session 29 call 3), mostly these
dependent reductions (top-8 at Qwen3-30B-A3B). `keys32_source(src)` edits `kernels/moe.py`'s text so; the same
routing bits are expected (tests/unit/test_explore_kernels.py checks ties against the reference on the CPU).

    python bench/explore/plan_keys32.py lowlat/kernels/moe.py      # edits the file in place (device scripts)
"""

from __future__ import annotations

import sys

KEY64 = '''        key = argmax_key(tl.where(logit != logit, float("inf"), logit), ei[None, :])
        key = tl.where(live, key, _NO_KEY)
'''
KEY32 = '''        key = _route_key32(tl.where(logit != logit, float("inf"), logit), ei[None, :])
        key = tl.where(live, key, _NO_KEY32)
'''
PICKED64 = "            key = tl.where(hit, _NO_KEY, key)\n"
PICKED32 = "            key = tl.where(hit, _NO_KEY32, key)\n"
HELPER_AT = "@triton.jit\ndef _route_plan_kernel("
HELPER = '''#: below every `_route_key32`
_NO_KEY32 = tl.constexpr(-(2 ** 31))


@triton.jit
def _route_key32(x, ids):
    """int32 keys of bf16-exact fp32 values x that sort like (value descending, id ascending), ids < 2^16: the
    upper 16 bits of `argmax_key`'s order-preserving image (a bf16 value's low 16 bits are 0, or all 1 once
    negative values are flipped) above 0xFFFF - id."""
    b = tl.where(x == 0.0, 0.0, x).to(tl.int32, bitcast=True)
    s = tl.where(b < 0, b ^ 0x7FFFFFFF, b)
    return (s & -65536) | (ids ^ 0xFFFF)


'''


def keys32_source(src: str) -> str:
    """kernels/moe.py's text with the route / plan kernel's top-k on int32 keys."""
    for old in (KEY64, PICKED64, HELPER_AT):
        assert src.count(old) == 1, f"kernels/moe.py changed: {old!r}"
    return src.replace(KEY64, KEY32).replace(PICKED64, PICKED32).replace(HELPER_AT, HELPER + HELPER_AT)


if __name__ == "__main__":
    path = sys.argv[1]
    text = keys32_source(open(path).read())
    with open(path, "w") as f:
        f.write(text)
