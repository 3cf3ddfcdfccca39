"""Work-efficient scans of 2-D blocks: ``scan(x, kind, reverse, axis)`` is
the inclusive ``cumsum`` (``kind="add"``), ``cumprod`` (``"mul"``),
``cummax`` (``"max"``) or ``cummin`` (``"min"``) along ``axis`` of a block of
a 32-bit type, with about two combining operations per element along the
minor axis (one along the rows) instead of Hillis--Steele's ``log2 n``.

Why a round trip: in WGMMA's layout a row's columns are spread over the
four lanes of a quad in pairs (column ``8 j + 2 q + b`` in lane ``q``), so
no lane holds a run of consecutive columns to scan on its own. Through the
scratch each lane gets one: lane ``q`` of the quad holding row ``r`` takes
columns ``[q n / 4, (q + 1) n / 4)`` of it.

How, for the warpgroup, between warpgroup barriers (a scratch slice per
Pallas warpgroup, as ``take``'s):

1. every thread stores its registers (``vector<2 x T>``, WGMMA's layout);
2. every thread loads its quarter of each of its rows in 16-byte vectors,
   scans it sequentially (``n / 4 - 1`` combines), and the quad combines
   the four quarters' totals into each lane's exclusive prefix (two
   shuffle rounds, ``shfl.sync`` within the quad, and one more to shift
   by a lane); each element then combines that prefix with its own
   (``n / 4`` combines), and the quarter is stored back in place;
3. every thread loads its registers back in WGMMA's layout.

``reverse=True`` scans each quarter from its end and takes the prefix
from the lanes after it. About ``2 + 3 s / 8`` instructions per element
for ``s``-byte elements in memory (four vector accesses of the block), and
two combines: issue 37's work-efficient scan.

Banks: logical 16-byte chunk ``c`` of row ``r`` (in quarter ``s = c // (n
/ 16)``) is kept at chunk ``c ^ X``, ``X = (s ^ (r & 2)) | ((r & 1) << 2)``:
the 8 lanes of a quarter-warp's 16-byte loads (two rows, four quarters)
and the 16 lanes of a half-warp's 8-byte stores (four rows, two chunks)
then meet 8 distinct groups of 4 banks, for rows of 32 to 256 elements
(found by search over such XORs; the profiler's wavefront counts in the
tests hold it).

Accuracy: element ``i`` of a quarter is ``P ⊕ (x_0 ⊕ ... ⊕ x_i)`` (the
quarter's elements in order, then the prefix ``P`` of the quarters before,
itself a tree of depth 2 over their totals), so a float sum's error is at
most ``(n / 4 + 2) u sum |x_j|`` -- another order than Hillis--Steele's
(bound ``ceil(log2 n) u sum |x_j|``), still well inside a sequential
sum's ``i u sum |x_j|``; a product's is ``i u |prod|`` to first order, as
any order's; max and min are exact.

Along the rows (``axis=0``) the round trip is simpler: after the stores,
thread ``t`` of the warpgroup scans columns ``t, t + 128, ...`` itself,
one scalar load, combine and store per element (a warp's lanes touch 32
consecutive words of a row: one wavefront), so every element is a
sequential scan of its column: exact for integers and extrema, a float
sum within ``i u sum |x_j|``. About ``4.5`` instructions per element in
f32, one combine, two passes of the block.

Where it applies (:func:`fits`): the register paths' conditions
(:func:`smalti.vocabulary.lanes.fits`), a 32-bit type, and rows of 32, 64,
128 or 256 elements (along the rows: a multiple of 128 columns); elsewhere,
and where the kernel's scratch is short, the scan is Hillis--Steele's
(:func:`smalti.vocabulary.scans.scan`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax._src import core as jax_core
from jax._src.interpreters import mlir
from jax._src.lib.mlir import ir
from jax._src.lib.mlir.dialects import arith, memref, vector
from jax._src.pallas.mosaic_gpu import lowering as pallas_lowering
from jax.experimental.mosaic.gpu import fragmented_array as fa
from jax.experimental.mosaic.gpu import utils as mgpu_utils

from smalti.vocabulary import lanes
from smalti.vocabulary import rows as row_moves
from smalti.vocabulary.annotations import Aval, Lowered, Operand, PallasContext
from smalti.vocabulary.rows import xor_const

__all__ = ["scan", "lane_scan_p", "fits", "KINDS"]

lane_scan_p = jax_core.Primitive("smalti_lane_scan")

#: kind -> the jnp combine (for the fallback and the CPU)
KINDS: dict[str, Callable[[jax.Array, jax.Array], jax.Array]] = {
    "add": lax.add, "mul": lax.mul, "max": lax.max, "min": lax.min,
}
ROW_LENGTHS = (32, 64, 128, 256)
#: 16-bit floats: rows of 64 to 256 (16 to 64 words: runs of 2 to 8 chunks,
#: which the pairs' swizzle keeps conflict-free).
PAIR_ROW_LENGTHS = (64, 128, 256)
SIXTEEN_BIT_FLOATS = (np.dtype(jnp.float16), np.dtype(jnp.bfloat16))


def identity(kind: str, dtype: Any) -> float | int:
    """``e`` with ``combine(e, v) == v`` bit for bit: the scans' own
    (:func:`smalti.vocabulary.scans.identity`; ``-0.0`` for float sums)."""
    from smalti.vocabulary.scans import LANE_SCAN_KINDS
    from smalti.vocabulary.scans import identity as scan_identity

    name = {k: n for n, k in LANE_SCAN_KINDS.items()}[kind]
    value = scan_identity(name, np.dtype(dtype))
    assert value is not None, f"no identity of {name} for {dtype}: scan() refuses those"
    return value


def scan(x: jax.Array, kind: str, *, reverse: bool = False, axis: int = 1) -> jax.Array:
    """The inclusive scan along ``axis`` of the 2-D ``x`` (see the module
    docstring); Hillis--Steele's where the register paths are not allowed."""
    if kind not in KINDS:
        raise ValueError(f"lane_scan.scan: kind must be one of {sorted(KINDS)}, got {kind!r}")
    if x.ndim != 2 or axis not in (0, 1):
        raise ValueError(f"lane_scan.scan: a 2-D block and axis 0 or 1, got shape {x.shape} "
                         f"and axis {axis}")
    if not lanes.registers_allowed():
        return _fallback(x, kind=kind, reverse=reverse, axis=axis)
    return lane_scan_p.bind(x, kind=kind, reverse=bool(reverse), axis=int(axis))


