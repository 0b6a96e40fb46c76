"""Inline-asm helpers of session 38's Gluon explores (explore51-55): %globaltimer stamps, the SM id, a program's
stamp record, and the next launch released (griddepcontrol.launch_dependents) at a chosen point. Generated kernel
sources import them by name (`from gluon_asm import ...`; bench/explore on the path)."""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl


@gluon.jit
def _stamp(v):
    """%globaltimer (ns, int64) read once the int32 v is available (the read is predicated on it)."""
    return gl.inline_asm_elementwise(
        "{ .reg .pred p; setp.eq.u32 p, $1, 0x7fc00001; @p mov.u64 $0, 0; @!p mov.u64 $0, %globaltimer; }",
        "=l,r", [v], dtype=gl.int64, is_pure=False, pack=1)


@gluon.jit
def _smid(v):
    """The SM this thread runs on (int32), read after v."""
    return gl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r,r", [v], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _store_record(tr_ptr, pid, f0, f1, f2, f3, f4, lane, L1: gl.constexpr):
    """Program pid's record of 8 int64 at tr_ptr + 8 pid: the five stamps f0..f4 (scalars), its SM, 1 (written).
    lane: the program's arange(0, threads) in layout L1."""
    f = gl.arange(0, 8, layout=L1)
    rec = gl.where(f == 0, f0, gl.where(f == 1, f1, gl.where(f == 2, f2, gl.where(
        f == 3, f3, gl.where(f == 4, f4, gl.where(f == 5, gl.max(_smid(lane), axis=0).to(gl.int64), 1))))))
    gl.store(tr_ptr + pid.to(gl.int64) * 8 + f, rec)


@gluon.jit
def _release_when(v):
    """griddepcontrol.launch_dependents once the int32 v is available (one predicated release an element)."""
    return gl.inline_asm_elementwise(
        "{ .reg .pred p; setp.ne.b32 p, $1, 0x7fc00001; @p griddepcontrol.launch_dependents; mov.b32 $0, 0; }",
        "=r,r", [v], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _release_now(v):
    """griddepcontrol.launch_dependents (once an element of v, whose values are not read); returns int32 0s."""
    return gl.inline_asm_elementwise("{ griddepcontrol.launch_dependents; mov.b32 $0, 0; }", "=r,r", [v],
                                     dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _release_through(v):
    """v (int16) unchanged, each element through an asm that also executes griddepcontrol.launch_dependents."""
    return gl.inline_asm_elementwise("{ griddepcontrol.launch_dependents; mov.b16 $0, $1; }", "=h,h", [v],
                                     dtype=gl.int16, is_pure=False, pack=1)
