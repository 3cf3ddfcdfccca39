"""``wgmma.mma_async`` as jax's WGMMA code generator (``mosaic_gpu/wgmma.py``)
emits it: one PTX block per instruction,

    { .reg .pred p; setp.ne.b32 p, $U, 0;
      wgmma.mma_async.sync.aligned.m64nNkK.D.A.B {d...}, A, $Bdesc, p, imm...; }

computing D (64 x N) = A (64 x K) @ B (K x N) + (p ? D : 0) for the whole
warpgroup, complete when issued (``wgmma.fence``/``commit_group``/
``wait_group`` order nothing further in lockstep).

Operands, per the PTX ISA ("Asynchronous Warpgroup Level Matrix Multiply-
Accumulate", matrix descriptors and shared memory layouts):

* **SMEM matrix descriptors** (64 bits): start address >> 4 in bits 0-13,
  leading byte offset (LBO) >> 4 in bits 16-29, stride byte offset (SBO) >> 4
  in bits 32-45, base offset in bits 49-51 (must be 0 here), swizzle in bits
  62-63 (1: 128 B, 2: 64 B, 3: 32 B; 0, no swizzle, is not modelled -- jax
  never emits it). The matrix is read through the canonical layouts of
  swizzle width S bytes, for element (mn, k) of an M/N x K operand with
  ``e``-byte elements:

  - K-major (``imm-trans`` 0): ``(mn % 8) * S + (mn // 8) * SBO + k * e``
  - MN-major (``imm-trans`` 1): ``(mn * e) % S + (mn * e // S) * LBO + (k % 8) * S
    + (k // 8) * SBO``

  each byte address then passed through the S-byte swizzle
  (:func:`..memory.swizzle`).
* **A in registers**: four b32 registers per thread; register ``g`` holds
  ``p = 4 / e`` consecutive elements (``e``-byte; the low bits first) of row
  ``16 * warp + lane // 4 + 8 * (g % 2)``, from column
  ``p * (lane % 4) + 4 * p * (g // 2)`` -- for f16/bf16 (K = 16) and for
  s8/e4m3/e5m2 (K = 32) alike.
* **D** (f32 or s32): N/2 registers per thread, register ``i`` at row
  ``16 * warp + lane // 4 + 8 * ((i // 2) % 2)``, column
  ``8 * (i // 4) + 2 * (lane % 4) + i % 2``. An f16 D packs two of those
  elements (``2j``, ``2j + 1``, the low half first) in each of N/4 b32
  registers.

Numbers: each f16/bf16 instruction adds its K products and D as an H200's
tensor core does, bit for bit (:mod:`..tensorcore`: products aligned to the
largest term, truncated 25 bits below it, summed exactly, rounded towards
zero to an f32 D or to nearest to an f16 D). fp8 (e4m3/e5m2, mixed as the
PTX ISA allows) goes through the same adder, one group per instruction (K =
32) -- a reading, not validated on the hardware. s8 x s8 -> s32 is exact
(wrapping).

tf32 (``.tf32``, jax's WGMMA of f32 operands; K = 8, 4-byte elements): the
PTX ISA ("wgmma.mma_async", Precision and rounding) says the instruction
"will truncate lower 13 bits of the 32-bit input data before multiplication
is issued", so each operand is its f32 bits with the low 13 cleared -- sign,
8 exponent bits, the top 10 mantissa bits: truncation towards zero, and a NaN
whose payload lies only in those 13 bits reads as an infinity. The truncated
operands go through the same adder as f16/bf16 (:mod:`..tensorcore`: a
product of two tf32 values has 22 significant bits, exact; MMA-Sim's Hopper
model, arXiv 2511.10909, truncates and adds the same way) -- not validated on
our H200 recording. Refused with :class:`Unsupported`: a subnormal tf32
operand (the ISA leaves subnormal inputs unspecified, and Fasi et al.'s
tensor-core tests report an A100's tf32 mma flushing them), A from
registers (PTX has the form, jax never emits it: its ``wgmma`` takes f32 A
from SMEM only) and any immediates beyond scale-a and scale-b (PTX gives
``.tf32`` no ``imm-trans``: "the transpose operation is only supported for
the .f16/.bf16 types", so tf32 operands are K-major).
Scales other than +-1 raise :class:`Unsupported` for every type.
"""