def _fallback(x: jax.Array, *, kind: str, reverse: bool, axis: int) -> jax.Array:
    from smalti.vocabulary.scans import scan as hillis_steele

    if np.dtype(x.dtype) in SIXTEEN_BIT_FLOATS:  # in f32 (the 32-bit round trip), rounded once
        return scan(x.astype(jnp.float32), kind, reverse=reverse, axis=axis).astype(x.dtype)

    return hillis_steele(x, KINDS[kind], axis=axis, reverse=reverse,
                         fill=identity(kind, x.dtype))


def fits(aval: Aval, x: ir.Value | None = None, axis: int = 1) -> bool:
    """Whether the round trip scans ``aval`` along ``axis`` (see the module
    docstring): 32-bit types, and 16-bit floats along the minor axis."""
    dtype = np.dtype(aval.dtype)
    if not lanes.fits(aval, x):
        return False
    cols = aval.shape[1]
    if dtype in SIXTEEN_BIT_FLOATS and axis == 1:
        return cols in PAIR_ROW_LENGTHS
    if dtype.itemsize != 4 and dtype not in SIXTEEN_BIT_FLOATS:
        return False
    return cols in ROW_LENGTHS if axis == 1 else cols % mgpu_utils.WARPGROUP_SIZE == 0


@lane_scan_p.def_abstract_eval
def _abstract_eval(x: Aval, *, kind: str, reverse: bool, axis: int) -> Aval:
    del kind, reverse, axis
    return jax_core.ShapedArray(x.shape, x.dtype)


