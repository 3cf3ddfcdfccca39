"""Warpgroup lowerings of the Pallas primitives the vocabulary adds.

Each lowering either emits one dialect op (``math.floor``, ``math.powf``) or
is a decomposition, written as a jax function and lowered by Pallas' own
``_lower_fun`` into primitives Pallas lowers (``exp``, ``log``, ``sqrt``,
``sin``, ``cos``, ``atan2``, ``select_n``, arithmetic, comparisons) --
including the ones this plugin adds, since smalti installs its lowerings into
Pallas' rule table.

Accuracy (f32; measured on the emulator, which rounds every ``math`` op
correctly, against jnp on the CPU; the bounds in ``docs/vocabulary.md``):

- exact: floor, ceil (``-floor(-x)``), trunc (jax's own ``select(x < 0,
  ceil, floor)``), is_finite (``|x| < inf``), population_count (SWAR bit
  counting), integer_pow with ``y in {0, 1}`` or ``y <= -2`` (jax's own
  multiplication order, then ``1 / acc``);
- expm1, log1p: Kahan's formulas (``(u - 1) * (x / log u)`` with
  ``u = exp x``; ``log(u) * (x / (u - 1))`` with ``u = 1 + x``), a few ulp
  everywhere, with no cancellation near 0;
- tan = sin / cos; sinh, cosh from expm1 and exp (``exp(|x| / 2)`` squared
  beyond ``exp``'s overflow); asinh, acosh, atanh from log1p, sqrt and log;
  asin, acos, atan from atan2; cbrt from ``exp(log|x| / 3)`` and one Newton
  step; pow from ``math.powf``;
- exact: nextafter (a step of the bit pattern), stop_gradient (the identity).

16-bit floats (f16, bf16) are computed in f32 and rounded once, so they are
within 1 ulp of the exact value.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax._src.lib.mlir import ir
from jax._src.lib.mlir.dialects import arith as arith_dialect
from jax._src.lib.mlir.dialects import math as mlir_math
from jax._src.pallas.mosaic_gpu import lowering as pallas_lowering
from jax.experimental.mosaic.gpu import utils as mgpu_utils

from smalti.diagnostics import SmaltiNotImplementedError, format_location
from smalti.jax import replaced_rule
from smalti.vocabulary.annotations import (
    Aval,
    EstimatorContext,
    Lowered,
    Operand,
    PallasContext,
    Resources,
)

_lower_fun = pallas_lowering._lower_fun
_copysign = pallas_lowering._copysign  # Pallas' own math.copysign primitive
SIXTEEN_BIT = (jnp.float16, jnp.bfloat16)
FLOATS = (jnp.float32, *SIXTEEN_BIT)
LN2 = math.log(2.0)
# exp(a) overflows f32 beyond 88.72; sinh and cosh stay finite up to 89.41.
EXP_LIMIT = 88.0
# Beyond 2**24, asinh(a) = log(2a) and acosh(a) = log(2a) in f32.
LOG_2A_FROM = float(2 ** 24)


# --- errors ---------------------------------------------------------------------------


def refuse(ctx: PallasContext, message: str, *, fix: str | list[str],
           jax_cannot: bool = False) -> SmaltiNotImplementedError:
    """The error for a use of a primitive this plugin cannot lower: the
    primitive, its operand types and the user's line (Pallas sets the
    equation's location as the current MLIR location). The plugin's rules
    hand a refused equation to jax's own rule (``_or_jax`` in
    ``smalti.vocabulary``), unless ``jax_cannot`` says that jax's rule
    certainly fails too (no register layout holds the result): then this
    error, with its way out, is what the user sees."""
    try:
        location = format_location(ir.Location.current)
    except ValueError:
        location = None
    avals = ", ".join(a.str_short() for a in ctx.avals_in)
    error = SmaltiNotImplementedError(
        "SM206", f"Pallas primitive {ctx.prim.name}: {message}", location=location,
        values={"primitive": ctx.prim.name, "operands": avals}, fix=fix)
    error.jax_cannot = jax_cannot
    return error


def jax_rule(ctx: PallasContext) -> Callable[..., Lowered]:
    """Pallas' own rule for the primitive ``ctx`` lowers, which this plugin's
    replaced (for the parameters jax handles)."""
    return replaced_rule(ctx.prim)


def _dtype(ctx: PallasContext) -> np.dtype:
    return np.dtype(ctx.avals_in[0].dtype)


def _require_float(ctx: PallasContext, accuracy: object = None) -> None:
    if accuracy is not None:
        raise refuse(ctx, f"accuracy={accuracy!r} is not supported",
                     fix="call it without accuracy= (the lowering's bound is in "
                         "docs/vocabulary.md)")
    if _dtype(ctx) not in [np.dtype(d) for d in FLOATS]:
        raise refuse(ctx, f"operands of dtype {_dtype(ctx)} are not supported",
                     fix="compute in float32, float16 or bfloat16 (x.astype(jnp.float32))")


def _in_f32(fn: Callable[..., jax.Array]) -> Callable[..., jax.Array]:
    """``fn`` on f32; f16 and bf16 arguments are computed in f32 and rounded once."""

    def wrapped(x: jax.Array, *rest: jax.Array, **params: Any) -> jax.Array:
        del params
        if x.dtype in SIXTEEN_BIT:
            return fn(x.astype(jnp.float32), *(r.astype(jnp.float32) for r in rest)).astype(x.dtype)
        return fn(x, *rest)

    return wrapped


def _decomposed(fn: Callable[..., jax.Array]) -> Callable[..., Lowered]:
    """A Pallas lowering rule computing the jax function ``fn`` (on f32)."""
    lowered = _lower_fun(_in_f32(fn))

    def rule(ctx: PallasContext, *args: Operand, accuracy: object = None, **params: Any) -> Lowered:
        _require_float(ctx, accuracy)
        return lowered(ctx, *args, **params)

    return rule


# --- rounding and classification --------------------------------------------------------


def lower_floor(ctx: PallasContext, x: Operand) -> ir.Value:
    _require_float(ctx)
    return mlir_math.floor(pallas_lowering._ensure_ir_value(x, _dtype(ctx)))


def lower_ceil(ctx: PallasContext, x: Operand) -> ir.Value:
    """ceil(x) = -floor(-x), exactly (signed zeros included)."""
    _require_float(ctx)
    x = pallas_lowering._ensure_ir_value(x, _dtype(ctx))
    return arith_dialect.negf(mlir_math.floor(arith_dialect.negf(x)))


def lower_is_finite(ctx: PallasContext, x: Operand) -> Lowered:
    """|x| < inf: false for infinities and NaN."""
    _require_float(ctx)
    return _lower_fun(lambda x: _abs(x) < jnp.inf)(ctx, x)


# --- exponentials and logarithms -------------------------------------------------------


def _full(x: jax.Array, value: float) -> jax.Array:
    return jnp.full_like(x, value)


def _abs(x: jax.Array) -> jax.Array:
    """|x| as copysign(x, 1). (lax.abs of f32 lowers to inline PTX ``abs.f32``,
    which the emulator does not model yet; both are one bit operation.)"""
    return _copysign(x, jnp.ones_like(x))


def expm1_f32(x: jax.Array) -> jax.Array:
    """Kahan: u = exp(x); u == 1 -> x; u - 1 == -1 -> -1; else (u - 1) * (x / log u)."""
    u = lax.exp(x)
    um1 = u - 1
    r = um1 * (x / lax.log(u))
    r = lax.select(um1 == -1, _full(x, -1.0), r)
    r = lax.select(u == 1, x, r)
    return lax.select(u == jnp.inf, u, r)


def log1p_f32(x: jax.Array) -> jax.Array:
    """Kahan: u = 1 + x; u == 1 -> x; else log(u) * (x / (u - 1))."""
    u = 1 + x
    r = lax.log(u) * (x / (u - 1))
    r = lax.select(u == 1, x, r)
    return lax.select(x == jnp.inf, x, r)


lower_expm1 = _decomposed(expm1_f32)
lower_log1p = _decomposed(log1p_f32)


# --- powers -----------------------------------------------------------------------------


def lower_pow(ctx: PallasContext, x: Operand, y: Operand) -> Lowered:
    """x ** y for a float x: math.powf (an integer y converted to x's type,
    exact for |y| < 2**24)."""
    x_aval, y_aval = ctx.avals_in
    if not any(np.dtype(x_aval.dtype) == np.dtype(d) for d in FLOATS):
        raise refuse(ctx, f"a base of dtype {x_aval.dtype} is not supported",
                     fix=["for an integer base with a constant exponent write x ** 3 "
                          "(lax.integer_pow)", "or compute in float32"])

    if jnp.issubdtype(y_aval.dtype, jnp.integer):
        # pow(x, y.astype(x.dtype)): lowered again by this rule, float exponent
        return _lower_fun(lambda x, y: lax.pow(x, y.astype(x.dtype)))(ctx, x, y)
    x, y = pallas_lowering._bcast_wg(x, y, *ctx.avals_in, *ctx.avals_out)
    return mlir_math.powf(x, y)


def integer_pow_f(x: jax.Array, y: int) -> jax.Array:
    """jax's own order (lax._integer_pow): right-to-left binary powering,
    then 1 / acc for a negative exponent -- bit for bit what jnp computes."""
    if y == 0:
        return jnp.ones_like(x)
    reciprocal, y = y < 0, abs(y)
    acc: jax.Array | None = None
    while y > 0:
        if y & 1:
            acc = x if acc is None else acc * x
        y >>= 1
        if y > 0:
            x = x * x
    assert acc is not None  # y != 0
    return 1 / acc if reciprocal else acc


def lower_integer_pow(ctx: PallasContext, x: Operand, *, y: int) -> Lowered:
    """jax's own rule where it has one (y >= 2, y == -1); else y == 0 (ones,
    NaN included, as jnp), y == 1 (x), y <= -2 (1 / x ** |y|)."""
    if y >= 2 or y == -1:
        return jax_rule(ctx)(ctx, x, y=y)
    if y == 1:
        return x
    return _lower_fun(lambda x: integer_pow_f(x, y))(ctx, x)


# --- trigonometric and hyperbolic -------------------------------------------------------


def tan_f32(x: jax.Array) -> jax.Array:
    return lax.sin(x) / lax.cos(x)


def sinh_f32(x: jax.Array) -> jax.Array:
    a = _abs(x)
    e = expm1_f32(a)
    small = 0.5 * (e + e / (e + 1))
    t = lax.exp(0.5 * a)
    big = (0.5 * t) * t
    return _copysign(lax.select(a > EXP_LIMIT, big, small), x)


def cosh_f32(x: jax.Array) -> jax.Array:
    a = _abs(x)
    t = lax.exp(a)
    small = 0.5 * t + 0.5 / t
    h = lax.exp(0.5 * a)
    big = (0.5 * h) * h
    return lax.select(a > EXP_LIMIT, big, small)


def asinh_f32(x: jax.Array) -> jax.Array:
    a = _abs(x)
    s = a * a
    small = log1p_f32(a + s / (1 + lax.sqrt(1 + s)))
    big = lax.log(a) + LN2
    return _copysign(lax.select(a >= LOG_2A_FROM, big, small), x)


def acosh_f32(x: jax.Array) -> jax.Array:
    t = x - 1
    small = log1p_f32(t + lax.sqrt(t * (t + 2)))
    big = lax.log(x) + LN2
    return lax.select(x >= LOG_2A_FROM, big, small)


def atanh_f32(x: jax.Array) -> jax.Array:
    a = _abs(x)
    return _copysign(0.5 * log1p_f32((a + a) / (1 - a)), x)


def _cos_of_asin(x: jax.Array) -> jax.Array:
    """sqrt(1 - x^2), as (1 - x)(1 + x): 1 - x is exact near |x| = 1."""
    return lax.sqrt((1 - x) * (1 + x))


def asin_f32(x: jax.Array) -> jax.Array:
    return lax.atan2(x, _cos_of_asin(x))


def acos_f32(x: jax.Array) -> jax.Array:
    return lax.atan2(_cos_of_asin(x), x)


def atan_f32(x: jax.Array) -> jax.Array:
    return lax.atan2(x, jnp.ones_like(x))


def cbrt_f32(x: jax.Array) -> jax.Array:
    """exp(log|x| / 3), one Newton step y += (a / y^2 - y) / 3, sign of x;
    0 and inf pass through."""
    a = _abs(x)
    y = lax.exp(lax.log(a) * (1 / 3))
    y = y + (a / (y * y) - y) * (1 / 3)
    y = lax.select((a == 0) | (a == jnp.inf), a, y)
    return _copysign(y, x)


lower_tan = _decomposed(tan_f32)
lower_sinh = _decomposed(sinh_f32)
lower_cosh = _decomposed(cosh_f32)
lower_asinh = _decomposed(asinh_f32)
lower_acosh = _decomposed(acosh_f32)
lower_atanh = _decomposed(atanh_f32)
lower_asin = _decomposed(asin_f32)
lower_acos = _decomposed(acos_f32)
lower_atan = _decomposed(atan_f32)
lower_cbrt = _decomposed(cbrt_f32)


def nextafter_f(x: jax.Array, y: jax.Array) -> jax.Array:
    """The float after x in the direction of y, by stepping x's bit pattern:
    exact (IEEE 754 nextUp/nextDown; nextafter(x, x) = y, NaN if either is)."""
    int_type = {2: jnp.int16, 4: jnp.int32}[x.dtype.itemsize]
    bits = lax.bitcast_convert_type(x, int_type)
    away = (y > x) == (x > 0)  # moving away from zero: |bits| grows
    step = lax.bitcast_convert_type(lax.select(away, bits + 1, bits - 1), x.dtype)
    tiny = jnp.full_like(x, float(jnp.finfo(x.dtype).smallest_subnormal))
    step = lax.select(x == 0, _copysign(tiny, y), step)
    step = lax.select(x == y, y, step)
    return lax.select((x != x) | (y != y), x + y, step)


def lower_nextafter(ctx: PallasContext, x: Operand, y: Operand) -> Lowered:
    _require_float(ctx)
    return _lower_fun(nextafter_f)(ctx, x, y)


def horner(x: jax.Array, *coeffs: jax.typing.ArrayLike) -> jax.Array:
    """``a_0 + x (a_1 + x (... + x a_N))``, a multiply and an add per term in
    x's dtype: what ``lax.polynomial`` (jax 0.12) defines."""
    acc = jnp.broadcast_to(coeffs[-1], x.shape).astype(x.dtype)
    for a in reversed(coeffs[:-1]):
        acc = acc * x + a
    return acc


