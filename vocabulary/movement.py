"""Data movement inside Pallas Mosaic GPU kernels: ``take`` and the
primitives built on it.

``take(x, indices)`` is ``x.reshape(-1)[indices]``: a gather of arbitrary
elements of a register value. It is a jax primitive of smalti's own
(``take_p``, with an abstract eval and a CPU lowering through jnp), so
decompositions (transpose, flip, pad, roll, scans, sorting) are written as
ordinary jax functions with iota arithmetic for the indices, and run on the
CPU as well as in a kernel.

In a kernel (Warpgroup semantics) ``take`` goes through SMEM: it takes a
1-D scratch view of ``x.size`` elements, writes ``x`` into it with
``vector.scatter`` at each element's row-major linear index (swizzled
where rows are multiples of 128 bytes, so that a warp's access of several
rows is free of bank conflicts: "take's scratch, swizzled" below) and
reads it back with ``vector.gather`` at ``indices``, swizzled alike (rules
in :mod:`smalti.vocabulary.gather_ops`: a scalar store/load per register
element, between warpgroup barriers). In a kernel of several Pallas
warpgroups each takes through a slice of its own (the estimators reserve
one per warpgroup, from the thread axis's size), so warpgroup barriers
suffice; a slice the estimate did not reserve (a caller whose own
estimate counts one) is SM206.

Built on it (``_lower_fun`` decompositions; exact, since values only move):
``transpose`` (any permutation of a 1-D/2-D block; 2-D blocks that
WGMMA's layout tiles take the whole-vector round trip of
:mod:`smalti.vocabulary.smem_transpose` instead, which several Pallas
warpgroups may use), ``rev``, ``pad``
(low/high, negative, interior; the pad value by a select; a pad whose
pieces fall on tiles is concatenations with blocks of the pad value by
jax's rule instead), ``tile``,
``dynamic_slice`` and ``dynamic_update_slice`` (traced starts, clamped as
jax clamps them), ``slice`` with strides or unaligned bounds,
``concatenate`` of unaligned pieces (one take per distinct operand and
selects) and,
in a ``jax.jit`` (``jnp.roll``'s ``_roll_static``), slices fused into the
unaligned concatenation they feed: pieces of odd widths have no register
layout at all. ``slice`` and ``concatenate`` of pieces on the tiles of
jax's layouts go to jax's own rules (same IR, no scratch); so does every
``jit`` with nothing to fuse.
Each primitive has a resource estimator reserving its scratch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, cast

import jax
import jax.numpy as jnp
import numpy as np
from jax._src import core as jax_core
from jax._src.interpreters import mlir
from jax._src.lax import lax as lax_internal
from jax._src.lax import slicing
from jax._src.lib import mosaic_gpu_dialect as mgpu_dialect
from jax._src.lib.mlir import ir
from jax._src.lib.mlir.dialects import arith, vector
from jax._src.pallas.mosaic_gpu import lowering as pallas_lowering
from jax.experimental.mosaic.gpu import utils as mgpu_utils

from smalti.vocabulary import block_reduce, lanes, lines, smem_transpose
from smalti.vocabulary import rows as row_moves
from smalti.vocabulary.annotations import (
    Aval,
    EstimatorContext,
    Lowered,
    Operand,
    PallasContext,
    Resources,
    Shape,
)
from smalti.vocabulary.primitives import jax_rule, refuse

#: A slice fused into a concatenation: its start indices, strides and shape.
View = tuple[Shape, Shape, Shape]

__all__ = ["take", "take_p", "take_estimate"]


take_p = jax_core.Primitive("smalti_take")


def take(x: jax.Array, indices: jax.typing.ArrayLike) -> jax.Array:
    """``x.reshape(-1)[indices]``: every index must be in ``[0, x.size)``
    (unchecked in a kernel). ``x`` is 1-D or 2-D; ``indices`` is an int32
    array of at most 2 dimensions; the result has ``indices.shape`` and
    ``x.dtype``."""
    x = jnp.asarray(x)
    indices = jnp.asarray(indices)
    if x.ndim not in (1, 2):
        raise ValueError(f"take: x must be 1-D or 2-D, got shape {x.shape}")
    if indices.ndim > 2:
        raise ValueError(f"take: indices must have at most 2 dimensions, got {indices.shape}")
    if indices.dtype != jnp.int32:
        indices = indices.astype(jnp.int32)
    return take_p.bind(x, indices)


@take_p.def_abstract_eval
def _take_abstract_eval(x: Aval, indices: Aval) -> Aval:
    return jax_core.ShapedArray(indices.shape, x.dtype)


def _take_impl(x: jax.Array, indices: jax.Array) -> jax.Array:
    return jnp.take(x.reshape(-1), indices, mode="clip")


take_p.def_impl(_take_impl)
mlir.register_lowering(take_p, mlir.lower_fun(_take_impl, multiple_results=False))


def take_estimate(ctx: EstimatorContext, x_aval: Aval, indices_aval: Aval, **params: Any
                  ) -> Resources:
    """The scratch ``take`` writes ``x`` into: ``x.size`` elements per warpgroup."""
    del indices_aval, params
    return _scratch(ctx, x_aval)


# --- Pallas Warpgroup lowering -----------------------------------------------------------


def lower_take(ctx: PallasContext, x: Operand, indices: Operand) -> ir.Value:
    """Scatter ``x`` into a 1-D scratch view at its row-major linear indices,
    gather the requested ones back."""
    x_aval, idx_aval = ctx.avals_in
    dtype = np.dtype(x_aval.dtype)
    module_ctx = ctx.module_ctx
    count = smem_transpose.warpgroups(module_ctx.axis_names, module_ctx.mesh_info)
    needed = count * int(x_aval.size) * dtype.itemsize
    # Warpgroup w's slice starts w strides on, the same stride for every take
    # of the kernel: a warpgroup may be at another take than its neighbour.
    stride = smem_transpose.slice_stride(module_ctx, count) // dtype.itemsize
    if count > 1 and stride < int(x_aval.size):
        raise refuse(ctx, f"its {count} Pallas warpgroups need {needed} bytes of scratch SMEM "
                          "(a slice each), more than the kernel reserved for it",
                      fix="call it in a kernel of one warpgroup (no num_threads / thread_name), "
                          "or move the data through an SMEM ref of your own")
    if dtype == np.bool_ or dtype.itemsize not in (1, 2, 4):
        raise refuse(ctx, f"operands of dtype {dtype} are not supported",
                      fix="move 8-, 16- or 32-bit values (x.astype(jnp.int32) for booleans)")
    if x_aval.ndim not in (1, 2):
        raise refuse(ctx, f"a {x_aval.ndim}-D operand is not supported",
                      fix="reshape it to 1-D or 2-D first")
    if idx_aval.ndim == 0:
        raise refuse(ctx, "0-d indices are not supported",
                      fix="take indices of shape (1,) and reshape the result")
    n = int(x_aval.size)
    element = mgpu_utils.dtype_to_ir_type(dtype)
    i32 = ir.IntegerType.get_signless(32)
    i1 = ir.IntegerType.get_signless(1)
    x = pallas_lowering._ensure_ir_value(x, dtype)
    indices = pallas_lowering._ensure_ir_value(indices, np.dtype(np.int32))
    shape = tuple(x_aval.shape)

    def vec(shape: Shape, ty: ir.Type) -> ir.VectorType:
        return ir.VectorType.get(shape, ty)

    def splat(shape: Shape, ty: ir.Type, value: int | float) -> ir.Value:
        return arith.constant(vec(shape, ty), ir.DenseElementsAttr.get_splat(
            vec(shape, ty), ir.IntegerAttr.get(ty, value) if isinstance(ty, ir.IntegerType)
            else ir.FloatAttr.get(ty, value)))

    # the row-major linear index of each element of x
    linear = mgpu_dialect.broadcasted_iota(vec(shape, i32), len(shape) - 1)
    out_shape = tuple(idx_aval.shape)
    if len(shape) == 2:
        rows = mgpu_dialect.broadcasted_iota(vec(shape, i32), 0)
        linear = arith.addi(arith.muli(rows, splat(shape, i32, shape[1])), linear)
        if _swizzles(shape, dtype):  # both sides address the scratch swizzled
            linear = _swizzled(linear, rows, shape, dtype, splat)
            row_of = _row_of(indices, out_shape, shape[1], splat)
            indices = _swizzled(indices, row_of, out_shape, dtype, splat)
    index = ir.IndexType.get()
    mine = arith.constant(index, 0)  # where this warpgroup's slice starts
    if count > 1:
        mine = arith.muli(arith.index_cast(index, mgpu_utils.warpgroup_idx(sync=True)),
                          arith.constant(index, stride))
    span = n if count == 1 else (count - 1) * stride + n
    with module_ctx.scratch_view(jax.ShapeDtypeStruct((span,), dtype)) as ref:
        vector.scatter(None, ref, [mine], linear, splat(shape, i1, 1), x)
        pass_thru = splat(out_shape, element, 0)
        return vector.gather(vec(out_shape, element), ref, [mine], indices,
                             splat(out_shape, i1, 1), pass_thru)


# --- take's scratch, swizzled ------------------------------------------------------------------
#
# A register layout puts a warp's lanes on a few consecutive elements of
# several rows (WGMMA's: 8 rows, 4 lanes of 2 columns each), so a scalar
# access of rows whose length is a multiple of the 32 banks hits each bank
# 8 times. Where a row is a multiple of 128 bytes, take addresses its
# scratch with each row's 4-byte words XORed with g(row % 8), which spreads
# those 8 rows over the banks the 4 lanes leave free (bits 0, 3 and 4 of
# the word for 32-bit types, whose lanes are 2 words apart; bits 2 to 4 for
# narrower ones, whose lanes are 1 word apart). The XOR stays within the
# row's aligned groups of 32 words, so a row-contiguous access keeps its
# banks. Scatter and gather address the same way: the values are unchanged.


def _swizzles(shape: Shape, dtype: np.dtype) -> bool:
    return len(shape) == 2 and shape[1] * dtype.itemsize % 128 == 0


def _row_of(indices: ir.Value, shape: Shape, cols: int, splat: Callable[..., ir.Value]
            ) -> ir.Value:
    """The row of each linear index (a shift where ``cols`` is a power of 2)."""
    i32 = ir.IntegerType.get_signless(32)
    if cols & (cols - 1) == 0:
        return arith.shrui(indices, splat(shape, i32, cols.bit_length() - 1))
    return arith.divui(indices, splat(shape, i32, cols))


def _swizzled(linear: ir.Value, rows: ir.Value, shape: Shape, dtype: np.dtype,
              splat: Callable[..., ir.Value]) -> ir.Value:
    """``linear`` with its word within the row XORed with g(``rows`` % 8)."""
    i32 = ir.IntegerType.get_signless(32)

    def c(value: int) -> ir.Value:
        return splat(shape, i32, value)

    per_word = 4 // dtype.itemsize  # elements per 4-byte bank word
    if dtype.itemsize == 4:  # g(r) = r0 | r1 << 3 | r2 << 4: bits 0, 3, 4 of r ^ r << 2
        g = arith.andi(arith.xori(rows, arith.shli(rows, c(2))), c(25))
    else:  # g(r) = r << 2, in elements: r << 2 << log2(per_word)
        g = arith.andi(arith.shli(rows, c(2 + per_word.bit_length() - 1)), c(28 * per_word))
    return arith.xori(linear, g)


# --- decompositions on take ----------------------------------------------------------------
#
# Each output element's source is computed with iota arithmetic (int32) as a
# linear index into the operand; elements with no source (padding) take the
# pad value by a select. All exact: values are only moved.


def _iotas(shape: tuple[int, ...]) -> list[jax.Array]:
    return [jax.lax.broadcasted_iota(jnp.int32, shape, d) for d in range(len(shape))]


def _linear(positions: list[jax.Array], shape: tuple[int, ...]) -> jax.Array:
    """The row-major linear index of ``positions`` (one array per dim) in ``shape``."""
    index = positions[-1]
    stride = 1
    for d in range(len(shape) - 2, -1, -1):
        stride *= shape[d + 1]
        index = index + positions[d] * stride
    return index


def _clamp(i: jax.Array, n: int) -> jax.Array:
    """``i`` clamped into ``[0, n)``."""
    return jax.lax.min(jax.lax.max(i, jnp.zeros_like(i)), jnp.full_like(i, n - 1))


def transpose_f(x: jax.Array, permutation: tuple[int, ...]) -> jax.Array:
    out_shape = tuple(x.shape[p] for p in permutation)
    out = _iotas(out_shape)
    source_of = {p: out[d] for d, p in enumerate(permutation)}  # by source dim
    return take(x, _linear([source_of[p] for p in range(x.ndim)], x.shape))


def rev_f(x: jax.Array, dimensions: tuple[int, ...]) -> jax.Array:
    if x.ndim == 2:  # the minor axis in registers, rows a vector per register through SMEM
        if 1 in dimensions:
            x = lanes.permute(x, lanes.flipped(x.shape[1]))
        if 0 in dimensions:
            x = row_moves.permute(x, lanes.flipped(x.shape[0]))
        return x
    source = [(n - 1) - i if d in dimensions else i
              for d, (i, n) in enumerate(zip(_iotas(x.shape), x.shape))]
    return take(x, _linear(source, x.shape))


def pad_f(x: jax.Array, value: jax.Array,
          padding_config: Sequence[tuple[int, int, int]]) -> jax.Array:
    """Output position p of a dim padded (lo, hi, interior) holds x[q / (interior + 1)]
    where q = p - lo is a non-negative multiple of interior + 1 below
    n * (interior + 1); the pad value elsewhere."""
    out_shape = tuple(int(lo) + n + max(n - 1, 0) * int(interior) + int(hi)
                      for n, (lo, hi, interior) in zip(x.shape, padding_config))
    source: list[jax.Array] = []
    valid: jax.Array | None = None
    for i, n, (lo, _, interior) in zip(_iotas(out_shape), x.shape, padding_config):
        step = int(interior) + 1
        q = i - int(lo)
        s = jax.lax.div(q, jnp.int32(step)) if step > 1 else q
        ok = (q >= 0) & (s < n)
        if step > 1:
            ok = ok & (jax.lax.rem(q, jnp.int32(step)) == 0)
        source.append(_clamp(s, n))
        valid = ok if valid is None else valid & ok
    taken = take(x, _linear(source, x.shape))
    fill = jax.lax.broadcast_in_dim(value.astype(x.dtype), out_shape, ())
    assert valid is not None  # x has a dim (1-D or 2-D)
    return jax.lax.select(valid, taken, fill)


def _minor_gather(xs: Sequence[jax.Array], views: Sequence[View | None], dimension: int
                  ) -> tuple[int, ...] | None:
    """The static columns of ``xs[0]`` that the concatenation reads, where
    every operand is a unit-stride slice of whole rows of that one 2-D array
    along its minor axis and the result has its shape (``jnp.roll``);
    ``None`` otherwise."""
    x = xs[0]
    if x.ndim != 2 or dimension != 1 or any(v is None or y is not x for y, v in zip(xs, views)):
        return None
    columns: list[int] = []
    for view in views:
        assert view is not None
        (row, col), (row_step, col_step), (rows, cols) = view
        if row or row_step != 1 or col_step != 1 or rows != x.shape[0]:
            return None
        columns.extend(range(col, col + cols))
    return tuple(columns) if len(columns) == x.shape[1] else None


def concatenate_f(*xs: jax.Array, dimension: int, views: Sequence[View | None] | None = None
                  ) -> jax.Array:
    """One take per distinct operand (operands that are views of one array,
    as ``jnp.roll``'s two slices, share it: their indices are chosen by the
    position first), of the positions it covers (clamped elsewhere), chosen
    by the position along ``dimension``. ``views[k]``, if given, is
    ``(start_indices, strides, shape)``: operand k is that strided slice of
    ``xs[k]`` (a slice fused into the concatenation)."""
    views = views or (None,) * len(xs)
    columns = _minor_gather(xs, views, dimension)
    if columns is not None:  # jnp.roll along the minor axis: in registers
        return lanes.permute(xs[0], columns)
    shapes = [x.shape if v is None else v[2] for x, v in zip(xs, views)]
    dims = list(shapes[0])
    dims[dimension] = sum(shape[dimension] for shape in shapes)
    out_shape = tuple(dims)
    positions = _iotas(out_shape)
    along = positions[dimension]
    sources: dict[int, tuple[jax.Array, jax.Array]] = {}  # id -> (array, its indices)
    starts: list[tuple[int, int]] = []  # (start, id of the array) per operand
    start = 0
    for x, view, shape in zip(xs, views, shapes):
        n = shape[dimension]
        local = list(positions)
        local[dimension] = _clamp(along - start, n)
        if view is not None:
            lows, strides, _ = view
            local = [int(lo) + i * int(st) for i, lo, st in zip(local, lows, strides)]
        index = _linear(local, x.shape)
        if id(x) in sources:  # a later view of the same array: its positions
            index = jax.lax.select(along >= start, index, sources[id(x)][1])
        sources[id(x)] = (x, index)
        starts.append((start, id(x)))
        start += n
    pieces = {key: take(x, index) for key, (x, index) in sources.items()}
    result = None
    for first, key in starts:
        piece = pieces[key]
        if result is None or result is piece:  # nothing to choose between
            result = piece
            continue
        result = jax.lax.select(along >= first, piece, result)
    assert result is not None  # a concatenation has operands
    return result


def slice_f(x: jax.Array, start_indices: Shape, limit_indices: Shape,
            strides: Shape | None) -> jax.Array:
    strides = strides or (1,) * x.ndim
    out_shape = tuple(max(0, -(-(hi - lo) // s))
                      for lo, hi, s in zip(start_indices, limit_indices, strides))
    if x.ndim == 2 and out_shape == (x.shape[0], 1):  # a line, as a reduction gives it
        return lines.column(x, start_indices[1])
    if x.ndim == 2 and out_shape == (1, x.shape[1]):
        return lines.row(x, start_indices[0])
    if x.ndim == 2 and out_shape[0] == x.shape[0] and out_shape[1]:  # columns only: in registers
        return lanes.permute(x, range(start_indices[1], limit_indices[1], strides[1]))
    source = [i * int(s) + int(lo) if s != 1 else i + int(lo)  # no multiply by 1
              for i, lo, s in zip(_iotas(out_shape), start_indices, strides)]
    return take(x, _linear(source, x.shape))


def tile_f(x: jax.Array, reps: tuple[int, ...]) -> jax.Array:
    out_shape = tuple(n * r for n, r in zip(x.shape, reps))
    if x.ndim == 2 and reps[0] == 1:  # along the columns: in registers
        return lanes.permute(x, [c % x.shape[1] for c in range(out_shape[1])])
    source = [jax.lax.rem(i, jnp.int32(n)) if r != 1 else i
              for i, n, r in zip(_iotas(out_shape), x.shape, reps)]
    return take(x, _linear(source, x.shape))


def _start(start: jax.Array, n: int, size: int) -> jax.Array:
    """A dynamic start index as jax clamps it: into ``[0, n - size]``; broadcast later."""
    start = start.astype(jnp.int32)
    return jax.lax.max(jax.lax.min(start, jnp.int32(n - size)), jnp.int32(0))


def _spread(scalar: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    return jax.lax.broadcast_in_dim(scalar, shape, ())


def dynamic_slice_f(x: jax.Array, *starts: jax.Array, slice_sizes: Shape) -> jax.Array:
    out_shape = tuple(slice_sizes)
    source = [i + _spread(_start(s, n, size), out_shape)
              for i, s, n, size in zip(_iotas(out_shape), starts, x.shape, slice_sizes)]
    return take(x, _linear(source, x.shape))


def dynamic_update_slice_f(x: jax.Array, update: jax.Array, *starts: jax.Array) -> jax.Array:
    """x, with ``update`` over the window at the (clamped) starts: a take of
    update's elements, selected inside the window."""
    local: list[jax.Array] = []
    inside: jax.Array | None = None
    for i, s, n, size in zip(_iotas(x.shape), starts, x.shape, update.shape):
        q = i - _spread(_start(s, n, size), x.shape)
        ok = (q >= 0) & (q < size)
        local.append(_clamp(q, size))
        inside = ok if inside is None else inside & ok
    assert inside is not None  # x has a dim (1-D or 2-D)
    return jax.lax.select(inside, take(update, _linear(local, update.shape)), x)


