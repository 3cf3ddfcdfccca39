"""Static permutations (and other static gathers) of a block's minor axis in
registers: ``permute(x, columns)`` is ``x[..., columns]`` for a static
tuple ``columns`` (output column ``c`` reads input column ``columns[c]``),
with no SMEM at all where the block is in WGMMA's register layout.

Why it is cheap: in Mosaic GPU's WGMMA layout a row's columns live in one
quad of lanes. Column ``c = 8 j + 2 q + b`` is element ``b`` of register
``j`` (a ``vector<2 x T>``) of lane ``q = (c // 2) % 4`` of the quad. So a
thread's output slot ``(j, b)`` reads, for each of the four lanes ``q`` of
its quad, one slot of one lane of the same quad: register moves (free),
quad shuffles (``shfl.sync``) and selects.

How (:func:`route`), per output slot, on 32-bit *words* (a 32-bit element,
or the pair of 16-bit elements of a register, so a 16-bit shuffle moves
two elements):

- the four receivers' sources ``(lane q', word, half)`` are split into
  rounds in which no lane sends two different words (one round for any
  permutation, and wherever receivers share a sender's word: a 16-bit
  interleave's two lanes reading the halves of one word);
- in a round each sender lane sends the word its receiver wants (selects
  on the sender's lane where that word differs between lanes) through one
  ``shfl.sync``: none where every receiver reads its own lane, ``bfly``
  where the lanes are ``q ^ k``, ``idx`` within the quad (segment mask
  ``0x1c``) otherwise;
- a receiver keeps its round's word (a select per extra round) and, for
  16-bit types, its half (a select where the half differs between lanes).

Shuffles and lane predicates are shared between the slots of a row group
(the same word sent along the same lanes is shuffled once). The bitonic
partners ``c ^ m`` cost one shuffle per word where ``m`` has bit 2 or 4
set (the lane's bits), nothing otherwise; a flip one shuffle per word; a
roll by ``8 a + r`` a shuffle and a select per word (none where ``r = 0``).
A sorting network's placement of positions (:func:`relabelling`, the lane
bits on top) goes back to column order as a 4 x 4 transpose of lanes and
registers in two butterfly steps (4 instructions per word, where the
rounds above would take 6.4).
A column ``-1`` is the static ``fill`` (a shift, as the scans use): a
constant, a select where only some lanes of a slot take it.

Inside a rule that decided the register paths apply to its operands
(:func:`for_operands`), iotas of such blocks are built in registers too
(:func:`iota`: an add per register of distinct columns, shared by rows).

Nothing is written to memory, so it is race-free with any number of Pallas
warpgroups, and exact (values only move).

Where it applies (:func:`fits`, decided when the primitive is lowered): a
2-D block of a 16- or 32-bit type, rows a multiple of 64 and columns a
multiple of 8 (WGMMA layout's tile), ``columns`` as long as the row, and
the value not computed from a plain load of global memory (Pallas loads
those in a strided layout that no relayout turns into WGMMA's, see
:func:`smalti.vocabulary.smem_transpose.from_global_memory`). Elsewhere
the primitive is :func:`smalti.vocabulary.movement.take` at the same
indices, so its estimator reserves take's scratch (whether the operand
comes from global memory is only known when it is lowered).

The body is a ``plgpu.inline_mgpu`` function (Pallas lowers it to a
``mosaic_gpu.custom_primitive`` whose operand and result are pinned to
WGMMA's layout), so it lowers under jax's pipeline and smalti's alike.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax._src import core as jax_core
from jax._src.interpreters import mlir
from jax._src.lib import mosaic_gpu_dialect as mgpu_dialect
from jax._src.lib.mlir import ir
from jax._src.lib.mlir.dialects import arith, nvvm, vector
from jax._src.pallas.mosaic_gpu import lowering as pallas_lowering
from jax.experimental.mosaic.gpu import fragmented_array as fa
from jax.experimental.mosaic.gpu import layouts as mgpu_layouts
from jax.experimental.mosaic.gpu import utils as mgpu_utils
from jax.experimental.pallas import mosaic_gpu as plgpu

from smalti.vocabulary import smem_transpose
from smalti.vocabulary.annotations import Aval, EstimatorContext, Lowered, Operand, PallasContext

__all__ = ["permute", "permute_p", "fits", "shifted", "flipped", "xor_partners", "for_operands",
           "iota", "in_registers", "relabelling"]

QUAD = 4  # lanes holding one row of a WGMMA tile
TILE_ROWS, TILE_COLS = 64, 8  # WGMMA layout's tile
#: ``shfl.sync``'s ``c`` operand for shuffles within quads: segment mask
#: 0x1c (lanes differing only in their two low bits), clamp 0x1f.
QUAD_SEGMENT = 0x1C1F

permute_p = jax_core.Primitive("smalti_lane_permute")


def relabelling(n: int) -> tuple[int, ...]:
    """Where (column) a row of ``n`` (a power of two, at least 8) keeps each
    position of the network, so that the positions' two top bits are the
    lane bits of WGMMA's layout (column ``8 j + 2 q + b``: bits 1 and 2) and
    the others the register's and the slot's: position ``b + 2 j' + 2 n / 8
    q`` at column ``8 j' + 2 q + b``. A bitonic network's stages then cross
    lanes (and choose the side by the lane) only where their masks reach the
    top two bits: 5 of 28 stages for 128, against 11 (and 4 more crossing)
    in column order."""
    registers = n // TILE_COLS
    return tuple(TILE_COLS * ((p >> 1) % registers) + 2 * (p // (2 * registers)) + p % 2
                 for p in range(n))


def permute(x: jax.Array, columns: Sequence[int], fill: float | int | None = None
            ) -> jax.Array:
    """``x[..., columns]`` for a static ``columns`` (each in ``[0,
    x.shape[-1])``, or ``-1`` for the scalar ``fill``; as many as the result
    has columns: slices, tiles and repeats are permutes too): in registers
    where :func:`fits` and the result has whole registers (a multiple of 8
    columns), a ``take`` otherwise."""
    x = jnp.asarray(x)
    columns = tuple(int(c) for c in columns)
    n = x.shape[-1]
    if x.ndim not in (1, 2) or not columns or any(
            not (0 <= c < n or (c == -1 and fill is not None)) for c in columns):
        raise ValueError(f"permute: columns must be indices in [0, {n}) (or -1 with a fill) "
                         f"of a 1-D or 2-D array's last axis, got {len(columns)} of them "
                         f"for shape {x.shape}")
    if columns == tuple(range(n)):
        return x
    if not registers_allowed():
        return _take_f(x, columns=columns, fill=fill)
    return permute_p.bind(x, columns=columns, fill=fill)


#: Whether the rule being lowered lets the register paths pin WGMMA's layout
#: (see :func:`for_operands`); ``None`` outside such a rule, where
#: :func:`permute`'s own rule decides from its operand.
_ALLOWED: contextvars.ContextVar[bool | None] = contextvars.ContextVar("smalti_lanes",
                                                                       default=None)


def registers_allowed() -> bool:
    """Whether :func:`permute` (and the other register paths) may be bound."""
    return _ALLOWED.get() is not False


def in_registers(shape: tuple[int, ...], dtype: Any = np.int32) -> bool:
    """Whether a value of ``shape`` computed inside a :func:`for_operands`
    that allows registers is in WGMMA's layout: iotas and slices of it may
    then be built in registers too (:func:`iota`)."""
    return _ALLOWED.get() is True and fits(jax_core.ShapedArray(shape, np.dtype(dtype)))


@contextlib.contextmanager
def for_operands(*operands: Operand) -> Iterator[None]:
    """Within: the register paths are taken only if no operand of the rule
    being lowered comes from a plain load of global memory. Their WGMMA
    layout would otherwise reach that load through the elementwise ops that
    combine the operand with results (a strided load cannot be relaid out),
    so such a rule's decomposition takes ``take`` throughout."""
    token = _ALLOWED.set(_ALLOWED.get() is not False and not any(
        isinstance(v, ir.Value) and smem_transpose.from_global_memory(v) for v in operands))
    try:
        yield
    finally:
        _ALLOWED.reset(token)


