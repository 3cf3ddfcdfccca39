"""A bitonic network's stage along a block's minor axis (or its rows) in registers:
``compare_exchange(words, mask=m, half=h)`` gives each element (a list of
int32 *words*, compared lexicographically, or a single float32 word without
NaNs) the smaller or the larger of it and its partner ``c ^ m``: the
smaller where bit ``h`` of its column ``c`` is clear.

How: the partner's words come from :mod:`smalti.vocabulary.lanes`'
routing (free for ``m`` in ``1`` and multiples of 8, one ``shfl.sync`` per
word where ``m`` has bit 2 or 4 set); then, per slot, the lexicographic
compare (a ``cmpi`` per word and a select per word beyond the last), the
choice and a select per word. Elements of several words whose partner is
in the same thread's registers compare once per pair: the partner's slot
reuses the compare with its selects' operands swapped (distinct elements:
``mine < theirs`` is ``not theirs < mine``). A single word keeps its
compare per slot, which MLIR folds with the select into a min or a max;
a float word is a ``minimumf``/``maximumf`` (PTX ``min``/``max``) where
the side is static, an ordered ``cmpf`` otherwise. A lone f16 or bf16
word whose mask leaves bit 0 alone (each half of a register paired with
the same half of its partner register, both keeping the same side) is
exchanged a register at a time: one packed ``min``/``max``
(``min.bf16x2``), a shuffle of the register where the partner is in
another lane, and where the side is the lane's both extrema and a select.
With ``keys=k`` only the first ``k`` words are compared and the others
ride along (sorts whose keys are known to differ: the index beside a
float32 key). Which of the two an element keeps is known statically for each register
slot (bit ``h`` of ``c = 8 j + 2 q + b``), except for ``h`` in 2 and 4,
where it is the lane's bit: one ``xori`` with a lane predicate then. No
memory is touched: race-free with any number of warpgroups; exact (words
only move).

``live=`` (along the minor axis) names the columns whose result is read
later; a register slot none of whose four columns (one per lane of the
quad) is live keeps its words and costs nothing. top_k's rounds use it:
each keeps only the smallest run of every pair, so half the columns of
the round before are dead.

With ``axis=0`` the stage is along the rows: the partner's words come from
:func:`smalti.vocabulary.rows.permute_registers` (a ``shfl.bfly`` per word
and register moves within a warp, the SMEM round trip across warps), and
which of the two an element keeps is bit ``h`` of its row: static per
register for bit 3 and bits 6+, the thread's own row otherwise (one
``xori``). The round trip writes and reads the warpgroup's scratch slice
between warpgroup barriers, so that path is race-free with several
warpgroups too.

Where it applies is :func:`smalti.vocabulary.lanes.fits` of an int32
block; elsewhere it is the same stage written with
:func:`smalti.vocabulary.lanes.permute` (and so ``take``) and jnp, which is
also its CPU implementation, so both paths compute the same words.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
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
from smalti.vocabulary.annotations import Aval, EstimatorContext, Lowered, Operand, PallasContext

__all__ = ["compare_exchange", "exchange_p", "less"]

exchange_p = jax_core.Primitive("smalti_lane_exchange")
exchange_p.multiple_results = True


def less(a: list[jax.Array], b: list[jax.Array]) -> jax.Array:
    """Lexicographic ``a < b`` of lists of int32 words."""
    lt = a[-1] < b[-1]
    for x, y in zip(a[-2::-1], b[-2::-1]):
        lt = jnp.where(x == y, lt, x < y)
    return lt


def compare_exchange(words: list[jax.Array], *, mask: int, half: int, axis: int = 1,
                     live: tuple[bool, ...] | None = None, keys: int | None = None
                     ) -> list[jax.Array]:
    """One stage of a bitonic network along ``axis`` of 2-D int32 ``words``,
    or of one float32 word without NaNs (a power of two long): see the
    module docstring. Elements must differ in some word, or be equal values.
    ``live`` (``axis=1`` only): which columns' results are used; the others'
    words are unspecified. ``keys``: only the first ``keys`` words are
    compared (the first may then be a float32 word without NaNs), the
    others ride along; elements must then differ in their keys (equal keys
    may lose or duplicate the other words)."""
    if live is not None:
        if axis != 1 or len(live) != words[0].shape[1]:
            raise ValueError(f"compare_exchange: live= names each column of axis 1, got "
                             f"{len(live)} for shape {words[0].shape} and axis {axis}")
        live = tuple(bool(v) for v in live)
    keys = len(words) if keys is None else int(keys)
    if not lanes.registers_allowed():
        return exchange_f(*words, mask=int(mask), half=int(half), axis=int(axis), live=live,
                          keys=keys)
    return exchange_p.bind(*words, mask=int(mask), half=int(half), axis=int(axis), live=live,
                           keys=keys)


def exchange_f(*words: jax.Array, mask: int, half: int, axis: int, live: tuple[bool, ...] | None,
               keys: int) -> list[jax.Array]:
    """The stage in jnp over :func:`~smalti.vocabulary.lanes.permute` (columns)
    or :func:`~smalti.vocabulary.rows.permute` (rows); every column computed
    (``live`` only allows skipping)."""
    del live
    n = words[0].shape[axis]
    move = lanes.permute if axis == 1 else row_moves.permute
    theirs = [move(w, lanes.xor_partners(n, mask)) for w in words]
    keep_min = (jax.lax.broadcasted_iota(jnp.int32, words[0].shape, axis) & half) == 0
    # distinct elements: theirs > mine is not(theirs < mine)
    swap = less(theirs[:keys], list(words[:keys])) == keep_min
    return [jnp.where(swap, t, w) for t, w in zip(theirs, words)]


@exchange_p.def_abstract_eval
def _abstract_eval(*avals: Aval, mask: int, half: int, axis: int,
                   live: tuple[bool, ...] | None, keys: int) -> list[Aval]:
    del mask, half, axis, live, keys
    return [jax_core.ShapedArray(a.shape, a.dtype) for a in avals]


exchange_p.def_impl(exchange_f)
mlir.register_lowering(exchange_p, mlir.lower_fun(exchange_f, multiple_results=True))


def lower(ctx: PallasContext, *words: Operand, mask: int, half: int, axis: int,
          live: tuple[bool, ...] | None, keys: int) -> Lowered:
    """In registers (and, for rows across warps, the scratch) where every
    word :func:`fits <smalti.vocabulary.lanes.fits>`."""
    fallback = pallas_lowering._lower_fun(
        lambda *ws: exchange_f(*ws, mask=mask, half=half, axis=axis, live=live, keys=keys))
    scratch = None
    if axis == 0:
        mapping = row_moves.RowMap(0, mask=mask)
        scratch = row_moves.scratch_for(ctx, ctx.avals_in[0])
        if scratch is None and not row_moves.in_registers(mapping):
            return fallback(ctx, *words)
    if not all(lanes.fits(a, w) for a, w in zip(ctx.avals_in, words)):
        return fallback(ctx, *words)
    [aval, *_] = ctx.avals_in
    layout = plgpu.Layout.WGMMA
    wgmma = mgpu_layouts.to_layout_attr(fa.WGMMA_LAYOUT)
    words = tuple(mgpu_dialect.layout_cast(pallas_lowering._ensure_ir_value(w, a.dtype), wgmma)
                  for w, a in zip(words, ctx.avals_in))
    results = tuple(plgpu.ShapeDtypeStruct(a.shape, a.dtype, layout) for a in ctx.avals_in)

    @plgpu.inline_mgpu(arg_types=((layout,) * len(words),), return_type=results)
    def body(_: Any, values: tuple[fa.FragmentedArray, ...]) -> tuple[fa.FragmentedArray, ...]:
        if axis == 0:
            return _exchange_rows(values, mask, half, scratch, keys)
        return _exchange_registers(values, mask, half, live, keys)

    return pallas_lowering._lower_fun(lambda *ws: list(body(ws)))(ctx, *words)


def estimate(ctx: EstimatorContext, *avals: Aval, **params: Any) -> Any:
    """take's scratch, for the fallback (see lanes.estimate)."""
    return lanes.estimate(ctx, avals[0])


