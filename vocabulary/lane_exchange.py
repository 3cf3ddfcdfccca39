"""A bitonic network's stage along a block's minor axis in registers:
``compare_exchange(words, mask=m, half=h)`` gives each element (a list of
int32 *words*, compared lexicographically) the smaller or the larger of it
and its partner ``c ^ m``: the smaller where bit ``h`` of its column ``c``
is clear.

How: the partner's words come from :mod:`smalti.vocabulary.lanes`'
routing (free for ``m`` in ``1`` and multiples of 8, one ``shfl.sync`` per
word where ``m`` has bit 2 or 4 set); then, per slot, the lexicographic
compare (a ``cmpi`` per word and a select per word beyond the last), the
choice and a select per word. Which of the two an element keeps is known
statically for each register slot (bit ``h`` of ``c = 8 j + 2 q + b``),
except for ``h`` in 2 and 4, where it is the lane's bit: one ``xori`` with
a lane predicate then. No memory is touched: race-free with any number of
warpgroups; exact (words only move).

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
from jax.experimental.pallas import mosaic_gpu as plgpu

from smalti.vocabulary import lanes
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


def compare_exchange(words: list[jax.Array], *, mask: int, half: int) -> list[jax.Array]:
    """One stage of a bitonic network along the last axis of 2-D int32
    ``words`` (a power of two long): see the module docstring. Elements must
    differ in some word, or be equal values."""
    if not lanes.registers_allowed():
        return exchange_f(*words, mask=int(mask), half=int(half))
    return exchange_p.bind(*words, mask=int(mask), half=int(half))


def exchange_f(*words: jax.Array, mask: int, half: int) -> list[jax.Array]:
    """The stage in jnp over :func:`~smalti.vocabulary.lanes.permute`."""
    n = words[0].shape[-1]
    columns = lanes.xor_partners(n, mask)
    theirs = [lanes.permute(w, columns) for w in words]
    keep_min = (jax.lax.broadcasted_iota(jnp.int32, words[0].shape, 1) & half) == 0
    # distinct elements: theirs > mine is not(theirs < mine)
    swap = less(theirs, list(words)) == keep_min
    return [jnp.where(swap, t, w) for t, w in zip(theirs, words)]


@exchange_p.def_abstract_eval
def _abstract_eval(*avals: Aval, mask: int, half: int) -> list[Aval]:
    del mask, half
    return [jax_core.ShapedArray(a.shape, a.dtype) for a in avals]


exchange_p.def_impl(exchange_f)
mlir.register_lowering(exchange_p, mlir.lower_fun(exchange_f, multiple_results=True))


def lower(ctx: PallasContext, *words: Operand, mask: int, half: int) -> Lowered:
    """In registers where every word :func:`fits <smalti.vocabulary.lanes.fits>`."""
    if not all(lanes.fits(a, w) for a, w in zip(ctx.avals_in, words)):
        return pallas_lowering._lower_fun(
            lambda *ws: exchange_f(*ws, mask=mask, half=half))(ctx, *words)
    [aval, *_] = ctx.avals_in
    layout = plgpu.Layout.WGMMA
    wgmma = mgpu_layouts.to_layout_attr(fa.WGMMA_LAYOUT)
    words = tuple(mgpu_dialect.layout_cast(pallas_lowering._ensure_ir_value(w, a.dtype), wgmma)
                  for w, a in zip(words, ctx.avals_in))
    result = plgpu.ShapeDtypeStruct(aval.shape, aval.dtype, layout)

    @plgpu.inline_mgpu(arg_types=((layout,) * len(words),),
                       return_type=(result,) * len(words))
    def body(_: Any, values: tuple[fa.FragmentedArray, ...]) -> tuple[fa.FragmentedArray, ...]:
        return _exchange_registers(values, mask, half)

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


def _exchange_registers(values: tuple[fa.FragmentedArray, ...], mask: int, half: int
                        ) -> tuple[fa.FragmentedArray, ...]:
    i32 = ir.IntegerType.get_signless(32)
    quad = lanes.Quad()
    cols = values[0].shape[1]
    partners = lanes.xor_partners(cols, mask)
    rows = [np.moveaxis(v.registers, 1, -1) for v in values]  # row groups x registers
    outs = [np.empty_like(r) for r in rows]
    pred = arith.CmpIPredicate
    for group in np.ndindex(rows[0].shape[:-1]):
        mine_words = [[lanes.extract(r, b) for r in row[group] for b in range(2)]
                      for row in rows]
        caches: list[dict[tuple[Any, ...], ir.Value]] = [{} for _ in values]
        for j in range(rows[0].shape[-1]):
            kept: list[list[ir.Value]] = [[] for _ in values]
            for b in range(2):
                slot = 2 * j + b
                srcs = [partners[lanes.TILE_COLS * j + 2 * q + b] for q in range(lanes.QUAD)]
                sources = [((s // 2) % lanes.QUAD, 2 * (s // lanes.TILE_COLS) + s % 2)
                           for s in srcs]
                mine = [w[slot] for w in mine_words]
                theirs = [_routed(quad, w, sources, c) for w, c in zip(mine_words, caches)]
                lt = arith.cmpi(pred.slt, theirs[-1], mine[-1])
                for t, m in zip(theirs[-2::-1], mine[-2::-1]):
                    lt = arith.select(arith.cmpi(pred.eq, t, m), lt,
                                      arith.cmpi(pred.slt, t, m))
                keep_min = [(lanes.TILE_COLS * j + 2 * q + b) & half == 0
                            for q in range(lanes.QUAD)]
                if all(keep_min):  # swap where theirs < mine
                    pairs = [(t, m) for t, m in zip(theirs, mine)]
                elif not any(keep_min):  # swap where not theirs < mine
                    pairs = [(m, t) for t, m in zip(theirs, mine)]
                else:  # by the lane: lt flipped where the lane keeps the larger
                    maxing = frozenset(q for q in range(lanes.QUAD) if not keep_min[q])
                    lt = arith.xori(lt, quad.lanes_in(maxing))
                    pairs = [(t, m) for t, m in zip(theirs, mine)]
                for i, (if_lt, otherwise) in enumerate(pairs):
                    kept[i].append(arith.select(lt, if_lt, otherwise))
            for i in range(len(values)):
                outs[i][group + (j,)] = vector.from_elements(ir.VectorType.get((2,), i32),
                                                             kept[i])
    return tuple(fa.FragmentedArray(_registers=np.moveaxis(o, -1, 1), _layout=v.layout,
                                    _is_signed=v.is_signed) for o, v in zip(outs, values))
