"""Cumulative reductions inside Pallas Mosaic GPU kernels: ``cumsum``,
``cumprod``, ``cummax``, ``cummin``, ``cumlogsumexp`` (``jnp.cumsum``,
``jnp.cumprod``, ``lax.cummax``, ``lax.cummin``, ``lax.cumlogsumexp``),
along either axis of a 1-D or 2-D block, ``reverse=`` included.

How: a Hillis--Steele scan written as a jax function over
:func:`smalti.vocabulary.movement.take` and lowered by Pallas' ``_lower_fun``.
Step ``s = 1, 2, 4, ...`` (``ceil(log2 n)`` steps for ``n`` elements along
the axis) combines every element with the one ``s`` places before it (after
it, for ``reverse=True``), fetched with one ``take``:
``x = where(pos >= s, x (+) take(x, idx - s), x)``. Hillis--Steele needs
half the ``take`` steps of a work-efficient (Blelloch) scan, and a ``take``
(an SMEM round trip) is what costs.

Accuracy. Each partial result after step ``t`` is a sum (product, ...) of a
contiguous run of up to ``2**t`` elements, combined as a balanced tree of
depth ``t``, so, with ``u = eps / 2`` the unit roundoff of the compute type:

- integer ``cumsum``/``cumprod`` (wrapping), ``cummax``, ``cummin``: exact
  (bit for bit equal to jnp); float ``cummax``/``cummin`` too: ``lax.max``
  and ``lax.min`` are IEEE 754-2019 maximum and minimum (NaN propagates,
  ``-0.0 < +0.0``), as XLA computes them and as PTX ``max.NaN.f32`` does
  (the PTX ISA's pseudo-code: "+0.0 > -0.0 here"); a NaN comes out as a NaN
  (its sign and payload, which XLA does not define either, not kept);
- float ``cumsum``: ``|err_i| <= ceil(log2 n) * u * sum_{j<=i} |x_j|``
  (a sequential sum's bound has ``i`` in place of ``ceil(log2 n)``);
- float ``cumprod``: ``|err_i| <= i * u * |prod_{j<=i} x_j|`` to first
  order (``i`` multiplications, as sequentially; no overflow/underflow);
- ``cumlogsumexp``: each combine is ``m + log1p(exp(-|a - b|))``,
  ``m = max(a, b)`` (a few ulp; its sensitivity to its inputs is at most 1),
  so ``|err_i| <= ceil(log2 n) * 4 * eps * (|r_i| + 1)``.

f16 and bf16 sums, products and log-sum-exps are computed in f32 and
rounded once (the bounds above with f32's ``u``, plus half an ulp of the
result type); their ``cummax``/``cummin`` on their own keys (exact).
Integers narrower than 32 bits are computed in int32 (exact: sums and
products wrap modulo ``2**bits`` when truncated back).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import jax.numpy as jnp
import numpy as np
from jax import lax

from smalti.vocabulary import lane_scan, lanes
from smalti.vocabulary import rows as row_moves
from smalti.vocabulary.annotations import (
    Aval,
    DTypeLike,
    EstimatorContext,
    Lowered,
    Operand,
    PallasContext,
    Resources,
)
from smalti.vocabulary.movement import take

#: The longest axis a scan or sort handles (each ``take`` is an SMEM round
#: trip of the whole block; longer axes want a multi-block algorithm).
MAX_AXIS = 256
#: The largest block (elements) handled: (128, 256).
MAX_ELEMENTS = 128 * 256
SIXTEEN_BIT_FLOATS = (np.dtype(jnp.float16), np.dtype(jnp.bfloat16))


# --- geometry of a block along one axis --------------------------------------------------


def positions(shape: tuple[int, ...], axis: int) -> jnp.ndarray:
    """Each element's index along ``axis`` (int32): built in registers
    where the block is (:func:`smalti.vocabulary.lanes.iota`)."""
    if len(shape) == 2:
        return lanes.iota(shape, axis)
    return lax.broadcasted_iota(jnp.int32, shape, axis)


def linear(shape: tuple[int, ...]) -> jnp.ndarray:
    """Each element's row-major linear index (what ``take`` indexes)."""
    if len(shape) == 1:
        return lax.broadcasted_iota(jnp.int32, shape, 0)
    return lax.broadcasted_iota(jnp.int32, shape, 0) * shape[1] \
        + lax.broadcasted_iota(jnp.int32, shape, 1)