from __future__ import annotations

import functools
import re

import numpy as np

from .. import irtypes, tensorcore
from ..compiler import OWNS, Op, Step, accumulator_use
from ..errors import Unsupported
from ..machine import Frame, uniform
from ..memory import swizzle as swizzle_addr

WGMMA = re.compile(
    r"\{\s*\.reg \.pred p;\s*setp\.ne\.b32 p, \$(\d+), 0;\s*"
    r"wgmma\.mma_async\.sync\.aligned\.m64n(\d+)k(\d+)\.(\w+)\.(\w+)\.(\w+)\s+"
    r"\{([^}]*)\},\s*(\{[^}]*\}|\$\d+),\s*\$(\d+),\s*p((?:,\s*\$\d+)*);\s*\}\s*$")

ELEMENTS = {"f16": np.dtype(np.float16), "bf16": irtypes.SCALARS["bf16"], "s8": np.dtype(np.int8),
            "e4m3": irtypes.SCALARS["f8E4M3FN"], "e5m2": irtypes.SCALARS["f8E5M2"],
            "tf32": np.dtype(np.float32)}  # tf32: f32 storage, read through tf32()
# The accumulator types PTX pairs with each operand type.
ACCUMULATORS = {"f16": ("f32", "f16"), "bf16": ("f32",), "tf32": ("f32",), "e4m3": ("f32", "f16"),
                "e5m2": ("f32", "f16"), "s8": ("s32",)}
FP8 = ("e4m3", "e5m2")
TF32_MASK = np.uint32(0xFFFFE000)  # what the tensor core keeps of a 32-bit .tf32 element
F32_MIN_NORMAL = float(np.finfo(np.float32).tiny)
SWIZZLES = {1: 128, 2: 64, 3: 32}


def is_wgmma(text: str) -> bool:
    return "wgmma.mma_async" in text


def _num(s: str) -> int:
    return int(s.strip().lstrip("$"))


