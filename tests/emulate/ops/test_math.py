"""``math`` rules against numpy's float64 functions, rounded once to the
operand's type, on edge values (signed zeros, infinities, NaN, subnormals,
the largest finite value, domain edges), plus the special values C99's
Annex F fixes (log(-0) = -inf, sqrt(-0) = -0, atan2 of signed zeros...),
asserted directly. Integer functions against Python integers."""

from __future__ import annotations

import math

import numpy as np
import pytest

from smalti.emulate.ops.math import _round_half_away

from .harness import (
    FLOAT_TYPES,
    INT_TYPES,
    assert_same_bits,
    covers,
    float_edges,
    int_edges,
    pairs,
    run,
    wrap,
)

DOMAIN = [0.25, -0.25, 0.75, -0.999, 2.0, -3.0, 10.0, 88.0, 89.0, -104.0, 710.0, 1e-30,
          1.5707964, 3.1415927, -3.1415927, 1e5, 0.49999997, 2.5, -2.5, -0.5000001]


def _inputs(ty: str) -> np.ndarray:
    dt = np.dtype(FLOAT_TYPES[ty])
    with np.errstate(over="ignore"):
        return np.concatenate([float_edges(ty), np.array(DOMAIN).astype(dt)])


UNARY = {
    "math.exp": np.exp, "math.exp2": np.exp2, "math.expm1": np.expm1,
    "math.log": np.log, "math.log2": np.log2, "math.log10": np.log10, "math.log1p": np.log1p,
    "math.sin": np.sin, "math.cos": np.cos, "math.tan": np.tan,
    "math.asin": np.arcsin, "math.acos": np.arccos, "math.atan": np.arctan,
    "math.sinh": np.sinh, "math.cosh": np.cosh, "math.tanh": np.tanh,
    "math.asinh": np.arcsinh, "math.acosh": np.arccosh, "math.atanh": np.arctanh,
    "math.sqrt": np.sqrt, "math.rsqrt": lambda x: 1.0 / np.sqrt(x), "math.cbrt": np.cbrt,
    "math.erf": np.vectorize(lambda v: math.erf(v) if not math.isnan(v) else v, otypes=[float]),
    "math.floor": np.floor, "math.ceil": np.ceil, "math.trunc": np.trunc,
    "math.roundeven": np.rint, "math.round": _round_half_away,  # asserted in SPECIAL
    "math.absf": np.abs,
}


def _unary(op: str, ty: str, x: np.ndarray):
    vt = f"vector<{x.size}x{ty}>"
    return run(f"%r = {op} %a : {vt}", {"a": (vt, x)}, {"r": vt})["r"]


@pytest.mark.parametrize("ty", ["f16", "bf16", "f32", "f64"])
@covers(*UNARY)
def test_unary_functions_are_float64_rounded_once(ty):
    x = _inputs(ty)
    for op, fn in UNARY.items():
        with np.errstate(all="ignore"):
            want = np.asarray(fn(x.astype(np.float64)), np.float64).astype(x.dtype)
        try:
            assert_same_bits(_unary(op, ty, x), want)
        except AssertionError as e:
            raise AssertionError(f"{op}: {e}") from None


# C99 Annex F / IEEE 754 special cases: (op, input, expected)
SPECIAL = [
    ("math.log", -0.0, -math.inf), ("math.log", 0.0, -math.inf), ("math.log", -1.0, math.nan),
    ("math.log2", math.inf, math.inf), ("math.log1p", -1.0, -math.inf),
    ("math.log1p", -0.0, -0.0), ("math.sqrt", -0.0, -0.0), ("math.sqrt", -1.0, math.nan),
    ("math.rsqrt", 0.0, math.inf), ("math.rsqrt", -0.0, -math.inf),
    ("math.rsqrt", math.inf, 0.0), ("math.exp", -math.inf, 0.0), ("math.exp2", 128.0, math.inf),
    ("math.expm1", -0.0, -0.0), ("math.expm1", -math.inf, -1.0), ("math.tanh", -0.0, -0.0),
    ("math.tanh", -math.inf, -1.0), ("math.sin", -0.0, -0.0), ("math.sin", math.inf, math.nan),
    ("math.atanh", 1.0, math.inf), ("math.acosh", 0.5, math.nan), ("math.asin", 2.0, math.nan),
    ("math.erf", -0.0, -0.0), ("math.erf", -math.inf, -1.0), ("math.cbrt", -8.0, -2.0),
    ("math.floor", -0.5, -1.0), ("math.ceil", -0.5, -0.0), ("math.trunc", -0.7, -0.0),
    ("math.round", -0.0, -0.0), ("math.round", -0.4, -0.0), ("math.round", 2.5, 3.0),
    ("math.round", -2.5, -3.0), ("math.round", 0.5, 1.0), ("math.round", -0.5, -1.0),
    ("math.round", 0.49999997, 0.0), ("math.round", -0.49999997, -0.0), ("math.round", 1.5, 2.0),
    ("math.round", -math.inf, -math.inf), ("math.round", math.nan, math.nan),
    ("math.round", 3.4028235e38, 3.4028235e38), ("math.round", 1e-45, 0.0),
    ("math.roundeven", 2.5, 2.0), ("math.roundeven", -0.5, -0.0),
    ("math.absf", -0.0, 0.0), ("math.absf", -math.inf, math.inf),
]