def shifted(n: int, s: int, wrap: bool = True) -> tuple[int, ...]:
    """The columns of a roll by ``s`` (output ``c`` reads ``(c - s) mod n``);
    with ``wrap=False`` a shift (``-1`` where ``c - s`` is outside the row)."""
    return tuple((c - s) % n if wrap or 0 <= c - s < n else -1 for c in range(n))


def flipped(n: int) -> tuple[int, ...]:
    return tuple(range(n - 1, -1, -1))


def xor_partners(n: int, mask: int) -> tuple[int, ...]:
    """The columns of the bitonic partner ``c ^ mask`` (``n`` a power of two)."""
    return tuple(c ^ mask for c in range(n))


@permute_p.def_abstract_eval
def _abstract_eval(x: Aval, *, columns: tuple[int, ...], fill: Any) -> Aval:
    del fill
    return jax_core.ShapedArray((*x.shape[:-1], len(columns)), x.dtype)


def _impl(x: jax.Array, *, columns: tuple[int, ...], fill: Any) -> jax.Array:
    cols = np.asarray(columns, np.int32)
    taken = jnp.take(x, np.maximum(cols, 0), axis=-1)
    return taken if fill is None else jnp.where(cols >= 0, taken, jnp.asarray(fill, x.dtype))


permute_p.def_impl(_impl)
mlir.register_lowering(permute_p, mlir.lower_fun(_impl, multiple_results=False))


