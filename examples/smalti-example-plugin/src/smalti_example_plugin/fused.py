"""The op ``smalti_example.fma``: ``a * b + c``, elementwise, fused.

No MLIR dialect defines it: kernels build it with ``ir.Operation.create`` (see
:func:`fma_op`) in a context that allows unregistered dialects, and smalti
lowers it away before anything else sees it.
"""

from __future__ import annotations

from jax._src.lib.mlir import ir
from jax._src.lib.mlir.dialects import math as mlir_math

from smalti.rules import ConstraintBuilder, LoweringContext
from smalti_example_plugin.vectorized import Vectorized

OP_NAME = "smalti_example.fma"

#: Elements per register the op wants (see :class:`Vectorized`).
MIN_VECTOR = 2


def fma_op(a: ir.Value, b: ir.Value, c: ir.Value) -> ir.Value:
    """Builds ``smalti_example.fma(a, b, c)`` at the current insertion point."""
    return ir.Operation.create(OP_NAME, results=[a.type], operands=[a, b, c]).result


def fma_constraints(op: ir.OpView, b: ConstraintBuilder) -> None:
    """Operands and result share one layout, and it is vectorized."""
    layout = b.variable(*b.vector_sites())
    b.require(Vectorized(layout, MIN_VECTOR))


def lower_fma(ctx: LoweringContext, op: ir.OpView) -> list[ir.Value]:
    result_type = op.operation.results[0].type
    if not isinstance(ir.VectorType(result_type).element_type, ir.FloatType):
        raise ctx.fail(op, f"{OP_NAME} takes floating-point vectors",
                       type=str(result_type), fix="convert the operands to a float type first")
    [layout] = ctx.out_layouts(op)
    a, b, c = ctx.operand_arrays(op, layout=layout)
    # One math.fma per register: Mosaic GPU's pointwise helper applies it.
    return [ctx.to_ir(a._pointwise(mlir_math.fma, b, c), result_type)]