# --- Pallas rules: jax's own where it has one -----------------------------------------------


def _rank_ok(ctx: PallasContext, *, what: str) -> None:
    for aval in (*ctx.avals_in[:1], *ctx.avals_out):
        if aval.ndim not in (1, 2):
            raise refuse(ctx, f"{what} of {aval.ndim}-D arrays is not supported",
                          fix="reshape to 1-D or 2-D blocks first")
        if aval.size == 0:
            raise refuse(ctx, f"{what} to or from an empty array is not supported",
                          fix="drop the empty operand")


def _lowered(fn: Callable[..., jax.Array]) -> Callable[..., Lowered]:

    return pallas_lowering._lower_fun(fn)


def lower_transpose(ctx: PallasContext, x: Operand, *, permutation: Sequence[int]) -> Lowered:
    _rank_ok(ctx, what="transpose")
    if tuple(permutation) == tuple(range(len(permutation))):
        return x
    if smem_transpose.fits(ctx.avals_in[0], x) and smem_transpose.fits_slices(
            ctx, ctx.avals_in[0]):
        return smem_transpose.lower(ctx, x)
    return _lowered(transpose_f)(ctx, x, permutation=tuple(permutation))


def lower_rev(ctx: PallasContext, x: Operand, *, dimensions: Sequence[int]) -> Lowered:
    _rank_ok(ctx, what="rev")
    if not dimensions:
        return x
    with lanes.for_operands(x):
        return _lowered(rev_f)(ctx, x, dimensions=tuple(dimensions))