def fits(aval: Aval, x: ir.Value | None = None) -> bool:
    """Whether the register path permutes ``aval`` (see the module docstring);
    with the operand ``x``, also whether it can be in WGMMA's layout."""
    dtype = np.dtype(aval.dtype)
    if x is not None and (not isinstance(x, ir.Value) or smem_transpose.from_global_memory(x)):
        return False
    return (aval.ndim == 2 and dtype != np.bool_ and dtype.itemsize in (2, 4)
            and aval.shape[0] % TILE_ROWS == 0 and aval.shape[1] % TILE_COLS == 0)


iota_p = jax_core.Primitive("smalti_lane_iota")


def iota(shape: tuple[int, ...], dimension: int) -> jax.Array:
    """``lax.broadcasted_iota(int32, shape, dimension)`` of a 2-D ``shape``,
    built in WGMMA's layout from the thread's index (an add per register
    holding distinct columns) where :func:`in_registers`; jax's iota
    otherwise."""
    if not in_registers(tuple(shape)):
        return jax.lax.broadcasted_iota(jnp.int32, shape, dimension)
    return iota_p.bind(shape=tuple(shape), dimension=int(dimension))


@iota_p.def_abstract_eval
def _iota_abstract_eval(*, shape: tuple[int, ...], dimension: int) -> Aval:
    del dimension
    return jax_core.ShapedArray(shape, np.dtype(np.int32))


def _iota_impl(*, shape: tuple[int, ...], dimension: int) -> jax.Array:
    return jax.lax.broadcasted_iota(jnp.int32, shape, dimension)


iota_p.def_impl(_iota_impl)
mlir.register_lowering(iota_p, mlir.lower_fun(_iota_impl, multiple_results=False))


def lower_iota(ctx: PallasContext, *, shape: tuple[int, ...], dimension: int) -> Lowered:
    layout = plgpu.Layout.WGMMA

    @plgpu.inline_mgpu(return_type=plgpu.ShapeDtypeStruct(shape, jnp.int32, layout))
    def body(_: Any) -> fa.FragmentedArray:
        return _iota_registers(shape, dimension)

    return pallas_lowering._lower_fun(body)(ctx)


def _iota_registers(shape: tuple[int, ...], dimension: int) -> fa.FragmentedArray:
    """Row ``64 g + 16 w + 8 h + l // 4`` and column ``8 j + 2 (l % 4) + b``
    of element ``b`` of register ``(g, j, h)`` of lane ``l`` of warp ``w``."""
    i32 = ir.IntegerType.get_signless(32)
    pair = ir.VectorType.get((2,), i32)
    layout = fa.WGMMA_LAYOUT
    regs = np.empty(layout.registers_shape(shape), dtype=object)
    tid = arith.andi(mgpu_utils.thread_idx(), mgpu_utils.c(mgpu_utils.WARPGROUP_SIZE - 1, i32))

    def shift(v: ir.Value, right: int, left: int) -> ir.Value:
        v = arith.shrui(v, mgpu_utils.c(right, i32)) if right else v
        return arith.shli(v, mgpu_utils.c(left, i32)) if left else v

    if dimension == 1:  # 2 (l % 4), then + 8 j + (0, 1)
        base = vector.broadcast(pair, shift(arith.andi(tid, mgpu_utils.c(QUAD - 1, i32)), 0, 1))
        offsets = {j: arith.addi(base, _constant(pair, [TILE_COLS * j, TILE_COLS * j + 1]))
                   for j in range(regs.shape[1])}
        for index in np.ndindex(regs.shape):
            regs[index] = offsets[index[1]]
    else:  # 16 w + l // 4, then + 64 g + 8 h
        row = arith.ori(shift(tid, 5, 4), arith.andi(shift(tid, 2, 0), mgpu_utils.c(7, i32)))
        base = vector.broadcast(pair, row)
        offsets = {}
        for index in np.ndindex(regs.shape):
            key = TILE_ROWS * index[0] + TILE_COLS * index[4]
            if key not in offsets:
                offsets[key] = arith.addi(base, _constant(pair, [key, key])) if key else base
            regs[index] = offsets[key]
    return fa.FragmentedArray(_registers=regs, _layout=layout, _is_signed=True)