def lower_polynomial(ctx: PallasContext, x: Operand, *coeffs: Operand, unroll: object = None
                     ) -> Lowered:
    """``lax.polynomial`` (jax 0.12's ``jnp.sinc`` and special functions use
    it) by Horner's rule, unrolled (Pallas lowers no scan here)."""
    del unroll
    if np.dtype(ctx.avals_in[0].dtype) not in (*map(np.dtype, FLOATS), np.dtype(np.int32)):
        raise refuse(ctx, "operands of this dtype are not supported",
                     fix="evaluate it in float32 (x.astype(jnp.float32))")
    return _lower_fun(horner)(ctx, x, *coeffs)


def lower_copy(ctx: PallasContext, x: Operand) -> Operand:
    """``lax.copy`` (``jnp.array(x, copy=True)``, the end of ``jax.nn.gelu``):
    values are immutable in a kernel, so the copy is the value itself."""
    return x


def lower_stop_gradient(ctx: PallasContext, x: Operand) -> Operand:
    """The identity: there are no gradients inside a kernel."""
    del ctx
    return x


def lower_custom_jvp_call(ctx: PallasContext, *args: Operand, call_jaxpr: Any, num_consts: int,
                          **params: Any) -> Lowered:
    """The function's own body (its JVP rule is irrelevant inside a kernel).
    Reached because :func:`estimate_custom_jvp_call` lets Pallas' resource
    estimation, which runs first, through."""
    del params
    jaxpr, consts = (call_jaxpr.jaxpr, call_jaxpr.consts) if hasattr(call_jaxpr, "consts") \
        else (call_jaxpr, ())
    if consts:
        raise refuse(ctx, "a custom_jvp function that closes over array constants",
                     fix="pass the constants to the function as arguments")
    return pallas_lowering.lower_jaxpr_to_mosaic_gpu(ctx.module_ctx, ctx.launch_ctx, jaxpr, args)


