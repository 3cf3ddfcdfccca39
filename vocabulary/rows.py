"""Static permutations of a block's rows: ``permute(x, rows)`` is
``x[rows, :]`` for a static tuple ``rows`` (output row ``r`` reads input
row ``rows[r]``, or the scalar ``fill`` where that is ``-1``), moved
through SMEM one vector per register instead of ``take``'s one scalar per
element.

Why memory: in Mosaic GPU's WGMMA layout row ``64 g + 16 w + 8 h + l // 4``
of a block is held by warp ``w``'s lanes ``l`` (register row ``h`` of row
group ``g``), so most row moves cross warps, which only memory connects.

How: each thread stores every register (a ``vector<2 x T>``: two columns
of one row) at its own place in a scratch of the block's shape, the
warpgroup synchronizes, and each thread loads, for each of its registers,
the same two columns of the row its output row reads. The row a register
reads is the thread's own (computed once) plus a constant per register
row, so the accesses are a store and a load per register and an index
operation per register row and per register column. The mappings this
covers (:func:`classify`), which are what the vocabulary moves rows by:

- ``r -> r ^ m``: the partners of a bitonic stage along the rows;
- ``r -> (r + b) mod n`` and ``r -> (b - r) mod n``: rolls and flips;
- the same without the wrap, ``fill`` where the source falls outside the
  block: the shifts of a scan along the rows (the load reads the wrapped
  row, a valid address, and a select puts the fill in).

A xor that keeps rows within their warp (``m`` without bits 4 and 5) needs
no memory: bits 0-2 of a row are bits 2-4 of its lane (a ``shfl.bfly``
per 32-bit word) and bit 3 and bits 6+ its register (moves).

Other mappings, and blocks that do not fit (:func:`fits`), go through
``take`` at the same indices.

Banks: the scratch is swizzled. Element column ``c`` of row ``r`` is kept
at column ``c ^ ((r & M) << 3)``, ``M = 3`` for 32-bit types (a 64-bit
access is served by half-warps: 4 rows x 4 lanes x 2 words; the XOR puts
the 4 rows on the 4 groups of 8 banks) and ``M = 7`` for 16-bit ones (a
warp's 32-bit accesses: 8 rows x 4 lanes; the XOR puts the 8 rows on the
8 groups of 4 banks). Every mapping above sends 4 (or 8) consecutive rows
to rows that differ in their low bits, so loads are conflict-free too:
one write and one read pass of the block at the ideal wavefront count
(where a row is a multiple of 128 bytes; narrower rows only conflict).

Synchronization: a warpgroup barrier before the stores (earlier reads of
the scratch by this warpgroup are done), between stores and loads (every
write is visible), and after the loads (every read is done before the
scratch is reused). Each Pallas warpgroup uses a slice of its own, at the
same stride as ``take``'s (:func:`smalti.vocabulary.smem_transpose.slice_stride`),
so warpgroup barriers suffice; the estimate is ``take``'s (one block per
warpgroup).

The body is a ``plgpu.inline_mgpu`` function whose scratch is a view of
the kernel's dynamic SMEM at the offset the rule reserved (Pallas' scratch
starts there), so it lowers under jax's pipeline and smalti's alike.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax._src import core as jax_core
from jax._src.interpreters import mlir
from jax._src.lib.mlir import ir
from jax._src.lib.mlir.dialects import arith, gpu, memref, vector
from jax._src.pallas.mosaic_gpu import lowering as pallas_lowering
from jax.experimental.mosaic.gpu import fragmented_array as fa
from jax.experimental.mosaic.gpu import utils as mgpu_utils

from smalti.vocabulary import lanes, smem_transpose
from smalti.vocabulary.annotations import Aval, Lowered, Operand, PallasContext

__all__ = ["permute", "row_permute_p", "fits", "classify", "RowMap", "Scratch", "scratch_for",
           "permute_registers", "map_rows", "store_block", "swizzle", "in_registers",
           "own_row"]

row_permute_p = jax_core.Primitive("smalti_row_permute")


def permute(x: jax.Array, rows: Sequence[int], fill: float | int | None = None) -> jax.Array:
    """``x[rows, :]`` for a static ``rows`` as long as ``x``'s first axis
    (each in ``[0, x.shape[0])``, or ``-1`` for the scalar ``fill``) of a
    2-D ``x``: through SMEM a vector per register where :func:`fits`, a
    ``take`` otherwise."""
    x = jnp.asarray(x)
    rows = tuple(int(r) for r in rows)
    n = x.shape[0] if x.ndim else 0
    if x.ndim != 2 or len(rows) != n or any(
            not (0 <= r < n or (r == -1 and fill is not None)) for r in rows):
        raise ValueError(f"rows.permute: rows must be {n} indices in [0, {n}) (or -1 with a "
                         f"fill) of a 2-D array's first axis, got {len(rows)} for shape "
                         f"{x.shape}")
    if rows == tuple(range(n)):
        return x
    if fill is not None and all(r == -1 for r in rows):
        return jnp.full(x.shape, fill, x.dtype)
    if not lanes.registers_allowed():
        return _take_f(x, rows=rows, fill=fill)
    return row_permute_p.bind(x, rows=rows, fill=fill)


@dataclass(frozen=True)
class RowMap:
    """Output row ``r`` reads ``r ^ mask`` (``sign == 0``) or
    ``sign * r + offset``, modulo the rows where ``wrap``, else nothing
    (the fill) where that falls outside."""

    sign: int
    offset: int = 0
    mask: int = 0
    wrap: bool = True

    def source(self, r: int, n: int) -> int:
        if self.sign == 0:
            return r ^ self.mask
        s = self.sign * r + self.offset
        return s % n if self.wrap or 0 <= s < n else -1


def classify(rows: Sequence[int]) -> RowMap | None:
    """The :class:`RowMap` that ``rows`` is, or None."""
    n = len(rows)
    candidates = [RowMap(0, mask=rows[0])] if rows[0] >= 0 else []
    for sign in (1, -1):
        first = next((r for r in range(n) if rows[r] >= 0), None)
        if first is not None:
            offset = rows[first] - sign * first
            candidates += [RowMap(sign, offset % n), RowMap(sign, offset, wrap=False)]
    for m in candidates:
        if all(m.source(r, n) == rows[r] for r in range(n)):
            return m
    return None


def fits(aval: Aval, x: ir.Value | None = None) -> bool:
    """Whether the SMEM path moves ``aval``'s rows: what
    :func:`smalti.vocabulary.lanes.fits` asks (WGMMA's layout can hold it)."""
    return lanes.fits(aval, x)


@row_permute_p.def_abstract_eval
def _abstract_eval(x: Aval, *, rows: tuple[int, ...], fill: Any) -> Aval:
    del rows, fill
    return jax_core.ShapedArray(x.shape, x.dtype)


def _impl(x: jax.Array, *, rows: tuple[int, ...], fill: Any) -> jax.Array:
    index = np.asarray(rows, np.int32)
    taken = jnp.take(x, np.maximum(index, 0), axis=0)
    if fill is None:
        return taken
    return jnp.where((index >= 0)[:, None], taken, jnp.asarray(fill, x.dtype))


row_permute_p.def_impl(_impl)
mlir.register_lowering(row_permute_p, mlir.lower_fun(_impl, multiple_results=False))


def _take_f(x: jax.Array, *, rows: tuple[int, ...], fill: Any = None) -> jax.Array:
    """The same through ``take``: row indices as iota arithmetic (a kernel
    cannot capture a constant array), a select per run of rows."""
    from smalti.vocabulary.movement import take

    n, cols = x.shape
    source = lanes._source_columns(n, x.shape, rows, axis=0)
    valid = source >= 0
    linear = jnp.maximum(source, 0) * cols + jax.lax.broadcasted_iota(jnp.int32, x.shape, 1)
    taken = take(x, linear)
    if fill is None:
        return taken
    return jnp.where(valid, taken, jnp.asarray(fill, x.dtype))


# --- Pallas lowering ------------------------------------------------------------------------


def scratch_for(ctx: PallasContext, aval: Aval) -> Scratch | None:
    """This warpgroup's slice of the reserved scratch for a block of
    ``aval``, or None where the kernel reserved too little (then ``take``,
    which refuses with the reason)."""
    module_ctx = ctx.module_ctx
    count = smem_transpose.warpgroups(module_ctx.axis_names, module_ctx.mesh_info)
    nbytes = int(aval.size) * np.dtype(aval.dtype).itemsize
    free = module_ctx.smem_requested_bytes - module_ctx.smem_used_bytes
    stride = smem_transpose.slice_stride(module_ctx, count)
    if free < count * nbytes or (count > 1 and stride < nbytes):
        return None
    return Scratch(module_ctx.smem_used_bytes, stride if count > 1 else 0)


def lower(ctx: PallasContext, x: Operand, *, rows: tuple[int, ...], fill: Any) -> Lowered:
    """Through SMEM (or in registers) where :func:`fits`, the mapping is a
    :class:`RowMap` and the warpgroup's scratch slice is free; ``take``
    otherwise."""
    [aval] = ctx.avals_in
    mapping = classify(rows)
    scratch = scratch_for(ctx, aval)
    if mapping is None or not fits(aval, x) or (scratch is None and not in_registers(mapping)):
        return pallas_lowering._lower_fun(
            lambda v: _take_f(v, rows=rows, fill=fill))(ctx, x)
    return lanes.on_registers(ctx, x, aval.shape,
                              lambda value: permute_registers(value, mapping, fill, scratch))



# --- the SMEM round trip --------------------------------------------------------------------


@dataclass(frozen=True)
class Scratch:
    """Where a warpgroup's slice starts: ``offset`` bytes into dynamic SMEM
    (the kernel's scratch), plus ``stride`` per warpgroup index."""

    offset: int
    stride: int

    def view(self, shape: tuple[int, ...], element: ir.Type) -> ir.Value:
        """This warpgroup's slice as a Lane-level memref of ``shape``."""
        index = ir.IndexType.get()
        byte_offset = mgpu_utils.c(self.offset, index)
        if self.stride:
            wg = arith.index_cast(index, mgpu_utils.warpgroup_idx(sync=False))
            byte_offset = arith.addi(byte_offset,
                                     arith.muli(wg, mgpu_utils.c(self.stride, index)))
        smem = gpu.dynamic_shared_memory(ir.MemRefType.get(
            (mgpu_utils.DYNAMIC,), ir.IntegerType.get_signless(8),
            memory_space=mgpu_utils.smem()))
        return memref.view(ir.MemRefType.get(shape, element, memory_space=mgpu_utils.smem()),
                           smem, byte_offset, [])


def swizzle_mask(cols: int, itemsize: int) -> int:
    """``M`` of the module docstring, as far as the row's width allows (the
    XOR must stay within the row)."""
    m = 3 if itemsize == 4 else 7
    while m and cols % (8 * (m + 1)):
        m >>= 1
    return m


WARP_ROW_BITS = 0x30  # the bits of a row that name its warp (16 w)
#: the bits of a row that the thread holding it gives (``16 w + l // 4``);
#: bit 3 and bits 6+ are its register's
THREAD_ROW_BITS = 0x37


def in_registers(mapping: RowMap) -> bool:
    """Whether the rows ``mapping`` reads are in the same warp: ``r ^ m``
    with ``m`` not touching the warp's bits (lane shuffles, register moves)."""
    return mapping.sign == 0 and not mapping.mask & WARP_ROW_BITS


def _xor_rows_registers(x: fa.FragmentedArray, mask: int) -> fa.FragmentedArray:
    """``x[r ^ mask]`` within warps: row bits 0-2 are the lane's bits 2-4
    (a ``shfl.bfly`` per word), bit 3 the register row and bits 6+ the
    row group (register moves)."""
    regs = x.registers
    out = np.empty_like(regs)
    for idx in np.ndindex(regs.shape):
        source = list(idx)
        source[0] ^= mask >> 6
        source[4] ^= (mask >> 3) & 1
        value = regs[tuple(source)]
        out[idx] = mgpu_utils.shfl_bfly(value, (mask & 7) << 2) if mask & 7 else value
    return fa.FragmentedArray(_registers=out, _layout=x.layout, _is_signed=x.is_signed)


def permute_registers(x: fa.FragmentedArray, mapping: RowMap, fill: Any,
                      scratch: Scratch | None) -> fa.FragmentedArray:
    """``x[rows, :]`` of a WGMMA-layout array (the module docstring's
    method); ``scratch`` may be None where :func:`in_registers`."""
    if in_registers(mapping):
        return _xor_rows_registers(x, mapping.mask)
    assert scratch is not None, "a move across warps without scratch"
    regs = x.registers  # (rows / 64, cols / 8, 1, 1, 2, 1, 1, 1, 1) of vector<2 x T>
    n, cols = x.shape
    pair = ir.VectorType(regs.flat[0].type)
    element = pair.element_type
    itemsize = mgpu_utils.bitwidth(element) // 8
    index = ir.IndexType.get()

    def c(v: int) -> ir.Value:
        return mgpu_utils.c(v, index)

    place = ThreadPlace.here()
    own = place.own
    m = swizzle_mask(cols, itemsize)
    view = scratch.view((n, cols), element)
    groups = row_groups(regs)
    # the rows read: the thread's part, then per register row a constant
    if mapping.sign == 0:
        thread_bits = THREAD_ROW_BITS
        source_own = arith.xori(own, c(mapping.mask & thread_bits)) \
            if mapping.mask & thread_bits else own
        source_row = {(g, h): xor_const(source_own,
                                        (64 * g + 8 * h) ^ (mapping.mask & ~thread_bits))
                      for g, h in groups}
        valid: dict[tuple[int, int], ir.Value] = {}
    else:
        sign_own = own if mapping.sign > 0 else arith.subi(c(0), own)
        source_row, valid = {}, {}
        for g, h in groups:
            raw = _plus(sign_own, mapping.sign * (64 * g + 8 * h) + mapping.offset)
            source_row[(g, h)] = _wrapped(raw, n)
            if not mapping.wrap:
                valid[(g, h)] = arith.andi(
                    arith.cmpi(arith.CmpIPredicate.sge, raw, c(0)),
                    arith.cmpi(arith.CmpIPredicate.slt, raw, c(n)))
        source_own = source_row[groups[0]]  # every row's low bits are its thread's
    load_cols = swizzled_columns(source_own, place.lane_cols, m, regs.shape[1])

    store_block(regs, view, place, m)
    out = np.empty_like(regs)
    filler = None
    if valid:
        scalar = mgpu_utils.c(float(fill) if isinstance(element, ir.FloatType) else int(fill),
                              element)
        filler = vector.broadcast(pair, scalar)
    for idx in np.ndindex(regs.shape):
        g, j, h = idx[0], idx[1], idx[4]
        loaded = vector.load(pair, view, [source_row[(g, h)], load_cols[j]])
        if valid:
            loaded = arith.select(valid[(g, h)], loaded, filler)
        out[idx] = loaded
    mgpu_utils.warpgroup_barrier()  # every read is done before the scratch is reused
    return fa.FragmentedArray(_registers=out, _layout=x.layout, _is_signed=x.is_signed)


def store_block(regs: np.ndarray, view: ir.Value, place: ThreadPlace, m: int) -> None:
    """Every register of a WGMMA-layout array (``regs``) at its place in the
    swizzled scratch ``view`` (column ``c`` of row ``r`` at ``c ^ ((r & m)
    << 3)``), between warpgroup barriers: earlier reads of the scratch are
    done before the first store, every store is visible after the last."""
    natural = natural_rows(place.own, regs)
    columns = swizzled_columns(place.own, place.lane_cols, m, regs.shape[1])
    mgpu_utils.warpgroup_barrier()
    for idx in np.ndindex(regs.shape):
        vector.store(regs[idx], view, [natural[(idx[0], idx[4])], columns[idx[1]]])
    mgpu_utils.warpgroup_barrier()


def map_rows(x: fa.FragmentedArray, out_rows: int, source: Callable[[ir.Value], ir.Value],
             scratch: Scratch) -> fa.FragmentedArray:
    """The WGMMA-layout array of ``out_rows`` rows whose row ``R`` is ``x``'s
    row ``source(R)`` (``R`` and the result: index values; ``source`` emits
    the arithmetic, once per register row of the result): the SMEM round
    trip of :func:`permute_registers` for row maps that change the height
    (repeats and interleaves of rows)."""
    regs = x.registers
    n, cols = x.shape
    element = ir.VectorType(regs.flat[0].type).element_type
    m = swizzle_mask(cols, mgpu_utils.bitwidth(element) // 8)
    place = ThreadPlace.here()
    view = scratch.view((n, cols), element)
    out = np.empty((out_rows // 64, *regs.shape[1:]), dtype=object)
    store_block(regs, view, place, m)
    for g, h in row_groups(out):
        row = source(xor_const(place.own, 64 * g + 8 * h))
        load_cols = swizzled_columns(row, place.lane_cols, m, regs.shape[1])
        for idx in np.ndindex(out.shape):
            if (idx[0], idx[4]) == (g, h):
                out[idx] = vector.load(regs.flat[0].type, view, [row, load_cols[idx[1]]])
    mgpu_utils.warpgroup_barrier()  # every read is done before the scratch is reused
    return fa.FragmentedArray(_registers=out, _layout=x.layout, _is_signed=x.is_signed)


@dataclass(frozen=True)
class ThreadPlace:
    """Where this thread's registers sit in a WGMMA-layout block (index
    values): ``tid`` its index in the warpgroup, ``own`` its row in each
    register's row group (``16 w + l // 4``), ``lane_cols`` its first
    column in each register column (``2 (l % 4)``)."""

    tid: ir.Value
    own: ir.Value
    lane_cols: ir.Value

    @staticmethod
    def here() -> ThreadPlace:
        index = ir.IndexType.get()
        tid = arith.andi(arith.index_cast(index, mgpu_utils.thread_idx()),
                         mgpu_utils.c(mgpu_utils.WARPGROUP_SIZE - 1, index))
        lane_cols = arith.shli(arith.andi(tid, mgpu_utils.c(3, index)), mgpu_utils.c(1, index))
        return ThreadPlace(tid, own_row(tid), lane_cols)


def row_groups(regs: np.ndarray) -> list[tuple[int, int]]:
    """The (row group ``g``, register row ``h``) of a WGMMA-layout register array."""
    return sorted({(idx[0], idx[4]) for idx in np.ndindex(regs.shape)})


def natural_rows(own: ir.Value, regs: np.ndarray) -> dict[tuple[int, int], ir.Value]:
    """Each (g, h)'s row of this thread, ``own + 64 g + 8 h`` (disjoint bits)."""
    return {(g, h): xor_const(own, 64 * g + 8 * h) for g, h in row_groups(regs)}


def swizzled_columns(row: ir.Value, lane_cols: ir.Value, m: int, count: int
                     ) -> dict[int, ir.Value]:
    """Each register column's element column ``(8 j + 2 q) ^ ((row & m) << 3)``
    (the module docstring's swizzle) for rows whose low bits ``row`` has."""
    base = arith.ori(swizzle(row, m), lane_cols) if m else lane_cols
    return {j: xor_const(base, 8 * j) for j in range(count)}


def swizzle(row: ir.Value, m: int) -> ir.Value:
    """``(row & m) << 3``: what row ``row``'s element columns are xored
    with (the module docstring's swizzle; ``m`` nonzero)."""
    index = ir.IndexType.get()
    return arith.shli(arith.andi(row, mgpu_utils.c(m, index)), mgpu_utils.c(3, index))


def xor_const(v: ir.Value, k: int) -> ir.Value:
    """``v ^ k`` (``v`` itself for 0); ``v + k`` where their bits are disjoint."""
    return arith.xori(v, mgpu_utils.c(k, v.type)) if k else v


def own_row(tid: ir.Value) -> ir.Value:
    """This thread's row in each register's row group, ``16 w + l // 4``, of
    the thread index ``tid`` (index or i32: the result has its type)."""
    def c(v: int) -> ir.Value:
        return mgpu_utils.c(v, tid.type)

    warp_row = arith.shli(arith.andi(arith.shrui(tid, c(5)), c(3)), c(4))
    return arith.ori(warp_row, arith.andi(arith.shrui(tid, c(2)), c(7)))


def _plus(v: ir.Value, k: int) -> ir.Value:
    return arith.addi(v, mgpu_utils.c(k, ir.IndexType.get())) if k else v


def _wrapped(v: ir.Value, n: int) -> ir.Value:
    """``v mod n`` for ``v`` in ``(-2 n, 2 n)``: a mask for a power of two."""
    index = ir.IndexType.get()
    if n & (n - 1) == 0:
        return arith.andi(v, mgpu_utils.c(n - 1, index))
    return arith.remui(arith.addi(v, mgpu_utils.c(2 * n, index)), mgpu_utils.c(n, index))
