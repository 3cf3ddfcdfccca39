"""Warpgroup lowerings of the reductions Pallas lacks, and of the two
operations ``jnp.var``/``jnp.std`` and ``jnp.any`` of integers need.

Every reduction here is a decomposition, written as a jax function and
lowered by Pallas' ``_lower_fun`` into the reductions Pallas has
(``reduce_max``, ``reduce_min``, ``reduce_sum``: ``vector.multi_reduction``
along one axis, ``vector.shape_cast`` + ``vector.reduction`` to a scalar)
and elementwise ops:

- ``argmax``/``argmin``: ``m = max(x)`` along the axis, then the smallest
  index where ``x == m`` (``min(where(x == m, iota, n))``); for floats
  ``x != x`` also hits, and only matters when ``m`` is NaN (max and min
  propagate NaN), so the first NaN wins -- jnp's answer, ties to the first
  index, ``-0 == +0``;
- ``reduce_or``/``reduce_and``/``reduce_xor`` of booleans: ``max``, ``min``
  and ``sum & 1`` of ``x`` as int32; of integers (bitwise): per bit, how
  many elements have it set, counted by ``reduce_sum`` with several bits
  packed into one int32 in fields wide enough for the count (one
  ``reduce_sum`` per ``32 // width`` bits), then ``count > 0``,
  ``count == n``, ``count & 1``. All exact.

Pallas reserves scratch SMEM for a reduction across warps through its
resource estimators, which exist only for ``reduce_sum``/``max``/``min``:
``estimate_reduction`` is registered for ``reduce_prod`` (Pallas' own
lowering) and for each primitive above.

Two non-reductions, each only where Pallas refuses (jax's own rule for
everything else, so kernels jax lowers keep their IR):

- ``select_n`` with a scalar predicate and vector cases (``jnp.where`` in
  ``jnp.var``/``jnp.std``): the predicate is broadcast (a splat) first;
- ``convert_element_type`` of a non-boolean vector to bool (``jnp.any`` of
  integers, ``jnp.signbit``): ``x != 0``, jnp's meaning. Pallas emits
  ``arith.trunci``/``fptoui`` to ``i1``, which keeps the lowest bit (``2``
  would be False) and which jax's lowering cannot lower.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax._src.lib.mlir import ir
from jax._src.lib.mlir.dialects import arith as arith_dialect
from jax._src.lib.mlir.dialects import vector as vector_dialect
from jax._src.pallas.mosaic_gpu import lowering as pallas_lowering

from smalti.vocabulary.annotations import (
    Aval,
    DTypeLike,
    EstimatorContext,
    Lowered,
    Operand,
    PallasContext,
    Resources,
)
from smalti.vocabulary.primitives import jax_rule, refuse

_lower_fun = pallas_lowering._lower_fun
_INDEX_DTYPES = (np.dtype(np.int32), np.dtype(np.uint32), np.dtype(np.int16),
                 np.dtype(np.uint16), np.dtype(np.int8), np.dtype(np.uint8))


def estimate_reduction(ctx: EstimatorContext, *avals: Aval, **params: Any) -> Resources:
    """As Pallas' own estimator of reduce_sum/max/min: the most a reduction
    across warps may take (whether it does depends on the layout)."""
    del avals, params
    return pallas_lowering.Resources(smem_scratch_bytes=ctx.reduction_scratch_bytes)


def _dtype(ctx: PallasContext) -> np.dtype:
    return np.dtype(ctx.avals_in[0].dtype)


def _require(ctx: PallasContext, kinds: str, what: str) -> None:
    """Operands of 32 bits or fewer, of the kinds ``f`` (float, bfloat16
    included), ``i``/``u`` (integer), ``b`` (bool)."""
    dtype = _dtype(ctx)
    kind = "f" if jnp.issubdtype(dtype, jnp.floating) else dtype.kind
    if kind not in kinds or dtype.itemsize > 4:
        raise refuse(ctx, f"operands of dtype {dtype} are not supported",
                     fix=f"reduce {what} (convert with x.astype(...))")


# --- argmax / argmin --------------------------------------------------------------------


def arg_extreme(x: jax.Array, axis: int, index_dtype: DTypeLike, largest: bool) -> jax.Array:
    """The first index of the largest (smallest) element along ``axis``;
    the first NaN's, if there is one."""
    if x.dtype == jnp.bool_:
        x = x.astype(jnp.int32)
    n = x.shape[axis]
    extreme = lax.reduce_max(x, (axis,)) if largest else lax.reduce_min(x, (axis,))
    kept = tuple(d for d in range(x.ndim) if d != axis)
    hit = x == lax.broadcast_in_dim(extreme, x.shape, kept)
    if jnp.issubdtype(x.dtype, jnp.floating):
        hit = hit | (x != x)  # only where the extreme is NaN
    iota = lax.broadcasted_iota(jnp.int32, x.shape, axis)
    index = lax.reduce_min(lax.select(hit, iota, jnp.full_like(iota, n)), (axis,))
    return index.astype(index_dtype)