def stride(shape: tuple[int, ...], axis: int) -> int:
    """The linear distance between neighbours along ``axis``."""
    return shape[1] if (len(shape) == 2 and axis == 0) else 1


# --- the scan -----------------------------------------------------------------------------


def scan(x: jnp.ndarray, combine: Callable, *, axis: int, reverse: bool,
         fill: float | int | None = None) -> jnp.ndarray:
    """Inclusive scan of ``x`` along ``axis`` with the associative ``combine``
    (Hillis--Steele: ``ceil(log2 n)`` steps). In a 2-D block each step's
    move is a :func:`~smalti.vocabulary.lanes.permute` along the minor axis
    (in registers where it fits) or a :func:`~smalti.vocabulary.rows.permute`
    along the rows (a vector per register through SMEM where it fits); there,
    ``fill`` (an identity of ``combine``: ``combine(fill, v)`` is ``v`` bit
    for bit) is shifted in instead of selecting the elements that have no
    neighbour ``s`` away."""
    shape = x.shape
    n = shape[axis]
    if len(shape) == 2:  # columns in registers, rows a vector per register through SMEM
        move = lanes.permute if axis == 1 else row_moves.permute
        if fill is not None:  # the identity shifted in: no select
            s = 1
            while s < n:
                x = combine(move(x, lanes.shifted(n, -s if reverse else s, wrap=False), fill), x)
                s *= 2
            return x
    pos = positions(shape, axis)
    lin = linear(shape)
    if reverse:  # distance to the end, neighbours after
        dist, step = (n - 1) - pos, stride(shape, axis)
    else:
        dist, step = pos, -stride(shape, axis)
    s = 1
    while s < n:
        has = dist >= s
        if len(shape) == 2:
            moved = move(x, lanes.shifted(n, -s if reverse else s))
        else:
            moved = take(x, jnp.where(has, lin + step * s, lin))
        x = jnp.where(has, combine(moved, x), x)
        s *= 2
    return x


def logaddexp_f32(a: jnp.ndarray, b: jnp.ndarray) -> jnp.ndarray:
    """log(exp a + exp b) = m + log1p(exp(-|a - b|)), m = max(a, b); both
    -inf (or m = +inf) gives m; NaN propagates."""
    from smalti.vocabulary.primitives import log1p_f32

    m = lax.max(a, b)
    r = m + log1p_f32(lax.exp(-lax.abs(a - b)))
    return lax.select(lax.abs(m) == jnp.inf, m, r)


COMBINE: dict[str, Callable] = {
    "cumsum": lax.add,
    "cumprod": lax.mul,
    "cummax": lax.max,
    "cummin": lax.min,
    "cumlogsumexp": logaddexp_f32,
}


#: The scans :mod:`smalti.vocabulary.lane_scan` computes along the minor axis.
LANE_SCAN_KINDS = {"cumsum": "add", "cumprod": "mul", "cummax": "max", "cummin": "min"}


def compute_dtype(name: str, dtype: np.dtype) -> np.dtype:
    """The dtype a scan of ``dtype`` values is computed in."""
    dtype = np.dtype(dtype)
    if dtype in SIXTEEN_BIT_FLOATS:
        return np.dtype(np.float32)
    if dtype.kind in "iu" and dtype.itemsize < 4:
        return np.dtype(np.int32)
    return dtype


def identity(name: str, dtype: np.dtype) -> float | int | None:
    """A value ``e`` with ``combine(e, v) == v`` bit for bit for every ``v``
    (a signalling NaN aside, which comes out quiet): ``-0.0`` for float sums
    (``+0.0 + -0.0`` is ``+0.0``), the ends of the range for max and min
    (``-inf`` and ``+inf`` for floats: below ``-0.0`` and above ``+0.0``);
    ``None`` for cumlogsumexp (whose combine does not keep ``-0.0``)."""
    floating = jnp.issubdtype(dtype, jnp.floating)
    info = None if floating else np.iinfo(dtype)
    return {
        "cumsum": -0.0 if floating else 0,
        "cumprod": 1.0 if floating else 1,
        "cummax": -np.inf if info is None else int(info.min),
        "cummin": np.inf if info is None else int(info.max),
    }.get(name)


