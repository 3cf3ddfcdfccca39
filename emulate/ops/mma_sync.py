"""Ampere's warp-level ``mma.sync`` as jax's ``mosaic_gpu/mma.py`` emits it:

    mma.sync.aligned.m16n8kK.row.col[.satfinite].D.A.B.D {d0..d3}, {a0..}, {b0..}, {c0..d3};

Each warp computes its own D (16 x 8) = A (16 x K, row-major) @ B (K x 8,
column-major) + C, every register of the operands spread over its 32 lanes as
the PTX ISA's "Matrix Fragments for mma.m16n8k*" lay them out. With ``p``
elements per b32 register (2 for f16/bf16, 4 for 8-bit, 8 for 4-bit types;
the first element in the lowest bits), ``gid = lane // 4`` and
``tig = lane % 4``:

* A (2 or 4 registers): register ``g`` element ``j`` is A[gid + 8 (g % 2),
  p tig + j + 4 p (g // 2)];
* B (1 or 2 registers): register ``h`` element ``j`` is B[p tig + j + 4 p h, gid];
* C and D (4 f32 or s32 registers): register ``i`` is
  C[gid + 8 (i // 2), 2 tig + i % 2].

so K = 8 p with four A registers (m16n8k16 f16/bf16, m16n8k32 8-bit, m16n8k64
4-bit) and 4 p with two (m16n8k8, m16n8k16 8-bit, m16n8k32 4-bit).

Numbers: integer types (s8/u8, s4/u4, mixed) multiply exactly into s32,
wrapping modulo 2^32 -- or, with ``.satfinite``, the exact sum clamped to the
s32 range. Floating types (f16, bf16, e4m3/e5m2 in any pairing) go through the
tensor-core adder of :mod:`..tensorcore` (validated bit for bit on an H200's
WGMMA; for mma.sync a reading, not validated on the hardware), one group of K
products per instruction, into an f32 D. Other shapes and types (f16
accumulators, tf32, f64, b1) raise :class:`Unsupported`.
"""

from __future__ import annotations

import re

import numpy as np

from .. import irtypes, tensorcore
from ..compiler import Op, Step
from ..errors import Unsupported
from ..machine import Frame
from .nvvm import _check_full_warps, _warps, per_thread

OPCODE = re.compile(r"mma\.sync\.aligned\.m16n8k(\d+)\.row\.col(\.satfinite)?"
                    r"\.(\w+)\.(\w+)\.(\w+)\.(\w+)")
GROUPS = re.compile(r"\{([^}]*)\}")

FLOATS = {"f16": np.dtype(np.float16), "bf16": irtypes.SCALARS["bf16"],
          "e4m3": irtypes.SCALARS["f8E4M3FN"], "e5m2": irtypes.SCALARS["f8E5M2"]}
# integer element types: (bits, signed)
INTEGERS = {"s8": (8, True), "u8": (8, False), "s4": (4, True), "u4": (4, False)}
FP8 = ("e4m3", "e5m2")
S32_MIN, S32_MAX = -(1 << 31), (1 << 31) - 1


def _bits(ty: str) -> int:
    return INTEGERS[ty][0] if ty in INTEGERS else FLOATS[ty].itemsize * 8


def _check_types(d: str, a: str, b: str, c: str, sat: bool, k: int, where: str) -> None:
    """Raises Unsupported for a type combination or shape not modelled."""
    def no(why: str) -> Unsupported:
        return Unsupported(f"mma.sync {why} (modelled: f16/bf16/e4m3/e5m2 into f32, "
                           "s8/u8/s4/u4 into s32, m16n8k(4p) or m16n8k(8p) for p elements "
                           "per b32 register)", where)
    if d != c:
        raise no(f"with a .{c} C and a .{d} D")
    if a in INTEGERS and b in INTEGERS:
        if d != "s32" or INTEGERS[a][0] != INTEGERS[b][0]:
            raise no(f".{d}.{a}.{b}")
    elif a in FLOATS and b in FLOATS:
        if d != "f32" or sat or (a != b and not {a, b} <= set(FP8)):
            raise no(f"{'.satfinite' if sat else ''}.{d}.{a}.{b}")
    else:
        raise no(f"of .{a} x .{b}")
    p = 32 // _bits(a)
    if k not in (4 * p, 8 * p):
        raise no(f"m16n8k{k} of .{a}")


