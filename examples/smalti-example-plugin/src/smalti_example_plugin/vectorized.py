"""``Vectorized``: a constraint smalti's core does not know.

A fused multiply-add pays off when each thread holds its elements in vectors
(``f16x2`` / ``f32x2`` packed instructions), not one element per register.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from jax.experimental.mosaic.gpu import fragmented_array as fa

from smalti.constraints import Constraint, Expression, SearchContext, Variable, describe
from smalti.layouts import Constant, RegisterLayout


def elements_per_vector(layout: object) -> int | None:
    """How many elements one register of ``layout`` holds; ``None`` for splats
    (one value for the whole array: always fine) and non-register layouts."""
    match layout:
        case fa.WGStridedFragLayout():
            return layout.vec_size
        case fa.TiledLayout():
            return layout.vector_length
    return None


@dataclass(frozen=True)
class Vectorized(Constraint):
    """``expr`` is a register layout whose registers hold at least ``elements``
    elements each (or a splat)."""

    expr: Expression
    elements: int

    def expressions(self) -> tuple[Expression, ...]:
        return (self.expr,)

    def check(self, values: tuple[Constant, ...]) -> bool:
        (value,) = values
        if not isinstance(value, RegisterLayout):
            return False
        if isinstance(value.layout, fa.WGSplatFragLayout):
            return True
        length = elements_per_vector(value.layout)
        return length is not None and length >= self.elements

    def candidates(self, ctx: SearchContext) -> Iterator[tuple[Variable, Constant]]:
        # The widest strided layout of the type, if it is wide enough.
        if isinstance(self.expr, Variable) and ctx.value_of(self.expr) is None:
            layout = fa.WGStridedFragLayout.from_shaped_type(self.expr.type)
            if layout is not None and layout.vec_size >= self.elements:
                yield self.expr, RegisterLayout(layout)

    def __str__(self) -> str:
        return f"{describe(self.expr)} holds vectors of at least {self.elements} elements"
