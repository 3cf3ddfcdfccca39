"""Gathers and scatters inside Pallas Mosaic GPU kernels: ``gather``
(``jnp.take_along_axis``, ``x[idx]``, ``x[:, idx]``, ``jnp.take``) and
``scatter`` / ``scatter-add`` / ``scatter-mul`` / ``scatter-min`` /
``scatter-max`` (``x.at[idx].set/add/multiply/min/max``), on 1-D and 2-D
operands, along either axis.

How: decompositions over :func:`smalti.vocabulary.movement.take`, written
from XLA's definitions of the operations (any dimension numbers with at most
2-D operands and results):

- ``gather``: for each output element, its batch coordinates pick an index
  vector (one ``take`` from the indices per component), which with the
  element's offset coordinates addresses the operand (one ``take``). Start
  indices are clamped as XLA clamps them (``clip``, ``promise_in_bounds``);
  with ``fill`` (jnp's default for ``take_along_axis``) a window out of
  bounds gives the fill value (NaN for floats, the most negative signed
  value, the largest unsigned one, as jnp);
- ``scatter*``: a ``fori_loop`` over the index vectors, in order: each step
  reads its index vector (``take`` at one address, broadcast over the
  block), finds the operand elements inside its window and combines the
  update elements there (one ``take`` from the updates): a later update
  wins for ``set`` (XLA leaves the order of duplicates unspecified; this is
  the sequential one), ``add`` and the others combine every update, as on the
  CPU. A window out of bounds is dropped (``fill``, jnp's default for
  ``.at[]``) or clamped (``clip``).

Index arrays that jax reshapes to add the index-vector dimension
(``take_along_axis`` makes a (64, 1, 1) array of a (64, 1) one) are read
through the ``vector.shape_cast``: the values are the same in the same
order, and no register layout holds such 3-D arrays.
Results with unit dimensions (``take_along_axis``'s (64, 1)) are computed
without them and broadcast back (iotas of such shapes have no layout).
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
from jax._src.lax import slicing
from jax._src.lib.mlir import ir
from jax._src.pallas.mosaic_gpu import lowering as pallas_lowering

from smalti.vocabulary import block_gather, index_ranges, smem_transpose
from smalti.vocabulary.annotations import (
    Aval,
    DTypeLike,
    EstimatorContext,
    Lowered,
    Operand,
    PallasContext,
    Resources,
    Shape,
)
from smalti.vocabulary.movement import take
from smalti.vocabulary.primitives import refuse
from smalti.vocabulary.rows import scratch_for
from smalti.vocabulary.scans import take_scratch

Mode = slicing.GatherScatterMode
#: A coordinate along one dim: an int32 array, or 0 along a unit dim.
Coordinate = jax.Array | int


# --- geometry ------------------------------------------------------------------------------


def _squeezed(shape: tuple[int, ...]) -> tuple[int, ...]:
    kept = tuple(n for n in shape if n != 1)
    return kept or (1,)


def _column(shape: tuple[int, ...]) -> bool:
    """Whether ``shape`` is an (n, 1) column computed as (n, 8) (see :func:`_back`)."""
    return len(shape) == 2 and shape[1] == 1 and shape[0] % 64 == 0


def _positions(shape: Shape) -> tuple[Shape, list[Coordinate]]:
    """Each element's coordinate along every dim of ``shape``, computed on
    ``shape`` without its unit dims (a coordinate along a unit dim is 0), or
    for an (n, 1) column on (n, 8), every column the same."""
    if _column(shape):
        return (shape[0], 8), [lax.broadcasted_iota(jnp.int32, (shape[0], 8), 0), 0]
    inner = _squeezed(shape)
    iotas = iter(lax.broadcasted_iota(jnp.int32, inner, d) for d in range(len(inner)))
    if inner == (1,) and shape != (1,):
        return inner, [0] * len(shape)
    return inner, [next(iotas) if n != 1 else 0 for n in shape]


def _linear(coords: Sequence[Coordinate], shape: Shape, like: Shape) -> jax.Array:
    """The row-major linear index of ``coords`` (arrays or ints) in ``shape``,
    as an int32 array of ``like``'s shape."""
    index: Coordinate = 0
    stride = 1
    for c, n in zip(reversed(coords), reversed(shape)):
        if not (isinstance(c, int) and c == 0):
            index = index + c * stride if stride != 1 else index + c
        stride *= n
    if isinstance(index, int):
        return jnp.full(like, index, jnp.int32)
    return index


