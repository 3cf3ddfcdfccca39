"""``jnp.take_along_axis`` of a block in WGMMA's layout, along either axis:
``out[r, c] = x[r, idx[r, c]]`` (axis 1) or ``x[idx[r, c], c]`` (axis 0),
through SMEM with a vector store per register and a scalar load per element
instead of :func:`smalti.vocabulary.movement.take`'s scalar round trip with
its per-element index arithmetic.

Which gathers: XLA's ``gather`` as ``take_along_axis`` writes it, one
batching dimension (the axis not gathered along), the other collapsed and
indexed, slices of one element (:func:`along_axis`), of a 2-D operand, index
array and result that WGMMA's layout holds (16- or 32-bit elements, int32
indices, rows a multiple of 64 and columns of 8; none from a plain load of
global memory) with the warpgroup's scratch slice free; and (through
:mod:`smalti.vocabulary.indexing`) one pick per row or column, an (n, 1) or
(1, n) index broadcast to a whole tile, and whole rows or columns
(``x[idx]``, ``x[:, idx]``, ``jnp.take(x, idx, 1)``), the (k,) index
broadcast across the lines. Every other gather is
:mod:`smalti.vocabulary.indexing`'s.

How: each thread stores every register of ``x`` (two columns of one row)
into a scratch of the block's shape whose rows are padded (:func:`padded`:
by 8 elements where the row's words are an even multiple of a phase's
share of the banks, so the rows one store phase writes -- 4 for 32-bit
types, 8 for 16-bit -- start in distinct banks and the stores are
conflict-free), the warpgroup synchronizes, and each thread loads each
element of its result from the row and column the index names: along the
columns, its own row and the index's column; along the rows, the index's
row and its own column. Padding rather than :mod:`smalti.vocabulary.rows`'
swizzle: a swizzled column is an ``xor`` per load (and an ``and`` and a
shift too along the rows), where a padded one is the index itself. The
loads' banks depend on the data. Out-of-bounds indices are clamped as XLA
clamps them (``clip``, ``promise_in_bounds``), or (``fill``, jnp's default)
clamped for the load and replaced by the fill value with a select: a load never leaves the
scratch. Barriers before the stores, between stores and loads, and after
the loads, as for row moves; a scratch slice per Pallas warpgroup.
"""

from __future__ import annotations

import enum
from typing import Any

import numpy as np
from jax._src.lax import slicing
from jax._src.lib import mosaic_gpu_dialect as mgpu_dialect
from jax._src.lib.mlir import ir
from jax._src.lib.mlir.dialects import arith, memref, vector
from jax._src.pallas.mosaic_gpu import lowering as pallas_lowering
from jax.experimental.mosaic.gpu import fragmented_array as fa
from jax.experimental.mosaic.gpu import layouts as mgpu_layouts
from jax.experimental.mosaic.gpu import utils as mgpu_utils
from jax.experimental.pallas import mosaic_gpu as plgpu

from smalti.vocabulary import index_ranges, lanes
from smalti.vocabulary.annotations import Aval, Lowered, Operand, PallasContext
from smalti.vocabulary.rows import (
    Scratch,
    ThreadPlace,
    natural_rows,
    scratch_for,
    store_block,
    xor_const,
)

__all__ = ["along_axis", "numbers", "fits", "lower", "gather_registers", "checks_for", "Checks",
           "padded", "scratch_bytes", "MODES", "PAD"]

Mode = slicing.GatherScatterMode
#: The modes it models: XLA's clamp (``clip``, ``promise_in_bounds``) and the fill.
MODES = (Mode.CLIP, Mode.PROMISE_IN_BOUNDS, Mode.FILL_OR_DROP)


class Checks(enum.Enum):
    """The bounds work a gather does per index."""
    #: the mode's: XLA's clamp, or (fill) an unsigned compare, a clamp and a select
    BY_MODE = "by mode"
    #: none: the indices are known to lie in the axis
    NONE = "none"
    #: jnp's unwrapped index ``c`` under the fill mode: valid where
    #: ``-n <= c < n`` (``c + n < 2n``, unsigned), read at ``c & (n - 1)``
    WRAPPED = "wrapped"