def _pad_pieces(shape: Shape, config: Sequence[tuple[int, int, int]]
                ) -> list[tuple[int, list[Shape]]] | None:
    """A pad as concatenations of the operand with blocks of the pad value,
    one dim after another: ``[(dim, shapes of its pieces)]``; ``None``
    unless every padding is non-negative, without interior, and every
    piece falls on tiles of jax's layouts (:func:`_concatenate_aligned`)."""
    if any(lo < 0 or hi < 0 or interior for lo, hi, interior in config):
        return None
    steps = []
    current = list(shape)
    for d, (lo, hi, _) in enumerate(config):
        if not lo and not hi:
            continue
        pieces = [tuple(current[:d] + [n] + current[d + 1:]) for n in (lo, current[d], hi) if n]
        avals = [jax_core.ShapedArray(p, np.float32) for p in pieces]
        if not _concatenate_aligned(avals, d):
            return None
        steps.append((d, pieces))
        current[d] += lo + hi
    return steps


def pad_aligned_f(x: jax.Array, value: jax.Array,
                  padding_config: Sequence[tuple[int, int, int]]) -> jax.Array:
    """The pad of :func:`_pad_pieces`: blocks of the pad value (splat
    registers) concatenated to ``x`` by jax's rule, no SMEM."""
    fill = value.astype(x.dtype)
    for d, (lo, hi, _) in enumerate(padding_config):
        if not lo and not hi:
            continue
        shape = list(x.shape)
        low, high = [[jax.lax.broadcast_in_dim(fill, tuple(shape[:d] + [n] + shape[d + 1:]), ())]
                     if n else [] for n in (lo, hi)]
        x = jax.lax.concatenate([*low, x, *high], d)
    return x


