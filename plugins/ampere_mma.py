"""``mosaic_gpu.mma``: the Ampere-style synchronous warp-level MMA
(``mma.sync``), in the layouts of ``jax.experimental.mosaic.gpu.mma.MMALayouts``
for its shape. (Hopper's WGMMA and Blackwell's tcgen05 live in
``smalti.hopper`` and ``smalti.blackwell``.)
"""

from __future__ import annotations

from jax._src.lib import mosaic_gpu_dialect as mgpu
from jax._src.lib.mlir import ir
from jax.experimental.mosaic.gpu import layouts as mgpu_layouts

# The package exports a function named `mma` that shadows the module.
from jax.experimental.mosaic.gpu.mma import MMALayouts
from jax.experimental.mosaic.gpu.mma import mma as warp_level_mma

from smalti.diagnostics import SmaltiValueError
from smalti.plugins.pinned_layouts import pin_layout
from smalti.registry import ConstraintRegistry, LoweringRegistry
from smalti.rules import ConstraintBuilder, LoweringContext, malformed_op


def _mma_layouts(op: mgpu.MMAOp) -> MMALayouts:
    shapes = {what: list(ir.ShapedType(v.type).shape)
              for what, v in (("accumulator", op.accumulator), ("a", op.a), ("b", op.b))}
    if any(len(shape) != 2 for shape in shapes.values()):
        raise malformed_op(op, "the accumulator, a and b of mosaic_gpu.mma must be 2-D "
                           "vectors", fix="pass (M, N), (M, K) and (K, N) vectors", **shapes)
    m, n = shapes["accumulator"]
    try:
        return MMALayouts.for_shape(ir.VectorType(op.a.type).element_type, m, n)
    except ValueError as e:
        raise SmaltiValueError(
            "SM102", f"mosaic_gpu.mma has no MMA layouts for an accumulator of shape "
            f"{(m, n)}: {e}", op=op, values={"accumulator": str(op.accumulator.type)},
            fix="use an accumulator whose M is a multiple of 16 and N a multiple of 8 "
            "(e.g. 64x32)") from None


def mma(op: mgpu.MMAOp, b: ConstraintBuilder) -> None:
    """Accumulator (in and out), A and B are in the MMA layouts for the shape."""
    layouts = _mma_layouts(op)
    pin_layout(b, op, "the accumulator", layouts.acc, op.accumulator, b.operand(0), b.result(0))
    pin_layout(b, op, "the 'a' operand", layouts.lhs, op.a, b.operand(1))
    pin_layout(b, op, "the 'b' operand", layouts.rhs, op.b, b.operand(2))


def register_constraints(registry: ConstraintRegistry) -> None:
    registry.constraint_rule("mosaic_gpu.mma")(mma)


def lower_mma(ctx: LoweringContext, op: mgpu.MMAOp) -> list[ir.Value]:
    """``acc + a @ b`` with warp-level ``mma.sync`` instructions."""
    acc_layout, a_layout, b_layout = ctx.in_layouts(op)
    [out_layout] = ctx.out_layouts(op)
    m, n = ir.VectorType(op.accumulator.type).shape
    element_type = ir.VectorType(op.a.type).element_type
    expected = mgpu_layouts.to_layout_attr(
        MMALayouts.for_shape(element_type, m, n).acc)
    if acc_layout != expected or out_layout != expected:
        raise ctx.fail(op, "the accumulator of mosaic_gpu.mma must be in the MMA "
                       "accumulator layout for its shape", expected=str(expected),
                       fix="let layout inference choose the accumulator's layout")
    # Integer MMAs multiply signed operands into a signed accumulator.
    signed = True if isinstance(element_type, ir.IntegerType) else None
    acc = ctx.from_ir(op.accumulator, acc_layout, signed)
    a = ctx.from_ir(op.a, a_layout, signed)
    b = ctx.from_ir(op.b, b_layout, signed)
    return [ctx.to_ir(warp_level_mma(acc, a, b), op.result.type)]


def register_lowerings(registry: LoweringRegistry) -> None:
    registry.lowering_rule("mosaic_gpu.mma")(lower_mma)
