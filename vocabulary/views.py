"""Rank-3 views of 1-D and 2-D blocks inside Pallas Mosaic GPU kernels:
reshapes that split or merge the minor dimension into groups
(``x.reshape(64, 4, 32)`` for group-wise quantization scales, and back),
reductions of such views (``jnp.max(..., axis=-1)``), broadcasts into them
(``s[..., None]``, ``jnp.repeat``) and ``stack`` (interleaving).

No register layout of jax tiles a 3-D shape whose last two dimensions are
not multiples of a (64, 8) tile, so jax lowers none of these. Here a 3-D
value lives in registers in the strided layout (a 1-D vector of its
elements in row-major order, reshaped: ``vector.shape_cast`` between
strided layouts moves nothing), and every primitive that changes the shape
moves the elements with one :func:`smalti.vocabulary.movement.take`:

- ``reshape`` 2-D -> 3-D: the block taken in its own row-major order into a
  1-D vector, cast to the 3-D shape; 3-D -> 2-D: the 1-D cast of the view
  taken back into the 2-D shape;
- ``broadcast_in_dim`` into a 3-D shape: each output element takes the
  operand element it repeats (``jnp.repeat(x, 2, 1)`` is such a broadcast
  and a reshape);
- ``reduce_sum`` / ``reduce_max`` / ``reduce_min`` of a 3-D value along one
  axis: the view taken as (the other two dims, the reduced one) in the
  WGMMA layout, reduced along its rows by jax's own reduction, and the
  (n,) result (broadcast to (n, 8), the layout a reduction's result
  broadcasts to) taken into the 2-D result;
- ``stack`` of 1-D / 2-D operands: each output element takes from the
  operand its stacked coordinate names.

Which shapes: a reshape between a 1-D/2-D and a 3-D shape that changes the
minor dimension (not one that only adds or removes unit dimensions, nor one
of a block loaded plainly from GMEM, strided already: jax's), a
broadcast or reduction of a 3-D shape whose last two dimensions are not
tile-shaped; everything else is jax's own rule (shapes jax may tile,
leading dimensions split off a tiled block: kernels jax lowers keep their
IR). Exact for moves; sums in the reduction's tree order.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax._src import core as jax_core
from jax._src.lib.mlir import ir
from jax._src.lib.mlir.dialects import vector as vector_dialect
from jax._src.pallas.mosaic_gpu import lowering as pallas_lowering
from jax.experimental.mosaic.gpu import utils as mgpu_utils
from jax.experimental.pallas import mosaic_gpu as plgpu

from smalti.vocabulary.annotations import (
    Aval,
    EstimatorContext,
    Lowered,
    Operand,
    PallasContext,
    Resources,
)
from smalti.vocabulary.indexing import see_through
from smalti.vocabulary.movement import take
from smalti.vocabulary.primitives import jax_rule, refuse
from smalti.vocabulary.scans import take_scratch

#: The tile of jax's WGMMA layout: a 3-D shape whose last two dims are
#: multiples of it may have a tiled layout (jax's rules handle it).
TILE = (64, 8)


def tileable(shape: tuple[int, ...]) -> bool:
    return len(shape) >= 2 and shape[-2] % TILE[0] == 0 and shape[-1] % TILE[1] == 0


def _squeeze(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(n for n in shape if n != 1)


def views_reshape(old: tuple[int, ...], new: tuple[int, ...]) -> bool:
    """Whether this plugin reshapes ``old`` to ``new`` (see the module docstring)."""
    ranks = sorted((len(old), len(new)))
    if ranks != [2, 3] or _squeeze(old) == _squeeze(new):
        return False
    return not (tileable(old) and tileable(new))


def views_shape(shape: tuple[int, ...]) -> bool:
    """Whether a 3-D value of ``shape`` is one of this plugin's views."""
    return len(shape) == 3 and not tileable(shape)


def views_broadcast(old: tuple[int, ...], new: tuple[int, ...]) -> bool:
    """Whether this plugin broadcasts ``old`` into ``new``: into a view,
    other than by adding unit dimensions (jax's rule: the same elements)."""
    return views_shape(new) and len(old) > 0


# --- coordinates -----------------------------------------------------------------------------


def _strides(shape: tuple[int, ...]) -> list[int]:
    return [math.prod(shape[d + 1:]) for d in range(len(shape))]