def _impl(x: jax.Array, *, kind: str, reverse: bool, axis: int) -> jax.Array:
    if np.dtype(x.dtype) in SIXTEEN_BIT_FLOATS:  # computed in f32, rounded once
        return _impl(x.astype(jnp.float32), kind=kind, reverse=reverse, axis=axis
                     ).astype(x.dtype)
    return lax.associative_scan(KINDS[kind], x, reverse=reverse, axis=axis)


lane_scan_p.def_impl(_impl)
mlir.register_lowering(lane_scan_p, mlir.lower_fun(_impl, multiple_results=False))


def lower(ctx: PallasContext, x: Operand, *, kind: str, reverse: bool, axis: int) -> Lowered:
    """The round trip where :func:`fits` and the scratch slice is free;
    Hillis--Steele otherwise."""
    [aval] = ctx.avals_in
    scratch = row_moves.scratch_for(ctx, aval)
    if scratch is None or not fits(aval, x, axis):
        return pallas_lowering._lower_fun(
            lambda v: _fallback(v, kind=kind, reverse=reverse, axis=axis))(ctx, x)
    if np.dtype(aval.dtype) in SIXTEEN_BIT_FLOATS:
        pairs = _scan_pairs if axis == 1 else _scan_word_columns
        return lanes.on_registers(ctx, x, aval.shape,
                                  lambda value: pairs(value, kind, reverse, scratch))
    if axis == 0:
        return lanes.on_registers(ctx, x, aval.shape,
                                  lambda value: _scan_columns(value, kind, reverse, scratch))
    return lanes.on_registers(ctx, x, aval.shape,
                              lambda value: _scan_registers(value, kind, reverse, scratch))


# --- the round trip ----------------------------------------------------------------------------


def combiner(kind: str, element: ir.Type, signed: bool | None
              ) -> Callable[[ir.Value, ir.Value], ir.Value]:
    floating = isinstance(element, ir.FloatType)
    if kind == "add":
        return arith.addf if floating else arith.addi
    if kind == "mul":
        return arith.mulf if floating else arith.muli
    if kind == "max":  # floats: IEEE 754-2019 maximum, as lax.max (PTX max.NaN.f32)
        return arith.maximumf if floating else arith.maxsi if signed is not False else arith.maxui
    return arith.minimumf if floating else arith.minsi if signed is not False else arith.minui