def compile_wgmma(o: Op, text: str) -> Step:
    loc = o.loc
    m = WGMMA.match(" ".join(text.replace("\\0A", " ").split()))
    if not m:
        raise Unsupported(f"inline PTX {text!r} (a WGMMA form not modelled)", loc)
    use_out, n, k, dty, aty, bty, d_list, a_op, b_op, imms = m.groups()
    n, k = int(n), int(k)
    d_regs = [_num(x) for x in d_list.split(",")]
    if dty not in ("f32", "s32", "f16"):
        raise Unsupported(f"WGMMA with a .{dty} accumulator", loc)
    if aty not in ELEMENTS or bty not in ELEMENTS or (aty != bty and not {aty, bty} <= set(FP8)):
        raise Unsupported(f"WGMMA of .{aty} x .{bty} (f16, bf16, tf32, fp8 and s8 are modelled)",
                          loc)
    el, el_b = ELEMENTS[aty], ELEMENTS[bty]
    is_int = aty == "s8"
    if dty not in ACCUMULATORS[aty]:
        raise Unsupported(f"WGMMA of .{aty} into a .{dty} accumulator", loc)
    packed = dty == "f16"  # two f16 accumulators per b32 register
    if k * el.itemsize != 32 or len(d_regs) != n // (4 if packed else 2):
        raise Unsupported(f"WGMMA m64n{n}k{k} with {len(d_regs)} accumulator registers", loc)
    n_out = len(d_regs)  # "=f"/"=r" outputs $0..; then the tied inputs
    ins = o.ins

    def slot(dollar: int) -> int:
        i = dollar - n_out
        if not 0 <= i < len(ins):
            raise Unsupported(f"inline PTX {text!r}: operand ${dollar} out of range", loc)
        return ins[i]

    tied = [slot(n_out + i) for i in range(n_out)]
    a_in_regs = a_op.startswith("{")
    if a_in_regs:
        a_slots = [slot(_num(x)) for x in a_op.strip("{}").split(",")]
        if len(a_slots) != 4:
            raise Unsupported(f"WGMMA with {len(a_slots)} A registers", loc)
        if aty == "tf32":  # PTX has its fragment (one element a register); jax, no such kernel
            raise Unsupported("WGMMA .tf32 with A in registers (PTX has the form; jax never "
                              "emits it, so it is not modelled)", loc)
    else:
        a_slots = [slot(_num(a_op))]
    b_slot = slot(int(b_op))
    use_slot = slot(int(use_out))
    imm_slots = [slot(_num(x)) for x in imms.split(",") if x.strip()]
    if el.itemsize == 2:
        want = 3 if a_in_regs else 4  # scale-a, scale-b, [trans-a,] trans-b
    else:
        want = 0 if is_int else 2  # fp8: scale-a, scale-b (no transposes)
    if len(imm_slots) != want:
        if el.itemsize != 2 and not is_int and len(imm_slots) > want:
            raise Unsupported(f"WGMMA .{aty} with {len(imm_slots)} immediates: PTX gives "
                              f".{aty} no imm-trans-a/b (transposes are for .f16/.bf16 only), "
                              "so its operands must be K-major", loc)
        raise Unsupported(f"inline PTX {text!r}: {len(imm_slots)} immediates", loc)
    (out,) = [s for s, t in zip(o.outs, o.out_types) if t.kind != "none"]
    o.comp.accumulators.add(out)  # the checker guards what reads it before the wait
    acc_dt = {"f32": np.dtype(np.float32), "s32": np.dtype(np.int32),
              "f16": np.dtype(np.float16)}[dty]
    site = o.site(f"wgmma.mma_async.m64n{n}k{k}.{dty}.{aty}.{bty}")

    def step(fr: Frame) -> None:
        b = fr.need_block("wgmma.mma_async", loc)
        if fr.T != 128 or (fr.mask is not None and not fr.mask.all()):
            raise Unsupported("wgmma.mma_async issued by other than one whole warpgroup", loc)
        r = fr.regs
        vals = [uniform(r[s], fr, "a WGMMA immediate", loc) for s in imm_slots]
        scale_a, scale_b = (int(vals[0]), int(vals[1])) if vals else (1, 1)
        if scale_a not in (1, -1) or scale_b not in (1, -1):
            raise Unsupported(f"WGMMA scales {scale_a}, {scale_b} (1 or -1)", loc)
        if el.itemsize == 2:
            trans_a = int(vals[2]) if not a_in_regs else 0
            trans_b = int(vals[-1])
        else:
            trans_a = trans_b = 0
        issued = None if fr.sync is None else fr.sync.wgmma_issue(fr)  # (comp, stamp, agent)
        check = _operand_check(fr, site, issued)
        if a_in_regs:
            a = _a_from_registers(fr, a_slots, el)
        else:
            desc = int(uniform(r[a_slots[0]], fr, "the WGMMA A descriptor", loc))
            a = _read_operand(fr, desc, 64, k, el, trans_a, loc, check)
        desc_b = int(uniform(r[b_slot], fr, "the WGMMA B descriptor", loc))
        bm = _read_operand(fr, desc_b, n, k, el_b, trans_b, loc, check)  # (N, K)
        if aty == "tf32":
            a, bm = tf32(a, "A", loc), tf32(bm, "B", loc)
        del b
        flat, inverse = _d_order(n)
        use = np.asarray(r[use_slot]).reshape(-1)
        if np.any(use != use[0]):
            raise Unsupported("a WGMMA scale-d that differs between threads", loc)
        acc = None  # scale-d 0: the accumulators are not read
        if use[0] and packed:  # (T, N/4) b32 registers, each two f16: the low half first
            words = np.stack([per_thread_word(r[s], fr.T) for s in tied], axis=1)
            acc = words.view(np.float16).reshape(fr.T, n // 2)
        elif use[0]:
            acc = _per_thread_columns([r[s] for s in tied], fr.T)  # (T, N/2)
        if is_int:
            prod = (a.astype(np.int64) @ bm.astype(np.int64).T).reshape(-1)[flat]
            res = (prod + (0 if acc is None else acc.astype(np.int64))).astype(np.uint64) \
                .astype(np.uint32).view(np.int32)
        else:  # the tensor core's own rounding (see ..tensorcore)
            d = None if acc is None else acc.reshape(-1)[inverse].reshape(64, n)
            res = tensorcore.mma(a.astype(np.float64) * scale_a, bm.astype(np.float64) * scale_b,
                                 d, operands=(aty, bty), accumulator=dty).reshape(-1)[flat]
        if packed:
            words = np.ascontiguousarray(res.astype(np.float16)).view(np.int32)  # (T, N/4)
            r[out] = tuple(words[:, i] for i in range(n_out))
        else:  # register i of every thread: row i of the transposed result, as (T, 1)
            r[out] = tuple(np.ascontiguousarray(res.astype(acc_dt).T)[:, :, None])
        if fr.prof is not None:  # A from registers reads no SMEM
            fr.prof.mma(loc, 64, n, k, (0 if a_in_regs else 64 * k * el.itemsize)
                        + n * k * el_b.itemsize)
        if issued is not None:  # the accumulators are the WGMMA's until waited for
            comp, stamp, agent = issued
            fr.pending[out] = (comp, stamp, site, agent)
    return accumulator_use(step, OWNS)


def tf32(x: np.ndarray, which: str, where: str) -> np.ndarray:
    """f32 operand elements as the tensor core reads ``.tf32``: the low 13 bits
    cleared (the PTX ISA's truncation; a NaN with only those bits set becomes
    an infinity). A subnormal result raises :class:`Unsupported`: the ISA leaves
    subnormal inputs unspecified."""
    t = (np.ascontiguousarray(x, np.float32).view(np.uint32) & TF32_MASK).view(np.float32)
    sub = (t != 0) & (np.abs(t) < F32_MIN_NORMAL)
    if sub.any():
        raise Unsupported(f"a subnormal .tf32 WGMMA operand ({which} = {t[sub][0]!r}): the PTX "
                          "ISA leaves subnormal inputs unspecified", where)
    return t


def _per_thread_scalar(v, T: int) -> np.ndarray:
    """A vector<1xT> register (per thread (T, 1), or uniform (1,)) as (T,)."""
    v = np.asarray(v)
    if v.ndim == 2:
        return v[:, 0]
    return np.broadcast_to(v.reshape(-1)[:1], (T,))


def per_thread_word(v, T: int) -> np.ndarray:
    """A b32 register (per thread (T,), or uniform) as (T,) int32."""
    v = np.asarray(v).astype(np.int32)
    return v.reshape(T) if v.size == T else np.broadcast_to(v.reshape(-1)[:1], (T,))


def _per_thread_columns(values: list, T: int) -> np.ndarray:
    """vector<1xT> registers (each per thread (T, 1), or uniform) side by
    side: (T, len(values)); one concatenation when all are per thread (the
    usual case: tried first, its shape telling)."""
    try:
        out = np.concatenate(values, axis=1)
        if out.shape == (T, len(values)):
            return out
    except (ValueError, TypeError):  # a uniform register among them
        pass
    columns = [np.asarray(v) for v in values]
    if all(c.ndim < 2 for c in columns):  # all uniform: one row, every thread's
        return np.broadcast_to(np.array([c.reshape(-1)[0] for c in columns]), (T, len(columns)))
    return np.stack([_per_thread_scalar(c, T) for c in columns], axis=1)


def _d_positions(n: int) -> tuple[np.ndarray, np.ndarray]:
    """(row, column) of accumulator register i of each thread: (128, N/2) each."""
    t = np.arange(128)[:, None]
    i = np.arange(n // 2)[None, :]
    warp, lane = t // 32, t % 32
    rows = 16 * warp + lane // 4 + 8 * ((i // 2) % 2)
    cols = 8 * (i // 4) + 2 * (lane % 4) + i % 2
    return rows, cols


@functools.cache
def _d_order(n: int) -> tuple[np.ndarray, np.ndarray]:
    """The accumulator fragment as a permutation of the 64 x N tile, computed
    once per N: (``flat``, (128, N/2): the tile's flat index of each thread's
    register i; ``inverse``, (64 N,): which register element each tile
    element is, in the (128, N/2) order) -- every element is exactly one
    thread's register."""
    rows, cols = _d_positions(n)
    flat = rows * n + cols
    inverse = np.empty(64 * n, np.int64)
    inverse[flat.reshape(-1)] = np.arange(64 * n)
    flat.setflags(write=False)
    inverse.setflags(write=False)
    return flat, inverse


def _a_from_registers(fr: Frame, slots: list[int], el: np.dtype) -> np.ndarray:
    """The 64 x K A tile (K = 32 bytes of elements) held in four b32 registers
    per thread: register ``g`` holds ``p = 4 / e`` consecutive elements of row
    ``16 warp + lane // 4 + 8 (g % 2)``, from column ``p (lane % 4) + 4 p (g // 2)``
    (the low bits first) -- the PTX ISA's fragment for 16- and 8-bit A."""
    regs = np.stack([per_thread_word(fr.regs[s], fr.T) for s in slots], axis=1)  # (T, 4)
    e = el.itemsize
    p = 4 // e
    elems = np.ascontiguousarray(regs).view(np.dtype(f"u{e}")).reshape(fr.T, 4, p)
    t = np.arange(fr.T)[:, None, None]
    g = np.arange(4)[None, :, None]
    j = np.arange(p)[None, None, :]
    warp, lane = t // 32, t % 32
    rows = 16 * warp + lane // 4 + 8 * (g % 2)
    cols = p * (lane % 4) + j + 4 * p * (g // 2)
    a = np.zeros((64, 8 * p), np.dtype(f"u{e}"))
    a[rows, cols] = elems
    return a.view(el)


def _operand_check(fr: Frame, site, issued: tuple | None):
    """The checker's view of this WGMMA's SMEM reads: checked against what the
    issuing warpgroup knows, recorded under its WGMMA groups (``issued``:
    component, stamp, agent; ordered before what follows the
    ``wgmma.wait_group`` covering it)."""
    sync = fr.sync
    if issued is None or sync is None:
        return None
    comp, stamp, agent = issued
    view = sync.clocks.view(sync.rows(fr))

    def check(addrs, itemsize: int) -> None:
        sync.async_access(view, fr.mem["shared"], addrs, itemsize, False, site, comp, stamp, agent)
    return check


@functools.lru_cache(maxsize=1024)
def _operand_addresses(desc: int, mn: int, k: int, e: int, trans: int) -> np.ndarray:
    """The SMEM byte address of each element of the (mn, k) operand a
    (checked) descriptor points at, ``e``-byte elements: decoded once per
    descriptor -- a pipeline cycles through a few (read-only: shared)."""
    start = (desc & 0x3FFF) << 4
    lbo = ((desc >> 16) & 0x3FFF) << 4
    sbo = ((desc >> 32) & 0x3FFF) << 4
    s = SWIZZLES[desc >> 62]
    i = np.arange(mn, dtype=np.int64)[:, None]
    j = np.arange(k, dtype=np.int64)[None, :]
    if trans == 0:  # K-major
        off = (i % 8) * s + (i // 8) * sbo + j * e
    else:  # MN-major
        off = (i * e) % s + (i * e // s) * lbo + (j % 8) * s + (j // 8) * sbo
    # the descriptor holds address bits 4..17 of a shared-window address
    addr = swizzle_addr(start + off, s)
    addr.setflags(write=False)
    return addr


def _read_operand(fr: Frame, desc: int, mn: int, k: int, el: np.dtype, trans: int,
                  where: str, check=None, what: str = "WGMMA") -> np.ndarray:
    """The (mn, k) operand a matrix descriptor points at (``what``: the
    instruction reading it, for errors; tcgen05.mma shares the format)."""
    desc &= (1 << 64) - 1
    base_offset = (desc >> 49) & 0x7
    if desc >> 62 not in SWIZZLES:
        raise Unsupported(f"a {what} matrix descriptor without swizzle", where)
    if base_offset:
        raise Unsupported(f"a {what} matrix descriptor with base offset {base_offset}", where)
    addr = _operand_addresses(desc, mn, k, el.itemsize, trans)
    vals = fr.mem["shared"].load(addr, el, None, where)
    if check is not None:
        check(addr, el.itemsize)
    return vals
