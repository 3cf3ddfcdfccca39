"""Narrow floating-point formats and the PTX ``cvt`` conversions between them
and f32/f16/bf16, bit-exact, on numpy arrays of codes.

A :class:`Format` is described by its exponent and mantissa widths, its bias
and which codes are special; its value table is computed from that
description (no library decides a value). Conversions are done on float64
values, which hold every f32/f16/bf16 and every narrow value exactly, so a
conversion rounds once, as the hardware does.

:func:`encode` is ``cvt.{rn,rz,rp}[.satfinite][.relu].<narrow>.<wide>`` on one
element: the input's magnitude is placed between the two neighbouring finite
magnitudes of the format (``np.searchsorted`` on the table) and rounded

* ``rn``: to the nearer, a tie to the code whose last mantissa bit is 0;
* ``rz``: towards zero; ``rp``: towards +infinity (on a negative input the
  magnitude is rounded towards zero).

``.satfinite``, as the PTX ISA defines it: a NaN input gives the format's NaN
(formats without NaN -- e2m1, e2m3, e3m2 -- give +MAX_NORM), and a magnitude
beyond MAX_NORM, infinities included, gives MAX_NORM with the input's sign
(formats without a sign, ue8m0, give +MAX_NORM). ml_dtypes' casts differ: they
round an overflow to NaN (e4m3fn) or infinity (e5m2). ``.relu`` turns a
result with its sign set (-0 included) into +0 and keeps NaN. ue8m0 (2^(e-127),
no zero, no sign) maps every input at or below its smallest value 2^-127 --
zero and negative inputs included -- to that value.

:func:`decode` is the widening direction (``cvt.rn[.relu].{f16,bf16}x2.<narrow>x2``):
exact, NaN to the destination's canonical NaN 0x7FFF."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np


@dataclass(frozen=True)
class Format:
    """A narrow float format: 1 sign bit (if ``signed``), ``exp`` exponent bits
    with ``bias``, ``man`` mantissa bits. ``ieee``: the top exponent is
    infinity/NaN (e5m2); ``nan_all_ones``: the all-ones magnitude is NaN and
    everything else finite (e4m3, ue8m0); neither: every code is finite (e2m1,
    e2m3, e3m2)."""

    name: str
    exp: int
    man: int
    bias: int
    signed: bool = True
    ieee: bool = False
    nan_all_ones: bool = False

    @property
    def bits(self) -> int:
        return self.exp + self.man + int(self.signed)

    @property
    def sign_bit(self) -> int:
        return 1 << (self.exp + self.man) if self.signed else 0

    @property
    def nan_code(self) -> int | None:
        """The NaN the hardware writes (positive, all mantissa bits set)."""
        if self.ieee or self.nan_all_ones:
            return (1 << (self.exp + self.man)) - 1
        return None

    def magnitude(self, code: int) -> float:
        """The value of a non-negative code (NaN and infinity as floats)."""
        e, m = code >> self.man, code & ((1 << self.man) - 1)
        top = (1 << self.exp) - 1
        if self.ieee and e == top:
            return float("inf") if m == 0 else float("nan")
        if self.nan_all_ones and code == (1 << (self.exp + self.man)) - 1:
            return float("nan")
        if self.man == 0:  # ue8m0: no subnormals, no zero
            return 2.0 ** (e - self.bias)
        if e == 0:
            return m * 2.0 ** (1 - self.bias - self.man)
        return (1 + m / (1 << self.man)) * 2.0 ** (e - self.bias)

    @cached_property
    def finite(self) -> tuple[np.ndarray, np.ndarray]:
        """(magnitudes, codes) of the finite non-negative codes, increasing."""
        codes = np.arange(1 << (self.exp + self.man))
        mags = np.array([self.magnitude(int(c)) for c in codes])
        keep = np.isfinite(mags)
        return mags[keep], codes[keep]

    @property
    def max_norm(self) -> float:
        return float(self.finite[0][-1])


FORMATS: dict[str, Format] = {f.name: f for f in (
    Format("e4m3", 4, 3, 7, nan_all_ones=True),
    Format("e5m2", 5, 2, 15, ieee=True),
    Format("e2m1", 2, 1, 1),
    Format("e2m3", 2, 3, 1),
    Format("e3m2", 3, 2, 3),
    Format("ue8m0", 8, 0, 127, signed=False, nan_all_ones=True),
)}

WIDE = {"f16": np.dtype(np.float16), "f32": np.dtype(np.float32)}
CANONICAL_NAN16 = 0x7FFF


def encode(x: np.ndarray, fmt: Format, rounding: str = "rn", satfinite: bool = True,
           relu: bool = False) -> np.ndarray:
    """The codes (uint8) of ``x`` (any float array) converted to ``fmt`` as
    ``cvt.<rounding>[.satfinite][.relu]`` does (see the module docstring)."""
    if not satfinite:
        raise NotImplementedError("cvt to a narrow format without .satfinite")
    x = np.asarray(x, np.float64)
    mags, codes = fmt.finite
    a = np.abs(x)
    neg = np.signbit(x) & fmt.signed
    # hi: the first finite magnitude >= |x| (clipped: beyond MAX_NORM saturates)
    hi = np.minimum(np.searchsorted(mags, np.where(np.isnan(a), 0, a), "left"), len(mags) - 1)
    lo = np.maximum(hi - 1, 0)
    exact = mags[hi] == a
    if rounding == "rn":
        d_lo, d_hi = a - mags[lo], mags[hi] - a
        even_hi = (codes[hi] & 1) == 0
        pick = np.where((d_hi < d_lo) | ((d_hi == d_lo) & even_hi), hi, lo)
    elif rounding == "rz":
        pick = lo
    elif rounding == "rp":
        pick = np.where(neg, lo, hi)  # towards +inf: a negative magnitude shrinks
    else:
        raise NotImplementedError(f"cvt rounding .{rounding}")
    pick = np.where(exact, hi, pick)
    pick = np.where(a <= mags[0], 0, pick)  # zero (ue8m0: its smallest value)
    pick = np.where(a > mags[-1], len(mags) - 1, pick)  # satfinite: inf included
    if not fmt.signed:  # ue8m0: no zero, no sign: a negative input is its smallest value
        pick = np.where(np.signbit(x), 0, pick)
    out = codes[pick] | np.where(neg, fmt.sign_bit, 0)
    nan = np.isnan(x)
    if fmt.nan_code is not None:
        out = np.where(nan, fmt.nan_code, out)
    else:  # no NaN in the format: +MAX_NORM
        out = np.where(nan, codes[-1], out)
    if relu and fmt.signed:
        out = np.where(nan | ((out & fmt.sign_bit) == 0), out, 0)
    return out.astype(np.uint8)


def decode(codes: np.ndarray, fmt: Format) -> np.ndarray:
    """The values (float64; NaN where the code is NaN) of ``fmt`` codes."""
    codes = np.asarray(codes).astype(np.int64) & ((1 << fmt.bits) - 1)
    table = np.array([fmt.magnitude(c) for c in range(1 << (fmt.exp + fmt.man))])
    mag = table[codes & ((1 << (fmt.exp + fmt.man)) - 1)]
    return np.where(codes & fmt.sign_bit if fmt.signed else False, -mag, mag)


def to_bits16(values: np.ndarray, dtype: np.dtype, relu: bool = False) -> np.ndarray:
    """f16/bf16 bits (uint16) of exactly representable float64 ``values``; NaN
    is the canonical 0x7FFF; ``.relu`` makes negative results +0."""
    v = np.asarray(values, np.float64)
    if relu:
        v = np.where(np.signbit(v) & ~np.isnan(v), 0.0, v)
    with np.errstate(all="ignore"):
        bits = v.astype(dtype).view(np.uint16)
    return np.where(np.isnan(v), CANONICAL_NAN16, bits).astype(np.uint16)


def from_bits16(bits: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """float64 values of f16/bf16 bits."""
    return np.asarray(bits).astype(np.uint16).view(dtype).astype(np.float64)