def _scan_registers(x: fa.FragmentedArray, kind: str, reverse: bool,
                    scratch: row_moves.Scratch) -> fa.FragmentedArray:
    regs = x.registers  # (rows / 64, cols / 8, 1, 1, 2, 1, 1, 1, 1) of vector<2 x T>
    n, cols = x.shape
    pair = ir.VectorType(regs.flat[0].type)
    element = pair.element_type
    quad_vector = ir.VectorType.get((4,), element)
    index = ir.IndexType.get()
    combine = combiner(kind, element, x.is_signed)
    floating = isinstance(element, ir.FloatType)
    fill = identity(kind, np.float32 if floating else
                    np.uint32 if x.is_signed is False else np.int32)
    if x.is_signed is False:  # u32 bits as a signless constant
        fill = int(np.array(fill, np.uint32).view(np.int32))

    def c(v: int) -> ir.Value:
        return mgpu_utils.c(v, index)

    place = row_moves.ThreadPlace.here()
    own = place.own
    q = arith.andi(place.tid, c(3))
    quarter = cols // 4  # elements per lane's run
    chunks = quarter // 4  # 16-byte chunks per run
    view = scratch.view((n, cols), element)

    # X of the module docstring for this thread's rows (their low bits are its own)
    row_bit_1 = arith.andi(own, c(2))
    row_bit_0 = arith.shli(arith.andi(own, c(1)), c(2))

    def swizzle(segment: ir.Value | int) -> ir.Value:
        s = c(segment) if isinstance(segment, int) else segment
        return arith.ori(arith.xori(s, row_bit_1), row_bit_0)

    # WGMMA-layout columns: (8 j + 2 q) ^ 4 X(quarter of 8 j)
    by_quarter = {s: arith.xori(place.lane_cols, arith.shli(swizzle(s), c(2)))
                  for s in sorted({8 * j // quarter for j in range(regs.shape[1])})}
    pair_cols = {j: xor_const(by_quarter[8 * j // quarter], 8 * j)
                 for j in range(regs.shape[1])}
    groups = row_moves.row_groups(regs)
    rows = row_moves.natural_rows(own, regs)
    # the run's chunks: 4 (q chunks + k) ^ 4 X(q)
    run_base = arith.xori(arith.muli(q, c(4 * chunks)), arith.shli(swizzle(q), c(2)))
    run_cols = [xor_const(run_base, 4 * k) for k in range(chunks)]

    mgpu_utils.warpgroup_barrier()  # earlier reads of the scratch are done
    for idx in np.ndindex(regs.shape):
        g, j, h = idx[0], idx[1], idx[4]
        vector.store(regs[idx], view, [rows[(g, h)], pair_cols[j]])
    mgpu_utils.warpgroup_barrier()  # every write is visible to the warpgroup

    quad = lanes.Quad()
    order = list(range(quarter))[::-1] if reverse else list(range(quarter))
    for g, h in groups:
        loaded = [vector.load(quad_vector, view, [rows[(g, h)], col]) for col in run_cols]
        values = [lanes.extract(v, i) for v in loaded for i in range(4)]
        prefix: list[ir.Value] = list(values)
        for before, i in zip(order, order[1:]):  # the run, in scan order
            prefix[i] = combine(prefix[before], values[i])
        offset = _exclusive_in_quad(quad, prefix[order[-1]], combine, reverse, element, fill)
        done = [combine(offset, p) for p in prefix]
        for k, col in enumerate(run_cols):
            vector.store(vector.from_elements(quad_vector, done[4 * k:4 * k + 4]), view,
                         [rows[(g, h)], col])
    mgpu_utils.warpgroup_barrier()  # every run is back
    out = np.empty_like(regs)
    for idx in np.ndindex(regs.shape):
        g, j, h = idx[0], idx[1], idx[4]
        out[idx] = vector.load(pair, view, [rows[(g, h)], pair_cols[j]])
    mgpu_utils.warpgroup_barrier()  # every read is done before the scratch is reused
    return fa.FragmentedArray(_registers=out, _layout=x.layout, _is_signed=x.is_signed)


def _scan_pairs(x: fa.FragmentedArray, kind: str, reverse: bool,
                scratch: row_moves.Scratch) -> fa.FragmentedArray:
    """The round trip of a 16-bit float block along its minor axis, in
    32-bit words (a register's two elements, consecutive columns): each
    register is stored as one word (a warp's 32 lanes: 8 rows of 4 words),
    each lane loads its quarter of the row in 16-byte chunks, scans it --
    sums and products in float32, rounded to the 16-bit type once at the
    end; maxima and minima in the 16-bit type, exact -- stores it back, and
    the registers are loaded back. Logical chunk ``c`` of row ``r`` in
    quarter ``s`` is kept at chunk ``c ^ s ^ bitrev3(r & 7)``: the 8 rows of a
    warp's word stores meet 8 distinct groups of 4 banks, and the 8 lanes of
    a quarter-warp's 16-byte accesses (two rows, four quarters) too (found
    by search over such XORs for runs of 2, 4 and 8 chunks)."""
    regs = x.registers  # (rows / 64, cols / 8, 1, 1, 2, 1, 1, 1, 1) of vector<2 x T>
    n, cols = x.shape
    pair = ir.VectorType(regs.flat[0].type)
    element = pair.element_type
    i32 = ir.IntegerType.get_signless(32)
    index = ir.IndexType.get()
    exact = kind in ("max", "min")  # extrema of 16-bit values are 16-bit values
    compute = element if exact else ir.F32Type.get()
    combine = combiner(kind, compute, True)
    fill = identity(kind, np.float32)
    chunk = ir.VectorType.get((4,), i32)  # 16 bytes: 8 elements
    run = cols // 4  # elements per lane's run: a quarter of the row
    chunks = run // 8  # chunks per run

    def c(v: int) -> ir.Value:
        return mgpu_utils.c(v, index)

    place = row_moves.ThreadPlace.here()
    own = place.own
    q = arith.andi(place.tid, c(3))
    # 4 bitrev3(own & 7): bit 0 of the row to bit 2 of the chunk and back
    flipped = arith.ori(arith.ori(arith.andi(arith.shrui(own, c(2)), c(1)), arith.andi(own, c(2))),
                        arith.shli(arith.andi(own, c(1)), c(2)))
    view = scratch.view((n, cols // 2), i32)
    # register j (word 4 j + q, chunk j, quarter j // chunks) at 4 (j ^ s ^ R) + q
    word_base = arith.ori(arith.shli(flipped, c(2)), q)
    word_cols = {j: xor_const(word_base, 4 * (j ^ (j // chunks))) for j in range(regs.shape[1])}
    # this lane's run: chunks q chunks + k, at (q chunks + k) ^ q ^ R
    run_base = arith.shli(arith.xori(arith.xori(arith.muli(q, c(chunks)), q), flipped), c(2))
    run_cols = [xor_const(run_base, 4 * k) for k in range(chunks)]
    rows = row_moves.natural_rows(own, regs)

    mgpu_utils.warpgroup_barrier()  # earlier reads of the scratch are done
    for idx in np.ndindex(regs.shape):
        memref.store(_as_word(regs.item(idx)), view, [rows[(idx[0], idx[4])], word_cols[idx[1]]])
    mgpu_utils.warpgroup_barrier()  # every write is visible to the warpgroup

    quad = lanes.Quad()
    eight = ir.VectorType.get((8,), element)
    order = list(range(run))[::-1] if reverse else list(range(run))
    for g, h in row_moves.row_groups(regs):
        loaded = [vector.bitcast(eight, vector.load(chunk, view, [rows[(g, h)], col]))
                  for col in run_cols]
        values = [lanes.extract(v, i) for v in loaded for i in range(8)]
        if not exact:
            values = [arith.extf(compute, v) for v in values]
        prefix: list[ir.Value] = list(values)
        for before, i in zip(order, order[1:]):  # the run, in scan order
            prefix[i] = combine(prefix[before], values[i])
        f32 = ir.F32Type.get()  # the quad's exchange in 32-bit words
        total = prefix[order[-1]]
        offset = _exclusive_in_quad(quad, arith.extf(f32, total) if exact else total,
                                    combiner(kind, f32, True), reverse, f32, fill)
        if exact:
            offset = arith.truncf(element, offset)  # a 16-bit value: exact
        done = [combine(offset, p) for p in prefix]
        if not exact:
            done = [arith.truncf(element, v) for v in done]
        for k, col in enumerate(run_cols):
            stored = vector.from_elements(eight, done[8 * k:8 * k + 8])
            vector.store(vector.bitcast(chunk, stored), view, [rows[(g, h)], col])
    mgpu_utils.warpgroup_barrier()  # every run is back
    out = np.empty_like(regs)
    for idx in np.ndindex(regs.shape):
        word = memref.load(view, [rows[(idx[0], idx[4])], word_cols[idx[1]]])
        out[idx] = _as_pair(word, pair)
    mgpu_utils.warpgroup_barrier()  # every read is done before the scratch is reused
    return fa.FragmentedArray(_registers=out, _layout=x.layout, _is_signed=x.is_signed)


def _as_word(register: ir.Value) -> ir.Value:
    """A register of two 16-bit elements as one i32 word (no instruction)."""
    i32 = ir.IntegerType.get_signless(32)
    return lanes.extract(vector.bitcast(ir.VectorType.get((1,), i32), register), 0)


def _as_pair(word: ir.Value, pair: ir.Type) -> ir.Value:
    """An i32 word as a register of two 16-bit elements (no instruction)."""
    return vector.bitcast(pair, vector.broadcast(ir.VectorType.get((1,), word.type), word))


def _exclusive_in_quad(quad: lanes.Quad, total: ir.Value, combine: Callable[..., ir.Value],
                       reverse: bool, element: ir.Type, fill: float | int) -> ir.Value:
    """The combination of the runs before this lane's in the quad (after it,
    ``reverse``): an inclusive Hillis--Steele over the four totals, then a
    shift by one lane with the identity shifted in."""
    i32 = ir.IntegerType.get_signless(32)

    def shuffled(v: ir.Value, d: int) -> tuple[ir.Value, ir.Value]:
        """``v`` of lane ``q - d`` (``q + d``), and whether there is one."""
        sources = tuple(min(max(q + (d if reverse else -d), 0), lanes.QUAD - 1)
                        for q in range(lanes.QUAD))
        valid = frozenset(q for q in range(lanes.QUAD)
                          if 0 <= q + (d if reverse else -d) < lanes.QUAD)
        word = quad.shuffle(mgpu_utils.bitcast(v, i32), sources)
        return mgpu_utils.bitcast(word, element), quad.lanes_in(valid)

    inclusive = total
    for d in (1, 2):
        theirs, has = shuffled(inclusive, d)
        inclusive = arith.select(has, combine(theirs, inclusive), inclusive)
    before, has = shuffled(inclusive, 1)
    identity_value = mgpu_utils.c(float(fill) if isinstance(element, ir.FloatType) else int(fill),
                                  element)
    return arith.select(has, before, identity_value)






def _scan_columns(x: fa.FragmentedArray, kind: str, reverse: bool,
                  scratch: row_moves.Scratch) -> fa.FragmentedArray:
    """The scan along the rows: every thread stores its registers (WGMMA's
    layout, swizzled as :mod:`smalti.vocabulary.rows` does), then thread
    ``t`` of the warpgroup scans columns ``t, t + 128, ...`` sequentially
    with scalar loads and stores (a warp's 32 lanes: 32 consecutive
    elements of one row, one wavefront), and the registers are loaded back."""
    regs = x.registers
    n, cols = x.shape
    pair = ir.VectorType(regs.flat[0].type)
    element = pair.element_type
    index = ir.IndexType.get()
    combine = combiner(kind, element, x.is_signed)

    def c(v: int) -> ir.Value:
        return mgpu_utils.c(v, index)

    place = row_moves.ThreadPlace.here()
    view = scratch.view((n, cols), element)
    m = row_moves.swizzle_mask(cols, 4)
    # WGMMA layout, swizzled as rows.py's round trip is
    pair_cols = row_moves.swizzled_columns(place.own, place.lane_cols, m, regs.shape[1])
    rows = row_moves.natural_rows(place.own, regs)

    mgpu_utils.warpgroup_barrier()  # earlier reads of the scratch are done
    for idx in np.ndindex(regs.shape):
        vector.store(regs[idx], view, [rows[(idx[0], idx[4])], pair_cols[idx[1]]])
    mgpu_utils.warpgroup_barrier()  # every write is visible to the warpgroup
    order = range(n - 1, -1, -1) if reverse else range(n)
    for first in range(0, cols, mgpu_utils.WARPGROUP_SIZE):
        column = xor_const(place.tid, first)  # this thread's column, then its place in a row
        placed = {low: xor_const(column, low << 3) for low in range(m + 1)}
        running: ir.Value | None = None
        for r in order:
            where = [c(r), placed[r & m]]
            value = memref.load(view, where)
            running = value if running is None else combine(running, value)
            memref.store(running, view, where)
    mgpu_utils.warpgroup_barrier()  # every column is scanned
    out = np.empty_like(regs)
    for idx in np.ndindex(regs.shape):
        out[idx] = vector.load(pair, view, [rows[(idx[0], idx[4])], pair_cols[idx[1]]])
    mgpu_utils.warpgroup_barrier()  # every read is done before the scratch is reused
    return fa.FragmentedArray(_registers=out, _layout=x.layout, _is_signed=x.is_signed)


def _scan_word_columns(x: fa.FragmentedArray, kind: str, reverse: bool,
                       scratch: row_moves.Scratch) -> fa.FragmentedArray:
    """The scan along the rows of a 16-bit float block, in 32-bit words (a
    register's two elements, two adjacent columns): every register is
    stored as one word, word ``w`` of row ``r`` at ``w ^ ((r & 7) << 2)``
    (a warp's 8 rows of 4 words on 32 distinct banks), then thread ``t`` of
    the warpgroup scans word column ``t`` (and ``t + 128``; the threads
    beyond the row's words skip the loop) sequentially, a word load and
    store per row (a warp's 32 lanes: 32 words of one row, one wavefront),
    both columns at once: maxima and minima in the 16-bit type (a packed
    ``max``/``min`` per word), sums and products in float32, each running
    value rounded once as it is stored; then the registers are loaded back."""
    regs = x.registers
    n, cols = x.shape
    pair = ir.VectorType(regs.flat[0].type)
    i32 = ir.IntegerType.get_signless(32)
    index = ir.IndexType.get()
    exact = kind in ("max", "min")
    compute = pair if exact else ir.VectorType.get((2,), ir.F32Type.get())
    combine = combiner(kind, compute.element_type, True)
    words = cols // 2

    def c(v: int) -> ir.Value:
        return mgpu_utils.c(v, index)

    place = row_moves.ThreadPlace.here()
    view = scratch.view((n, words), i32)
    q = arith.andi(place.tid, c(3))
    # register j of a row is word 4 j + q, kept at (4 j + q) ^ ((r & 7) << 2)
    spread = arith.shli(arith.andi(place.own, c(7)), c(2))
    word_cols = {j: xor_const(arith.ori(spread, q), 4 * j) for j in range(regs.shape[1])}
    rows = row_moves.natural_rows(place.own, regs)
    mgpu_utils.warpgroup_barrier()  # earlier reads of the scratch are done
    for idx in np.ndindex(regs.shape):
        memref.store(_as_word(regs.item(idx)), view, [rows[(idx[0], idx[4])], word_cols[idx[1]]])
    mgpu_utils.warpgroup_barrier()  # every write is visible to the warpgroup
    order = range(n - 1, -1, -1) if reverse else range(n)
    for first in range(0, words, mgpu_utils.WARPGROUP_SIZE):
        column = xor_const(place.tid, first)
        busy = arith.cmpi(arith.CmpIPredicate.ult, column, c(words))
        with mgpu_utils.when(busy):
            placed = {low: xor_const(column, low << 2) for low in range(8)}
            running: ir.Value | None = None
            for r in order:
                where = [c(r), placed[r & 7]]
                value = _as_pair(memref.load(view, where), pair)
                if not exact:
                    value = arith.extf(compute, value)
                running = value if running is None else combine(running, value)
                done = running if exact else arith.truncf(pair, running)
                memref.store(_as_word(done), view, where)
    mgpu_utils.warpgroup_barrier()  # every column is scanned
    out = np.empty_like(regs)
    for idx in np.ndindex(regs.shape):
        out[idx] = _as_pair(memref.load(view, [rows[(idx[0], idx[4])], word_cols[idx[1]]]), pair)
    mgpu_utils.warpgroup_barrier()  # every read is done before the scratch is reused
    return fa.FragmentedArray(_registers=out, _layout=x.layout, _is_signed=x.is_signed)
