"""One column or one row of a block, as a reduction with ``keepdims`` gives
it: ``column(x, c)`` is ``x[:, c:c+1]``, built as ``x[:, c]`` in WGMMA's row
layout (what ``jnp.max(x, 1)`` gives: each thread holds its rows' values)
broadcast to ``(R, 1)``, and ``row(x, r)`` is ``x[r:r+1, :]``, built as
``x[r, :]`` in WGMMA's column layout (what ``jnp.max(x, 0)`` gives: each
thread holds its lane's columns) broadcast to ``(1, C)``; so a size-1
slice broadcasts back over the block the way a ``keepdims`` reduction does
-- ``x[:, :1] + x[:1, :]``, the outer broadcast -- with nothing through
``take``.

How:

- a column: column ``c = 8 j + 2 q + b`` of a thread's row is element
  ``b`` of register ``j`` of lane ``q`` of its quad: one ``shfl.sync`` per
  register row from that lane (the quad's four lanes then all hold it, as
  the row layout replicates it);
- a row: the threads holding row ``r`` store it (two columns per register,
  one vector store each) into a scratch of one row, the warpgroup
  synchronizes, and every thread loads its lane's columns (one vector load
  per register column), between warpgroup barriers, a scratch slice per
  Pallas warpgroup as ``take``'s.

Exact (values only move). Where it applies is
:func:`smalti.vocabulary.lanes.fits` of the block, and for a row a free
scratch slice; elsewhere the slice is one ``take``, as before.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax._src import core as jax_core
from jax._src.interpreters import mlir
from jax._src.lib import mosaic_gpu_dialect as mgpu_dialect
from jax._src.lib.mlir import ir
from jax._src.lib.mlir.dialects import arith, vector
from jax._src.pallas.mosaic_gpu import lowering as pallas_lowering
from jax.experimental.mosaic.gpu import fragmented_array as fa
from jax.experimental.mosaic.gpu import layouts as mgpu_layouts
from jax.experimental.mosaic.gpu import utils as mgpu_utils
from jax.experimental.pallas import mosaic_gpu as plgpu

from smalti.vocabulary import lanes
from smalti.vocabulary import rows as row_moves
from smalti.vocabulary.annotations import Aval, Lowered, Operand, PallasContext

__all__ = ["column", "row", "line_p"]

line_p = jax_core.Primitive("smalti_line")


def column(x: jax.Array, c: int) -> jax.Array:
    """``x[:, c:c+1]`` of a 2-D ``x`` (see the module docstring)."""
    return _line(x, axis=1, index=c)


def row(x: jax.Array, r: int) -> jax.Array:
    """``x[r:r+1, :]`` of a 2-D ``x`` (see the module docstring)."""
    return _line(x, axis=0, index=r)


def _line(x: jax.Array, *, axis: int, index: int) -> jax.Array:
    x = jnp.asarray(x)
    if x.ndim != 2 or not 0 <= index < x.shape[axis]:
        raise ValueError(f"lines: index {index} along axis {axis} of a 2-D block, got shape "
                         f"{x.shape}")
    if not lanes.registers_allowed():
        return _take_f(x, axis=axis, index=index)
    return line_p.bind(x, axis=int(axis), index=int(index))


@line_p.def_abstract_eval
def _abstract_eval(x: Aval, *, axis: int, index: int) -> Aval:
    del index
    return jax_core.ShapedArray(_shape(x.shape, axis), x.dtype)


def _shape(shape: tuple[int, ...], axis: int) -> tuple[int, int]:
    return (shape[0], 1) if axis == 1 else (1, shape[1])


def _impl(x: jax.Array, *, axis: int, index: int) -> jax.Array:
    return x[:, index:index + 1] if axis == 1 else x[index:index + 1, :]


line_p.def_impl(_impl)
mlir.register_lowering(line_p, mlir.lower_fun(_impl, multiple_results=False))


def _take_f(x: jax.Array, *, axis: int, index: int) -> jax.Array:
    from smalti.vocabulary.movement import _iotas, _linear, take

    i, j = _iotas(_shape(x.shape, axis))  # the slice's own take, as movement.slice_f's
    return take(x, _linear([i, j + index] if axis == 1 else [i + index, j], x.shape))


def lower(ctx: PallasContext, x: Operand, *, axis: int, index: int) -> Lowered:
    """In registers (a column) or through a scratch of one row where the
    block :func:`fits <smalti.vocabulary.lanes.fits>`; ``take`` otherwise."""
    [aval] = ctx.avals_in
    scratch = row_moves.scratch_for(ctx, aval)
    if not lanes.fits(aval, x) or (axis == 0 and scratch is None):
        return pallas_lowering._lower_fun(
            lambda v: _take_f(v, axis=axis, index=index))(ctx, x)
    wgmma = mgpu_layouts.to_layout_attr(fa.WGMMA_LAYOUT)
    x = mgpu_dialect.layout_cast(pallas_lowering._ensure_ir_value(x, aval.dtype), wgmma)
    out = plgpu.ShapeDtypeStruct((aval.shape[1 - axis],), aval.dtype,
                                 plgpu.Layout.WGMMA.reduce(axis))

    @plgpu.inline_mgpu(arg_types=(plgpu.Layout.WGMMA,), return_type=out)
    def body(_: Any, value: fa.FragmentedArray) -> fa.FragmentedArray:
        if axis == 1:
            return _column_registers(value, index)
        assert scratch is not None
        return _row_registers(value, index, scratch)

    def line(v: jax.Array) -> jax.Array:  # broadcast as a keepdims reduction is
        return lax.broadcast_in_dim(body(v), _shape(aval.shape, axis), (1 - axis,))

    return pallas_lowering._lower_fun(line)(ctx, x)


def _column_registers(x: fa.FragmentedArray, c: int) -> fa.FragmentedArray:
    regs = x.registers  # (rows / 64, cols / 8, 1, 1, 2, 1, 1, 1, 1) of vector<2 x T>
    element = ir.VectorType(regs.flat[0].type).element_type
    i32 = ir.IntegerType.get_signless(32)
    quad = lanes.Quad()
    j, q, b = c // lanes.TILE_COLS, (c // 2) % lanes.QUAD, c % 2
    out = np.empty(fa.WGMMA_ROW_LAYOUT.registers_shape((x.shape[0],)), dtype=object)
    one = ir.VectorType.get((1,), element)
    for idx in np.ndindex(out.shape):  # (rows / 64, 1, 2, 1, 1): row group g, register row h
        g, h = idx[0], idx[2]
        register = regs[(g, j, 0, 0, h, 0, 0, 0, 0)]
        if mgpu_utils.bitwidth(element) == 16:  # the word holds both halves
            word = lanes.extract(vector.bitcast(ir.VectorType.get((1,), i32), register), 0)
            got = quad.shuffle(word, (q,) * lanes.QUAD)
            pair = vector.bitcast(ir.VectorType.get((2,), element),
                                  vector.broadcast(ir.VectorType.get((1,), i32), got))
            value = lanes.extract(pair, b)
        else:
            word = mgpu_utils.bitcast(lanes.extract(register, b), i32)
            value = mgpu_utils.bitcast(quad.shuffle(word, (q,) * lanes.QUAD), element)
        out[idx] = vector.broadcast(one, value)
    return fa.FragmentedArray(_registers=out, _layout=fa.WGMMA_ROW_LAYOUT,
                              _is_signed=x.is_signed)


def _row_registers(x: fa.FragmentedArray, r: int, scratch: row_moves.Scratch
                   ) -> fa.FragmentedArray:
    regs = x.registers
    n, cols = x.shape
    pair = ir.VectorType(regs.flat[0].type)
    index = ir.IndexType.get()

    def c(v: int) -> ir.Value:
        return mgpu_utils.c(v, index)

    place = row_moves.ThreadPlace.here()
    own, lane_cols = place.own, place.lane_cols
    view = scratch.view((cols,), pair.element_type)
    g, h = r // 64, (r // 8) % 2
    mgpu_utils.warpgroup_barrier()  # earlier reads of the scratch are done
    holds = arith.cmpi(arith.CmpIPredicate.eq, own, c(r % 64 - 8 * h))
    with mgpu_utils.when(holds):  # the quad holding row r
        for j in range(regs.shape[1]):
            vector.store(regs[(g, j, 0, 0, h, 0, 0, 0, 0)], view,
                         [row_moves.xor_const(lane_cols, 8 * j)])
    mgpu_utils.warpgroup_barrier()  # the row is visible to the warpgroup
    out = np.empty(fa.WGMMA_COL_LAYOUT.registers_shape((cols,)), dtype=object)
    for idx in np.ndindex(out.shape):  # (cols / 8, 1, 1): register column j
        j = idx[0]
        out[idx] = vector.load(pair, view, [row_moves.xor_const(lane_cols, 8 * j)])
    mgpu_utils.warpgroup_barrier()  # every read is done before the scratch is reused
    return fa.FragmentedArray(_registers=out, _layout=fa.WGMMA_COL_LAYOUT,
                              _is_signed=x.is_signed)