def _coords(shape: tuple[int, ...]) -> list[jax.Array]:
    """Each element's coordinates, as arrays: of ``shape`` itself for 1-D
    and 2-D shapes, of the flat (size,) shape for 3-D ones (no iota of a 3-D
    shape has a layout)."""
    if len(shape) <= 2:
        return [lax.broadcasted_iota(jnp.int32, shape, d) for d in range(len(shape))]
    n = lax.iota(jnp.int32, math.prod(shape))
    return [lax.rem(lax.div(n, jnp.int32(s)), jnp.int32(size)) if s > 1 else
            lax.rem(n, jnp.int32(size)) for s, size in zip(_strides(shape), shape)]


def _linear(coords: Sequence[jax.Array | int], shape: tuple[int, ...]) -> jax.Array | int:
    index: jax.Array | int = 0
    for c, s in zip(coords, _strides(shape)):
        if isinstance(c, int) and c == 0:
            continue
        index = index + (c * s if s != 1 else c)
    return index


def _flat(x: jax.Array) -> jax.Array:
    """A 3-D view as its 1-D vector (the same elements, in order)."""
    return x.reshape(x.size) if x.ndim > 2 else x


def _build(out_shape: tuple[int, ...], source: jax.Array,
           source_linear: Callable[[list[jax.Array]], jax.Array | int]) -> jax.Array:
    """The value of ``out_shape`` whose element at coordinates ``c`` is
    ``source``'s element at linear index ``source_linear(c)``."""
    coords = _coords(out_shape)
    taken = take(_flat(source), source_linear(coords))
    return taken.reshape(out_shape) if len(out_shape) > 2 else taken


# --- decompositions ----------------------------------------------------------------------------


def reshape_f(x: jax.Array, *, new_sizes: tuple[int, ...]) -> jax.Array:
    return _build(tuple(new_sizes), x, lambda c: _linear(c, tuple(new_sizes)))


def broadcast_f(x: jax.Array, *, shape: tuple[int, ...], broadcast_dimensions: tuple[int, ...],
                operand_shape: tuple[int, ...]) -> jax.Array:
    """``x`` holds the elements of an ``operand_shape`` array in row-major
    order (its own shape may differ by unit dims)."""
    def source(c: list[jax.Array]) -> jax.Array | int:
        mine = [c[d] if operand_shape[i] != 1 else 0
                for i, d in enumerate(broadcast_dimensions)]
        return _linear(mine, operand_shape) if mine else jnp.zeros_like(c[0])
    return _build(tuple(shape), x, source)


REDUCE = {"sum": lax.reduce_sum, "max": lax.reduce_max, "min": lax.reduce_min}


def reduce_f(x: jax.Array, *, axis: int, kind: str) -> jax.Array:
    """One axis of a 3-D view reduced (see the module docstring)."""
    shape = tuple(x.shape)
    rest = [d for d in range(3) if d != axis]
    p, q = (shape[d] for d in rest)
    rows, k = p * q, shape[axis]
    r = lax.broadcasted_iota(jnp.int32, (rows, k), 0)
    coords: list[jax.Array | int] = [0, 0, 0]
    coords[axis] = lax.broadcasted_iota(jnp.int32, (rows, k), 1)
    coords[rest[0]], coords[rest[1]] = lax.div(r, jnp.int32(q)), lax.rem(r, jnp.int32(q))
    # nothing else pins it: iotas alone may be given the strided layout,
    # which a reduction along one axis does not take (the rule checked the tile)
    t = plgpu.layout_cast(take(_flat(x), _linear(coords, shape)), plgpu.Layout.WGMMA)
    reduced = lax.broadcast_in_dim(REDUCE[kind](t, (1,)), (rows, TILE[1]), (0,))
    i = lax.broadcasted_iota(jnp.int32, (p, q), 0)
    j = lax.broadcasted_iota(jnp.int32, (p, q), 1)
    return take(reduced, (i * q + j) * TILE[1])


def stack_f(*xs: jax.Array, axis: int) -> jax.Array:
    dims = list(xs[0].shape)
    dims.insert(axis, len(xs))
    shape = tuple(dims)
    coords = _coords(shape)
    which = coords[axis]
    inner = [c for d, c in enumerate(coords) if d != axis]
    lin = _linear(inner, tuple(xs[0].shape))
    result = None
    for k, x in enumerate(xs):
        piece = take(x, lin)
        result = piece if result is None else jnp.where(which == k, piece, result)
    assert result is not None  # a stack has operands
    return result.reshape(shape) if len(shape) > 2 else result