def _back(result: jax.Array, shape: Shape) -> jax.Array:
    """``result`` (on the squeezed shape) with ``shape``'s unit dims back. An
    (n, 1) column was computed as (n, 8) with equal columns: their maximum
    (the value itself, NaN included) has the layout of a reduction, which
    broadcasts to (n, 1) (an iota-derived (n,) vector does not)."""
    if tuple(result.shape) == tuple(shape):
        return result
    if _column(shape):
        return lax.broadcast_in_dim(lax.reduce_max(result, (1,)), shape, (0,))
    kept = [d for d, n in enumerate(shape) if n != 1]
    if not kept:
        return lax.broadcast_in_dim(result.reshape(()), shape, ())
    return lax.broadcast_in_dim(result, shape, kept)


def default_fill(dtype: DTypeLike) -> float | int | bool:
    """jnp's fill value for out-of-bounds gathers."""
    dtype = np.dtype(dtype)
    if dtype.kind == "f" or dtype == np.dtype(jnp.bfloat16):
        return np.nan
    if dtype.kind == "i":
        return int(np.iinfo(dtype).min)
    if dtype.kind == "u":
        return int(np.iinfo(dtype).max)
    return True


def _index(indices: jax.Array, coords: Sequence[Coordinate], index_shape: Shape, k: int,
           like: Shape) -> jax.Array:
    """Component ``k`` of the index vector at batch coordinates ``coords``."""
    linear = _linear([*coords, k], index_shape, like)
    return take(indices, linear).astype(jnp.int32)


# --- gather --------------------------------------------------------------------------------


def gather_f(operand: jax.Array, indices: jax.Array, *,
             dimension_numbers: slicing.GatherDimensionNumbers, slice_sizes: Shape, mode: Mode,
             fill_value: float | int | bool | None, index_shape: Shape,
             out_shape: Shape) -> jax.Array:
    """XLA's gather of a 1-D/2-D ``operand``; ``indices`` holds the index
    array of ``index_shape`` (last dim: the index vector) in row-major order."""
    dn = dimension_numbers
    shape = tuple(operand.shape)
    inner, pos = _positions(out_shape)
    batch = [pos[d] for d in range(len(out_shape)) if d not in dn.offset_dims]
    offsets = [od for od in range(len(shape))
               if od not in dn.collapsed_slice_dims and od not in dn.operand_batching_dims]
    start: list[Coordinate] = [0] * len(shape)
    valid = None
    for k, od in enumerate(dn.start_index_map):
        s = _index(indices, batch, index_shape, k, inner)
        hi = shape[od] - slice_sizes[od]
        if mode == Mode.FILL_OR_DROP:
            ok = (s >= 0) & (s <= hi)
            valid = ok if valid is None else valid & ok
        start[od] = jnp.clip(s, 0, hi)
    for od, j in zip(dn.operand_batching_dims, dn.start_indices_batching_dims):
        start[od] = start[od] + batch[j]
    coords = list(start)
    for od, d in zip(offsets, sorted(dn.offset_dims)):
        coords[od] = coords[od] + pos[d]
    result = take(operand, _linear(coords, shape, inner))
    if valid is not None:
        fill = default_fill(operand.dtype) if fill_value is None else fill_value
        result = jnp.where(valid, result, jnp.full(inner, fill, operand.dtype))
    return _back(result, out_shape)


def see_through(value: Operand, aval: Aval) -> tuple[Operand, Aval]:
    """The source of a ``vector.shape_cast`` (same elements, same order) and
    its aval, or the value itself."""
    op = index_ranges.defining_op(value)
    if isinstance(value, ir.Value) and op is not None and op.name == "vector.shape_cast":
        source = op.operands[0]
        shape = tuple(ir.VectorType(source.type).shape)
        return source, jax_core.ShapedArray(shape, aval.dtype)
    return value, aval


def _supported(ctx: PallasContext, avals: Sequence[Aval], what: str) -> None:
    for aval in avals:
        dtype = np.dtype(aval.dtype)
        if dtype == np.bool_ or dtype.itemsize not in (1, 2, 4):
            raise refuse(ctx, f"{what} of operands of dtype {dtype} is not supported",
                         fix="gather 8-, 16- or 32-bit values (x.astype(jnp.int32) for "
                             "booleans)")
        if aval.ndim not in (1, 2) or aval.size == 0:
            raise refuse(ctx, f"{what} of a {aval.ndim}-D or empty operand is not supported",
                         fix="reshape the operand to 1-D or 2-D first")