def _constant(t: ir.VectorType, values: list[int]) -> ir.Value:
    return arith.constant(t, ir.DenseElementsAttr.get(np.asarray(values, np.int32), type=t))


# --- Pallas lowering ------------------------------------------------------------------------


def _source_columns(n: int, shape: tuple[int, ...], columns: tuple[int, ...],
                    axis: int = -1) -> jax.Array:
    """``columns`` (indices along ``axis``) as int32 iota arithmetic of
    ``shape`` (a kernel cannot capture a constant array): ``c ^ m`` where it
    is a xor, else a select per run of consecutive indices with a slope of 1
    or -1."""
    c = jax.lax.broadcasted_iota(jnp.int32, shape, axis % len(shape))
    mask = columns[0]
    if all(columns[i] == i ^ mask for i in range(len(columns))):
        return c ^ mask
    runs: list[tuple[int, int, int]] = []  # (first column, slope, source of the first)
    for i, src in enumerate(columns):
        if runs:
            first, slope, base = runs[-1]
            if i - first == 1 and slope == 0 and abs(src - base) == 1:
                runs[-1] = (first, src - base, base)
                continue
            if slope and src == base + slope * (i - first):
                continue
        runs.append((i, 0, src))
    source = jnp.zeros(shape, jnp.int32)
    for first, slope, base in runs:
        run = base + slope * (c - first) if slope else jnp.full(shape, base, jnp.int32)
        source = jnp.where(c >= first, run, source)
    return source


def _take_f(x: jax.Array, *, columns: tuple[int, ...], fill: Any = None) -> jax.Array:
    from smalti.vocabulary.movement import take

    n = x.shape[-1]
    cols = _source_columns(n, (*x.shape[:-1], len(columns)), columns)
    valid = cols >= 0
    cols = jnp.maximum(cols, 0)
    if x.ndim == 2:
        cols = jax.lax.broadcasted_iota(jnp.int32, cols.shape, 0) * n + cols
    taken = take(x, cols)
    if fill is None:
        return taken
    return jnp.where(valid, taken, jnp.asarray(fill, x.dtype))


def lower(ctx: PallasContext, x: Operand, *, columns: tuple[int, ...], fill: Any) -> Lowered:
    """In registers where :func:`fits`; ``take`` otherwise."""
    [aval] = ctx.avals_in
    [out_aval] = ctx.avals_out
    if not (fits(aval, x) and fits(out_aval)):
        return pallas_lowering._lower_fun(
            lambda v: _take_f(v, columns=columns, fill=fill))(ctx, x)
    return on_registers(ctx, x, out_aval.shape,
                        lambda value: _permute_registers(value, columns, fill))


def on_registers(ctx: PallasContext, x: Operand, out_shape: tuple[int, ...],
                 fn: Callable[[fa.FragmentedArray], fa.FragmentedArray],
                 out_dtype: Any = None, out_layout: Any = None) -> Lowered:
    """``fn`` of the rule's one operand ``x`` as WGMMA-layout registers, a
    result of ``out_shape`` in the same layout (or ``out_layout``, a
    ``plgpu.Layout``) and of ``out_dtype`` (default: the operand's type):
    the ``plgpu.inline_mgpu`` body every register path of the vocabulary is."""
    [aval] = ctx.avals_in
    layout = plgpu.Layout.WGMMA
    wgmma = mgpu_layouts.to_layout_attr(fa.WGMMA_LAYOUT)
    x = mgpu_dialect.layout_cast(pallas_lowering._ensure_ir_value(x, aval.dtype), wgmma)

    @plgpu.inline_mgpu(arg_types=(layout,),
                       return_type=plgpu.ShapeDtypeStruct(
                           tuple(out_shape), aval.dtype if out_dtype is None else out_dtype,
                           layout if out_layout is None else out_layout))
    def body(_: Any, value: fa.FragmentedArray) -> fa.FragmentedArray:
        return fn(value)

    return pallas_lowering._lower_fun(body)(ctx, x)


