"""A sort down the columns of a 32-bit block with each column in one
thread's registers: the whole bitonic network is register ``min``/``max``.

``sort_columns(x)`` of an ``(R, C)`` block is each column sorted ascending,
in place (``jnp.sort(x, 0)`` for values without NaN). With
``transposed=True`` it is ``x.T`` sorted along its minor axis instead, the
``p``-th smallest of column ``c`` at ``[c, relabelling(R)[p]]``
(:func:`smalti.vocabulary.lanes.relabelling`): what
:func:`smalti.vocabulary.sorting.bitonic_sort` of ``x.T`` on relabelled
positions gives, the form the quantized argsorts along the rows continue
from (their test of neighbours and repair, then
:func:`~smalti.vocabulary.smem_transpose.relabelled_transpose` back).

Why: in WGMMA's layout a line of ``R`` sits in a quad, ``R / 4`` values to
a lane; of a bitonic network's ``log R (log R + 1) / 2`` stages the 3 (5 for
128) whose masks reach the two lane bits each cost a shuffle, a compare, a
lane-dependent choice and a select per element, against one ``min`` or
``max`` in registers. With 128 threads and 128 columns each thread can hold
a whole column instead, and then every stage is one ``min`` or ``max`` per
element: the network's ideal.

How (:func:`_sort_registers`, a ``plgpu.inline_mgpu`` body on the
warpgroup's scratch slice of :func:`smalti.vocabulary.rows.scratch_for`):

1. every thread stores its registers (two columns of a row: one 8-byte
   store each) into an ``(R, C + 8)`` scratch: the padding puts the 4 rows
   of a half-warp's stores 8 banks apart, so they are conflict-free;
2. thread ``t`` loads column ``t`` (and ``t + 128 k`` for wider blocks), one
   scalar load per element at a constant offset from its own: a warp reads
   32 consecutive words of one row, one wavefront;
3. the network (:func:`smalti.vocabulary.sorting.network_stages`) on the column's
   ``R`` values: per stage and pair, the lower position keeps the ``min``;
4. thread ``t`` stores its sorted column as row ``t`` of a ``(C, R + 4)``
   scratch, four positions to a 16-byte store, position group ``v`` at
   group ``pi(v) = v ^ (lane(v) << 1)`` (``lane(v)``: the group's top two
   bits, the WGMMA lane that reads it): rows 4 words apart keep a
   quarter-warp's stores (8 rows, one group) on distinct banks;
5. each thread loads its registers of the ``(C, R)`` result in WGMMA's
   layout: lane ``q`` holds positions ``q R / 4`` to ``(q + 1) R / 4 - 1``
   of its rows (the relabelling), 16-byte loads of 4 positions each;
   ``pi`` spreads a quarter-warp's 4 lanes of one row over distinct banks
   and the row stride of ``R + 4`` words puts the next row on the others.

In position order (the default) steps 4 and 5 are step 2 and 1 reversed
instead: each thread stores its sorted column where it came from (a scalar
store per element, a warp's 32 on one row's consecutive words) and loads
its registers back with 8-byte loads.

About 23 instructions per element for ``R = 64`` (21 of them the network)
against 34 for the transpose and the network in WGMMA's layout, and two
conflict-free passes of the block through SMEM each way; in position order
the transpose back (3 more instructions and a pass) is saved too. Where it
applies (:func:`applies`): 32-bit types (int32 words compared signed,
float32 values by ``minimumf``/``maximumf``: the callers' values have no
NaN), ``R`` 64 or 128 and ``C`` a multiple of 128, the value in WGMMA's
layout (not a plain load of global memory) and the warpgroup's scratch
slice free; elsewhere it is the transpose and the network in WGMMA's
layout, which is also its CPU implementation, so both compute the same
words. Barriers around each SMEM phase, as for the other round trips: the
stores after earlier reads, the loads after the stores, the next stores
after the loads (in position order each thread rewrites only the words it
alone read: no barrier there), and the scratch's reuse after the last
loads; a scratch slice per Pallas warpgroup.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from typing import Any

import jax
import numpy as np
from jax._src import core as jax_core
from jax._src.interpreters import mlir
from jax._src.lib.mlir import ir
from jax._src.lib.mlir.dialects import arith, memref, vector
from jax._src.pallas.mosaic_gpu import lowering as pallas_lowering
from jax.experimental.mosaic.gpu import fragmented_array as fa
from jax.experimental.mosaic.gpu import utils as mgpu_utils

from smalti.vocabulary import lanes, smem_transpose
from smalti.vocabulary.annotations import (
    Aval,
    DTypeLike,
    EstimatorContext,
    Lowered,
    Operand,
    PallasContext,
)
from smalti.vocabulary.lane_scan import combiner
from smalti.vocabulary.rows import (
    Scratch,
    ThreadPlace,
    natural_rows,
    scratch_for,
    store_block,
    swizzled_columns,
    xor_const,
)

__all__ = ["sort_columns", "sort_columns_p", "applies", "scratch_bytes", "lower", "estimate",
           "LINE_LENGTHS"]

#: The column lengths the register path sorts (powers of two whose lane
#: groups ``pi`` spreads over the banks).
LINE_LENGTHS = (64, 128)
THREADS = mgpu_utils.WARPGROUP_SIZE
#: Padding of the first scratch's rows (8 words: a half-warp's 4 rows of 8-byte
#: stores on distinct banks) and of the second's (4 words: a quarter-warp's 8 rows).
ROW_PAD, COLUMN_PAD = 8, 4
VECTOR = 4  # positions per 16-byte store and load
#: The types it sorts: int32 words (signed), float32 values (without NaN).
WORDS = (np.dtype(np.int32), np.dtype(np.float32))

sort_columns_p = jax_core.Primitive("smalti_sort_columns")


def sort_columns(x: jax.Array, *, transposed: bool = False) -> jax.Array:
    """Each column of a 2-D 32-bit block sorted ascending; with
    ``transposed``, as the rows of ``x.T``, position ``p`` at column
    ``relabelling(R)[p]`` (see the module docstring). ``R`` must be a power
    of two, at least 8; int32 words compare signed, float32 values must not
    be NaN."""
    rows = x.shape[0] if x.ndim == 2 else 0
    if (x.ndim != 2 or np.dtype(x.dtype) not in WORDS or rows < 8 or rows & (rows - 1)):
        raise ValueError("sort_columns: a 2-D int32 or float32 block whose columns' length is a "
                         f"power of two, at least 8; got {x.dtype} of shape {x.shape}")
    return sort_columns_p.bind(x, transposed=transposed)


def applies(shape: tuple[int, ...], dtype: DTypeLike) -> bool:
    """Whether the register path can sort the columns of a ``shape`` block of
    ``dtype`` (the lowering also needs the value in WGMMA's layout and the
    scratch free, and falls back otherwise)."""
    return (len(shape) == 2 and shape[0] in LINE_LENGTHS and shape[1] % THREADS == 0
            and np.dtype(dtype) in WORDS)


def scratch_bytes(shape: tuple[int, ...]) -> int:
    """The bytes of one warpgroup's scratch: the larger of the two phases'."""
    rows, cols = shape
    return 4 * max(rows * (cols + ROW_PAD), cols * (rows + COLUMN_PAD))


@sort_columns_p.def_abstract_eval
def _abstract_eval(x: Aval, *, transposed: bool) -> Aval:
    return jax_core.ShapedArray(tuple(x.shape[::-1] if transposed else x.shape), x.dtype)


def _sort_columns_f(x: jax.Array, *, transposed: bool) -> jax.Array:
    """The transpose, then the network on relabelled positions in WGMMA's
    layout (and the relabelled transpose back for position order)."""
    from smalti.vocabulary import sorting

    _, stages = sorting.relabelled_stages(x.shape[0])
    [word] = sorting.bitonic_sort([x.T], 1, stages)
    return word if transposed else smem_transpose.relabelled_transpose(word)


sort_columns_p.def_impl(_sort_columns_f)
mlir.register_lowering(sort_columns_p, mlir.lower_fun(_sort_columns_f, multiple_results=False))


def lower(ctx: PallasContext, x: Operand, *, transposed: bool) -> Lowered:
    """The register path where it applies (see the module docstring), the
    transpose and the network in WGMMA's layout otherwise."""
    [aval] = ctx.avals_in
    rows, cols = aval.shape
    scratch = None
    if applies(tuple(aval.shape), aval.dtype) and smem_transpose.fits(aval, x):
        scratch = scratch_for(ctx, aval.update(shape=(scratch_bytes((rows, cols)),),
                                               dtype=np.dtype(np.uint8)))
    if scratch is None:
        return pallas_lowering._lower_fun(partial(_sort_columns_f, transposed=transposed))(ctx, x)
    return lanes.on_registers(ctx, x, (cols, rows) if transposed else (rows, cols),
                              lambda value: _sort_registers(value, scratch, transposed))