def lower_pad(ctx: PallasContext, x: Operand, value: Operand, *,
              padding_config: Sequence[tuple[int, int, int]]) -> Lowered:
    """Concatenations with blocks of the pad value where every piece falls
    on tiles (no SMEM) and ``x`` is not loaded from global memory (whose
    strided layout jax's concatenation cannot take); a take otherwise."""
    _rank_ok(ctx, what="pad")
    config = tuple((int(lo), int(hi), int(interior)) for lo, hi, interior in padding_config)
    if _pad_pieces(tuple(ctx.avals_in[0].shape), config) is not None and \
            isinstance(x, ir.Value) and not smem_transpose.from_global_memory(x):
        return _lowered(pad_aligned_f)(ctx, x, value, padding_config=config)
    return _lowered(pad_f)(ctx, x, value, padding_config=config)


def lower_tile(ctx: PallasContext, x: Operand, *, reps: Sequence[int]) -> Lowered:
    _rank_ok(ctx, what="tile")
    if all(r == 1 for r in reps):
        return x
    with lanes.for_operands(x):
        return _lowered(tile_f)(ctx, x, reps=tuple(reps))


def lower_dynamic_slice(ctx: PallasContext, x: Operand, *starts: Operand,
                        slice_sizes: Sequence[int]) -> Lowered:
    _rank_ok(ctx, what="dynamic_slice")
    return _lowered(dynamic_slice_f)(ctx, x, *starts, slice_sizes=tuple(slice_sizes))