def _lower_arg(ctx: PallasContext, x: Operand, axes: Sequence[int], index_dtype: DTypeLike,
               largest: bool) -> Lowered:
    _require(ctx, "fiub", "float, integer or boolean values")
    if np.dtype(index_dtype) not in _INDEX_DTYPES:
        raise refuse(ctx, f"index_dtype={np.dtype(index_dtype)} is not supported",
                     fix="ask for int32 indices (the default without jax_enable_x64)")
    [axis] = axes
    n = ctx.avals_in[0].shape[axis]
    if n - 1 > np.iinfo(index_dtype).max:
        raise refuse(ctx, f"the indices of an axis of {n} elements do not fit "
                     f"index_dtype={np.dtype(index_dtype)}", fix="ask for int32 indices")
    return _lower_fun(lambda v: arg_extreme(v, axis, index_dtype, largest))(ctx, x)


def lower_argmax(ctx: PallasContext, x: Operand, *, axes: Sequence[int],
                 index_dtype: DTypeLike) -> Lowered:
    return _lower_arg(ctx, x, axes, index_dtype, largest=True)


def lower_argmin(ctx: PallasContext, x: Operand, *, axes: Sequence[int],
                 index_dtype: DTypeLike) -> Lowered:
    return _lower_arg(ctx, x, axes, index_dtype, largest=False)


# --- reduce_or / reduce_and / reduce_xor ------------------------------------------------


def _bool_reduce(x: jax.Array, axes: tuple[int, ...], kind: str) -> jax.Array:
    v = x.astype(jnp.int32)
    if kind == "or":
        return lax.reduce_max(v, axes) != 0
    if kind == "and":
        return lax.reduce_min(v, axes) != 0
    return (lax.reduce_sum(v, axes) & 1) != 0


