"""The functions smalti.vocabulary adds, with inputs, the exact answer and
the bound they are held to -- shared by the tests and ``benchmarks/vocabulary.py``.

Each :class:`Case` is one jax function applied elementwise to a (64, 128)
block. ``truth`` computes the exact answer in float64 from the inputs (as the
kernel sees them, i.e. already rounded to the dtype); ``ulp`` is the bound in
units in the last place of the result dtype on the emulator (0: bit for bit
equal to jnp on the CPU too). The emulator rounds each ``math`` op correctly;
on a GPU, libdevice's documented error of the ops used (1-2 ulp for f32
exp/log/sin/cos/atan2/powf, CUDA C Programming Guide) adds to the f32 figures.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax import lax

SHAPE = (64, 128)
BF16 = np.dtype(ml_dtypes.bfloat16)
F16 = np.dtype(np.float16)
F32 = np.dtype(np.float32)
FLOATS = (F32, F16, BF16)


@dataclass
class Case:
    name: str
    fn: Callable[..., Any]        # applied to the kernel's inputs (jax arrays)
    gen: Callable[[np.random.Generator, np.dtype], list[np.ndarray]]
    truth: Callable[..., np.ndarray] | None  # float64 (or integer) exact answer
    ulp: dict[np.dtype, int]      # per dtype; absent dtype: not tested
    exact: bool = False           # also bit-equal to jnp on the CPU
    note: str = ""
    out_dtype: Callable[[np.dtype], np.dtype] = field(default=lambda d: d)

    @property
    def dtypes(self):
        return tuple(self.ulp)


def _finite_max(dtype) -> float:
    return float(np.finfo(dtype).max)


#: fill's default: no values in place of the first elements (never written to).
NO_SPECIALS = np.array([])


def specials(dtype, *extra) -> np.ndarray:
    vals = [0.0, -0.0, np.inf, -np.inf, np.nan, 0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 1.0, -1.0,
            *extra]
    return np.array(vals, np.float64)


def fill(rng, dtype, body: np.ndarray, special: np.ndarray = NO_SPECIALS) -> np.ndarray:
    """A (64, 128) block of ``body`` values (float64, flattened and cycled),
    the first elements replaced by ``special``; rounded to ``dtype``."""
    n = SHAPE[0] * SHAPE[1]
    flat = np.resize(np.asarray(body, np.float64).ravel(), n)
    flat[: special.size] = special
    with np.errstate(over="ignore"):
        return flat.reshape(SHAPE).astype(dtype)


def log_uniform(rng, lo: float, hi: float, signed: bool = True) -> np.ndarray:
    """Magnitudes 10**u, u uniform in [lo, hi], random signs."""
    v = 10.0 ** rng.uniform(lo, hi, SHAPE[0] * SHAPE[1])
    return v * rng.choice([-1.0, 1.0], v.size) if signed else v


def _clip(x, dtype):
    m = _finite_max(dtype)
    return np.clip(x, -m, m)


def g_rounding(rng, dtype):
    big = 2.0 ** {F32: 23, F16: 10, BF16: 7}[np.dtype(dtype)]
    body = np.concatenate([rng.standard_normal(4096) * 4, rng.uniform(-big * 4, big * 4, 4096)])
    return [fill(rng, dtype, body, specials(dtype, big + 0.5, -big - 0.5, 1e-3, -1e-3))]


def g_normal(scale):
    return lambda rng, dtype: [fill(rng, dtype, rng.standard_normal(8192) * scale,
                                    specials(dtype, 1e-6, -1e-6))]


def g_magnitudes(lo, hi):
    """|x| in [lo, hi] (so that x ** n stays normal in f16), random signs."""
    return lambda rng, dtype: [fill(rng, dtype, rng.uniform(lo, hi, 8192)
                                    * rng.choice([-1.0, 1.0], 8192), specials(dtype)[:5])]


def g_expm1(rng, dtype):
    top = {F32: 100.0, F16: 12.0, BF16: 100.0}[np.dtype(dtype)]
    body = np.concatenate([rng.uniform(-top, top, 4096), log_uniform(rng, -12, 0.5)[:4096]])
    return [fill(rng, dtype, body, specials(dtype, 88.5, 89.0, -88.0, 1e-30))]


def g_log1p(rng, dtype):
    body = np.concatenate([np.expm1(rng.uniform(-15, 30, 4096)),
                           log_uniform(rng, -12, -0.5)[:4096]])
    return [fill(rng, dtype, _clip(body, dtype), specials(dtype, -0.999, 1e30, -2.0))]


def g_hyperbolic(rng, dtype):
    top = {F32: 90.0, F16: 11.5, BF16: 90.0}[np.dtype(dtype)]
    body = np.concatenate([rng.uniform(-top, top, 4096), log_uniform(rng, -10, 0.5)[:4096]])
    return [fill(rng, dtype, body, specials(dtype, 88.5, -89.2, 89.41))]


def g_wide(rng, dtype):
    hi = {F32: 37.5, F16: 4.5, BF16: 37.5}[np.dtype(dtype)]
    lo = {F32: -30.0, F16: -4.0, BF16: -30.0}[np.dtype(dtype)]
    return [fill(rng, dtype, log_uniform(rng, lo, hi), specials(dtype))]


def g_acosh(rng, dtype):
    hi = {F32: 38.0, F16: 4.5, BF16: 38.0}[np.dtype(dtype)]
    body = np.concatenate([1 + log_uniform(rng, -7, 0.3, signed=False)[:4096],
                           log_uniform(rng, 0, hi, signed=False)[:4096]])
    return [fill(rng, dtype, _clip(body, dtype), specials(dtype, 0.9, 1.0000001))]


def g_unit(rng, dtype):
    body = np.concatenate([rng.uniform(-1, 1, 4096),
                           (1 - log_uniform(rng, -8, -0.3, signed=False)[:4096])
                           * rng.choice([-1.0, 1.0], 4096)])
    return [fill(rng, dtype, body, specials(dtype, 1.0, -1.0, 1.001, 1e-8))]


def g_cbrt(rng, dtype):
    hi = {F32: 38.0, F16: 4.5, BF16: 38.0}[np.dtype(dtype)]
    lo = {F32: -37.0, F16: -4.0, BF16: -37.0}[np.dtype(dtype)]
    return [fill(rng, dtype, _clip(log_uniform(rng, lo, hi), dtype), specials(dtype, 27.0, -8.0))]


def g_pow(rng, dtype):
    """Positive bases with any exponent; negative bases with integer exponents."""
    n = 4096
    x = np.concatenate([10.0 ** rng.uniform(-2, 2, n), -(10.0 ** rng.uniform(-1, 1, n))])
    y = np.concatenate([rng.uniform(-6, 6, n), rng.integers(-5, 6, n).astype(np.float64)])
    if np.dtype(dtype) == F16:
        y = np.clip(y, -2.5, 2.5).round(0) * (x < 0) + np.clip(y, -2.5, 2.5) * (x >= 0)
    xs = fill(rng, dtype, x, np.array([0.0, 2.0, 0.0, -2.0, np.inf, 1.0, np.nan, 4.0]))
    ys = fill(rng, dtype, y, np.array([2.0, -1.0, 0.0, 3.0, -1.0, np.nan, 0.0, 0.5]))
    return [xs, ys]


def g_pow_int(rng, dtype):
    x = fill(rng, dtype, rng.uniform(-3, 3, 8192), specials(dtype))
    y = rng.integers(-6, 7, SHAPE).astype(np.int32)
    return [x, y]


def g_int(rng, dtype):
    info = np.iinfo(dtype)
    v = rng.integers(info.min, int(info.max) + 1, SHAPE, dtype=np.int64)
    v.flat[:4] = [0, -1 if info.min < 0 else info.max, info.min, info.max]
    return [v.astype(dtype)]


def g_nextafter(rng, dtype):
    x = fill(rng, dtype, rng.standard_normal(8192) * 3, specials(dtype))
    toward = rng.choice([-np.inf, np.inf, 0.0], SHAPE)
    y = np.where(rng.random(SHAPE) < 0.2, x.astype(np.float64), toward)
    y.flat[:13] = [1.0, -1.0, 0.0, 0.0, 1.0, np.nan, 0.0, 0.5, -np.inf, 0.0, np.inf, -0.0, 0.0]
    return [x, y.astype(dtype)]


def _nextafter(x, y):
    if x.dtype == BF16:  # numpy has no bf16 nextafter: bit-equality with jnp is the check
        return np.asarray(jnp.nextafter(x, y)).astype(np.float64)
    return np.nextafter(x, y).astype(np.float64)


def _f64(*xs):
    return [np.asarray(x).astype(np.float64) for x in xs]


def _where_finite(x):
    return np.where(np.isfinite(x), x, 0.0)


def _np_pow(x, y):
    with np.errstate(all="ignore"):
        return np.power(x, y)


def _int_pow(n):
    def truth(x):
        with np.errstate(all="ignore"):
            return np.power(x, float(n))
    return truth


def _popcount(x):
    bits = np.dtype(x.dtype).itemsize * 8
    u = np.asarray(x).astype(np.int64) & ((1 << bits) - 1)
    return np.array([bin(int(v)).count("1") for v in u.ravel()], np.int64).reshape(u.shape)


def _all(n):
    return {F32: n, F16: max(n, 1) if n else 0, BF16: max(n, 1) if n else 0}


def _ufunc(f):
    def truth(*xs):
        with np.errstate(all="ignore"):
            return f(*_f64(*xs))
    return truth


CASES: list[Case] = [
    Case("floor", jnp.floor, g_rounding, _ufunc(np.floor), _all(0), exact=True),
    Case("ceil", jnp.ceil, g_rounding, _ufunc(np.ceil), _all(0), exact=True),
    Case("trunc", jnp.trunc, g_rounding, _ufunc(np.trunc), _all(0), exact=True),
    Case("isfinite", lambda x: jnp.where(jnp.isfinite(x), x, 0), g_rounding,
         _ufunc(_where_finite), _all(0), exact=True),
    Case("expm1", jnp.expm1, g_expm1, _ufunc(np.expm1), {F32: 3, F16: 1, BF16: 1}),
    Case("log1p", jnp.log1p, g_log1p, _ufunc(np.log1p), {F32: 3, F16: 1, BF16: 1}),
    Case("tan", jnp.tan, g_normal(3), _ufunc(np.tan), {F32: 3, F16: 1, BF16: 1}),
    Case("sinh", jnp.sinh, g_hyperbolic, _ufunc(np.sinh), {F32: 3, F16: 1, BF16: 1}),
    Case("cosh", jnp.cosh, g_hyperbolic, _ufunc(np.cosh), {F32: 2, F16: 1, BF16: 1}),
    Case("asinh", jnp.arcsinh, g_wide, _ufunc(np.arcsinh), {F32: 3, F16: 1, BF16: 1}),
    Case("acosh", jnp.arccosh, g_acosh, _ufunc(np.arccosh), {F32: 4, F16: 1, BF16: 1}),
    Case("atanh", jnp.arctanh, g_unit, _ufunc(np.arctanh), {F32: 4, F16: 1, BF16: 1}),
    Case("asin", jnp.arcsin, g_unit, _ufunc(np.arcsin), {F32: 2, F16: 1, BF16: 1}),
    Case("acos", jnp.arccos, g_unit, _ufunc(np.arccos), {F32: 2, F16: 1, BF16: 1}),
    Case("atan", jnp.arctan, g_wide, _ufunc(np.arctan), {F32: 1, F16: 1, BF16: 1}),
    Case("cbrt", jnp.cbrt, g_cbrt, _ufunc(np.cbrt), {F32: 2, F16: 1, BF16: 1}),
    Case("pow", jnp.power, g_pow, _ufunc(_np_pow), {F32: 1, F16: 1, BF16: 1},
         note="array exponent: math.powf"),
    Case("pow_int_array", lambda x, y: jnp.power(x, y), g_pow_int,
         lambda x, y: _np_pow(*_f64(x, y)), {F32: 1, F16: 1, BF16: 1},
         note="integer array exponent, converted to the base's type"),
    Case("pow_scalar_2.5", lambda x: x ** 2.5, lambda rng, d: g_pow(rng, d)[:1],
         _ufunc(lambda x: _np_pow(x, 2.5)), {F32: 1, F16: 1, BF16: 1}),
    Case("x**0", lambda x: x ** 0, g_rounding, lambda x: np.ones_like(_f64(x)[0]), _all(0),
         exact=True),
    Case("x**1", lambda x: lax.integer_pow(x, 1), g_rounding, _ufunc(lambda x: x), _all(0),
         exact=True),
    Case("x**-2", lambda x: x ** -2, g_magnitudes(0.1, 4), _int_pow(-2), {F32: 2, F16: 1, BF16: 1},
         exact=True, note="jax's multiplication order: bit-equal to jnp"),
    Case("x**-5", lambda x: x ** -5, g_magnitudes(0.3, 3), _int_pow(-5), {F32: 4, F16: 3, BF16: 3},
         exact=True, note="jax's multiplication order: bit-equal to jnp"),
]

CASES += [
    Case("nextafter", jnp.nextafter, g_nextafter, _nextafter, _all(0), exact=True),
    Case("stop_gradient", lax.stop_gradient, g_rounding, _ufunc(lambda x: x), _all(0),
         exact=True),
    Case("copy", lambda x: jnp.array(x, copy=True), g_rounding, _ufunc(lambda x: x), _all(0),
         exact=True),
]

INT_CASES: list[Case] = [
    Case("population_count", lax.population_count, g_int, _popcount,
         {np.dtype(d): 0 for d in (np.int32, np.uint32, np.int16, np.uint16, np.int8, np.uint8)},
         exact=True),
]

ALL = CASES + INT_CASES
BY_NAME = {c.name: c for c in ALL}