# --- Pallas rules --------------------------------------------------------------------------------


def _lowered(ctx: PallasContext, fn: Callable[..., Any], *args: Operand) -> Lowered:
    return pallas_lowering._lower_fun(fn)(ctx, *args)


def _check(ctx: PallasContext, what: str, *avals: Aval) -> None:
    for aval in avals:
        dtype = np.dtype(aval.dtype)
        if dtype == np.bool_ or dtype.itemsize not in (1, 2, 4):
            raise refuse(ctx, f"{what} of dtype {dtype} is not supported",
                         fix="move 8-, 16- or 32-bit values (x.astype(jnp.int32) for booleans)")


def _plainly_loaded(value: Operand) -> bool:
    """Whether ``value`` is a ``vector_load`` from GMEM: the strided layout,
    which jax reshapes itself (a ``shape_cast`` between strided layouts)."""
    owner = getattr(value, "owner", None)
    op = getattr(owner, "operation", owner)
    if (not isinstance(value, ir.Value) or op is None
            or getattr(op, "name", "") != "mosaic_gpu.vector_load"):
        return False
    return ir.MemRefType(op.operands[0].type).memory_space is None


def lower_reshape(ctx: PallasContext, x: Operand, *, new_sizes: Sequence[int],
                  dimensions: Sequence[int] | None, sharding: Any = None,
                  **params: Any) -> Lowered:
    [aval] = ctx.avals_in
    if dimensions is not None or _plainly_loaded(x) or \
            not views_reshape(tuple(aval.shape), tuple(new_sizes)):
        return jax_rule(ctx)(ctx, x, new_sizes=new_sizes, dimensions=dimensions,
                             sharding=sharding, **params)
    _check(ctx, "a reshape into or out of a 3-D view", aval)
    return _lowered(ctx, lambda v: reshape_f(v, new_sizes=tuple(new_sizes)), x)


def lower_broadcast_in_dim(ctx: PallasContext, x: Operand, *dyn: Operand, shape: Sequence[int],
                           broadcast_dimensions: Sequence[int], sharding: Any = None,
                           **params: Any) -> Lowered:
    [aval, *_] = ctx.avals_in
    if dyn or not views_broadcast(tuple(aval.shape), tuple(shape)):
        return jax_rule(ctx)(ctx, x, *dyn, shape=shape,
                             broadcast_dimensions=broadcast_dimensions, sharding=sharding,
                             **params)
    _check(ctx, "a broadcast into a 3-D view", aval)
    if _squeeze(tuple(aval.shape)) == _squeeze(tuple(shape)):
        # unit dims added: the same elements in the same order (what a
        # reshape is); a broadcast of it sees through the cast (below)
        element = mgpu_utils.dtype_to_ir_type(aval.dtype)
        x = pallas_lowering._ensure_ir_value(x, aval.dtype)
        return vector_dialect.shape_cast(ir.VectorType.get(tuple(shape), element), x)
    value, seen = see_through(x, aval)
    fn = partial(broadcast_f, shape=tuple(shape), operand_shape=tuple(aval.shape),
                 broadcast_dimensions=tuple(broadcast_dimensions))
    return pallas_lowering._lower_fun(fn, in_avals=(seen,))(ctx, value)


def _broadcast_view(ctx: PallasContext, x: Operand, aval: Aval, shape: tuple[int, ...]
                    ) -> Lowered:
    """``x`` (of ``aval``) broadcast into the view ``shape``, dims in order."""
    value, seen = see_through(x, aval)
    fn = partial(broadcast_f, shape=tuple(shape), operand_shape=tuple(aval.shape),
                 broadcast_dimensions=tuple(range(len(shape))))
    out = jax_core.ShapedArray(tuple(shape), aval.dtype)
    [result] = pallas_lowering._lower_fun(lambda v: [fn(v)], in_avals=(seen,))(
        ctx.replace(avals_in=[seen], avals_out=[out]), value)
    return result