def _checked_indices(ctx: PallasContext, indices: Operand, aval: Aval, what: str
                     ) -> tuple[Operand, Aval]:
    value, seen = see_through(indices, aval)
    if seen.ndim not in (1, 2) and seen.size != 1:
        raise refuse(ctx, f"{what} with a {aval.ndim}-D index array is not supported",
                     fix="index with a 1-D or 2-D integer array")
    if np.dtype(seen.dtype).kind not in "iu" or np.dtype(seen.dtype).itemsize > 4:
        raise refuse(ctx, f"{what} with indices of dtype {seen.dtype} is not supported",
                     fix="index with int32 arrays")
    return value, seen


def _one_pick_per_line(ctx: PallasContext, operand: Operand, o_aval: Aval, indices: Operand,
                       seen: Aval, axis: int | None, gather: Callable[..., jax.Array]
                       ) -> Lowered | None:
    """One pick per row (an (n, 1) index along the columns: cross-entropy's)
    or per column (a (1, n) index along the rows) through the block gather:
    the index broadcast to a whole tile, every copy gathered, and the picks
    taken back (a reduction of equal values for (n, 1), a row for (1, n));
    None where the block gather does not apply."""
    [out] = ctx.avals_out
    shape = tuple(out.shape)
    if axis == 1 and _column(shape):
        tile = (shape[0], 8)
    elif axis == 0 and len(shape) == 2 and shape[0] == 1 and shape[1] % 8 == 0:
        tile = (64, shape[1])
    else:
        return None
    if block_gather.fits(ctx, operand, o_aval, indices, seen.update(shape=tile),
                         out=out.update(shape=tile)) is None:
        return None

    def pick(o: jax.Array, i: jax.Array) -> jax.Array:
        line = i.reshape(i.size)
        taken = gather(o, lax.broadcast_in_dim(line, tile, (1 - axis,))[..., None])
        return _back(taken, shape) if axis == 1 else lax.slice(taken, (0, 0), shape)

    return pallas_lowering._lower_fun(pick, in_avals=(o_aval, seen))(ctx, operand, indices)


def whole_lines(operand: Aval, indices: Aval, dimension_numbers: slicing.GatherDimensionNumbers,
                slice_sizes: tuple[int, ...]) -> int | None:
    """The axis along which a gather takes whole lines of a 2-D operand by a
    (k, 1) index array -- 0 for rows, ``x[idx]`` (``out[j, :] =
    x[idx[j], :]``), 1 for columns, ``x[:, idx]`` and ``jnp.take(x, idx,
    1)`` -- or None for any other gather."""
    if operand.ndim != 2 or indices.ndim != 2 or indices.shape[1] != 1:
        return None
    for axis in (0, 1):
        numbers = slicing.GatherDimensionNumbers(
            offset_dims=(1 - axis,), collapsed_slice_dims=(axis,), start_index_map=(axis,))
        sizes = tuple(1 if d == axis else operand.shape[d] for d in (0, 1))
        if dimension_numbers == numbers and tuple(slice_sizes) == sizes:
            return axis
    return None


def _whole_lines(ctx: PallasContext, operand: Operand, o_aval: Aval, indices: Operand,
                 seen: Aval, axis: int | None, mode: Any, fill_value: Any) -> Lowered | None:
    """Whole rows or columns (:func:`whole_lines`) through the block gather:
    the (k,) index broadcast across the lines' other axis into a block of
    the result's shape and gathered element by element along ``axis``. An
    index in the row layout for whole columns (:func:`_reduced_along_rows`)
    is broadcast along the columns instead and that block transposed (the
    register transpose). None where the block gather, or that transpose,
    does not apply."""
    [out] = ctx.avals_out
    if axis is None or block_gather.fits(ctx, operand, o_aval, indices,
                                         seen.update(shape=tuple(out.shape))) is None:
        return None
    rows, k = out.shape
    # columns by indices in the row layout: broadcast along the columns, then transposed
    across = axis == 1 and _reduced_along_rows(indices, seen.size)
    transposed = jax_core.ShapedArray((k, rows), seen.dtype)
    if across and not (smem_transpose.fits(transposed)
                       and scratch_for(ctx, transposed) is not None):
        return None

    def lines(o: jax.Array, i: jax.Array) -> jax.Array:
        line = i.reshape(i.size)
        if across:
            full = lax.transpose(lax.broadcast_in_dim(line, (k, rows), (0,)), (1, 0))
        else:
            full = lax.broadcast_in_dim(line, tuple(out.shape), (axis,))
        return lax.gather(o, full[..., None], block_gather.numbers(axis), (1, 1), mode=mode,
                          fill_value=fill_value)

    return pallas_lowering._lower_fun(lines, in_avals=(o_aval, seen))(ctx, operand, indices)


