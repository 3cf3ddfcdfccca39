"""How a Hopper tensor core adds: the numerics of an f16/bf16 WGMMA.

NVIDIA documents what a WGMMA computes, not how it rounds. The emulator uses
a model of the adder fitted to, and validated bit for bit against, an H200
(``benchmarks/hardware.py`` records the kernels; the recording is
``benchmarks/data/h200_bits.npz``; ``tests/emulate/test_hardware.py`` holds
the emulator to it). For f16 and bf16 operands, each ``wgmma.mma_async``
instruction (K = 16) adds its 16 exact products and the incoming accumulator
in one step:

1. every term gets an *alignment exponent*: a product ``a * b`` gets
   ``E(a) + E(b)``, where ``E(x)`` is x's exponent field read as a power of
   two (``floor(log2 |x|)``, and the format's minimum normal exponent for a
   subnormal: -14 for f16, -126 for bf16) -- not the product's own exponent,
   which can be one higher; the accumulator gets its own exponent (with the
   same subnormal rule for an f16 accumulator);
2. every term is truncated towards zero to a multiple of ``2 ** (emax - 25)``,
   ``emax`` the largest alignment exponent of the nonzero terms;
3. the truncated terms are added exactly;
4. the sum is rounded towards zero to f32 (an f32 accumulator) or to the
   nearest even f16 (an f16 accumulator).

The same kernels under IEEE f32 arithmetic (or an exact sum rounded once)
agree with the H200 on 1-25% of outputs; the hardware is the less accurate
(its error reaches 3.4e-7 of ``sum |a b|`` where an exact sum rounded once
gives 6e-8). Validated: random f16 and bf16 operands with K = 1024 (64
instructions into one accumulator), mixed magnitudes with cancellation,
subnormal f16 operands, an f16 output rounded from the f32 accumulator, an
f16 accumulator over 12 instructions. Not validated on the hardware: infinities
and NaN among the terms (the IEEE sum of the exact terms is used) and an
overflowing sum (rounded towards zero, it saturates at the largest finite
value, as IEEE's round-towards-zero does).

tf32 (WGMMA K = 8) goes through the same four steps, on operands the caller
has truncated to tf32 (:mod:`.ops.wgmma`). The model's assumptions hold for
it: a product of two tf32 values (11-bit significands) has at most 22
significant bits and an exponent within [-252, 255] (subnormal operands are
refused before this), so it is exact in float64; the terms scaled by
``2 ** (25 - emax)`` stay below ``2 ** 27`` and their sum is exact; an
operand's alignment exponent is its exponent field, as for bf16 (-126 at
the bottom of the range). MMA-Sim (arXiv 2511.10909), fitted to Hopper,
models tf32 WGMMA the same way (truncate, then the 25-bit fused sum, rounded
towards zero); the H200 recording here has no tf32 kernel.

How it is computed: :func:`mma` walks the K terms one at a time over
(M, N) planes. The largest alignment exponent is a running maximum of
``E(a[:, k]) + E(b[:, k])`` (for f16 and fp8, one matrix product of powers
of two instead: :func:`_largest_alignment_by_matmul`); each term
``a[:, k] b[:, k]`` is multiplied by ``2 ** (25 - emax)`` (exact: a power
of two, far inside float64's range for every operand format here),
truncated and added -- so no (M, N, K) array is built and no ``ldexp``
runs per term; with K <= 32 the Python loop costs less than the memory
traffic it saves. For f16 and fp8 operands the terms are formed in
float32 (exact for their products, half the traffic) wherever the scale is
a normal float32; the sum is always float64. Operands or an accumulator
holding infinities or NaN take :func:`mma_reference`, the four steps
written over (M, N, K) arrays, which also holds the fast path to the same
bits in tests. Where numba is installed, steps 1 to 3 run compiled instead
(:mod:`.tensorcore_compiled`: the same exact operations, so the same bits,
in a seventh to a quarter of the time).
"""

from __future__ import annotations

import numpy as np

from . import tensorcore_compiled

# Bits kept below the largest alignment exponent (step 2).
ALIGNMENT_BITS = 25
# The exponent field's value for subnormals, per operand format.
MIN_EXPONENT = {"f16": -14, "bf16": -126, "tf32": -126, "f32": -126, "e4m3": -6, "e5m2": -14}
_NONE = np.int64(-(1 << 20))  # the alignment exponent of a zero term: below any other
# Operand formats whose products and scaled terms float32 holds exactly (see
# mma), and the scale's exponents float32 holds as normal numbers.
NARROW = ("f16", "e4m3", "e5m2")
F32_SHIFTS = (-126, 127)
F32_MIN_NORMAL = 2.0 ** -126