@covers(*sorted({op for op, _, _ in SPECIAL}))
def test_special_values():
    for op, x, want in SPECIAL:
        got = _unary(op, "f32", np.array([x], np.float32))
        assert_same_bits(got, np.array([want], np.float32))


@covers("math.round")
def test_round_of_a_large_odd_double_is_itself():
    """x + 0.5 rounds up for odd integers past 2**52: round must not add it."""
    x = np.array([2.0 ** 52 + 1, -(2.0 ** 52 + 1), 2.0 ** 53 - 1, 0.49999999999999994])
    assert_same_bits(_unary("math.round", "f64", x), np.array([x[0], x[1], x[2], 0.0]))


BINARY = {"math.atan2": np.arctan2, "math.powf": np.power, "math.copysign": np.copysign}


@pytest.mark.parametrize("ty", ["f16", "bf16", "f32", "f64"])
@covers(*BINARY)
def test_binary_functions(ty):
    a, b = pairs(float_edges(ty))
    vt = f"vector<{a.size}x{ty}>"
    for op, fn in BINARY.items():
        got = run(f"%r = {op} %a, %b : {vt}", {"a": (vt, a), "b": (vt, b)}, {"r": vt})["r"]
        with np.errstate(all="ignore"):
            want = fn(a.astype(np.float64), b.astype(np.float64)).astype(a.dtype)
        assert_same_bits(got, want)


@covers("math.atan2", "math.powf")
def test_atan2_and_pow_special_values():
    cases = [("math.atan2", 0.0, -0.0, math.pi), ("math.atan2", -0.0, -0.0, -math.pi),
             ("math.atan2", -0.0, 0.0, -0.0), ("math.atan2", 1.0, -math.inf, math.pi),
             ("math.powf", math.nan, 0.0, 1.0), ("math.powf", 1.0, math.nan, 1.0),
             ("math.powf", -8.0, 1 / 3, math.nan), ("math.powf", -0.0, -1.0, -math.inf),
             ("math.powf", -2.0, 3.0, -8.0)]
    for op, x, y, want in cases:
        got = run(f"%r = {op} %a, %b : f32", {"a": ("f32", x), "b": ("f32", y)}, {"r": "f32"})
        assert_same_bits(got["r"], np.float32(want))


@pytest.mark.parametrize("ty", ["f16", "bf16", "f32"])
@covers("math.fma", "vector.fma")
def test_fma_rounds_once(ty):
    dt = np.dtype(FLOAT_TYPES[ty])
    e = float_edges(ty)
    a, b = pairs(e)
    c = np.resize(e[::-1], a.size)
    vt = f"vector<{a.size}x{ty}>"
    for op in ("math.fma", "vector.fma"):
        got = run(f"%r = {op} %a, %b, %c : {vt}",
                  {"a": (vt, a), "b": (vt, b), "c": (vt, c)}, {"r": vt})["r"]
        with np.errstate(all="ignore"):
            want = (a.astype(np.float64) * b.astype(np.float64) + c.astype(np.float64)).astype(dt)
        assert_same_bits(got, want)
    # one rounding, not two: (1 + 2^-12)^2 - 1 in f32 keeps the 2^-24 term
    x = np.float32(1 + 2.0 ** -12)
    got = run("%r = math.fma %a, %a, %c : f32", {"a": ("f32", x), "c": ("f32", -1.0)},
              {"r": "f32"})["r"]
    assert got == np.float32(2.0 ** -11 + 2.0 ** -24)


@covers("math.isnan", "math.isinf", "math.isfinite")
def test_classification():
    x = float_edges("f32")
    vt, bt = f"vector<{x.size}xf32>", f"vector<{x.size}xi1>"
    for op, fn in [("math.isnan", np.isnan), ("math.isinf", np.isinf),
                   ("math.isfinite", np.isfinite)]:
        got = run(f"%r = {op} %a : {vt}", {"a": (vt, x)}, {"r": bt})["r"]
        assert got.tolist() == fn(x).tolist(), op


def _ctlz(v: int, bits: int) -> int:
    return bits - (v & ((1 << bits) - 1)).bit_length()


@pytest.mark.parametrize("ty", ["i8", "i16", "i32", "i64"])
@covers("math.ctlz", "math.ctpop", "math.absi")
def test_integer_functions(ty):
    bits = np.dtype(INT_TYPES[ty]).itemsize * 8
    x = np.array(int_edges(ty), INT_TYPES[ty])
    vt = f"vector<{x.size}x{ty}>"
    for op, ref in [("math.ctlz", lambda v: _ctlz(v, bits)),
                    ("math.ctpop", lambda v: bin(v & ((1 << bits) - 1)).count("1")),
                    ("math.absi", lambda v: wrap(abs(v), bits))]:  # |INT_MIN| wraps
        got = run(f"%r = {op} %a : {vt}", {"a": (vt, x)}, {"r": vt})["r"]
        assert_same_bits(got, np.array([ref(int(v)) for v in x], INT_TYPES[ty]))
