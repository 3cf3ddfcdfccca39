"""Flattening a tiled register layout to one dim (beyond jax).

Pallas reduces a vector to a scalar by flattening it (``vector.shape_cast``
to rank 1) and reducing the 1-D vector (``vector.reduction``); ``jnp.argmax``
without an axis flattens too. jax's layout inference only knows how to
flatten splat and strided layouts, so a tiled value (anything loaded from
swizzled SMEM, any WGMMA result) cannot be reduced to a scalar there.

A tiled layout needs no data movement to be flattened: tiling a shape ``S``
splits each of its dims into digits (mixed radix), and each digit is a
register, lane, warp or vector dim. Every digit has a stride in the
row-major flat index, and the digits of all dims, sorted by that stride,
are a mixed-radix decomposition of the flat index ``[0, prod S)``. A 1-D
tiling ``(N,)(N / r0,)(N / (r0 r1),)...`` has exactly those digits ``r0, r1,
...`` as its tiled dims, so giving each the role (warp, lane, vector or
register) it had in the source layout describes the same placement of every
element in every thread: the 1-D :class:`TiledLayout` this module computes.
Only the order of the register array changes (a transpose of the numpy
array of registers, no instruction). jax itself reinterprets a strided
layout as a 1-D tiled layout the same way before reducing it
(``FragmentedArray.reduce``).

The shape cast's constraint states the flattening one way
(:class:`Flattened`); the way back (a 1-D tiled layout to ``S``) has many
tiled answers that place elements alike but compare unequal, so
:class:`FlattenedFrom` only implies it for the layouts jax reshapes
(splat, strided, size-1 dims).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator

import numpy as np
from jax.experimental.mosaic.gpu import fragmented_array as fa

from smalti.constraints import (
    UNSUPPORTED,
    Constraint,
    Expression,
    Reshaped,
    ValueOf,
    Variable,
    describe,
    evaluate,
)
from smalti.layouts import Constant, RegisterLayout


def _row_major_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, acc = [], 1
    for size in reversed(shape):
        strides.append(acc)
        acc *= size
    return tuple(reversed(strides))


@functools.lru_cache(maxsize=256)
def flatten_tiled(layout: fa.TiledLayout, shape: tuple[int, ...]
                  ) -> tuple[fa.TiledLayout, tuple[int, ...]] | None:
    """The 1-D layout of ``prod(shape)`` elements placed as ``layout`` places
    ``shape``, and the permutation of the source's register-array dims that
    orders them as the 1-D layout's; ``None`` where there is none."""
    try:
        tiled_shape = layout.tiling.tile_shape(shape)
    except ValueError:
        return None
    strides = layout.tiling.tile_strides(_row_major_strides(shape))
    rank = len(tiled_shape)
    vector_dim = rank + layout.vector_dim
    # The digits: every dim of size > 1, major first (a size-1 vector dim last).
    digits = sorted((d for d in range(rank) if tiled_shape[d] > 1), key=lambda d: -strides[d])
    # They must be a mixed-radix decomposition of the flat index.
    expected = 1
    for d in reversed(digits):
        if strides[d] != expected:
            return None
        expected *= tiled_shape[d]
    if expected != math.prod(shape):
        return None
    if tiled_shape[vector_dim] == 1:
        digits.append(vector_dim)
    sizes = [tiled_shape[d] for d in digits]
    tiles = tuple((math.prod(sizes[i:]),) for i in range(len(sizes)))
    position = {d: i - len(digits) for i, d in enumerate(digits)}

    def role(d: int | fa.Replicated) -> int | fa.Replicated:
        return d if isinstance(d, fa.Replicated) else position[rank + d]

    try:
        flat = fa.TiledLayout(
            fa.Tiling(tiles),
            warp_dims=tuple(role(d) for d in layout.warp_dims),
            lane_dims=tuple(role(d) for d in layout.lane_dims),
            vector_dim=position[vector_dim],
        )
    except (ValueError, KeyError):
        return None
    others = tuple(d for d in range(rank) if d not in position)
    return flat, (*digits, *others)


def flatten_registers(registers: np.ndarray, permutation: tuple[int, ...],
                      flat: fa.TiledLayout, size: int) -> np.ndarray:
    """The register array of ``flat`` holding the same registers."""
    return registers.transpose(permutation).reshape(flat.registers_shape((size,)))


class Flattened(Reshaped):
    """The layout of ``expression`` (of ``source_shape``) flattened to rank 1:
    as :class:`Reshaped`, and for a tiled layout jax cannot reshape, the 1-D
    tiled layout that places every element alike."""

    __slots__ = ()

    def congruence_key(self):
        return (Flattened, self.source_shape, self.target_shape)

    def apply(self, value: Constant):
        result = super().apply(value)
        if result is not UNSUPPORTED or not isinstance(value, RegisterLayout) \
                or not isinstance(value.layout, fa.TiledLayout):
            return result
        flat = flatten_tiled(value.layout, self.source_shape)
        return UNSUPPORTED if flat is None else RegisterLayout(flat[0])

    def __str__(self) -> str:
        return f"flatten({describe(self.expression)}, {self.source_shape})"


class FlattenedFrom(Constraint):
    """``source`` is ``result`` reshaped back, where jax can say which layout
    that is (splat, strided, size-1 dims). Holds whenever ``result`` is the
    flattening of ``source``."""

    __slots__ = ("source", "result", "forward", "back")
    holds_once_implied = False

    def __init__(self, source: Variable, result: Variable, source_shape: tuple[int, ...],
                 result_shape: tuple[int, ...]) -> None:
        self.source, self.result = source, result
        self.forward = Flattened(source, source_shape, result_shape)
        self.back = Reshaped(result, result_shape, source_shape)

    def expressions(self) -> tuple[Expression, ...]:
        return (self.source, self.result)

    def check(self, values: tuple[Constant, ...]) -> bool:
        source, result = values
        return self.forward.apply(source) == result or self.back.apply(result) == source

    def implied(self, value_of: ValueOf) -> Iterator[tuple[Variable, Constant]]:
        if value_of(self.source) is None:
            value = evaluate(self.back, value_of)
            if value is not None and value is not UNSUPPORTED:
                yield self.source, value

    def __str__(self) -> str:
        return f"{describe(self.source)} == {self.back} (where not a flattening)"