def checks_for(indices: ir.Value, limit: int, mode: Mode) -> tuple[ir.Value, Checks]:
    """The indices to read and the checks they need, for a gather along an
    axis of ``limit`` whose indices ``indices`` computed (see
    :mod:`smalti.vocabulary.index_ranges`)."""
    bare = index_ranges.unwrapped(indices, limit)
    source = indices if bare is None else bare  # in [0, n), jnp's wrap changes nothing
    known = index_ranges.bounds(source)
    if known is not None and 0 <= known[0] and known[1] < limit:
        return source, Checks.NONE
    if bare is not None and mode == Mode.FILL_OR_DROP and limit & (limit - 1) == 0:
        return bare, Checks.WRAPPED
    return indices, Checks.BY_MODE


def along_axis(operand: Aval, indices: Aval, dimension_numbers: slicing.GatherDimensionNumbers,
               slice_sizes: tuple[int, ...]) -> int | None:
    """The axis of a 2-D ``operand`` that the gather takes along as
    ``jnp.take_along_axis`` does (``indices`` as the rule sees them, with
    their trailing index-vector dim of 1), or None for any other gather."""
    if operand.ndim != 2 or indices.ndim != 3 or indices.shape[-1] != 1 or \
            tuple(slice_sizes) != (1, 1):
        return None
    for axis in (0, 1):
        other = 1 - axis
        if dimension_numbers == numbers(axis) and indices.shape[other] == operand.shape[other]:
            return axis
    return None


def numbers(axis: int) -> slicing.GatherDimensionNumbers:
    """The dimension numbers of ``take_along_axis`` of a 2-D block along ``axis``."""
    return slicing.GatherDimensionNumbers(
        offset_dims=(), collapsed_slice_dims=(axis,), start_index_map=(axis,),
        operand_batching_dims=(1 - axis,), start_indices_batching_dims=(1 - axis,))


def fits(ctx: PallasContext, operand: Operand, operand_aval: Aval, indices: Operand,
         indices_aval: Aval, out: Aval | None = None) -> Scratch | None:
    """The scratch slice the fast path uses, where WGMMA's layout holds the
    operand, the (seen-through, 2-D) indices and the result (``out``, or the
    rule's), the indices are int32 and the slice is free; None otherwise."""
    if out is None:
        [out] = ctx.avals_out
    if np.dtype(indices_aval.dtype) != np.int32 or not (
            lanes.fits(operand_aval, operand) and lanes.fits(indices_aval, indices)
            and lanes.fits(out)):
        return None
    return scratch_for(ctx, operand_aval.update(
        shape=padded(tuple(operand_aval.shape), np.dtype(operand_aval.dtype).itemsize)))


#: The elements a row is padded by, where it is (:func:`padded`).
PAD = 8