def cumulative(x: jnp.ndarray, *, name: str, axis: int, reverse: bool) -> jnp.ndarray:
    """``lax.<name>(x, axis, reverse)`` as a scan (computed in
    :func:`compute_dtype`, converted back once: exact for 16-bit floats'
    maxima and minima)."""
    wide = compute_dtype(name, x.dtype)
    if (x.ndim == 2 and name in LANE_SCAN_KINDS
            and np.dtype(x.dtype) in lane_scan.SIXTEEN_BIT_FLOATS):
        # the round trip in the 16-bit type, computed in float32 (or exact) inside
        return lane_scan.scan(x, LANE_SCAN_KINDS[name], reverse=reverse, axis=axis)
    y = x.astype(wide) if wide != x.dtype else x
    if y.ndim == 2 and name in LANE_SCAN_KINDS:  # work-efficient
        y = lane_scan.scan(y, LANE_SCAN_KINDS[name], reverse=reverse, axis=axis)
    else:
        y = scan(y, COMBINE[name], axis=axis, reverse=reverse, fill=identity(name, wide))
    return y.astype(x.dtype) if wide != x.dtype else y


# --- Pallas rules --------------------------------------------------------------------------


def check_block(ctx: PallasContext, shape: tuple[int, ...], axis: int, what: str) -> None:
    """The block and axis limits every scan and sort shares (SM206)."""
    from smalti.vocabulary.primitives import refuse

    if len(shape) not in (1, 2):
        raise refuse(ctx, f"{what} of a {len(shape)}-D value",
                     fix="reshape the block to 1-D or 2-D first")
    if shape[axis] > MAX_AXIS:
        raise refuse(ctx, f"{what} along an axis of {shape[axis]} elements (at most {MAX_AXIS})",
                     fix=[f"split the axis into pieces of at most {MAX_AXIS}",
                          "or combine the per-piece results outside the kernel"])
    if int(np.prod(shape)) > MAX_ELEMENTS:
        raise refuse(ctx, f"{what} of a block of {int(np.prod(shape))} elements "
                          f"(at most {MAX_ELEMENTS}, e.g. (128, 256))",
                     fix="use a smaller block (BlockSpec / a loop over sub-blocks)")


def _check_dtype(ctx: PallasContext, name: str, dtype: np.dtype) -> None:
    from smalti.vocabulary.primitives import refuse

    dtype = np.dtype(dtype)
    floats = [np.dtype(np.float32), *SIXTEEN_BIT_FLOATS]
    ok = dtype in floats if name == "cumlogsumexp" else \
        (dtype in floats or (dtype.kind in "iu" and dtype.itemsize <= 4))
    if not ok:
        allowed = "float32, float16 or bfloat16" if name == "cumlogsumexp" \
            else "float32, float16, bfloat16 or an integer of at most 32 bits"
        raise refuse(ctx, f"operands of dtype {dtype} are not supported",
                     fix=f"compute in {allowed} (x.astype(jnp.float32))")


def _rule(name: str) -> Callable[..., Lowered]:
    def rule(ctx: PallasContext, x: Operand, *, axis: int, reverse: bool) -> Lowered:
        from smalti.vocabulary.primitives import _lower_fun

        [aval] = ctx.avals_in
        _check_dtype(ctx, name, aval.dtype)
        check_block(ctx, tuple(aval.shape), axis, name)
        fn = partial(cumulative, name=name, axis=int(axis), reverse=bool(reverse))
        with lanes.for_operands(x):
            return _lower_fun(fn)(ctx, x)

    rule.__name__ = rule.__qualname__ = f"lower_{name}"
    return rule


lower_cumsum = _rule("cumsum")
lower_cumprod = _rule("cumprod")
lower_cummax = _rule("cummax")
lower_cummin = _rule("cummin")
lower_cumlogsumexp = _rule("cumlogsumexp")


def take_scratch(ctx: EstimatorContext, source_shape: tuple[int, ...], dtype: DTypeLike
                 ) -> Resources:
    """The scratch of the largest ``take`` a decomposition makes: one of a
    ``source_shape`` value of ``dtype`` (``take``'s own estimate)."""
    from jax._src import core as jax_core

    from smalti.vocabulary.movement import take_estimate

    source = jax_core.ShapedArray(tuple(source_shape), np.dtype(dtype))
    return take_estimate(ctx, source, jax_core.ShapedArray(tuple(source_shape), np.int32))


def estimate_scan(ctx: EstimatorContext, x_aval: Aval, *, axis: int, reverse: bool) -> Resources:
    """Every step takes from the whole block, in the compute dtype."""
    del axis, reverse
    return take_scratch(ctx, tuple(x_aval.shape), compute_dtype("cumsum", x_aval.dtype))
