"""``math``: every function is evaluated in float64 by numpy and rounded once
to the value's dtype, i.e. (nearly always) correctly rounded. The GPU
evaluates them with libdevice (e.g. ``__nv_expf``, ``__nv_tanhf``) whose
documented maximum errors are 1-2 ulp (CUDA C Programming Guide, "Mathematical
Functions", single precision table); ``sqrt`` and ``fma`` are exact on both.
So the emulator's result and the hardware's differ by at most that table's
bound. ``fma`` rounds a*b+c computed in float64, which can differ from a true
fused op by 1 ulp in rare double-rounding cases."""

from __future__ import annotations

import math as pymath

import numpy as np

from ..compiler import Op, Step, rule
from ._util import binary, ternary, unary

_erf = np.frompyfunc(pymath.erf, 1, 1)


# (no np.errstate here: a run executes under errstate(all="ignore"), in the
# runner and in workers, and entering one per op costs a tenth of the op)
def _f64(fn):
    def f(x):
        x = np.asarray(x)
        return np.asarray(fn(x.astype(np.float64))).astype(np.float64).astype(x.dtype)
    return f


def _f64_2(fn):
    def f(x, y):
        x, y = np.asarray(x), np.asarray(y)
        return np.asarray(fn(x.astype(np.float64), y.astype(np.float64))).astype(x.dtype)
    return f


def _round_half_away(x: np.ndarray) -> np.ndarray:
    """To nearest, halves away from zero, keeping the sign of zero. Not
    ``floor(x + 0.5)``: the sum rounds up for odd doubles past 2**52, and
    loses the sign of -0.0 and of -0.4."""
    t = np.trunc(x)
    r = np.where(np.abs(x - t) >= 0.5, t + np.copysign(1.0, x), t)  # x - t is exact
    return np.copysign(r, x)


UNARY = {
    "math.exp": np.exp, "math.exp2": np.exp2, "math.expm1": np.expm1,
    "math.log": np.log, "math.log2": np.log2, "math.log10": np.log10, "math.log1p": np.log1p,
    "math.sin": np.sin, "math.cos": np.cos, "math.tan": np.tan,
    "math.asin": np.arcsin, "math.acos": np.arccos, "math.atan": np.arctan,
    "math.sinh": np.sinh, "math.cosh": np.cosh, "math.tanh": np.tanh,
    "math.asinh": np.arcsinh, "math.acosh": np.arccosh, "math.atanh": np.arctanh,
    "math.sqrt": np.sqrt, "math.rsqrt": lambda x: 1.0 / np.sqrt(x), "math.cbrt": np.cbrt,
    "math.erf": lambda x: _erf(x).astype(np.float64),
    "math.floor": np.floor, "math.ceil": np.ceil, "math.trunc": np.trunc,
    "math.roundeven": np.rint,
    "math.round": lambda x: _round_half_away(x),
}
# Each function made once: ops of one function may run as one call (..batching).
IN_F64 = {name: _f64(fn) for name, fn in UNARY.items()}
ATAN2, POWF = _f64_2(np.arctan2), _f64_2(np.power)
for _n in UNARY:
    rule(_n)(lambda o, n=_n: unary(o, IN_F64[n], batch=True))

rule("math.absf")(lambda o: unary(o, np.abs, batch=True))
rule("math.absi")(lambda o: unary(o, np.abs, batch=True))
rule("math.atan2")(lambda o: binary(o, ATAN2, batch=True))
rule("math.powf")(lambda o: binary(o, POWF, batch=True))
rule("math.copysign")(lambda o: binary(o, np.copysign, batch=True))


@rule("math.fma")
def fma(o: Op) -> Step:
    def f(a, b, c):
        a = np.asarray(a)
        return (a.astype(np.float64) * np.asarray(b).astype(np.float64)
                + np.asarray(c).astype(np.float64)).astype(a.dtype)
    return ternary(o, f)


rule("math.isnan")(lambda o: unary(o, np.isnan))
rule("math.isinf")(lambda o: unary(o, np.isinf))
rule("math.isfinite")(lambda o: unary(o, np.isfinite))


@rule("math.ctlz")
def ctlz(o: Op) -> Step:
    """Leading zero bits, in the operand's own width (the width for 0)."""
    def f(x):
        x = np.asarray(x)
        bits = x.dtype.itemsize * 8
        u = x.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[x.dtype.itemsize])
        u = u.astype(np.uint64)
        length = np.zeros(u.shape, np.int64)
        for k in range(bits):  # exact for every width, unlike a float log2
            length = np.where((u >> np.uint64(k)) != 0, k + 1, length)
        return (bits - length).astype(x.dtype)
    return unary(o, f)


@rule("math.ctpop")
def ctpop(o: Op) -> Step:
    def f(x):
        x = np.asarray(x)
        u = x.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[x.dtype.itemsize])
        return np.bitwise_count(u).astype(x.dtype)
    return unary(o, f)