def estimate(ctx: EstimatorContext, x_aval: Aval, **params: Any) -> Any:
    """take's scratch, one block per Pallas warpgroup: the fallback's (see the
    module docstring), and what the SMEM round trips of
    :mod:`smalti.vocabulary.rows` and :mod:`smalti.vocabulary.lane_scan` use."""
    from smalti.vocabulary.movement import estimate_one

    return estimate_one(ctx, x_aval, **params)


# --- the register permutation ------------------------------------------------------------------


class Quad:
    """Per-thread values shared by every slot of one permutation: the lane
    in the quad, lane predicates and shuffle lane indices (built once)."""

    def __init__(self) -> None:
        i32 = ir.IntegerType.get_signless(32)
        self.i32 = i32
        # a thread's lane in its quad: the low bits of its index
        self.q = arith.andi(mgpu_utils.thread_idx(), mgpu_utils.c(QUAD - 1, i32))
        self._in: dict[frozenset[int], ir.Value] = {}
        self._index: dict[tuple[int, ...], ir.Value] = {}

    def lanes_in(self, lanes: frozenset[int]) -> ir.Value:
        """i1: whether this thread's lane is in ``lanes`` (a proper, non-empty subset)."""
        if lanes not in self._in:
            pred = arith.CmpIPredicate
            lo, hi = min(lanes), max(lanes)
            if lanes == frozenset(range(lo, hi + 1)):  # a run: one or two compares
                conds = []
                if lo > 0:
                    conds.append(arith.cmpi(pred.uge, self.q, mgpu_utils.c(lo, self.i32)))
                if hi < QUAD - 1:
                    conds.append(arith.cmpi(pred.ule, self.q, mgpu_utils.c(hi, self.i32)))
                value = conds[0] if len(conds) == 1 else arith.andi(*conds)
            else:
                value = arith.cmpi(pred.ne, self.q, mgpu_utils.c(
                    next(iter(frozenset(range(QUAD)) - lanes)), self.i32)) if len(lanes) == 3 \
                    else arith.ori(*(self.lanes_in(frozenset([s])) for s in sorted(lanes)))
            self._in[lanes] = value
        return self._in[lanes]

    def index(self, sources: tuple[int, ...]) -> ir.Value:
        """The ``idx`` shuffle operand reading lane ``sources[q]`` of the quad."""
        if sources not in self._index:
            k = (sources[0]) % QUAD
            if all(sources[q] == (q + k) % QUAD for q in range(QUAD)):  # a rotation
                value = arith.addi(self.q, mgpu_utils.c(k, self.i32))  # the segment wraps it
            else:
                value = mgpu_utils.c(sources[0], self.i32)
                for q in range(1, QUAD):
                    if sources[q] != sources[0]:
                        value = arith.select(self.lanes_in(frozenset([q])),
                                             mgpu_utils.c(sources[q], self.i32), value)
            self._index[sources] = value
        return self._index[sources]

    def choose(self, by_lane: Sequence[ir.Value | None]) -> ir.Value:
        """The value ``by_lane[q]`` (never ``None``) for this thread's lane
        ``q``: selects on the lane (one per distinct value beyond the first)."""
        assert all(v is not None for v in by_lane), "a lane without a value"
        distinct = [v for v in dict.fromkeys(by_lane) if v is not None]
        value = distinct[0]
        for other in distinct[1:]:
            lanes = frozenset(q for q in range(QUAD) if by_lane[q] == other)
            value = arith.select(self.lanes_in(lanes), other, value)
        return value

    def shuffle(self, word: ir.Value, sources: tuple[int, ...]) -> ir.Value:
        """``word`` of lane ``sources[q]`` of the quad, for each lane ``q``."""
        if all(sources[q] == q for q in range(QUAD)):
            return word
        k = sources[0]
        if all(sources[q] == q ^ k for q in range(QUAD)):
            return mgpu_utils.shfl_bfly(word, k)
        return nvvm.shfl_sync(mgpu_utils.c(0xFFFFFFFF, self.i32), word,
                              self.index(sources), mgpu_utils.c(QUAD_SEGMENT, self.i32),
                              nvvm.ShflKind.idx)