def estimate(ctx: EstimatorContext, aval: Aval, **params: Any) -> pallas_lowering.Resources:
    """One scratch per warpgroup: the register path's, or the fallback's
    (the transpose's block) where it does not apply."""
    del params
    nbytes = (scratch_bytes(tuple(aval.shape)) if applies(tuple(aval.shape), aval.dtype)
              else int(aval.size) * np.dtype(aval.dtype).itemsize)
    count = smem_transpose.warpgroups(getattr(ctx, "axis_names", None))
    return pallas_lowering.Resources(smem_scratch_bytes=count * nbytes)


def _group_place(v: int, rows: int) -> int:
    """``pi(v)``: where position group ``v`` of a sorted column sits in its
    row of the second scratch (the module docstring's step 4)."""
    lane = v // (rows // (4 * VECTOR))
    return v ^ (lane << 1)


def _sort_registers(x: fa.FragmentedArray, scratch: Scratch, transposed: bool
                    ) -> fa.FragmentedArray:
    """:func:`sort_columns` of a WGMMA-layout array (the module docstring's steps)."""
    from smalti.vocabulary.sorting import network_stages

    regs = x.registers
    rows, cols = x.shape
    element = ir.VectorType(regs.flat[0].type).element_type
    index = ir.IndexType.get()

    def c(v: int) -> ir.Value:
        return mgpu_utils.c(v, index)

    place = ThreadPlace.here()
    # 1-2: the block row-major, then each thread's columns
    view = scratch.view((rows, cols + ROW_PAD), element)
    store_block(regs, view, place, 0)  # with the barriers before and after
    mine = [xor_const(place.tid, THREADS * k) for k in range(cols // THREADS)]
    columns = [[memref.load(view, [c(r), col]) for r in range(rows)] for col in mine]
    if transposed:  # (in place, each thread rewrites only the words it alone read)
        mgpu_utils.warpgroup_barrier()  # every read is done before the scratch is rewritten
    # 3: the network, all in this thread's registers
    smaller, larger = (combiner(kind, element, True) for kind in ("min", "max"))
    for mask, _ in network_stages(rows):
        for values in columns:
            for i in range(rows):
                j = i ^ mask
                if j > i:  # every stage is ascending: the lower position keeps the min
                    values[i], values[j] = smaller(values[i], values[j]), larger(values[i],
                                                                               values[j])
    if not transposed:
        return _in_place(x, columns, mine, view, place)
    # 4: each sorted column as a row, four positions to a store
    out = scratch.view((cols, rows + COLUMN_PAD), element)
    quad = ir.VectorType.get([VECTOR], element)
    for row, values in zip(mine, columns):
        for v in range(rows // VECTOR):
            stored = vector.from_elements(quad, values[VECTOR * v:VECTOR * (v + 1)])
            vector.store(stored, out, [row, c(VECTOR * _group_place(v, rows))])
    mgpu_utils.warpgroup_barrier()  # every write is visible to the warpgroup
    # 5: the (cols, rows) result in WGMMA's layout on relabelled positions
    out_regs = np.empty(fa.WGMMA_LAYOUT.registers_shape((cols, rows)), dtype=object)
    groups = rows // (4 * VECTOR)  # position groups per lane
    q = arith.andi(place.tid, c(3))
    # pi(q groups + m) = (q groups) ^ (q << 1) ^ m: the lane's part once, m's per load
    lane_group = arith.xori(arith.muli(q, c(groups)), arith.shli(q, c(1)))
    starts = {m: arith.muli(xor_const(lane_group, m), c(VECTOR)) for m in range(groups)}
    pair = ir.VectorType(regs.flat[0].type)
    loaded: dict[tuple[int, int, int], ir.Value] = {}
    for idx, row in _register_rows(place.own, out_regs):
        j = idx[1]  # register j holds positions q rows / 4 + 2 j and the next
        key = (idx[0], idx[4], j // 2)
        if key not in loaded:
            loaded[key] = vector.load(quad, out, [row, starts[j // 2]])
        out_regs[idx] = vector.extract_strided_slice(pair, loaded[key], [2 * (j % 2)], [2], [1])
    mgpu_utils.warpgroup_barrier()  # every read is done before the scratch is reused
    return fa.FragmentedArray(_registers=out_regs, _layout=x.layout, _is_signed=x.is_signed)


def _in_place(x: fa.FragmentedArray, columns: list[list[ir.Value]], mine: list[ir.Value],
              view: ir.Value, place: ThreadPlace) -> fa.FragmentedArray:
    """Steps 2 and 1 reversed: each thread's sorted columns stored where they
    came from (``view``, the first scratch), the block loaded back in WGMMA's
    layout."""
    for col, values in zip(mine, columns):
        for r, value in enumerate(values):
            memref.store(value, view, [mgpu_utils.c(r, ir.IndexType.get()), col])
    mgpu_utils.warpgroup_barrier()  # every write is visible to the warpgroup
    regs = x.registers
    out_regs = np.empty(regs.shape, dtype=object)
    pair = ir.VectorType(regs.flat[0].type)
    lane_columns = swizzled_columns(place.own, place.lane_cols, 0, regs.shape[1])
    for idx, row in _register_rows(place.own, out_regs):
        out_regs[idx] = vector.load(pair, view, [row, lane_columns[idx[1]]])
    mgpu_utils.warpgroup_barrier()  # every read is done before the scratch is reused
    return fa.FragmentedArray(_registers=out_regs, _layout=x.layout, _is_signed=x.is_signed)


def _register_rows(own: ir.Value, regs: np.ndarray) -> Iterator[tuple[tuple[int, ...], ir.Value]]:
    """Each register slot of a WGMMA-layout array with its row (index value)."""
    rows = natural_rows(own, regs)
    for idx in np.ndindex(regs.shape):
        yield idx, rows[(idx[0], idx[4])]