def lower_custom_vjp_call(ctx: PallasContext, *args: Operand, call_jaxpr: Any, num_consts: int,
                          **params: Any) -> Lowered:
    """The function's own body, as for ``custom_jvp_call`` (its forward and
    backward rules are irrelevant inside a kernel)."""
    return lower_custom_jvp_call(ctx, *args, call_jaxpr=call_jaxpr, num_consts=num_consts)


def estimate_custom_jvp_call(ctx: EstimatorContext, *avals: Aval, call_jaxpr: Any,
                             **params: Any) -> Resources:
    """What the function's body needs: Pallas' own estimate of the body's
    jaxpr (Pallas refuses any primitive whose parameters hold a jaxpr).
    Also the estimate of ``custom_vjp_call``, whose body is ``call_jaxpr`` too."""
    del avals, params
    jaxpr = call_jaxpr.jaxpr if hasattr(call_jaxpr, "consts") else call_jaxpr
    return pallas_lowering._estimate_resources(ctx, jaxpr)


# --- bit casts of scalars ----------------------------------------------------------------


def lower_bitcast_convert_type(ctx: PallasContext, x: Operand, *, new_dtype: np.dtype) -> ir.Value:
    """jax's rule for vectors; a scalar (``jnp.signbit(-1.0)``, so
    ``jnp.copysign(x, -1.0)``) is bitcast to the scalar type: jax's rule
    makes a 0-D vector of it, which Pallas then refuses ("Scalars must be
    represented by non-vector types")."""
    [aval] = ctx.avals_in
    if aval.shape:
        return jax_rule(ctx)(ctx, x, new_dtype=new_dtype)
    source, target = (mgpu_utils.dtype_to_ir_type(d) for d in (aval.dtype, new_dtype))
    if mgpu_utils.bitwidth(source) != mgpu_utils.bitwidth(target):
        raise refuse(ctx, f"a bitcast from {np.dtype(aval.dtype)} to {np.dtype(new_dtype)} "
                     "changes the width", fix="bitcast between types of one width "
                     "(lax.bitcast_convert_type(x, jnp.int32) for float32)")
    return arith_dialect.bitcast(target, pallas_lowering._ensure_ir_value(x, aval.dtype))