def _rounds(sources: Sequence[tuple[int, int] | None], receivers: Sequence[int]
            ) -> list[list[int]]:
    """The ``receivers`` (lanes) split into rounds in which no lane sends two
    different words (one shuffle hands a lane's word to any number of
    receivers)."""
    rounds: list[list[int]] = []
    for q in receivers:
        source = sources[q]
        for r in rounds:
            if all(sources[o] == source or _sender(sources[o]) != _sender(source) for o in r):
                r.append(q)
                break
        else:
            rounds.append([q])
    return rounds


def _sender(source: tuple[int, int] | None) -> int:
    return -1 if source is None else source[0]


def _lane_map(senders: Sequence[int], served: Sequence[int]) -> tuple[int, ...]:
    """A full lane map agreeing with ``senders`` on ``served``: the identity
    or a xor where one does (no index to compute), else the served lanes'
    senders and the rest filled in."""
    for k in range(QUAD):
        if all(senders[q] == q ^ k for q in served):
            return tuple(q ^ k for q in range(QUAD))
    for k in range(QUAD):
        if all(senders[q] == (q + k) % QUAD for q in served):
            return tuple((q + k) % QUAD for q in range(QUAD))
    return tuple(senders[q] if q in served else senders[served[0]] for q in range(QUAD))


def route(quad: Quad, words: Sequence[ir.Value], sources: Sequence[tuple[int, int] | None],
          shuffled: dict[tuple[Any, ...], ir.Value]) -> ir.Value | None:
    """The word each lane ``q`` wants: ``words[w]`` of lane ``l`` for
    ``(l, w) = sources[q]`` (anything where that is ``None``; ``None`` where
    all are); ``shuffled`` caches shuffles of a row group."""
    wanted = [q for q in range(QUAD) if sources[q] is not None]
    senders = [s[0] if s is not None else -1 for s in sources]
    value: ir.Value | None = None
    for served in _rounds(sources, wanted):
        lanes = _lane_map(senders, served)
        sent: list[int | None] = [None] * QUAD  # the word each sender lane sends
        for q in served:
            source = sources[q]
            assert source is not None
            sent[source[0]] = source[1]
        common = max((w for w in sent if w is not None), key=sent.count)
        key = (tuple(common if w is None else w for w in sent), lanes)
        if key not in shuffled:
            shuffled[key] = quad.shuffle(quad.choose([words[w] for w in key[0]]), lanes)
        got = shuffled[key]
        value = got if value is None else arith.select(
            quad.lanes_in(frozenset(served)), got, value)
    return value


def extract(v: ir.Value, i: int) -> ir.Value:
    return vector.extract(v, dynamic_position=[], static_position=ir.DenseI64ArrayAttr.get([i]))