def lower_dynamic_update_slice(ctx: PallasContext, x: Operand, update: Operand,
                               *starts: Operand) -> Lowered:
    _rank_ok(ctx, what="dynamic_update_slice")
    if ctx.avals_in[1].size == 0:
        return x
    return _lowered(dynamic_update_slice_f)(ctx, x, update, *starts)


# The smallest first-level tiles of jax's 2-D register layouts (WGMMA_LAYOUT;
# TMEM_NATIVE_LAYOUT) and 1-D ones (TMA_INDICES_4_LAYOUT): a piece whose
# offsets and sizes are multiples of one of them may be sliced or
# concatenated by jax's own rule, so it is left to that rule (kernels jax
# lowers keep their IR); any other piece jax cannot lower, and a take moves it.
_TILES_2D = ((64, 8), (128, 2))
_TILE_1D = 4


def _jax_may_tile(shape: tuple[int, ...], offsets: tuple[int, ...],
                  sizes: tuple[int, ...]) -> bool:
    values = list(zip(offsets, sizes))
    if len(shape) == 1:
        return all(o % _TILE_1D == 0 and s % _TILE_1D == 0 for o, s in values)
    lead, (rows, cols) = values[:-2], values[-2:]
    if any(s != n or o for (o, s), n in zip(lead, shape)):
        return False
    return any(all(v % t == 0 for v in rows) and all(v % u == 0 for v in cols)
               for t, u in _TILES_2D)