def compile_mma_sync(o: Op, opcode: str, text: str, unknown: Unsupported) -> Step:
    """The step of one ``mma.sync`` string (``unknown``: what an operand list
    that is not jax's raises)."""
    loc = o.loc
    m = OPCODE.fullmatch(opcode)
    if m is None:
        raise unknown
    k, sat, d_ty, a_ty, b_ty, c_ty = int(m[1]), m[2] is not None, m[3], m[4], m[5], m[6]
    _check_types(d_ty, a_ty, b_ty, c_ty, sat, k, loc)
    p = 32 // _bits(a_ty)
    n_a, n_b = (4, 2) if k == 8 * p else (2, 1)
    groups = [[x.strip() for x in g.split(",")] for g in GROUPS.findall(text)]
    if [len(g) for g in groups] != [4, n_a, n_b, 4] or \
            not all(re.fullmatch(r"\$\d+", x) for g in groups for x in g):
        raise unknown
    n_out = 4  # "=f"/"=r" outputs $0..$3, then the inputs

    def slot(x: str) -> int:
        i = int(x[1:]) - n_out
        if not 0 <= i < len(o.ins):
            raise unknown
        return o.ins[i]

    if [int(x[1:]) for x in groups[0]] != list(range(4)):
        raise unknown
    a_slots, b_slots, c_slots = ([slot(x) for x in g] for g in groups[1:])
    results = [s for s, t in zip(o.outs, o.out_types) if t.kind != "none"]
    if len(results) != 1:
        raise unknown
    (out,) = results
    is_int = d_ty == "s32"
    acc_dt = np.dtype(np.int32 if is_int else np.float32)
    name = opcode

    def step(fr: Frame) -> None:
        W = _warps(fr, loc)
        _check_full_warps(fr, name, loc)
        a = _fragment_a(_words(fr, a_slots, loc), a_ty, p, k, W)  # (W, 16, K)
        b = _fragment_b(_words(fr, b_slots, loc), b_ty, p, k, W)  # (W, 8, K)
        c = np.stack([per_thread(fr.regs[s], fr.T).reshape(fr.T) for s in c_slots], 1)
        c = c.astype(acc_dt).reshape(W, 32, 4)
        rows, cols = _c_positions()  # (32, 4)
        c_matrix = np.zeros((W, 16, 8), acc_dt)
        c_matrix[:, rows, cols] = c
        if is_int:
            exact = np.einsum("wmk,wnk->wmn", a, b) + c_matrix.astype(np.int64)
            if sat:
                d = np.clip(exact, S32_MIN, S32_MAX).astype(np.int32)
            else:
                d = exact.astype(np.uint64).astype(np.uint32).view(np.int32)
        else:
            d = np.stack([tensorcore.mma(a[w], b[w], c_matrix[w], operands=(a_ty, b_ty),
                                         accumulator="f32") for w in range(W)])
        regs = d[:, rows, cols].reshape(fr.T, 4).astype(acc_dt)
        fr.regs[out] = tuple(regs[:, i] for i in range(4))
        if fr.prof is not None:
            fr.prof.mma_sync(loc, W, k, is_int)
    return step


def _words(fr: Frame, slots: list[int], where: str) -> np.ndarray:
    """The b32 registers ``slots`` of every thread, as (T, len(slots)) uint32."""
    cols = []
    for s in slots:
        v = np.asarray(fr.regs[s])
        if v.dtype.itemsize != 4:
            raise Unsupported(f"an mma.sync operand register of type {v.dtype} (b32 expected)",
                              where)
        cols.append(per_thread(v.view(np.uint32), fr.T).reshape(fr.T))
    return np.stack(cols, 1)


def _elements(words: np.ndarray, ty: str, p: int) -> np.ndarray:
    """(..., R) b32 registers as (..., R, p) element values (int64 or float64),
    the first element in the lowest bits."""
    bits = 32 // p
    shifts = np.arange(p, dtype=np.uint32) * np.uint32(bits)
    raw = (words[..., None] >> shifts) & np.uint32((1 << bits) - 1)
    if ty in INTEGERS:
        v = raw.astype(np.int64)
        return np.where(v >> (bits - 1), v - (1 << bits), v) if INTEGERS[ty][1] else v
    dt = FLOATS[ty]
    return raw.astype(np.dtype(f"u{dt.itemsize}")).view(dt).astype(np.float64)


def _fragment_a(words: np.ndarray, ty: str, p: int, k: int, W: int) -> np.ndarray:
    """The (W, 16, K) A tiles: register g element j of lane l is
    A[l // 4 + 8 (g % 2), p (l % 4) + j + 4 p (g // 2)]."""
    el = _elements(words.reshape(W, 32, -1), ty, p)  # (W, 32, R, p)
    lane = np.arange(32)[:, None, None]
    g = np.arange(el.shape[2])[None, :, None]
    j = np.arange(p)[None, None, :]
    rows = np.broadcast_to(lane // 4 + 8 * (g % 2), el.shape[1:])
    cols = np.broadcast_to(p * (lane % 4) + j + 4 * p * (g // 2), el.shape[1:])
    a = np.zeros((W, 16, k), el.dtype)
    a[:, rows, cols] = el
    return a


def _fragment_b(words: np.ndarray, ty: str, p: int, k: int, W: int) -> np.ndarray:
    """The (W, 8, K) B tiles, N-major: register h element j of lane l is
    B[p (l % 4) + j + 4 p h, l // 4]."""
    el = _elements(words.reshape(W, 32, -1), ty, p)  # (W, 32, R, p)
    lane = np.arange(32)[:, None, None]
    h = np.arange(el.shape[2])[None, :, None]
    j = np.arange(p)[None, None, :]
    ks = np.broadcast_to(p * (lane % 4) + j + 4 * p * h, el.shape[1:])
    ns = np.broadcast_to(lane // 4, el.shape[1:])
    b = np.zeros((W, 8, k), el.dtype)
    b[:, ns, ks] = el
    return b


def _c_positions() -> tuple[np.ndarray, np.ndarray]:
    """(row, column) of C/D register i of each lane: (32, 4) each."""
    lane = np.arange(32)[:, None]
    i = np.arange(4)[None, :]
    return lane // 4 + 8 * (i // 2), 2 * (lane % 4) + i % 2
