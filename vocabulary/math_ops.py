"""Rules for the two ``math`` ops the vocabulary emits that :mod:`smalti.plugins`
has no rule for: ``math.floor`` and ``math.powf``.

Both are elementwise (operands and result share a layout) and both are ops
jax's own code generators already emit at Lane level --
``FragmentedArray.__floordiv__`` emits ``math.floor``,
``FragmentedArray.__pow__`` emits ``math.powf`` -- so what they compile to
on the GPU is what jax already relies on. 16-bit floats are computed in f32
and rounded once: ``floor`` of an f16/bf16 value is exact in f32, and f32
``powf`` rounded to 16 bits is within 1 ulp of the exact power.
"""

from __future__ import annotations

from collections.abc import Callable

from jax._src.lib.mlir import ir
from jax._src.lib.mlir.dialects import math as mlir_math
from jax.experimental.mosaic.gpu import fragmented_array as fa

from smalti.plugins.elementwise import shared_layout
from smalti.registry import ConstraintRegistry, LoweringRegistry
from smalti.rules import LoweringContext, same_layout

Array = fa.FragmentedArray

FLOOR = "math.floor"
POWF = "math.powf"


def _in_f32(element: ir.Type, *arrays: Array, fn: Callable[..., Array]) -> Array:
    """``fn(*arrays)``, computed in f32 when ``element`` is a 16-bit float."""
    if isinstance(element, (ir.F16Type, ir.BF16Type)):
        f32 = ir.F32Type.get()
        return fn(*(a.astype(f32) for a in arrays)).astype(element)
    return fn(*arrays)


def lower_floor(ctx: LoweringContext, op: ir.OpView) -> list[ir.Value]:
    [x] = ctx.operand_arrays(op, layout=shared_layout(ctx, op))
    element = ir.VectorType(op.result.type).element_type
    result = _in_f32(element, x, fn=lambda a: a._pointwise(mlir_math.floor))
    return [ctx.to_ir(result, op.result.type)]


def lower_powf(ctx: LoweringContext, op: ir.OpView) -> list[ir.Value]:
    x, y = ctx.operand_arrays(op, layout=shared_layout(ctx, op))
    element = ir.VectorType(op.result.type).element_type
    result = _in_f32(element, x, y, fn=lambda a, b: a ** b)  # FragmentedArray.__pow__: math.powf
    return [ctx.to_ir(result, op.result.type)]


def register_constraints(registry: ConstraintRegistry) -> None:
    registry.constraint_rule(FLOOR, POWF)(same_layout)


def register_lowerings(registry: LoweringRegistry) -> None:
    registry.lowering_rule(FLOOR)(lower_floor)
    registry.lowering_rule(POWF)(lower_powf)