# --- bit counting -----------------------------------------------------------------------


def popcount(x: jax.Array) -> jax.Array:
    """SWAR bit counting in 32 bits (narrower integers zero-extended)."""
    bits = jnp.iinfo(x.dtype).bits
    v = x.astype(jnp.uint32 if bits == 32 else jnp.int32)
    if bits < 32:
        v = v & ((1 << bits) - 1)
    v = v.astype(jnp.uint32)
    v = v - (lax.shift_right_logical(v, jnp.uint32(1)) & 0x55555555)
    v = (v & 0x33333333) + (lax.shift_right_logical(v, jnp.uint32(2)) & 0x33333333)
    v = (v + lax.shift_right_logical(v, jnp.uint32(4))) & 0x0F0F0F0F
    v = lax.shift_right_logical(v * jnp.uint32(0x01010101), jnp.uint32(24))
    return v.astype(x.dtype)


def lower_population_count(ctx: PallasContext, x: Operand) -> Lowered:
    dtype = _dtype(ctx)
    if dtype.kind not in "iu" or dtype.itemsize > 4:
        raise refuse(ctx, f"operands of dtype {dtype} are not supported",
                     fix="count the bits of 8-, 16- or 32-bit integers "
                         "(split an int64 into two int32 halves)")
    return _lower_fun(popcount)(ctx, x)