def _reduced_along_rows(value: Operand, size: int, budget: int = 256) -> bool:
    """Whether the ``size`` indices ``value`` holds come from a reduction
    along a block's rows (``jnp.argmax(x, 1)``: one per row, in the row
    layout), through ops on values of that many elements. No relayout turns
    that layout into the column layout a broadcast across the rows needs.
    Conservative: true once ``budget`` ops are walked."""
    def visit(op: ir.Operation) -> bool | list[ir.Value]:
        if op.name == "vector.multi_reduction":
            return list(ir.DenseI64ArrayAttr(op.attributes["reduction_dims"])) == [1]
        return [v for v in op.operands if isinstance(v.type, ir.VectorType)
                and math.prod(ir.VectorType(v.type).shape) == size]

    return isinstance(value, ir.Value) and smem_transpose.walk_back(value, visit, budget)


def lower_gather(ctx: PallasContext, operand: Operand, indices: Operand, *,
                 dimension_numbers: slicing.GatherDimensionNumbers, slice_sizes: Shape,
                 mode: Any, fill_value: float | int | bool | None, **params: Any) -> Lowered:
    del params
    o_aval, i_aval = ctx.avals_in
    [out_aval] = ctx.avals_out
    _supported(ctx, [o_aval, out_aval], "gather")
    indices, seen = _checked_indices(ctx, indices, i_aval, "gather")
    axis = block_gather.along_axis(o_aval, i_aval, dimension_numbers, tuple(slice_sizes)) \
        if Mode.from_any(mode) in block_gather.MODES else None
    picked = _one_pick_per_line(ctx, operand, o_aval, indices, seen, axis,
                                partial(lax.gather, dimension_numbers=dimension_numbers,
                                        slice_sizes=(1, 1), mode=mode, fill_value=fill_value))
    if picked is not None:
        return picked
    if Mode.from_any(mode) in block_gather.MODES:
        lines = _whole_lines(
            ctx, operand, o_aval, indices, seen,
            whole_lines(o_aval, i_aval, dimension_numbers, tuple(slice_sizes)), mode, fill_value)
        if lines is not None:
            return lines
    scratch = None if axis is None else block_gather.fits(ctx, operand, o_aval, indices, seen)
    if axis is not None and scratch is not None:
        fill = default_fill(o_aval.dtype) if fill_value is None else fill_value
        return block_gather.lower(ctx, operand, o_aval, indices, seen, axis=axis,
                                  mode=Mode.from_any(mode), fill=fill, scratch=scratch)
    fn = partial(gather_f, dimension_numbers=dimension_numbers,
                 slice_sizes=tuple(slice_sizes), mode=Mode.from_any(mode),
                 fill_value=fill_value, index_shape=tuple(i_aval.shape),
                 out_shape=tuple(out_aval.shape))
    return pallas_lowering._lower_fun(fn, in_avals=(o_aval, seen))(ctx, operand, indices)


# --- scatter -------------------------------------------------------------------------------


def _combine(kind: str) -> Callable[[jax.Array, jax.Array], jax.Array]:
    return {"set": lambda old, new: new, "add": lax.add, "mul": lax.mul,
            "min": lax.min, "max": lax.max}[kind]