# --- in registers ------------------------------------------------------------------------------


def _routed(quad: lanes.Quad, words: list[ir.Value], sources: list[tuple[int, int]],
            cache: dict[tuple[Any, ...], ir.Value]) -> ir.Value:
    value = lanes.route(quad, words, sources, cache)
    assert value is not None  # every lane has a partner
    return value


def _element_type(value: fa.FragmentedArray) -> ir.Type:
    return ir.VectorType(value.registers.flat[0].type).element_type


def _less(theirs: list[ir.Value], mine: list[ir.Value]) -> ir.Value:
    """Lexicographic ``theirs < mine``: a ``cmpi`` per word (a select per
    word beyond the last), or one ordered ``cmpf`` of a float word."""
    if isinstance(theirs[-1].type, ir.FloatType):
        return arith.cmpf(arith.CmpFPredicate.OLT, theirs[-1], mine[-1])
    pred = arith.CmpIPredicate
    lt = arith.cmpi(pred.slt, theirs[-1], mine[-1])
    for t, m in zip(theirs[-2::-1], mine[-2::-1]):
        lt = arith.select(arith.cmpi(pred.eq, t, m), lt, arith.cmpi(pred.slt, t, m))
    return lt


def _exchange_registers(values: tuple[fa.FragmentedArray, ...], mask: int, half: int,
                        live: tuple[bool, ...] | None, keys: int
                        ) -> tuple[fa.FragmentedArray, ...]:
    elements = [_element_type(v) for v in values]
    float_word = len(values) == 1 and isinstance(elements[0], ir.FloatType)
    quad = lanes.Quad()
    cols = values[0].shape[1]
    partners = lanes.xor_partners(cols, mask)
    # a 16-bit float word whose partners keep their half of the register:
    # both halves at once (packed min/max)
    packed = float_word and isinstance(elements[0], (ir.BF16Type, ir.F16Type)) and not mask & 1
    rows = [np.moveaxis(v.registers, 1, -1) for v in values]  # row groups x registers
    outs = [np.empty_like(r) for r in rows]
    for group in np.ndindex(rows[0].shape[:-1]):
        mine_words = [[lanes.extract(r, b) for r in row[group] for b in range(2)]
                      for row in rows]
        caches: list[dict[tuple[Any, ...], ir.Value]] = [{} for _ in values]
        # slot -> "mine < theirs" decided at its partner slot of this thread
        decided: dict[int, ir.Value] = {}
        if packed:
            registers = list(rows[0][group])
            words = [mgpu_utils.bitcast(r, ir.IntegerType.get_signless(32)) for r in registers] \
                if (mask >> 1) % lanes.QUAD else []  # what a shuffle moves
            for j in range(len(registers)):
                dead = live is not None and not any(live[lanes.TILE_COLS * j:
                                                         lanes.TILE_COLS * (j + 1)])
                outs[0][group + (j,)] = registers[j] if dead else _packed_stage(
                    quad, registers, words, j, mask, half, caches[0])
            continue
        for j in range(rows[0].shape[-1]):
            kept: list[list[ir.Value]] = [[] for _ in values]
            for b in range(2):
                slot = 2 * j + b
                if live is not None and not any(live[lanes.TILE_COLS * j + 2 * q + b]
                                                for q in range(lanes.QUAD)):
                    for i, w in enumerate(mine_words):  # read by no later stage
                        kept[i].append(w[slot])
                    continue
                srcs = [partners[lanes.TILE_COLS * j + 2 * q + b] for q in range(lanes.QUAD)]
                sources = [((s // 2) % lanes.QUAD, 2 * (s // lanes.TILE_COLS) + s % 2)
                           for s in srcs]
                mine = [w[slot] for w in mine_words]
                theirs = [_routed(quad, w, sources, c) for w, c in zip(mine_words, caches)]
                keep_min = [(lanes.TILE_COLS * j + 2 * q + b) & half == 0
                            for q in range(lanes.QUAD)]
                static = all(keep_min) or not any(keep_min)
                if float_word and static:  # one instruction: min.f32 or max.f32
                    extremum = arith.minimumf if all(keep_min) else arith.maximumf
                    kept[0].append(extremum(theirs[0], mine[0]))
                    continue
                # Several words: a partner in this thread's registers reuses the
                # compare made for the pair at the partner's slot (distinct
                # elements: mine < theirs is not theirs < mine; equal ones are
                # equal values, either way right). One word's compare and
                # select fold into a min or a max, which a shared compare stops.
                pair_shared = static and len(values) > 1 and all(
                    lane == q for q, (lane, _) in enumerate(sources))
                if pair_shared and slot in decided:  # "mine < theirs": not(theirs < mine)
                    lt, take_theirs_if_lt = decided.pop(slot), not all(keep_min)
                else:
                    lt, take_theirs_if_lt = _less(theirs[:keys], mine[:keys]), all(keep_min)
                    if pair_shared:
                        decided[sources[0][1]] = lt
                if static and take_theirs_if_lt:
                    pairs = [(t, m) for t, m in zip(theirs, mine)]
                elif static:
                    pairs = [(m, t) for t, m in zip(theirs, mine)]
                else:  # by the lane: lt flipped where the lane keeps the larger
                    maxing = frozenset(q for q in range(lanes.QUAD) if not keep_min[q])
                    lt = arith.xori(lt, quad.lanes_in(maxing))
                    pairs = [(t, m) for t, m in zip(theirs, mine)]
                for i, (if_lt, otherwise) in enumerate(pairs):
                    kept[i].append(arith.select(lt, if_lt, otherwise))
            for i in range(len(values)):
                outs[i][group + (j,)] = vector.from_elements(
                    ir.VectorType.get((2,), elements[i]), kept[i])
    return tuple(fa.FragmentedArray(_registers=np.moveaxis(o, -1, 1), _layout=v.layout,
                                    _is_signed=v.is_signed) for o, v in zip(outs, values))


def _packed_stage(quad: lanes.Quad, registers: list[ir.Value], words: list[ir.Value], j: int,
                  mask: int, half: int, cache: dict[tuple[Any, ...], ir.Value]) -> ir.Value:
    """Register ``j`` (columns ``8 j + 2 q + b``) of a lone 16-bit float word
    after the stage, both halves at once: ``mask`` leaves bit 0 alone, so
    column ``c``'s partner ``c ^ mask`` is in the same half of register
    ``j ^ mask // 8`` of lane ``q ^ (mask >> 1) % 4``, and ``half`` (a bit
    of ``mask``) is not bit 0, so both halves keep the same side. One
    packed ``min``/``max`` (``min.bf16x2``), a shuffle of the whole
    register (``words``: the registers as i32) where the partner is in
    another lane, and where the side is the lane's, both extrema and a
    select of the register."""
    lane_mask, register_mask = (mask >> 1) % lanes.QUAD, mask // lanes.TILE_COLS
    mine = registers[j]
    theirs = registers[j ^ register_mask]
    if lane_mask:
        sources = [(q ^ lane_mask, j ^ register_mask) for q in range(lanes.QUAD)]
        theirs = mgpu_utils.bitcast(_routed(quad, words, sources, cache), mine.type)
    keep_min = [(lanes.TILE_COLS * j + 2 * q) & half == 0 for q in range(lanes.QUAD)]
    if all(keep_min):
        return arith.minimumf(theirs, mine)
    if not any(keep_min):
        return arith.maximumf(theirs, mine)
    maxing = frozenset(q for q in range(lanes.QUAD) if not keep_min[q])
    return arith.select(quad.lanes_in(maxing), arith.maximumf(theirs, mine),
                        arith.minimumf(theirs, mine))


def _exchange_rows(values: tuple[fa.FragmentedArray, ...], mask: int, half: int,
                   scratch: row_moves.Scratch | None, keys: int
                   ) -> tuple[fa.FragmentedArray, ...]:
    """The stage along the rows: the partners' words from
    :func:`smalti.vocabulary.rows.permute_registers` (shuffles within a
    warp, the scratch across warps), then per register the compare and a
    select per word. Which of the two an element keeps is bit ``half`` of
    its row ``64 g + 16 w + 8 h + l // 4``: static per register for bit 3
    and bits 6+, the thread's own row bit otherwise (one ``xori``)."""
    mapping = row_moves.RowMap(0, mask=mask)
    theirs_all = [row_moves.permute_registers(v, mapping, None, scratch) for v in values]
    pred = arith.CmpIPredicate
    i32 = ir.IntegerType.get_signless(32)
    by_thread = None
    if half & row_moves.THREAD_ROW_BITS:  # the thread's row bit: it keeps the larger where set
        own = row_moves.own_row(arith.andi(mgpu_utils.thread_idx(),
                                           mgpu_utils.c(mgpu_utils.WARPGROUP_SIZE - 1, i32)))
        by_thread = arith.cmpi(pred.ne, arith.andi(own, mgpu_utils.c(half, i32)),
                               mgpu_utils.c(0, i32))
    elements = [_element_type(v) for v in values]
    outs = [np.empty_like(v.registers) for v in values]
    for idx in np.ndindex(values[0].registers.shape):
        register_row = 64 * idx[0] + 8 * idx[4]
        kept: list[list[ir.Value]] = [[] for _ in values]
        pairs_in = [v.registers.item(idx) for v in values]
        pairs_out = [t.registers.item(idx) for t in theirs_all]
        for b in range(2):
            mine = [lanes.extract(p, b) for p in pairs_in]
            theirs = [lanes.extract(p, b) for p in pairs_out]
            lt = _less(theirs[:keys], mine[:keys])
            if by_thread is not None:  # lt flipped where the thread keeps the larger
                lt = arith.xori(lt, by_thread)
            if by_thread is not None or not register_row & half:  # swap where theirs < mine
                pairs = list(zip(theirs, mine))
            else:  # swap where not theirs < mine
                pairs = list(zip(mine, theirs))
            for i, (if_lt, otherwise) in enumerate(pairs):
                kept[i].append(arith.select(lt, if_lt, otherwise))
        for i in range(len(values)):
            outs[i][idx] = vector.from_elements(ir.VectorType.get((2,), elements[i]), kept[i])
    return tuple(fa.FragmentedArray(_registers=o, _layout=v.layout, _is_signed=v.is_signed)
                 for o, v in zip(outs, values))