def _permute_registers(x: fa.FragmentedArray, columns: tuple[int, ...], fill: Any
                       ) -> fa.FragmentedArray:
    """``x[:, columns]`` of a WGMMA-layout array (the module docstring's
    method; a sort's relabelling by :func:`_relabelled_in_order`)."""
    n = x.shape[1]
    if fill is None and n >= 4 * TILE_COLS and n & (n - 1) == 0 and columns == relabelling(n):
        return _relabelled_in_order(x)
    regs = x.registers  # (rows / 64, cols / 8, 1, 1, 2, 1, 1, 1, 1) of vector<2 x T>
    element = ir.VectorType(regs.flat[0].type).element_type
    narrow = mgpu_utils.bitwidth(element) == 16
    i32 = ir.IntegerType.get_signless(32)
    filler = None if fill is None else mgpu_utils.c(
        float(fill) if isinstance(element, ir.FloatType) else int(fill), element)
    quad = Quad()
    moved = np.moveaxis(regs, 1, -1)  # row groups x registers of one row
    out = np.empty((*moved.shape[:-1], len(columns) // TILE_COLS), dtype=object)
    for group in np.ndindex(moved.shape[:-1]):
        row = list(moved[group])
        if narrow:  # one word per register
            words = [extract(vector.bitcast(ir.VectorType.get((1,), i32), r), 0) for r in row]
        else:
            words = [mgpu_utils.bitcast(extract(r, b), i32) for r in row for b in range(2)]
        shuffled: dict[tuple[Any, ...], ir.Value] = {}
        for j in range(out.shape[-1]):
            elements = []
            for b in range(2):
                srcs = [columns[TILE_COLS * j + 2 * q + b] for q in range(QUAD)]
                if narrow:  # the word, then the half
                    got = route(quad, words, [None if s < 0 else ((s // 2) % QUAD, s // TILE_COLS)
                                              for s in srcs], shuffled)
                    halves = {}
                    if got is not None:
                        pair = vector.bitcast(ir.VectorType.get((2,), element),
                                              vector.broadcast(ir.VectorType.get((1,), i32), got))
                        halves = {h: extract(pair, h) for h in sorted({s % 2 for s in srcs
                                                                        if s >= 0})}
                    elements.append(quad.choose([filler if s < 0 else halves[s % 2]
                                                 for s in srcs]))
                else:
                    got = route(quad, words, [None if s < 0 else ((s // 2) % QUAD,
                                                                  2 * (s // TILE_COLS) + s % 2)
                                              for s in srcs], shuffled)
                    value = None if got is None else mgpu_utils.bitcast(got, element)
                    elements.append(quad.choose([filler if s < 0 else value for s in srcs]))
            out[group + (j,)] = vector.from_elements(ir.VectorType.get((2,), element), elements)
    return fa.FragmentedArray(_registers=np.moveaxis(out, -1, 1), _layout=x.layout,
                              _is_signed=x.is_signed)  # the layout does not depend on the shape


def _relabelled_in_order(x: fa.FragmentedArray) -> fa.FragmentedArray:
    """``x[:, relabelling(n)]`` (``n`` at least 32): output register ``j =
    R a / 4 + r`` of lane ``q`` (``R = n / 8`` registers) is lane ``a``'s
    register ``4 r + q``, so for each ``r`` and word the four lanes hold a
    4 x 4 matrix (lane by ``q``) that is transposed: two butterfly steps,
    each exchanging the lane's bit ``k`` with the register's. In a step a
    lane sends, of each pair of words whose register bit ``k`` differs, the
    one whose bit is not its own lane's, and takes the partner's in its
    place: a select, a ``shfl.bfly`` and two selects per pair, 4
    instructions per word in all (the generic routing took 6.4)."""
    regs = x.registers  # (rows / 64, cols / 8, 1, 1, 2, 1, 1, 1, 1) of vector<2 x T>
    pair = ir.VectorType(regs.flat[0].type)
    element = pair.element_type
    narrow = mgpu_utils.bitwidth(element) == 16
    i32 = ir.IntegerType.get_signless(32)
    quad = Quad()
    lane_bit = [arith.cmpi(arith.CmpIPredicate.ne, arith.andi(quad.q, mgpu_utils.c(1 << k, i32)),
                           mgpu_utils.c(0, i32)) for k in range(2)]
    moved = np.moveaxis(regs, 1, -1)  # row groups x registers of one row
    count = moved.shape[-1]
    out = np.empty_like(moved)
    for group in np.ndindex(moved.shape[:-1]):
        # the 32-bit words of each register: its pair (16-bit types) or its elements
        words = [[extract(vector.bitcast(ir.VectorType.get((1,), i32), r), 0)] if narrow else
                 [mgpu_utils.bitcast(extract(r, b), i32) for b in range(2)]
                 for r in moved[group]]
        placed: list[list[ir.Value]] = [[] for _ in range(count)]
        for r in range(count // QUAD):
            for w in range(len(words[0])):
                m = [words[QUAD * r + c][w] for c in range(QUAD)]
                for k in range(2):
                    bit = 1 << k
                    for c in range(QUAD):
                        if c & bit:
                            continue
                        low, high = m[c], m[c | bit]
                        theirs = mgpu_utils.shfl_bfly(arith.select(lane_bit[k], low, high), bit)
                        m[c] = arith.select(lane_bit[k], theirs, low)
                        m[c | bit] = arith.select(lane_bit[k], high, theirs)
                for a in range(QUAD):
                    placed[count // QUAD * a + r].append(m[a])
        for j, ws in enumerate(placed):
            if narrow:
                out[group + (j,)] = vector.bitcast(pair, vector.broadcast(
                    ir.VectorType.get((1,), i32), ws[0]))
            else:
                out[group + (j,)] = vector.from_elements(
                    pair, [mgpu_utils.bitcast(v, element) for v in ws])
    return fa.FragmentedArray(_registers=np.moveaxis(out, -1, 1), _layout=x.layout,
                              _is_signed=x.is_signed)
