"""Repeats and interleaves of a block along either axis, fused out of the
two equations ``jnp`` writes them as.

``jnp.repeat(x, r, axis=1)`` is ``broadcast_in_dim`` of ``x`` into
``x.shape + (r,)`` and a ``reshape`` to ``(m, n * r)``; an interleave,
``jnp.stack(xs, axis=2).reshape(m, k * n)``, is ``stack`` and the same
``reshape``; along the rows the new axis sits in the middle and merges with
the first. Lowered one equation at a time, each goes through a 3-D view
(:mod:`smalti.vocabulary.views`: two ``take`` round trips through SMEM).
Together they are one static map of the axis: position ``j`` of a repeat
reads ``j // r``; of an interleave, ``(j % k) * n + j // k`` of the operands
concatenated along it.

The fusion is a jaxpr rewrite (``registry.jaxpr_rewrite``, applied to every
jaxpr Pallas lowers, nested ones included): where the 3-D value has no other
use, the pair becomes one :data:`interleave_p` equation with the
``reshape``'s source line. Its rule, where the operands can have WGMMA's
layout, concatenates them (whole tiles: no movement) and maps the columns in
registers (:func:`lanes.permute <smalti.vocabulary.lanes.permute>`: moves and
shuffles within a quad) or the rows through SMEM
(:func:`rows.map_rows <smalti.vocabulary.rows.map_rows>`: a vector store and
load per register; counts that are powers of two); otherwise it lowers the
original pair (a block loaded plainly from GMEM is strided, which the view
reshapes for free and a ``take`` would move element by element). Where the
3-D value is used again (reduced, combined), nothing changes. Pallas sizes
scratch before the rewrite, from the view's equations, which reserve at
least the operands' bytes that the row path needs.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import Any, cast

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax._src import core as jax_core
from jax._src.interpreters import mlir
from jax._src.lax import lax as lax_internal
from jax._src.lib.mlir import ir
from jax._src.lib.mlir.dialects import arith
from jax._src.pallas.mosaic_gpu import lowering as pallas_lowering
from jax.experimental.mosaic.gpu import fragmented_array as fa
from jax.experimental.mosaic.gpu import utils as mgpu_utils
from jax.experimental.pallas import mosaic_gpu as plgpu

from smalti.vocabulary import lanes, rows
from smalti.vocabulary.annotations import (
    Aval,
    EstimatorContext,
    Lowered,
    Operand,
    PallasContext,
    Resources,
)
from smalti.vocabulary.scans import take_scratch

__all__ = ["fuse", "interleave_p", "repeat_columns", "interleave_columns", "lower", "estimate"]

#: ``k`` operands of ``n`` elements along ``axis`` interleaved along it, each
#: element of the interleave then repeated ``repeats`` times: ``jnp.repeat``
#: (one operand) and ``jnp.stack(xs, axis + 1).reshape`` (``repeats=1``) fused.
interleave_p = jax_core.Primitive("smalti_interleave")


def interleave_columns(n: int, k: int, repeats: int = 1) -> tuple[int, ...]:
    """The position in the ``k`` operands (of ``n`` along the axis)
    concatenated that each position of the result takes."""
    return tuple((j // repeats % k) * n + j // repeats // k for j in range(n * k * repeats))


def repeat_columns(n: int, r: int) -> tuple[int, ...]:
    """The source column of each result column of a repeat by ``r`` of ``n`` columns."""
    return interleave_columns(n, 1, r)


def _unfused(*xs: jax.Array, repeats: int, axis: int) -> jax.Array:
    """What jnp wrote: the 3-D value (a new axis after ``axis``), then
    ``axis`` and the new one merged."""
    x = xs[0]
    if len(xs) == 1:
        shape = (*x.shape[:axis + 1], repeats, *x.shape[axis + 1:])
        kept = tuple(d for d in range(x.ndim + 1) if d != axis + 1)
        view = lax.broadcast_in_dim(x, shape, kept)
    else:
        view = lax_internal.stack_p.bind(*xs, axis=axis + 1)
    merged = (*view.shape[:axis], view.shape[axis] * view.shape[axis + 1], *view.shape[axis + 2:])
    return lax.reshape(view, merged)


@interleave_p.def_abstract_eval
def _abstract_eval(*xs: Aval, repeats: int, axis: int) -> Aval:
    shape = list(xs[0].shape)
    shape[axis] *= len(xs) * repeats
    return jax_core.ShapedArray(tuple(shape), xs[0].dtype)


def _impl(*xs: jax.Array, repeats: int, axis: int) -> jax.Array:
    joined = jnp.concatenate(xs, axis=axis)
    taken = interleave_columns(xs[0].shape[axis], len(xs), repeats)
    return jnp.take(joined, np.asarray(taken), axis=axis)


interleave_p.def_impl(_impl)
mlir.register_lowering(interleave_p, mlir.lower_fun(_impl, multiple_results=False))

#: Off while the rule lowers the original pair (which must not be fused again).
_FUSING: contextvars.ContextVar[bool] = contextvars.ContextVar("smalti_fuse_repeats",
                                                                default=True)


@contextlib.contextmanager
def _unfusing() -> Iterator[None]:
    token = _FUSING.set(False)
    try:
        yield
    finally:
        _FUSING.reset(token)


def _power_of_two(v: int) -> bool:
    return v > 0 and v & (v - 1) == 0


def _row_source(height: int, k: int, repeats: int) -> Callable[[ir.Value], ir.Value]:
    """The operands-concatenated row that result row ``R`` reads,
    ``(q % k) * height + q // k`` with ``q = R // repeats`` (``k`` and
    ``repeats`` powers of two): shifts and masks."""
    def c(v: int) -> ir.Value:
        return mgpu_utils.c(v, ir.IndexType.get())

    def source(row: ir.Value) -> ir.Value:
        q = arith.shrui(row, c(repeats.bit_length() - 1)) if repeats > 1 else row
        if k == 1:
            return q
        which = arith.muli(arith.andi(q, c(k - 1)), c(height))
        return arith.addi(which, arith.shrui(q, c(k.bit_length() - 1)))

    return source


def lower(ctx: PallasContext, *xs: Operand, repeats: int, axis: int) -> Lowered:
    """In registers where every operand may have WGMMA's layout: the
    operands concatenated (whole tiles), then along the columns a permute
    (moves and shuffles within quads), along the rows a round trip through
    SMEM, a vector per register (counts that are powers of two, a free
    scratch slice). The original pair of equations, each by its own rule,
    otherwise."""
    [out] = ctx.avals_out
    avals = ctx.avals_in
    if all(lanes.fits(a, x) for a, x in zip(avals, xs)) and lanes.fits(out):
        n = avals[0].shape[axis]
        if axis == avals[0].ndim - 1:
            columns = interleave_columns(n, len(xs), repeats)
            with lanes.for_operands(*xs):
                return pallas_lowering._lower_fun(
                    lambda *vs: lanes.permute(jnp.concatenate(vs, axis=-1), columns))(ctx, *xs)
        joined = jax_core.ShapedArray((n * len(xs), *avals[0].shape[1:]), avals[0].dtype)
        scratch = rows.scratch_for(ctx, joined)
        if scratch is not None and _power_of_two(len(xs)) and _power_of_two(repeats):
            move = _rows_kernel(out, _row_source(n, len(xs), repeats), scratch)
            with lanes.for_operands(*xs):
                return pallas_lowering._lower_fun(
                    lambda *vs: move(jnp.concatenate(vs, axis=0) if len(vs) > 1 else vs[0])
                )(ctx, *xs)
    with _unfusing():
        return pallas_lowering._lower_fun(
            lambda *vs: _unfused(*vs, repeats=repeats, axis=axis))(ctx, *xs)


def _rows_kernel(out: Aval, source: Callable[[ir.Value], ir.Value], scratch: rows.Scratch
                 ) -> Callable[[jax.Array], jax.Array]:
    """A traceable function moving a WGMMA-layout block's rows to ``out``'s
    height by ``source`` (:func:`smalti.vocabulary.rows.map_rows`)."""
    layout = plgpu.Layout.WGMMA

    @plgpu.inline_mgpu(arg_types=(layout,),
                       return_type=plgpu.ShapeDtypeStruct(tuple(out.shape), out.dtype, layout))
    def body(_: Any, value: fa.FragmentedArray) -> fa.FragmentedArray:
        return rows.map_rows(value, out.shape[0], source, scratch)

    def moved(x: jax.Array) -> jax.Array:
        return body(plgpu.layout_cast(x, layout))

    return moved


def estimate(ctx: EstimatorContext, *avals: Aval, repeats: int, axis: int) -> Resources:
    """What the original pair reserves (the views' estimate: the result's
    bytes, once per Pallas warpgroup), which covers the row path's copy of
    the operands: for an equation bound directly, not made by the rewrite
    (Pallas estimates before rewriting, from the pair itself)."""
    out = _abstract_eval(*avals, repeats=repeats, axis=axis)
    return take_scratch(ctx, (int(out.size) * np.dtype(out.dtype).itemsize,), np.uint8)


def _movable(aval: Aval) -> bool:
    """A 1-D or 2-D value the rule takes: 8-, 16- or 32-bit, not boolean
    (the view's rules refuse the others with their own reasons)."""
    dtype = np.dtype(aval.dtype)
    return aval.ndim in (1, 2) and dtype != np.bool_ and dtype.itemsize in (1, 2, 4)


def _fused(producer: jax_core.JaxprEqn, reshape: jax_core.JaxprEqn
           ) -> jax_core.JaxprEqn | None:
    """The equation that replaces ``producer`` (a broadcast_in_dim or stack
    making the 3-D value) and ``reshape`` (merging the new axis into the one
    before it), or ``None`` where the pair is not a repeat or interleave."""
    view = cast(Aval, producer.outvars[0].aval)
    out = cast(Aval, reshape.outvars[0].aval)
    if reshape.params.get("dimensions") is not None:
        return None
    merges = [a for a in range(view.ndim - 1) if tuple(out.shape) == (
        *view.shape[:a], view.shape[a] * view.shape[a + 1], *view.shape[a + 2:])]
    if len(merges) != 1:
        return None  # not a merge of two axes, or (unit axes) of either pair
    [axis] = merges
    new = axis + 1  # the axis the producer adds
    operand_shape = tuple(d for i, d in enumerate(view.shape) if i != new)
    operands: Sequence[jax_core.Atom] = producer.invars
    avals = [cast(Aval, v.aval) for v in operands]
    if not all(map(_movable, avals)) or any(tuple(a.shape) != operand_shape for a in avals):
        return None
    if producer.primitive is lax_internal.broadcast_in_dim_p:
        kept = tuple(d for d in range(view.ndim) if d != new)
        if len(operands) != 1 or tuple(producer.params["broadcast_dimensions"]) != kept:
            return None
        repeats = view.shape[new]
    elif producer.primitive is lax_internal.stack_p:
        if producer.params["axis"] != new:
            return None
        repeats = 1
    else:
        return None
    return reshape.replace(invars=list(operands), primitive=interleave_p,
                           params={"repeats": repeats, "axis": axis})


def fuse(jaxpr: jax_core.Jaxpr) -> jax_core.Jaxpr | None:
    """``jaxpr`` with every repeat and interleave whose 3-D value has no
    other use fused into one :data:`interleave_p` equation; ``None`` if it
    has none."""
    if not _FUSING.get():
        return None
    uses = Counter(v for eqn in jaxpr.eqns for v in eqn.invars if isinstance(v, jax_core.Var))
    uses.update(v for v in jaxpr.outvars if isinstance(v, jax_core.Var))
    producers = {eqn.outvars[0]: eqn for eqn in jaxpr.eqns
                 if eqn.primitive in (lax_internal.broadcast_in_dim_p, lax_internal.stack_p)}
    replaced: dict[int, jax_core.JaxprEqn] = {}
    dropped: set[int] = set()
    for eqn in jaxpr.eqns:
        if eqn.primitive is not lax_internal.reshape_p or len(eqn.invars) != 1:
            continue  # (a reshape with more operands is to a dynamic shape)
        [view] = eqn.invars
        if not isinstance(view, jax_core.Var):
            continue
        producer = producers.get(view)
        if producer is None or uses[view] != 1 or cast(Aval, view.aval).ndim != 3:
            continue
        fused = _fused(producer, eqn)
        if fused is not None:
            replaced[id(eqn)] = fused
            dropped.add(id(producer))
    if not replaced:
        return None
    eqns: list[Any] = [replaced.get(id(eqn), eqn) for eqn in jaxpr.eqns
                       if id(eqn) not in dropped]
    return jaxpr.replace(eqns=eqns)