def _holdable(shape: tuple[int, ...]) -> bool:
    """Whether some register layout may hold a vector of ``shape``: a
    strided one (a multiple of 128 elements), a tiled one (see the tiles
    above) or, for a 2-D shape with a unit dim, a reduced one (which a
    broadcast asks for). Conservative: false only where none can."""
    if math.prod(shape) % 128 == 0:
        return True
    if len(shape) == 1:
        return shape[0] % _TILE_1D == 0
    if len(shape) != 2 or 1 in shape:
        return True
    rows, cols = shape
    return any(rows % t == 0 and cols % u == 0 for t, u in _TILES_2D)


def lower_slice(ctx: PallasContext, x: Operand, *, start_indices: Sequence[int],
                limit_indices: Sequence[int], strides: Sequence[int] | None) -> Lowered:
    """jax's rule for unit strides where a tiled layout may hold the slice;
    a take otherwise (strided or unaligned slices, which jax refuses)."""
    [aval] = ctx.avals_in
    unit = strides is None or all(s == 1 for s in strides)
    sizes = tuple(hi - lo for lo, hi in zip(start_indices, limit_indices))
    if unit and _jax_may_tile(tuple(aval.shape), tuple(start_indices), sizes):
        # strides=None: jax's rule refuses any strides, even all ones
        return jax_rule(ctx)(ctx, x, limit_indices=limit_indices,
                             start_indices=start_indices, strides=None)
    _rank_ok(ctx, what="slice")
    shape = tuple(ctx.avals_out[0].shape)
    if shape == (1, 1) and aval.shape != (1, 1):  # one element (x[r, c])
        row, column = start_indices
        return _lower_element(ctx, x, (int(row), int(column)))
    if not _holdable(shape):
        raise refuse(
            ctx, f"a slice of shape {shape}: no register layout holds an array of that shape",
            fix=["concatenate the slices inside a jax.jit function (as jnp.roll does): "
                 "slices feeding a concatenation there are fused into it",
                 "or slice whole multiples of 8 columns (64 rows), or take() the elements "
                 "you need from the whole block"], jax_cannot=True)
    with lanes.for_operands(x):
        return _lowered(slice_f)(ctx, x, start_indices=tuple(start_indices),
                                 limit_indices=tuple(limit_indices),
                                 strides=None if strides is None else tuple(strides))