def _exponents(x: np.ndarray, min_exponent: int) -> np.ndarray:
    """floor(log2 |x|), clamped below at ``min_exponent``; ``_NONE`` for zeros."""
    _, e = np.frexp(x)
    e = np.maximum(e.astype(np.int64) - 1, min_exponent)
    return np.where(x == 0, _NONE, e)


F32_LOW_BITS = np.uint64(~((1 << 29) - 1) & ((1 << 64) - 1))  # float64's bits f32 keeps


def _round_towards_zero_f32(s: np.ndarray) -> np.ndarray:
    a = np.abs(s)
    if a.size and a.min() >= F32_MIN_NORMAL and a.max() < 2.0 ** 128:
        # within float32's normal range, dropping the 29 bits of float64's
        # significand that float32 lacks is the rounding; the cast is exact
        return (np.ascontiguousarray(s).view(np.uint64) & F32_LOW_BITS).view(
            np.float64).astype(np.float32)
    f = s.astype(np.float32)
    away = np.abs(f.astype(np.float64)) > np.abs(s)
    return np.where(away, np.nextafter(f, np.float32(0)), f)


def _formats(operands: str | tuple[str, str]) -> tuple[str, str]:
    return (operands, operands) if isinstance(operands, str) else operands


def _round(total: np.ndarray, accumulator: str) -> np.ndarray:
    """Step 4: the exact sum rounded to the accumulator's type."""
    with np.errstate(over="ignore"):  # overflow rounds as the accumulator's rounding says
        if accumulator == "f32":
            return _round_towards_zero_f32(total)
        return total.astype(np.float16)


