"""`lowlat.kernels.sm90_check.programs_per_sm`: how many programs of a kernel one sm_90 SM holds at once (what
bounds how far an early-launched PDL grid can pack onto a few SMs, session 12); `spills`: which compile reports the
check flags as spilling (session 17)."""

from __future__ import annotations

import pytest

from lowlat.kernels.sm90_check import programs_per_sm


@pytest.mark.parametrize("registers, shared, warps, expected, why", [
    (44, 28672, 4, 7, "shared memory: 7 x (28 KB + 1 KB) fits 228 KB, 8 does not (SmolLM2 out_proj, session 12)"),
    (40, 28672, 16, 3, "registers: 40 x 512 threads = 20480 a program, 3 fit in 65536"),
    (41, 28672, 16, 2, "registers are allocated in multiples of 8 per thread: 41 counts as 48"),
    (192, 69632, 4, 2, "registers: 192 x 128 = 24576, 2 fit (Qwen3 prologue)"),
    (66, 139648, 8, 1, "shared memory: 137 KB, one (Llama gate/up)"),
    (16, 0, 1, 32, "at most 32 blocks an SM"),
    (16, 0, 32, 2, "threads: 1024 a program, 2048 an SM"),
])
def test_programs_per_sm_takes_the_tightest_limit(registers, shared, warps, expected, why):
    assert programs_per_sm(registers, shared, warps) == expected, why


def test_programs_per_sm_refuses_nonsense():
    with pytest.raises(ValueError, match="registers=0"):
        programs_per_sm(0, 1024, 4)


def test_spills_tolerates_a_register_or_two_of_ptxas_stack_only():
    """`spills`: a local array in the PTX, or more than SPILL_BYTES_OK bytes of ptxas stack a thread, is a finding;
    up to SPILL_BYTES_OK bytes (session 17: Llama's out_proj at 2 row blocks, 8 bytes, measured faster) is not; an
    unknown stack (no cuobjdump) counts as none."""
    from lowlat.kernels.sm90_check import SPILL_BYTES_OK, spills

    assert SPILL_BYTES_OK == 8
    for local_array, stack, bad in ((False, 0, False), (False, 8, False), (False, 16, True), (True, 0, True),
                                    (False, None, False), (True, None, True)):
        assert spills(dict(local_array=local_array, spill_bytes=stack)) is bad, (local_array, stack)