def element_f(x: jax.Array, index: tuple[int, int]) -> jax.Array:
    """``x[r:r+1, c:c+1]`` of a 2-D block as a (1, 1) broadcast of one
    value the same in every thread (what ``x[r, c]`` squeezes to a scalar):
    the block's maximum where every other element is the dtype's least
    (an exact pick: ``-0.0`` and NaN included, float maxima propagate NaN),
    on the warpgroup's own scratch where
    :mod:`smalti.vocabulary.block_reduce` takes the type."""
    from smalti.vocabulary.scans import identity  # scans imports this module

    dtype = np.dtype(x.dtype)
    lowest = False if dtype == np.dtype(bool) else identity("cummax", dtype)
    rows, columns = _iotas(tuple(x.shape))
    hit = (rows == index[0]) & (columns == index[1])
    value = block_reduce.reduce(jnp.where(hit, x, np.asarray(lowest, dtype)), "max")
    return jax.lax.broadcast_in_dim(value, (1, 1), ())


def _lower_element(ctx: PallasContext, x: Operand, index: tuple[int, int]) -> Lowered:
    [aval] = ctx.avals_in
    several = smem_transpose.warpgroups(ctx.module_ctx.axis_names,
                                        ctx.module_ctx.mesh_info) != 1
    own = block_reduce.takes("max", aval.dtype)
    if several and not (own and lanes.fits(aval, x)):
        raise refuse(ctx, f"one element of a {np.dtype(aval.dtype).name} block "
                          f"{'not in registers ' if own else ''}"
                          "in a kernel of several Pallas warpgroups is not supported: "
                          "Pallas' reduction to a scalar shares one scratch among the "
                          "warpgroups", fix="read the element from its ref (x_ref[r, c]) "
                          "instead of from the loaded block", jax_cannot=True)
    return _lowered(element_f)(ctx, x, index=index)


def _concatenate_aligned(avals: Sequence[Aval], dimension: int) -> bool:
    """Whether every operand may fall on tiles of the result."""
    shape = list(avals[0].shape)
    shape[dimension] = sum(a.shape[dimension] for a in avals)
    start = 0
    for aval in avals:
        offsets = [0] * aval.ndim
        offsets[dimension] = start
        if not _jax_may_tile(tuple(shape), tuple(offsets), tuple(aval.shape)):
            return False
        start += aval.shape[dimension]
    return True


def lower_concatenate(ctx: PallasContext, *xs: Operand, dimension: int) -> Lowered:
    """jax's rule where every piece may fall on tiles; takes otherwise."""
    avals = ctx.avals_in
    aligned = _concatenate_aligned(avals, dimension)
    if aligned:
        return jax_rule(ctx)(ctx, *xs, dimension=dimension)
    for aval in avals:
        if aval.ndim not in (1, 2) or aval.size == 0:
            raise refuse(ctx, "concatenate of empty or more than 2-D operands is not "
                          "supported", fix="reshape to 1-D or 2-D blocks and drop empty ones")
    return _lowered(concatenate_f)(ctx, *xs, dimension=dimension)


# --- resource estimators: the scratch the takes above need ----------------------------------


def _scratch(ctx: EstimatorContext, *avals: Aval) -> Resources:
    """The largest operand's bytes, once per Pallas warpgroup (each takes
    through a slice of its own): the takes run one after another, each
    releasing its scratch. Nothing where an operand is not 1-D or 2-D: the
    plugin hands those to jax's rule (its estimate must then not change the
    kernel jax lowers)."""
    if any(a.ndim not in (1, 2) for a in avals):
        return pallas_lowering.Resources(smem_scratch_bytes=0)
    size = max((int(a.size) * np.dtype(a.dtype).itemsize for a in avals), default=0)
    count = smem_transpose.warpgroups(getattr(ctx, "axis_names", None))  # no ctx: one
    return pallas_lowering.Resources(smem_scratch_bytes=count * size)


def estimate_one(ctx: EstimatorContext, x_aval: Aval, *avals: Aval, **params: Any) -> Resources:
    """rev, pad, tile, dynamic_slice: one take of the first operand (an
    aligned pad takes none, but whether its operand comes from global
    memory, and so takes, is only known when it is lowered)."""
    del avals, params
    return _scratch(ctx, x_aval)


def estimate_transpose(ctx: EstimatorContext, x_aval: Aval, **params: Any) -> Resources:
    """The fast path's scratch (one block per warpgroup) where it applies, take's otherwise."""
    if smem_transpose.fits(x_aval):
        return smem_transpose.estimate(ctx, x_aval)
    return estimate_one(ctx, x_aval, **params)


def estimate_update(ctx: EstimatorContext, x_aval: Aval, update_aval: Aval, *avals: Aval,
                    **params: Any) -> Resources:
    """dynamic_update_slice: one take of the update."""
    del x_aval, avals, params
    return _scratch(ctx, update_aval)