def mma(a: np.ndarray, b: np.ndarray, acc: np.ndarray | None, *,
        operands: str | tuple[str, str], accumulator: str,
        compiled: bool | None = None) -> np.ndarray:
    """One instruction: ``acc + a @ b.T`` as the tensor core rounds it.

    ``a`` is (M, K) and ``b`` (N, K), holding values of the ``operands``
    formats (one name for both, or A's and B's: "f16", "bf16", "tf32" (already
    truncated), "e4m3", "e5m2"; fp8 and tf32 follow the f16 rule, unvalidated)
    in float64, signs already applied; ``acc`` is (M, N) in the accumulator's type (``accumulator``:
    "f32" or "f16"), or None when the instruction does not add it (scale-d 0). Returns (M, N) in the
    accumulator's type. The same bits as :func:`mma_reference`, term by term
    over (M, N) planes (see the module's docstring), or compiled
    (:mod:`.tensorcore_compiled`; ``compiled``: None where it is chosen --
    available, after a process's first sums --, True to require it, False
    for the numpy code).
    """
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    c = None if acc is None else np.asarray(acc, np.float64)
    if not (np.isfinite(a).all() and np.isfinite(b).all()
            and (c is None or np.isfinite(c).all())):
        return mma_reference(a, b, acc, operands=operands, accumulator=accumulator)
    out_type = np.float32 if accumulator == "f32" else np.float16
    a_format, b_format = _formats(operands)
    if tensorcore_compiled.chosen() if compiled is None else compiled:
        total = tensorcore_compiled.aligned_sum(
            a, b, c, MIN_EXPONENT[a_format], MIN_EXPONENT[b_format], MIN_EXPONENT[accumulator],
            ALIGNMENT_BITS, int(_NONE))
        return _round(total, accumulator).astype(out_type)
    # step 1: the largest alignment exponent of each output
    narrow = a_format in NARROW and b_format in NARROW
    if narrow:
        emax = _largest_alignment_by_matmul(a, b, MIN_EXPONENT[a_format],
                                            MIN_EXPONENT[b_format])
    else:  # a running maximum over k; exponents fit int32 (_NONE included)
        ea = _exponents(a, MIN_EXPONENT[a_format]).T.astype(np.int32)  # (K, M)
        eb = _exponents(b, MIN_EXPONENT[b_format]).T.astype(np.int32)  # (K, N)
        emax = np.add(ea[0][:, None], eb[0])
        plane = np.empty_like(emax)
        for k in range(1, a.shape[1]):
            np.maximum(emax, np.add(ea[k][:, None], eb[k], out=plane), out=emax)
    if c is not None:
        np.maximum(emax, _exponents(c, MIN_EXPONENT[accumulator]), out=emax)
    # steps 2 and 3 in units of 2 ** (emax - 25): the scale is a power of two
    # between 2 ** -260 and 2 ** 300, so every scaled term is exact
    shift = ALIGNMENT_BITS - np.where(emax < _NONE // 2, 0, emax)
    scale = _power_of_two(shift)
    kept = np.zeros(emax.shape) if c is None else np.trunc(c * scale)
    at, bt = a.T, b.T
    if narrow and F32_SHIFTS[0] <= shift.min() and shift.max() <= F32_SHIFTS[1]:
        # products of f16/fp8 values (at most 22 bits, 2 ** -48 to 2 ** 32)
        # and the scale are exact in float32; a scaled term >= 1 stays exact,
        # one that underflows truncates to the same signed zero
        at, bt, scale = at.astype(np.float32), bt.astype(np.float32), scale.astype(np.float32)
    term = np.empty(emax.shape, at.dtype)
    for k in range(a.shape[1]):
        np.multiply(at[k][:, None], bt[k], out=term)  # exact products
        term *= scale
        np.trunc(term, out=term)
        kept += term  # exact, in float64: integers below 2 ** 32
    # (times a power of two: exact, or one rounding into float64's subnormals as ldexp's)
    return _round(kept * _power_of_two(-shift), accumulator).astype(out_type)


def _power_of_two(e: np.ndarray) -> np.ndarray:
    """2.0 ** e for integers e in float64's normal range, from the exponent
    field (a tenth of ``ldexp``'s time)."""
    return ((e.astype(np.int64) + 1023) << 52).view(np.float64)


def _largest_alignment_by_matmul(a: np.ndarray, b: np.ndarray, low_a: int,
                                 low_b: int) -> np.ndarray:
    """max over k of E(a[m, k]) + E(b[n, k]) (``_NONE`` where every product is
    zero) for f16/fp8 operands, by one matrix product: with ``q`` such that
    K < 2 ** q, the sum S of ``2 ** (q * (E(a) + E(b)))`` over k lies in
    [2 ** (q emax), K 2 ** (q emax)), below 2 ** (q (emax + 1)) -- and a
    float64 sum of positive terms is never below its largest term, nor (for
    K <= 32) rounded anywhere near the next boundary -- so
    ``floor(log2 S) // q`` is emax. The exponents of these formats (-14 to
    15) keep every term a normal float64; a zero operand's term is 0."""
    q = int(a.shape[1]).bit_length()  # 2 ** q > K
    pa = np.ldexp(1.0, q * _exponents(a, low_a))  # 0 for a zero (_NONE underflows)
    pb = np.ldexp(1.0, q * _exponents(b, low_b))
    total = pa @ pb.T
    _, e = np.frexp(total)  # total = f 2 ** e, f in [0.5, 1)
    return np.where(total > 0, (e.astype(np.int64) - 1) // q, _NONE)


def mma_reference(a: np.ndarray, b: np.ndarray, acc: np.ndarray | None, *,
                  operands: str | tuple[str, str], accumulator: str) -> np.ndarray:
    """:func:`mma` (the same arguments and result) written as the four steps
    over (M, N, K) arrays, with infinities and NaN among the terms as their
    IEEE sum."""
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    out_type = np.float32 if accumulator == "f32" else np.float16
    c = np.zeros((a.shape[0], b.shape[0])) if acc is None else np.asarray(acc, np.float64)
    products = a[:, None, :] * b[None, :, :]  # (M, N, K), exact
    a_format, b_format = _formats(operands)
    # A zero operand's exponent is _NONE, so its products align below any other term.
    align = _exponents(a, MIN_EXPONENT[a_format])[:, None, :] + \
        _exponents(b, MIN_EXPONENT[b_format])[None, :, :]
    emax = np.maximum(align.max(axis=2), _exponents(c, MIN_EXPONENT[accumulator]))
    shift = ALIGNMENT_BITS - np.where(emax < _NONE // 2, 0, emax)  # all terms zero: any shift
    kept = np.trunc(np.ldexp(products, shift[:, :, None])).sum(axis=2) + \
        np.trunc(np.ldexp(c, shift))
    total = np.ldexp(kept, -shift)  # exact: at most ~32 significant bits
    result = _round(total, accumulator)
    if not (np.isfinite(a).all() and np.isfinite(b).all() and np.isfinite(c).all()):
        # Infinities and NaN: the IEEE sum of the exact terms.
        special = ~np.isfinite(products).all(axis=2) | ~np.isfinite(c)
        with np.errstate(invalid="ignore", over="ignore"):
            ieee = (products.sum(axis=2) + c).astype(out_type)
        result = np.where(special, ieee, result)
    return result.astype(out_type)
