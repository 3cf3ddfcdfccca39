"""Repeats and interleaves along the minor axis, fused out of the two
equations ``jnp`` writes them as.

``jnp.repeat(x, r, axis=-1)`` is ``broadcast_in_dim`` of ``x`` into
``x.shape + (r,)`` and a ``reshape`` to ``(..., n * r)``; an interleave,
``jnp.stack(xs, axis=-1).reshape(..., k * n)``, is ``stack`` and the same
``reshape``. Lowered one equation at a time, each goes through a 3-D view
(:mod:`smalti.vocabulary.views`: two ``take`` round trips through SMEM).
Together they are one static permute of the minor axis: column ``j`` of a
repeat is ``x[..., j // r]``; of an interleave, column ``(j % k) * n + j //
k`` of the operands concatenated along it. :func:`lanes.permute
<smalti.vocabulary.lanes.permute>` does that in registers (moves and
shuffles within a quad) where the block has WGMMA's layout, and with one
``take`` otherwise.

The fusion is a jaxpr rewrite (``registry.jaxpr_rewrite``, applied to every
jaxpr Pallas lowers, nested ones included): where the 3-D value has no other
use, the pair becomes one :data:`interleave_p` equation with the
``reshape``'s source line. Its rule permutes in registers where the operands
can have WGMMA's layout, and lowers the original pair otherwise (a block
loaded plainly from GMEM is strided, which the view reshapes for free and a
``take`` would move element by element). Where the 3-D value is used again
(reduced, combined), nothing changes. Pallas sizes scratch before the
rewrite, from the view's equations: the fused equation needs none beyond
theirs.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any, cast

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax._src import core as jax_core
from jax._src.interpreters import mlir
from jax._src.lax import lax as lax_internal
from jax._src.pallas.mosaic_gpu import lowering as pallas_lowering

from smalti.vocabulary import lanes
from smalti.vocabulary.annotations import Aval, Lowered, Operand, PallasContext

__all__ = ["fuse", "interleave_p", "repeat_columns", "interleave_columns", "lower"]

#: ``k`` operands of ``n`` columns interleaved along the last axis, each
#: column of the interleave then repeated ``repeats`` times: ``jnp.repeat``
#: (one operand) and ``jnp.stack(xs, -1).reshape`` (``repeats=1``) fused.
interleave_p = jax_core.Primitive("smalti_interleave")


def interleave_columns(n: int, k: int, repeats: int = 1) -> tuple[int, ...]:
    """The column of the ``k`` operands (of ``n`` columns) concatenated
    that each result column takes."""
    return tuple((j // repeats % k) * n + j // repeats // k for j in range(n * k * repeats))


def repeat_columns(n: int, r: int) -> tuple[int, ...]:
    """The source column of each result column of a repeat by ``r`` of ``n`` columns."""
    return interleave_columns(n, 1, r)


def _unfused(*xs: jax.Array, repeats: int) -> jax.Array:
    """What jnp wrote: the 3-D value, then its last two axes merged."""
    x = xs[0]
    if len(xs) == 1:
        view = lax.broadcast_in_dim(x, (*x.shape, repeats), tuple(range(x.ndim)))
    else:
        view = lax_internal.stack_p.bind(*xs, axis=x.ndim)
    return lax.reshape(view, (*view.shape[:-2], view.shape[-2] * view.shape[-1]))


@interleave_p.def_abstract_eval
def _abstract_eval(*xs: Aval, repeats: int) -> Aval:
    shape = xs[0].shape
    return jax_core.ShapedArray((*shape[:-1], shape[-1] * len(xs) * repeats), xs[0].dtype)


def _impl(*xs: jax.Array, repeats: int) -> jax.Array:
    joined = jnp.concatenate(xs, axis=-1)
    return jnp.take(joined, np.asarray(interleave_columns(xs[0].shape[-1], len(xs), repeats)),
                    axis=-1)


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


def lower(ctx: PallasContext, *xs: Operand, repeats: int) -> Lowered:
    """In registers (a concatenation of whole tiles, then a permute of the
    columns) where every operand may have WGMMA's layout; the original pair
    of equations, each by its own rule, otherwise."""
    [out] = ctx.avals_out
    if all(lanes.fits(a, x) for a, x in zip(ctx.avals_in, xs)) and lanes.fits(out):
        columns = interleave_columns(ctx.avals_in[0].shape[-1], len(xs), repeats)
        with lanes.for_operands(*xs):
            return pallas_lowering._lower_fun(
                lambda *vs: lanes.permute(jnp.concatenate(vs, axis=-1), columns))(ctx, *xs)
    with _unfusing():
        return pallas_lowering._lower_fun(lambda *vs: _unfused(*vs, repeats=repeats))(ctx, *xs)


def _movable(aval: Aval) -> bool:
    """A 1-D or 2-D value the rule takes: 8-, 16- or 32-bit, not boolean
    (the view's rules refuse the others with their own reasons)."""
    dtype = np.dtype(aval.dtype)
    return aval.ndim in (1, 2) and dtype != np.bool_ and dtype.itemsize in (1, 2, 4)


def _fused(producer: jax_core.JaxprEqn, reshape: jax_core.JaxprEqn
           ) -> jax_core.JaxprEqn | None:
    """The equation that replaces ``producer`` (a broadcast_in_dim or stack
    making the 3-D value) and ``reshape`` (merging its last two axes), or
    ``None`` where the pair is not a repeat or interleave of the minor axis."""
    view = cast(Aval, producer.outvars[0].aval)
    out = cast(Aval, reshape.outvars[0].aval)
    if reshape.params.get("dimensions") is not None or \
            tuple(out.shape) != (*view.shape[:-2], view.shape[-2] * view.shape[-1]):
        return None
    operands: Sequence[jax_core.Atom] = producer.invars
    avals = [cast(Aval, v.aval) for v in operands]
    if not all(map(_movable, avals)) or \
            any(tuple(a.shape) != tuple(view.shape[:-1]) for a in avals):
        return None
    if producer.primitive is lax_internal.broadcast_in_dim_p:
        if len(operands) != 1 or \
                tuple(producer.params["broadcast_dimensions"]) != tuple(range(avals[0].ndim)):
            return None
        repeats = view.shape[-1]
    elif producer.primitive is lax_internal.stack_p:
        if producer.params["axis"] != view.ndim - 1:
            return None
        repeats = 1
    else:
        return None
    return reshape.replace(invars=list(operands), primitive=interleave_p,
                           params={"repeats": repeats})


def fuse(jaxpr: jax_core.Jaxpr) -> jax_core.Jaxpr | None:
    """``jaxpr`` with every repeat and interleave of the minor axis whose
    3-D value has no other use fused into one :data:`interleave_p`
    equation; ``None`` if it has none."""
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