def estimate_slice(ctx: EstimatorContext, x_aval: Aval, *, start_indices: Sequence[int],
                   limit_indices: Sequence[int], strides: Sequence[int] | None) -> Resources:
    """Nothing where jax's rule slices (see :func:`lower_slice`)."""
    unit = strides is None or all(s == 1 for s in strides)
    sizes = tuple(hi - lo for lo, hi in zip(start_indices, limit_indices))
    if unit and _jax_may_tile(tuple(x_aval.shape), tuple(start_indices), sizes):
        return _scratch(ctx)
    return _scratch(ctx, x_aval)


def estimate_concatenate(ctx: EstimatorContext, *avals: Aval, dimension: int) -> Resources:
    """Nothing where jax's rule concatenates (see :func:`lower_concatenate`)."""
    if _concatenate_aligned(avals, dimension):
        return _scratch(ctx)
    return _scratch(ctx, *avals)


# --- slices fused into a concatenation (jnp.roll) --------------------------------------------


def _fusable(jaxpr: jax_core.Jaxpr) -> dict[int, dict[int, jax_core.JaxprEqn]]:
    """The unaligned concatenations of ``jaxpr`` (jax's rule cannot lower
    them) and, for each, the slices among its operands that only it uses:
    ``{concatenate eqn index: {operand position: slice eqn}}``. A slice of an
    odd width (``jnp.roll``'s pieces) has no register layout, so it can only
    be lowered fused with its consumer."""
    uses: dict = {}
    for eqn in jaxpr.eqns:
        for v in eqn.invars:
            if isinstance(v, jax_core.Var):
                uses[v] = uses.get(v, 0) + 1
    for v in jaxpr.outvars:
        if isinstance(v, jax_core.Var):
            uses[v] = uses.get(v, 0) + 1
    producers = {eqn.outvars[0]: eqn for eqn in jaxpr.eqns if eqn.primitive is slicing.slice_p}
    found = {}
    for k, eqn in enumerate(jaxpr.eqns):
        if eqn.primitive is not lax_internal.concatenate_p:
            continue
        avals = [cast(Aval, v.aval) for v in eqn.invars]
        if _concatenate_aligned(avals, eqn.params["dimension"]) or \
                any(a.ndim not in (1, 2) for a in avals):
            continue
        sliced = {i: producers[v] for i, v in enumerate(eqn.invars)
                  if isinstance(v, jax_core.Var) and v in producers and uses[v] == 1
                  and cast(Aval, producers[v].invars[0].aval).ndim in (1, 2)}
        if sliced:
            found[k] = sliced
    return found


def _fused_body(jaxpr: jax_core.Jaxpr, found: dict[int, dict[int, jax_core.JaxprEqn]]
                ) -> Callable[..., list[Any]]:
    """``jaxpr`` evaluated with each found concatenation taking from the
    slices' sources directly (the slices themselves skipped)."""
    skipped = {id(e) for sliced in found.values() for e in sliced.values()}

    def body(*args: Any) -> list[Any]:
        env = dict(zip(jaxpr.invars, args))

        def read(v: jax_core.Atom) -> Any:
            return v.val if isinstance(v, jax_core.Literal) else env[v]

        for k, eqn in enumerate(jaxpr.eqns):
            if id(eqn) in skipped:
                continue
            if k in found:
                xs: list[Any] = []
                views: list[View | None] = []
                for i, v in enumerate(eqn.invars):
                    producer = found[k].get(i)
                    if producer is None:
                        xs.append(read(v))
                        views.append(None)
                        continue
                    params = producer.params
                    aval = cast(Aval, v.aval)
                    xs.append(read(producer.invars[0]))
                    views.append((tuple(params["start_indices"]),
                                  tuple(params["strides"] or (1,) * aval.ndim),
                                  tuple(aval.shape)))
                outs = [concatenate_f(*xs, dimension=eqn.params["dimension"],
                                      views=tuple(views))]
            else:
                subfuns, params = eqn.primitive.get_bind_params(eqn.params)
                outs = eqn.primitive.bind(*subfuns, *map(read, eqn.invars), **params)
                if not eqn.primitive.multiple_results:
                    outs = [outs]
            env.update(zip(eqn.outvars, outs))
        return [read(v) for v in jaxpr.outvars]

    return body


def lower_jit(ctx: PallasContext, *args: Operand, jaxpr: Any, **params: Any) -> Lowered:
    """jax's rule, except that slices feeding an unaligned concatenation
    (which jax cannot lower: ``jnp.roll`` by an unaligned shift) are fused
    into it."""
    inner = jaxpr.jaxpr if hasattr(jaxpr, "jaxpr") else jaxpr
    found = _fusable(inner) if not getattr(jaxpr, "consts", ()) else {}
    if not found:
        return jax_rule(ctx)(ctx, *args, jaxpr=jaxpr, **params)
    with lanes.for_operands(*args):
        return pallas_lowering._lower_fun(_fused_body(inner, found))(ctx, *args)
