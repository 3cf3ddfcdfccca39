"""The types the vocabulary's Pallas rules are annotated with.

Pallas calls a Warpgroup lowering rule with its ``LoweringRuleContext``
(:class:`PallasContext`: what the rules read of it) and, for each operand,
an ``ir.Value`` or, for a literal, a Python scalar (Pallas leaves both
untyped: :data:`Operand`); the rule returns the result's ``ir.Value``, or a
sequence of them (:data:`Lowered`). A resource estimator gets a
``ResourceEstimatorContext`` and the operands' abstract values, and returns
a ``Resources``. Decompositions written as jax functions take and return
``jax.Array``s.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import jax
from jax._src import core as jax_core
from jax._src.pallas.mosaic_gpu import lowering as pallas_lowering
from jax.experimental.mosaic import gpu as mgpu

EstimatorContext = pallas_lowering.ResourceEstimatorContext
Resources = pallas_lowering.Resources
#: An operand of a Pallas lowering rule: an ``ir.Value`` or a Python scalar.
Operand = Any
#: What a Pallas lowering rule returns: an ``ir.Value`` or a sequence of them.
Lowered = Any
#: An operand's abstract value (shape and dtype).
Aval = jax_core.ShapedArray
#: A static shape.
Shape = tuple[int, ...]
DTypeLike = jax.typing.DTypeLike


class PallasContext(Protocol):
    """What the rules read of Pallas' ``LoweringRuleContext``. In Warpgroup
    lowering its avals are ``ShapedArray``s (Pallas types them as a protocol
    without the ``size`` and ``str_short`` the rules use)."""

    @property
    def module_ctx(self) -> pallas_lowering.ModuleContext: ...

    @property
    def launch_ctx(self) -> mgpu.LaunchContext: ...

    @property
    def prim(self) -> jax_core.Primitive: ...

    @property
    def avals_in(self) -> Sequence[Aval]: ...

    @property
    def avals_out(self) -> Sequence[Aval]: ...

    def replace(self, **changes: Any) -> PallasContext: ...