def padded(shape: tuple[int, ...], itemsize: int) -> tuple[int, int]:
    """The scratch's shape for a block of ``shape``: its rows padded by
    :data:`PAD` elements where their 4-byte words are an even multiple of
    ``32 / rows`` for the ``rows`` one store phase writes (a 64-bit access
    is served per half-warp: 4 rows of 8 words; a 32-bit one per warp: 8
    rows of 4), so those rows start in distinct banks."""
    rows, cols = shape
    share = 8 if itemsize == 4 else 4  # words per row and phase: 32 banks / rows per phase
    words = cols * itemsize // 4
    return rows, cols + (PAD if (words // share) % 2 == 0 else 0)


def scratch_bytes(aval: Aval) -> int:
    """The bytes of one warpgroup's scratch for a gather from ``aval``."""
    itemsize = np.dtype(aval.dtype).itemsize
    rows, cols = padded(tuple(aval.shape), itemsize)
    return rows * cols * itemsize


def lower(ctx: PallasContext, operand: Operand, operand_aval: Aval, indices: Operand,
          indices_aval: Aval, *, axis: int, mode: Mode, fill: Any, scratch: Scratch) -> Lowered:
    """The gather as a ``plgpu.inline_mgpu`` body over both operands in
    WGMMA's layout (see the module docstring)."""
    [out] = ctx.avals_out
    layout = plgpu.Layout.WGMMA
    wgmma = mgpu_layouts.to_layout_attr(fa.WGMMA_LAYOUT)
    read, checks = checks_for(indices, operand_aval.shape[axis], mode)
    if lanes.fits(indices_aval, read):
        indices = read
    else:
        checks = Checks.BY_MODE
    values = [mgpu_dialect.layout_cast(pallas_lowering._ensure_ir_value(v, a.dtype), wgmma)
              for v, a in ((operand, operand_aval), (indices, indices_aval))]

    @plgpu.inline_mgpu(arg_types=(layout, layout),
                       return_type=plgpu.ShapeDtypeStruct(tuple(out.shape), out.dtype, layout))
    def body(_: Any, x: fa.FragmentedArray, idx: fa.FragmentedArray) -> fa.FragmentedArray:
        return gather_registers(x, idx, axis=axis, mode=mode, fill=fill, scratch=scratch,
                                checks=checks)

    return pallas_lowering._lower_fun(body, in_avals=(operand_aval, indices_aval))(ctx, *values)


def gather_registers(x: fa.FragmentedArray, idx: fa.FragmentedArray, *, axis: int, mode: Mode,
                     fill: Any, scratch: Scratch, checks: Checks = Checks.BY_MODE
                     ) -> fa.FragmentedArray:
    """``take_along_axis(x, idx, axis)`` of WGMMA-layout arrays (the module
    docstring's method): the result has ``idx``'s shape and ``x``'s type;
    ``checks`` says what ``idx`` is known to be (:func:`checks_for`)."""
    regs, iregs = x.registers, idx.registers
    n, cols = x.shape
    pair = ir.VectorType(regs.flat[0].type)
    element = pair.element_type
    index = ir.IndexType.get()
    i32 = ir.IntegerType.get_signless(32)
    ipair = ir.VectorType.get([2], i32)

    def splat(v: int) -> ir.Value:
        return vector.broadcast(ipair, mgpu_utils.c(v, i32))

    place = ThreadPlace.here()
    view = scratch.view(padded((n, cols), mgpu_utils.bitwidth(element) // 8), element)
    store_block(regs, view, place, 0)

    limit = x.shape[axis]
    zero, bound, last, twice = splat(0), splat(limit), splat(limit - 1), splat(2 * limit)
    filler = valid = None
    if mode == Mode.FILL_OR_DROP and checks is not Checks.NONE:
        scalar = mgpu_utils.c(float(fill) if isinstance(element, ir.FloatType) else int(fill),
                              element)
        filler = vector.broadcast(pair, scalar)
    out = np.empty(iregs.shape, dtype=object)
    index_rows = natural_rows(place.own, iregs)
    for at in np.ndindex(iregs.shape):
        g, j, h = at[0], at[1], at[4]
        wanted = iregs[at]
        if checks is Checks.NONE:
            safe = wanted
        elif checks is Checks.WRAPPED:  # -limit <= c < limit; c & (limit - 1) is c's wrap
            valid = arith.cmpi(arith.CmpIPredicate.ult, arith.addi(wanted, bound), twice)
            safe = arith.andi(wanted, last)
        elif filler is not None:  # in bounds: 0 <= i < limit, unsigned
            valid = arith.cmpi(arith.CmpIPredicate.ult, wanted, bound)
            safe = arith.minui(wanted, last)
        else:  # XLA's clamp
            safe = arith.minsi(arith.maxsi(wanted, zero), last)
        loaded = []
        for b in range(2):
            s = arith.index_cast(
                index, vector.extract(safe, dynamic_position=[], static_position=[b]))
            if axis == 1:
                row, col = index_rows[(g, h)], s
            else:
                row, col = s, xor_const(place.lane_cols, 8 * j + b)
            loaded.append(memref.load(view, [row, col]))
        value = vector.from_elements(pair, loaded)
        out[at] = arith.select(valid, value, filler) if valid is not None else value
    mgpu_utils.warpgroup_barrier()  # every read is done before the scratch is reused
    return fa.FragmentedArray(_registers=out, _layout=idx.layout, _is_signed=x.is_signed)