def bitwise_reduce(x: jax.Array, axes: tuple[int, ...], kind: str) -> jax.Array:
    """``or``/``and``/``xor`` of integers along ``axes``: per bit, the number
    of elements with it set, several bits counted by one int32 ``reduce_sum``
    (fields of ``width`` bits hold counts up to ``n``: no carries)."""
    if x.dtype == jnp.bool_:
        return _bool_reduce(x, axes, kind)
    n = math.prod(x.shape[a] for a in axes)
    bits = jnp.iinfo(x.dtype).bits
    width = n.bit_length()
    per_sum = max(1, 32 // width)
    if x.dtype == jnp.int32:
        v = x
    elif bits == 32:
        v = lax.bitcast_convert_type(x, jnp.int32)
    else:
        v = x.astype(jnp.int32)  # sign extension leaves the low bits alone
    mask = (1 << width) - 1 if width < 32 else -1
    result: jax.Array | None = None
    for first in range(0, bits, per_sum):
        group = range(first, min(first + per_sum, bits))
        packed: jax.Array | None = None
        for j, bit in enumerate(group):
            field = lax.shift_left(lax.shift_right_logical(v, jnp.int32(bit)) & 1,
                                   jnp.int32(width * j))
            packed = field if packed is None else packed | field
        assert packed is not None  # a group has a bit
        sums = lax.reduce_sum(packed, axes)
        for j, bit in enumerate(group):
            count = lax.shift_right_logical(sums, jnp.int32(width * j)) & mask
            if kind == "or":
                on = count != 0
            elif kind == "and":
                on = count == n
            else:
                on = (count & 1) != 0
            term = lax.shift_left(on.astype(jnp.int32), jnp.int32(bit))
            result = term if result is None else result | term
    assert result is not None  # an integer has bits
    if x.dtype == jnp.int32:
        return result
    if bits == 32:
        return lax.bitcast_convert_type(result, x.dtype)
    return result.astype(x.dtype)  # keeps the low bits


def _lower_bitwise(kind: str) -> Callable[..., Lowered]:
    def rule(ctx: PallasContext, x: Operand, *, axes: Sequence[int], **params: Any) -> Lowered:
        del params
        _require(ctx, "biu", "booleans or 8-, 16- or 32-bit integers")
        axes = tuple(axes)
        return _lower_fun(lambda v: bitwise_reduce(v, axes, kind))(ctx, x)

    rule.__name__ = f"lower_reduce_{kind}"
    return rule


lower_reduce_or = _lower_bitwise("or")
lower_reduce_and = _lower_bitwise("and")
lower_reduce_xor = _lower_bitwise("xor")


# --- select_n with a scalar predicate ---------------------------------------------------


def lower_select_n(ctx: PallasContext, pred: Operand, *cases: Operand) -> Lowered:
    """jax's rule, except for a scalar predicate choosing between vectors
    (which Pallas refuses: "Implicit broadcast not implemented"): the
    predicate is broadcast to the cases' shape first."""
    pred_aval, *case_avals = ctx.avals_in
    [out_aval] = ctx.avals_out
    if len(cases) != 2 or pred_aval.shape or not out_aval.shape \
            or any(a.shape != out_aval.shape for a in case_avals):
        return jax_rule(ctx)(ctx, pred, *cases)
    pred = pallas_lowering._ensure_ir_value(pred, pred_aval.dtype)
    values = [pallas_lowering._ensure_ir_value(c, a.dtype) for c, a in zip(cases, case_avals)]
    i1 = ir.IntegerType.get_signless(1)
    pred = vector_dialect.broadcast(ir.VectorType.get(out_aval.shape, i1), pred)
    # select_n orders the cases false first.
    return arith_dialect.select(pred, values[1], values[0])


# --- logical not -------------------------------------------------------------------------


def lower_not(ctx: PallasContext, x: Operand) -> Lowered:
    """``~b`` of a boolean vector as ``b ^ True``; jax's rule otherwise
    (scalars included). jax's rule computes ``astype(astype(b, int) ^ -1,
    bool)``, which is only right when int-to-bool keeps the lowest bit, and
    :func:`lower_convert_element_type` makes int-to-bool of vectors
    ``x != 0``, as numpy's conversion is."""
    [x_aval] = ctx.avals_in
    if np.dtype(x_aval.dtype) == np.dtype(np.bool_) and x_aval.shape:
        return _lower_fun(lambda b: lax.bitwise_xor(b, jnp.ones_like(b)))(ctx, x)
    return jax_rule(ctx)(ctx, x)


# --- conversion to bool -----------------------------------------------------------------


def lower_convert_element_type(ctx: PallasContext, x: Operand, *, new_dtype: DTypeLike,
                               **params: Any) -> Lowered:
    """``x != 0`` for a non-boolean vector converted to bool; jax's rule otherwise."""
    [x_aval] = ctx.avals_in
    if np.dtype(new_dtype) == np.dtype(np.bool_) and x_aval.shape \
            and np.dtype(x_aval.dtype) != np.dtype(np.bool_):
        return _lower_fun(lambda v: v != jnp.zeros_like(v))(ctx, x)
    return jax_rule(ctx)(ctx, x, new_dtype=new_dtype, **params)
