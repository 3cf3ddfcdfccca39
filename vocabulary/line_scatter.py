"""Scatters of one element into every row (or every column) of a block:
``x.at[jnp.arange(n), cols].add(u)`` (cross-entropy's gradient, one-hot
updates) and ``jnp.put_along_axis(x, cols[:, None], u, axis=1)``, fused into
one elementwise select.

jnp writes them as a point ``scatter`` (``scatter-add``, ``-mul``, ``-min``,
``-max``) whose index array concatenates (or stacks) two coordinates, one of them an
iota over the rows (or columns): each line gets exactly one update, at the
other coordinate. :mod:`smalti.vocabulary.indexing`'s scatter, a loop over
the updates, cannot take that (n, 2) or (n, 1, 2) index array, whose
layouts Mosaic GPU does not have; and a loop is the wrong shape for it: no
two updates meet, so the result is, with ``p`` the update's position in
its line,

    out = where(iota_along_the_line == p, combine(x, u), x)

-- a compare and a select per element (and the combine: an add, a
multiply, a min or a max), exact for every kind and order since no element
is updated twice. jnp's wrap of negative positions is applied as jnp does;
under ``fill`` (jnp's default: out-of-bounds updates dropped) a position
outside the line hits nothing, under ``clip`` it is clamped first.

The fusion is a jaxpr rewrite (``registry.jaxpr_rewrite``, applied to every
jaxpr Pallas lowers, nested ones included): a scatter whose index array is
such a concatenation, its coordinates traced back through the broadcasts
and reshapes that only add unit dimensions and through jnp's wrap, becomes
one :data:`line_scatter_p` equation of the operand, the position vector
and the updates; the index array's equations, then unread, are dropped.
Every other scatter is left as it is.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, cast

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax._src import core as jax_core
from jax._src.interpreters import mlir
from jax._src.lax import lax as lax_internal
from jax._src.lax import slicing
from jax._src.pallas.mosaic_gpu import lowering as pallas_lowering

from smalti.vocabulary import lanes
from smalti.vocabulary.annotations import Aval, Lowered, Operand, PallasContext

__all__ = ["fuse", "line_scatter_p", "lower", "KINDS"]

Mode = slicing.GatherScatterMode

#: The scatter primitives fused, by the combine they apply.
KINDS: dict[Any, str] = {
    slicing.scatter_p: "set", slicing.scatter_add_p: "add", slicing.scatter_mul_p: "mul",
    slicing.scatter_min_p: "min", slicing.scatter_max_p: "max",
}

#: ``x`` with the element at ``positions[i]`` of its line ``i`` combined with
#: ``updates[i]`` (lines: rows for ``axis=0``, columns for ``axis=1``;
#: ``positions`` (int32) and ``updates`` are (n,) or (n, 1) for rows, (n,)
#: or (1, n) for columns).
line_scatter_p = jax_core.Primitive("smalti_line_scatter")


def _as_line(v: jax.Array, axis: int) -> jax.Array:
    """A (n,), (n, 1) or (1, n) array shaped to broadcast along the lines
    of ``axis``."""
    if v.ndim == 1:
        return v[:, None] if axis == 0 else v[None, :]
    return v


def line_scatter(x: jax.Array, positions: jax.Array, updates: jax.Array, *, axis: int,
                 kind: str, mode: Mode, wrapped: bool) -> jax.Array:
    """What :data:`line_scatter_p` computes (the module docstring's select)."""
    length = x.shape[1 - axis]
    p = _as_line(positions, axis)
    if wrapped:  # jnp's: -length <= p < 0 counts from the end
        p = jnp.where(p < 0, p + length, p)
    if mode == Mode.CLIP:
        p = jnp.clip(p, 0, length - 1)
    u = _as_line(updates, axis).astype(x.dtype)
    combined = {"set": lambda: jnp.broadcast_to(u, x.shape), "add": lambda: x + u,
                "mul": lambda: x * u, "min": lambda: lax.min(x, jnp.broadcast_to(u, x.shape)),
                "max": lambda: lax.max(x, jnp.broadcast_to(u, x.shape))}[kind]()
    # the position along the line: built in registers where the block is in them
    hit = lanes.iota(tuple(x.shape), 1 - axis) == p
    return jnp.where(hit, combined, x)


@line_scatter_p.def_abstract_eval
def _abstract_eval(x: Aval, positions: Aval, updates: Aval, **params: Any) -> Aval:
    del positions, updates, params
    return jax_core.ShapedArray(x.shape, x.dtype)


line_scatter_p.def_impl(line_scatter)
mlir.register_lowering(line_scatter_p, mlir.lower_fun(line_scatter, multiple_results=False))


def lower(ctx: PallasContext, x: Operand, positions: Operand, updates: Operand, *, axis: int,
          kind: str, mode: Mode, wrapped: bool) -> Lowered:
    with lanes.for_operands(x, positions, updates):
        return pallas_lowering._lower_fun(
            lambda x, p, u: line_scatter(x, p, u, axis=axis, kind=kind, mode=mode,
                                         wrapped=wrapped))(ctx, x, positions, updates)


# --- the rewrite ------------------------------------------------------------------------------

#: Primitives the index array's equations may be made of (pure, so dropped
#: once nothing reads them).
_INDEX_PRIMITIVES = frozenset({
    lax_internal.broadcast_in_dim_p, lax_internal.reshape_p, lax_internal.concatenate_p,
    lax_internal.stack_p,
    lax_internal.select_n_p, lax_internal.lt_p, lax_internal.add_p, lax_internal.iota_p,
    lax_internal.convert_element_type_p})


def _aval(v: Any) -> Aval:
    return cast(Aval, v.aval)


def _literal(v: Any) -> Any:
    return v.val if isinstance(v, jax_core.Literal) else None


def _unwrapped(eqn: jax_core.JaxprEqn | None, producers: dict, length: int) -> Any:
    """``c`` where ``eqn`` is jnp's ``select_n(c < 0, c, c + length)``; else None."""
    if eqn is None or eqn.primitive is not lax_internal.select_n_p or len(eqn.invars) != 3:
        return None
    test, kept, added = eqn.invars
    t, a = producers.get(test), producers.get(added)
    if t is None or a is None or t.primitive is not lax_internal.lt_p or \
            a.primitive is not lax_internal.add_p:
        return None
    if t.invars[0] is not kept or _literal(t.invars[1]) != 0:
        return None
    if a.invars[0] is not kept or _literal(a.invars[1]) != length:
        return None
    return kept


def _only_unit_dims(eqn: jax_core.JaxprEqn) -> bool:
    """A broadcast or reshape that keeps the elements and their order,
    adding or removing dimensions of size 1."""
    if eqn.primitive not in (lax_internal.broadcast_in_dim_p, lax_internal.reshape_p):
        return False
    src, out = _aval(eqn.invars[0]), _aval(eqn.outvars[0])
    return src.size == out.size and \
        [d for d in src.shape if d != 1] == [d for d in out.shape if d != 1]


def _line_form(aval: Aval, n: int, axis: int) -> bool:
    """(n,), or (n, 1) for rows and (1, n) for columns."""
    return tuple(aval.shape) in ((n,), (n, 1) if axis == 0 else (1, n))


def _coordinate(v: Any, producers: dict, length: int, n: int, axis: int
                ) -> tuple[Any, bool, Any]:
    """A coordinate of the index array traced back through unit-dimension
    moves and jnp's wrap into ``length``: (a value of a line form on the
    way -- before the wrap where there is one, which is then to be
    re-applied -- or None; whether it is to be wrapped; the ``iota``
    equation the chain starts at, or None)."""
    chain, wrap_at, iota = [], None, None
    while True:
        chain.append(v)
        eqn = producers.get(v)
        if eqn is None:
            break
        if eqn.primitive is lax_internal.iota_p:
            iota = eqn
            break
        bare = _unwrapped(eqn, producers, length)
        if bare is not None and wrap_at is None:
            wrap_at, v = len(chain), bare
            continue
        if not _only_unit_dims(eqn):
            break
        v = eqn.invars[0]
    for start, wrapped in ((wrap_at, True), (0, False)):
        if start is None:
            continue
        for value in chain[start:] if wrapped else chain[:wrap_at]:
            if _line_form(_aval(value), n, axis):
                return value, wrapped, iota
    return None, False, iota


def _match(eqn: jax_core.JaxprEqn, producers: dict) -> dict[str, Any] | None:
    """The :data:`line_scatter_p` equation's operands and parameters for a
    scatter ``eqn`` of one element per line, or None."""
    x, indices, updates = eqn.invars
    dn = eqn.params["dimension_numbers"]
    if _aval(x).ndim != 2 or dn.update_window_dims or tuple(dn.inserted_window_dims) != (0, 1) \
            or tuple(dn.scatter_dims_to_operand_dims) != (0, 1) or dn.operand_batching_dims:
        return None
    if eqn.params.get("update_jaxpr") is not None and KINDS[eqn.primitive] == "set":
        return None
    mode = Mode.from_any(eqn.params["mode"])
    cat = producers.get(indices)  # the coordinates, concatenated or stacked along the last axis
    last = _aval(indices).ndim - 1
    if cat is None or len(cat.invars) != 2 or not (
            (cat.primitive is lax_internal.concatenate_p and cat.params["dimension"] == last)
            or (cat.primitive is lax_internal.stack_p and cat.params["axis"] == last)):
        return None
    if tuple(_aval(updates).shape) != tuple(_aval(indices).shape[:-1]):
        return None
    for axis in (0, 1):  # the coordinate that is an iota: the lines' axis
        n, length = _aval(x).shape[axis], _aval(x).shape[1 - axis]
        if int(np.prod(_aval(updates).shape)) != n:
            continue
        _, _, iota = _coordinate(cat.invars[axis], producers, n, n, axis)
        if iota is None or tuple(iota.params["shape"]) != (n,) or \
                iota.params["dimension"] != 0:
            continue
        positions, wrapped, _ = _coordinate(cat.invars[1 - axis], producers, length, n, axis)
        if positions is None or not _line_form(_aval(updates), n, axis):
            continue
        if np.dtype(_aval(positions).dtype) != np.int32:  # jnp's; the iota's type
            continue
        return dict(invars=[x, positions, updates],
                    params=dict(axis=axis, kind=KINDS[eqn.primitive], mode=mode,
                                wrapped=wrapped))
    return None


def fuse(jaxpr: jax_core.Jaxpr) -> jax_core.Jaxpr | None:
    """``jaxpr`` with every scatter of one element per row or column as one
    :data:`line_scatter_p` equation, its index array's equations dropped
    where nothing else reads them; ``None`` if it has none."""
    producers = {v: e for e in jaxpr.eqns for v in e.outvars}
    replaced: dict[int, jax_core.JaxprEqn] = {}
    for eqn in jaxpr.eqns:
        if eqn.primitive in KINDS:
            found = _match(eqn, producers)
            if found is not None:
                replaced[id(eqn)] = eqn.replace(primitive=line_scatter_p, **found)
    if not replaced:
        return None
    eqns = [replaced.get(id(e), e) for e in jaxpr.eqns]
    # drop the index arrays' equations nothing reads any more (pure ones only)
    uses = Counter(v for v in jaxpr.outvars if isinstance(v, jax_core.Var))
    kept: list[jax_core.JaxprEqn] = []
    for e in reversed(eqns):
        if e.primitive in _INDEX_PRIMITIVES and not e.effects and \
                not any(uses[v] for v in e.outvars):
            continue
        kept.append(e)
        uses.update(v for v in e.invars if isinstance(v, jax_core.Var))
    return jaxpr.replace(eqns=kept[::-1])