def scatter_f(operand: jax.Array, indices: jax.Array, updates: jax.Array, *,
              dimension_numbers: slicing.ScatterDimensionNumbers, mode: Mode, kind: str,
              index_shape: Shape) -> jax.Array:
    """XLA's scatter into a 1-D/2-D ``operand``, one index vector after
    another (see the module docstring)."""
    dn = dimension_numbers
    shape = tuple(operand.shape)
    u_shape = tuple(updates.shape)
    count = math.prod(index_shape[:-1])
    k_size = index_shape[-1]
    windows = [od for od in range(len(shape)) if od not in dn.inserted_window_dims]
    sizes = [1] * len(shape)
    for od, ud in zip(windows, sorted(dn.update_window_dims)):
        sizes[od] = u_shape[ud]
    scatter_dims = [d for d in range(len(u_shape)) if d not in dn.update_window_dims]
    pos = [lax.broadcasted_iota(jnp.int32, shape, d) for d in range(len(shape))]
    combine = _combine(kind)

    def step(n: jax.Array, acc: jax.Array) -> jax.Array:
        nn = jnp.full(shape, n, jnp.int32)
        start: list[Coordinate] = [0] * len(shape)
        valid = None
        for k, od in enumerate(dn.scatter_dims_to_operand_dims):
            s = take(indices, nn * k_size + k).astype(jnp.int32)
            hi = shape[od] - sizes[od]
            if mode == Mode.FILL_OR_DROP:
                ok = (s >= 0) & (s <= hi)
                valid = ok if valid is None else valid & ok
            start[od] = jnp.clip(s, 0, hi)
        inside = valid
        u_coords: list[Coordinate] = [0] * len(u_shape)
        rest = nn  # n's coordinates along the updates' scatter dims, last fastest
        for d in reversed(scatter_dims):
            u_coords[d] = lax.rem(rest, jnp.int32(u_shape[d]))
            rest = lax.div(rest, jnp.int32(u_shape[d]))
        for od in range(len(shape)):
            q = pos[od] - start[od]
            ok = (q >= 0) & (q < sizes[od])
            inside = ok if inside is None else inside & ok
        for od, ud in zip(windows, sorted(dn.update_window_dims)):
            u_coords[ud] = jnp.clip(pos[od] - start[od], 0, u_shape[ud] - 1)
        new = take(updates, _linear(u_coords, u_shape, shape))
        assert inside is not None  # the operand has a dim (1-D or 2-D)
        return jnp.where(inside, combine(acc, new), acc)

    return lax.fori_loop(0, count, step, operand)


def _scatter_rule(kind: str) -> Callable[..., Lowered]:
    def rule(ctx: PallasContext, operand: Operand, indices: Operand, updates: Operand, *,
             dimension_numbers: slicing.ScatterDimensionNumbers, mode: Any,
             **params: Any) -> Lowered:
        del params
        o_aval, i_aval, u_aval = ctx.avals_in
        what = "scatter" if kind == "set" else f"scatter-{kind}"
        _supported(ctx, [o_aval, u_aval], what)
        if dimension_numbers.operand_batching_dims:
            raise refuse(ctx, f"{what} with batching dimensions is not supported",
                         fix="scatter each batch element in a lax.fori_loop")
        indices, seen = _checked_indices(ctx, indices, i_aval, what)
        fn = partial(scatter_f, dimension_numbers=dimension_numbers,
                     mode=Mode.from_any(mode), kind=kind, index_shape=tuple(i_aval.shape))
        return pallas_lowering._lower_fun(fn, in_avals=(o_aval, seen, u_aval))(
            ctx, operand, indices, updates)

    rule.__name__ = rule.__qualname__ = f"lower_scatter_{kind}"
    return rule


lower_scatter = _scatter_rule("set")
lower_scatter_add = _scatter_rule("add")
lower_scatter_mul = _scatter_rule("mul")
lower_scatter_min = _scatter_rule("min")
lower_scatter_max = _scatter_rule("max")


# --- resource estimators -------------------------------------------------------------------


def estimate(ctx: EstimatorContext, *avals: Aval, **params: Any) -> Resources:
    """The largest of the operands, once per Pallas warpgroup (``take``'s own
    estimate): each ``take`` reads one of them, one after another; a block
    gather's padded copy of its operand where it may take that path."""
    nbytes = max((int(a.size) * np.dtype(a.dtype).itemsize for a in avals), default=0)
    numbers = params.get("dimension_numbers")
    if isinstance(numbers, slicing.GatherDimensionNumbers) and len(avals) == 2:
        sizes = tuple(params.get("slice_sizes", ()))
        if block_gather.along_axis(avals[0], avals[1], numbers, sizes) is not None or \
                whole_lines(avals[0], avals[1], numbers, sizes) is not None:
            nbytes = max(nbytes, block_gather.scratch_bytes(avals[0]))
    return take_scratch(ctx, (nbytes,), np.uint8)