def lower_elementwise(ctx: PallasContext, *args: Operand, **params: Any) -> Lowered:
    """jax's rule for a binary elementwise primitive, after broadcasting
    operands into a 3-D view (``groups / s[..., None]``: Pallas broadcasts
    implicitly with ``mosaic_gpu.broadcast_in_dim``, which no layout of a
    view takes) the way :func:`lower_broadcast_in_dim` does."""
    [out] = ctx.avals_out
    shape = tuple(out.shape)
    if not views_shape(shape) or all(a.ndim == 0 or tuple(a.shape) == shape
                                     for a in ctx.avals_in):
        return jax_rule(ctx)(ctx, *args, **params)
    _check(ctx, f"{ctx.prim.name} broadcasting into a 3-D view", *ctx.avals_in)
    values, avals = [], []
    for v, a in zip(args, ctx.avals_in):
        if a.ndim and tuple(a.shape) != shape:
            v = _broadcast_view(ctx, v, a, shape)
            a = jax_core.ShapedArray(shape, a.dtype, weak_type=a.weak_type)
        values.append(v)
        avals.append(a)
    return jax_rule(ctx)(ctx.replace(avals_in=avals), *values, **params)


def _reduce_rule(kind: str) -> Callable[..., Lowered]:
    def rule(ctx: PallasContext, x: Operand, *, axes: Sequence[int], **params: Any) -> Lowered:
        [aval] = ctx.avals_in
        if not views_shape(tuple(aval.shape)):
            return jax_rule(ctx)(ctx, x, axes=axes, **params)
        _check(ctx, f"reduce_{kind} of a 3-D view", aval)
        if len(axes) != 1:
            raise refuse(ctx, f"reduce_{kind} of a 3-D view over axes {tuple(axes)}",
                         fix="reduce one axis at a time (jnp.max(jnp.max(x, 2), 1))")
        shape = tuple(aval.shape)
        rows = math.prod(shape) // shape[axes[0]]
        if rows % TILE[0] or shape[axes[0]] % TILE[1]:
            raise refuse(ctx, f"reduce_{kind} of a {shape} view along an axis of "
                         f"{shape[axes[0]]}: the view is reduced as ({rows}, "
                         f"{shape[axes[0]]}), which needs multiples of {TILE}",
                         fix="reduce along an axis of a multiple of 8 elements (the last, "
                             "in groups of 8 or more), or group the columns differently",
                         jax_cannot=True)
        return _lowered(ctx, lambda v: reduce_f(v, axis=int(axes[0]), kind=kind), x)

    rule.__name__ = rule.__qualname__ = f"lower_reduce_{kind}"
    return rule


lower_reduce_sum = _reduce_rule("sum")
lower_reduce_max = _reduce_rule("max")
lower_reduce_min = _reduce_rule("min")


def lower_stack(ctx: PallasContext, *xs: Operand, axis: int) -> Lowered:
    avals = ctx.avals_in
    if any(a.ndim not in (1, 2) for a in avals) or len(avals[0].shape) + 1 > 3:
        raise refuse(ctx, "stack of other than 1-D or 2-D operands",
                     fix="stack 1-D or 2-D blocks (jnp.concatenate for more)")
    _check(ctx, "stack", *avals)
    return _lowered(ctx, lambda *vs: stack_f(*vs, axis=int(axis)), *xs)


# --- resource estimators: nothing where jax's rule lowers ----------------------------------------


def _bytes(*avals: Aval) -> int:
    return max(int(a.size) * np.dtype(a.dtype).itemsize for a in avals)


def _scratch(ctx: EstimatorContext, nbytes: int) -> Resources:
    """``nbytes`` of ``take`` scratch, once per Pallas warpgroup."""
    return take_scratch(ctx, (nbytes,), np.uint8)


def estimate_reshape(ctx: EstimatorContext, aval: Aval, *args: Aval, new_sizes: Sequence[int],
                     **params: Any) -> Resources:
    del args, params
    if not views_reshape(tuple(aval.shape), tuple(new_sizes)):
        return pallas_lowering.Resources(smem_scratch_bytes=0)
    return _scratch(ctx, _bytes(aval))


def estimate_broadcast_in_dim(ctx: EstimatorContext, aval: Aval, *args: Aval,
                              shape: Sequence[int], **params: Any) -> Resources:
    """The operand's bytes, or the view's: a reduction of the view takes from it."""
    del args, params
    if not views_broadcast(tuple(aval.shape), tuple(shape)):
        return pallas_lowering.Resources(smem_scratch_bytes=0)
    out = jax_core.ShapedArray(tuple(shape), aval.dtype)
    return _scratch(ctx, _bytes(aval, out))


def estimate_stack(ctx: EstimatorContext, *avals: Aval, axis: int) -> Resources:
    del axis
    return _scratch(ctx, _bytes(*avals) * len(avals))
