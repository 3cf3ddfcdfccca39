"""The fast path of ``transpose`` (``x.T``): a round trip through swizzled
SMEM in whole vectors, as Mosaic GPU moves tiles, instead of ``take``'s
scalar one.

It goes by per-thread accesses (:func:`_transpose_registers`, a
``plgpu.inline_mgpu`` body on the scratch slice of
:func:`smalti.vocabulary.rows.scratch_for`): each thread stores its
registers with one vector store each and loads each output register's two
elements (two rows of one input column) with two scalar loads, the scratch
swizzled so that both are free of bank conflicts: about 3 instructions per
element. Where the warpgroups' scratch slices are not free, as follows.

How it works: ``x`` (R, C) is stored with one ``vector.store`` into an SMEM
scratch ref pinned (``mosaic_gpu.with_transforms``) to the
``(8, 128 / itemsize)`` tiling with the 128-byte swizzle, and read back with
one ``vector.load`` of the ref's ``memref.transpose`` view (C, R). Layout
inference gives the store WGMMA's layout and the load the transposed WGMMA
layout (the tiles' rows, 128 swizzled bytes, are contiguous in the view's
column pairs), so both transfers are Mosaic GPU's own conflict-free tiled
transfers (``stmatrix`` / ``ldmatrix`` for 16-bit types); a
``mosaic_gpu.layout_cast`` back to WGMMA's layout (a shuffle and a permute
per register) hands the result on in the layout every consumer takes.

Threads read what other threads of their warpgroup wrote, so the store is
preceded by a warpgroup barrier (earlier reads of the scratch are done),
the load by one (every write is visible) and followed by one (every read is
done before the scratch is reused). The first two are the store's own
(the lowering of ``vector_store`` puts them around it when Pallas inserts
barriers, its default); under ``unsafe_no_auto_barriers=True``, which
leaves the user's refs to the user but not this internal scratch, this rule
emits them. Each Pallas warpgroup of a kernel with
``num_threads`` gets a scratch slice of its own (the estimator reserves one
per warpgroup), so warpgroups never share bytes and warpgroup barriers
suffice. Warpgroups are not synchronized with each other, so one may be at
a later transpose or ``take`` than another: every slice of warpgroup ``w``
starts at ``w`` times the same stride, the reservation's share of one
warpgroup (:func:`slice_stride`), whatever its size -- so in a kernel of
several warpgroups the fast path takes only the arrays whose bytes are that
share (the largest scratch user), and smaller ones go to ``take``.

Where it applies (:func:`fits`, decided when the primitive is lowered): a
2-D array of a 16- or 32-bit type whose dims are multiples of 64 (both are
WGMMA tiles' 64 rows, before and after the transpose), not computed from a
load of global memory (Pallas loads those optimized, which only a strided
layout can be, and no relayout makes a strided layout tiled: such a value
cannot reach a tiled SMEM store). Everything else stays on ``take``
(:mod:`smalti.vocabulary.movement`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import jax
import numpy as np
from jax._src import core as jax_core
from jax._src.interpreters import mlir
from jax._src.lib import mosaic_gpu_dialect as mgpu_dialect
from jax._src.lib.mlir import ir
from jax._src.lib.mlir.dialects import arith, memref, vector
from jax._src.pallas import utils as pallas_utils
from jax._src.pallas.mosaic_gpu import lowering as pallas_lowering
from jax.experimental.mosaic.gpu import fragmented_array as fa
from jax.experimental.mosaic.gpu import layouts as mgpu_layouts
from jax.experimental.mosaic.gpu import utils as mgpu_utils

from smalti.vocabulary import index_ranges
from smalti.vocabulary.annotations import (
    Aval,
    EstimatorContext,
    Lowered,
    Operand,
    PallasContext,
    Resources,
)
from smalti.vocabulary.primitives import refuse

__all__ = ["fits", "lower", "estimate", "from_global_memory", "relabelled_transpose",
           "relabelled_transpose_p", "lower_relabelled"]

SWIZZLE = 128  # bytes: a tile row is one swizzle group of 8 x 16 bytes
WGMMA_ROWS = 64  # the rows of a WGMMA layout's tile


def fits(aval: Aval, x: ir.Value | None = None) -> bool:
    """Whether the fast path transposes ``aval`` (see the module docstring);
    with the operand ``x``, also whether it can be stored to tiled SMEM."""
    dtype = np.dtype(aval.dtype)
    if x is not None and (not isinstance(x, ir.Value) or from_global_memory(x)):
        return False
    return (aval.ndim == 2 and dtype != np.bool_ and dtype.itemsize in (2, 4)
            and all(n % WGMMA_ROWS == 0 for n in aval.shape))


def walk_back(value: ir.Value, visit: Callable[[ir.Operation], bool | Iterable[ir.Value]],
              budget: int) -> bool:
    """Walks the ops ``value`` is computed from, each once: ``visit(op)``
    returns True to end the walk with True, or the operands to walk on.
    True too once ``budget`` ops are walked (conservative for its callers'
    questions). Ops are told apart by the op itself, not by ``id()`` of
    their Python objects: a freed object's id is handed on to the next one
    made, which would then pass for seen, and one op may be reached through
    several objects."""
    seen: set[ir.Operation] = set()  # ops hash and compare as the op they are
    stack = [value]
    while stack:
        op = index_ranges.defining_op(stack.pop())
        if op is None:
            continue  # a block argument
        if op in seen:
            continue
        seen.add(op)
        if len(seen) > budget:
            return True
        found = visit(op)
        if found is True:
            return True
        if found is not False:
            stack.extend(found)
    return False


def from_global_memory(value: ir.Value, budget: int = 1024) -> bool:
    """Whether ``value`` is computed (through ops on whole vectors) from a
    ``mosaic_gpu.vector_load`` of global memory: Pallas loads those
    optimized, which only a strided register layout can be, and no relayout
    turns a strided layout into a tiled one, so the value cannot reach a
    tiled SMEM store. The walk stops at SMEM loads and at casts to a tiled
    layout (the register paths' inputs: a strided value there would fail
    anyway). Conservative: true once ``budget`` ops are walked."""
    def visit(op: ir.Operation) -> bool | list[ir.Value]:
        if op.name == "mosaic_gpu.vector_load":
            return ir.MemRefType(op.operands[0].type).memory_space is None
        if op.name == "mosaic_gpu.layout_cast" and isinstance(
                mgpu_layouts.from_layout_attr(op.attributes["new_layout"]), fa.TiledLayout):
            # cast to a tiled layout (the register paths' inputs): what it
            # casts cannot be strided either, or the kernel fails there
            return False
        return [v for v in op.operands if isinstance(v.type, ir.VectorType)]

    return walk_back(value, visit, budget)


def warpgroups(axis_names: pallas_lowering._AxisNames | None,
               mesh_info: pallas_utils.MeshInfo | None = None) -> int:
    """The Pallas warpgroups of the kernel (its thread axis's size): from the
    kernel's mesh when lowering, from the axis environment Pallas traces
    and estimates under otherwise (1 where neither names the axis: the
    lowering then finds the reserved scratch short, SM206)."""
    if axis_names is None or axis_names.wg is None:
        return 1
    if mesh_info is not None and axis_names.wg in mesh_info.axis_names:
        return int(mesh_info.mesh_shape[mesh_info.axis_names.index(axis_names.wg)])
    env = jax_core.get_axis_env()
    return int(env.axis_size(axis_names.wg)) if env.axis_exists(axis_names.wg) else 1


def slice_stride(module_ctx: Any, count: int) -> int:
    """The bytes between two Pallas warpgroups' slices of the scratch: the
    reserved scratch still free, split evenly among the ``count``
    warpgroups -- the same for every take and transpose of the kernel."""
    return (module_ctx.smem_requested_bytes - module_ctx.smem_used_bytes) // count


def fits_slices(ctx: PallasContext, aval: Aval) -> bool:
    """Whether the fast path's slices of ``aval`` keep to the warpgroups'
    stride: one warpgroup, or a warpgroup's share of the scratch holds
    ``aval`` (a kernel whose largest scratch user is bigger -- a block
    gather's padded copy -- leaves each share larger than the block; the
    register path places its slice at the stride, so it fits there too)."""
    module_ctx = ctx.module_ctx
    count = warpgroups(module_ctx.axis_names, module_ctx.mesh_info)
    return count == 1 or slice_stride(module_ctx, count) >= int(aval.size) * np.dtype(
        aval.dtype).itemsize


def estimate(ctx: EstimatorContext, aval: Aval) -> Resources:
    """One block of scratch per warpgroup."""
    nbytes = int(aval.size) * np.dtype(aval.dtype).itemsize
    count = warpgroups(getattr(ctx, "axis_names", None))  # no ctx: one
    return pallas_lowering.Resources(smem_scratch_bytes=count * nbytes)


def lower(ctx: PallasContext, x: Operand) -> ir.Value:
    """``x.T`` through the swizzled scratch (``x`` must :func:`fit <fits>`):
    32-bit types by per-thread accesses (:func:`_transpose_registers`),
    16-bit ones by Mosaic GPU's tiled transfers."""
    from smalti.vocabulary import lanes
    from smalti.vocabulary import rows as row_moves

    [aval] = ctx.avals_in
    dtype = np.dtype(aval.dtype)
    rows, cols = aval.shape
    scratch = row_moves.scratch_for(ctx, aval)
    if scratch is not None:
        return lanes.on_registers(ctx, x, (cols, rows),
                                  lambda value: _transpose_registers(value, scratch))
    x = pallas_lowering._ensure_ir_value(x, dtype)
    wgmma = mgpu_layouts.to_layout_attr(fa.WGMMA_LAYOUT)
    module_ctx = ctx.module_ctx
    count = warpgroups(module_ctx.axis_names, module_ctx.mesh_info)
    needed = count * int(aval.size) * dtype.itemsize
    if module_ctx.smem_requested_bytes - module_ctx.smem_used_bytes < needed:
        raise refuse(ctx, f"its {count} warpgroups need {needed} bytes of scratch SMEM, more "
                          "than the kernel reserved for it",
                     fix="call it in a kernel of one warpgroup, or transpose through an SMEM "
                         "ref of your own (ref.T[...])")
    with module_ctx.scratch_view(jax.ShapeDtypeStruct((count, rows, cols), dtype)) as ref:
        ref = mgpu_dialect.with_transforms(ref, ir.ArrayAttr.get([
            mgpu_dialect.TileTransformAttr.get((8, SWIZZLE // dtype.itemsize)),
            mgpu_dialect.SwizzleTransformAttr.get(SWIZZLE)]))
        mine: int | ir.Value = 0  # this warpgroup's slice
        if count > 1:
            mine = arith.index_cast(ir.IndexType.get(), mgpu_utils.warpgroup_idx(sync=True))
        ref = mgpu_utils.memref_slice(ref, mine)
        # the store's own lowering puts these two barriers around it when
        # Pallas inserts barriers (its default)
        if not module_ctx.auto_barriers:
            mgpu_utils.warpgroup_barrier()  # earlier reads of the scratch are done
        mgpu_dialect.vector_store(mgpu_dialect.layout_cast(x, wgmma), ref)
        if not module_ctx.auto_barriers:
            mgpu_utils.warpgroup_barrier()  # every write is visible to the warpgroup
        loaded = mgpu_dialect.vector_load(mgpu_utils.memref_transpose(ref, (1, 0)))
        mgpu_utils.warpgroup_barrier()  # every read is done before the scratch is reused
    return mgpu_dialect.layout_cast(loaded, wgmma)


def _transpose_registers(x: fa.FragmentedArray, scratch: Any, relabelled: bool = False
                         ) -> fa.FragmentedArray:
    """``x.T`` of a WGMMA-layout array: each thread stores its registers
    (two columns of a row: one 8- or 4-byte store) into the scratch, the
    warpgroup synchronizes, and each thread loads the two elements of each
    output register (two rows of one input column: two scalar loads).
    Column ``c`` of row ``r`` sits at ``c ^ S(r)``: for 32-bit types
    ``S(r) = ((r ^ (r >> 1)) & 3) << 3``, so that a half-warp's 8-byte
    stores (4 rows, 4 lanes' pairs) and a warp's loads (8 columns of the 4
    rows ``2 q + b``) meet 32 distinct banks; for 16-bit types ``S(r) = (r &
    7) << 3``, so that a warp's 4-byte stores (8 rows) meet 32 distinct banks
    and its loads 16 distinct words (two lanes to a word) on distinct banks.
    One write and one read pass of the block: the ideal.

    ``relabelled`` (32-bit types): ``x``'s rows hold position ``p`` at
    column ``relabelling(n)[p]`` (:func:`relabelled_transpose`), so a
    register ``j`` of lane ``q`` holds positions ``p = q n / 4 + 2 j + b``
    (two adjacent positions) and is stored where position ``p`` belongs:
    the permutation back to position order costs nothing. Position ``p`` of
    row ``r`` sits at ``P(p) ^ (T(r) << 3)``, ``P(p) = p ^ ((p >> (L - 2)) &
    3) << 1`` (``n = 2 ** L``) and ``T(r) = ((r ^ (r >> 2)) & 1) | (r & 2)``:
    a half-warp's stores vary ``p``'s bits 0, ``L - 2``, ``L - 1`` and
    ``r``'s bits 0, 1, a warp's loads ``p``'s bits 0-2 and ``r``'s bits 1,
    2, and both sets map one-to-one onto the 5 bank bits."""
    from smalti.vocabulary import rows as row_moves
    from smalti.vocabulary.rows import xor_const

    regs = x.registers  # (rows / 64, cols / 8, 1, 1, 2, 1, 1, 1, 1) of vector<2 x T>
    n, cols = x.shape
    pair = ir.VectorType(regs.flat[0].type)
    element = pair.element_type
    index = ir.IndexType.get()

    def c(v: int) -> ir.Value:
        return mgpu_utils.c(v, index)

    top = cols.bit_length() - 3  # relabelled: L - 2, the lane bits' place in a position

    def spread(row: ir.Value) -> ir.Value:  # S(row), or T(row) << 3 where relabelled
        if relabelled:
            odd = arith.andi(arith.xori(row, arith.shrui(row, c(2))), c(1))
            return arith.shli(arith.ori(odd, arith.andi(row, c(2))), c(3))
        if mgpu_utils.bitwidth(element) == 16:
            return arith.shli(arith.andi(row, c(7)), c(3))
        return arith.shli(arith.andi(arith.xori(row, arith.shrui(row, c(1))), c(3)), c(3))

    def placed_const(p: int) -> int:  # P(p) of a constant position
        return p ^ (((p >> top) & 3) << 1)

    place = row_moves.ThreadPlace.here()
    own, lane_cols = place.own, place.lane_cols
    view = scratch.view((n, cols), element)
    natural = row_moves.natural_rows(own, regs)
    if relabelled:
        # stores: position q n / 4 + 2 j of row own + 64 g + 8 h at P(p) ^ T(own)
        lane_place = arith.shli(lane_cols, c(top - 1))  # q n / 4
        store_cols = arith.xori(arith.xori(lane_place, lane_cols), spread(own))
        pair_cols = {j: xor_const(store_cols, 2 * j) for j in range(regs.shape[1])}
    else:
        # stores: row own + 64 g + 8 h (S depends on its low 3 bits: own's), column 8 j + 2 q
        store_cols = arith.xori(lane_cols, spread(own))
        pair_cols = {j: xor_const(store_cols, 8 * j) for j in range(regs.shape[1])}
    mgpu_utils.warpgroup_barrier()  # earlier reads of the scratch are done
    for idx in np.ndindex(regs.shape):
        vector.store(regs[idx], view, [natural[(idx[0], idx[4])], pair_cols[idx[1]]])
    mgpu_utils.warpgroup_barrier()  # every write is visible to the warpgroup
    # loads: output (r', c') = input (c', r'), r' = own + 64 g' + 8 h', c' = 8 j' + 2 q + b
    out_shape = (cols, n)
    out_regs = np.empty(fa.WGMMA_LAYOUT.registers_shape(out_shape), dtype=object)
    source_rows = {b: xor_const(lane_cols, b) for b in range(2)}  # 2 q + b; + 8 j' below
    # S(c') of c' = 8 j' + 2 q + b: its low 3 bits are 2 q + b's
    source_spread = {b: spread(source_rows[b]) for b in range(2)}
    out_rows = row_moves.natural_rows(own, out_regs)
    if relabelled:  # P(r') ^ T(c'); P is linear: P(own + k) = P(own) ^ P(k)
        own_place = arith.xori(own, arith.shli(arith.andi(arith.shrui(own, c(top)), c(3)), c(1)))
        out_rows = {(g, h): xor_const(own_place, placed_const(64 * g + 8 * h))
                    for g, h in out_rows}
    placed = {(g, h, b): arith.xori(row, source_spread[b])  # r' ^ S(c')
              for (g, h), row in out_rows.items() for b in range(2)}
    input_rows = {(j, b): xor_const(source_rows[b], 8 * j)
                  for j in range(out_regs.shape[1]) for b in range(2)}
    for idx in np.ndindex(out_regs.shape):
        g, j, h = idx[0], idx[1], idx[4]
        elements = [memref.load(view, [input_rows[(j, b)], placed[(g, h, b)]]) for b in range(2)]
        out_regs[idx] = vector.from_elements(pair, elements)
    mgpu_utils.warpgroup_barrier()  # every read is done before the scratch is reused
    return fa.FragmentedArray(_registers=out_regs, _layout=x.layout, _is_signed=x.is_signed)


# --- a sort's rows back in position order, transposed ----------------------------------------

#: ``x[:, relabelling(n)].T`` (:func:`relabelled_transpose`).
relabelled_transpose_p = jax_core.Primitive("smalti_relabelled_transpose")


def relabelled_transpose(x: jax.Array) -> jax.Array:
    """``x[:, relabelling(n)].T`` of a 2-D block of ``n`` columns whose rows
    hold position ``p`` at column ``relabelling(n)[p]``
    (:func:`smalti.vocabulary.lanes.relabelling`: a sorting network's
    placement along the minor axis): the positions back in order, as rows.
    Where the fast path applies (a 32-bit block in WGMMA's registers, both
    dims multiples of 64, ``n`` a power of two, the warpgroup's scratch
    slice free) it is one transpose whose register stores put each position
    where it belongs, so the permutation costs nothing; elsewhere the
    permutation in registers (:func:`smalti.vocabulary.lanes.permute`), then
    the transpose."""
    return relabelled_transpose_p.bind(x)


@relabelled_transpose_p.def_abstract_eval
def _relabelled_abstract_eval(x: Aval) -> Aval:
    return jax_core.ShapedArray(tuple(x.shape[::-1]), x.dtype)


def _relabelled_f(x: jax.Array) -> jax.Array:
    from smalti.vocabulary import lanes

    return lanes.permute(x, lanes.relabelling(x.shape[1])).T


relabelled_transpose_p.def_impl(_relabelled_f)
mlir.register_lowering(relabelled_transpose_p,
                       mlir.lower_fun(_relabelled_f, multiple_results=False))


def lower_relabelled(ctx: PallasContext, x: Operand) -> Lowered:
    """The fast path of :func:`relabelled_transpose` where it applies, the
    permutation and the transpose by their own rules otherwise."""
    from smalti.vocabulary import lanes
    from smalti.vocabulary import rows as row_moves

    [aval] = ctx.avals_in
    rows, cols = aval.shape
    fast = (np.dtype(aval.dtype).itemsize == 4 and cols & (cols - 1) == 0
            and fits(aval, x) and fits_slices(ctx, aval))
    scratch = row_moves.scratch_for(ctx, aval) if fast else None
    if scratch is None:
        return pallas_lowering._lower_fun(_relabelled_f)(ctx, x)
    return lanes.on_registers(ctx, x, (cols, rows),
                              lambda value: _transpose_registers(value, scratch, relabelled=True))
