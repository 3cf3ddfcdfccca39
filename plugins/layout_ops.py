"""Ops about layouts themselves: ``layout_cast``, ``optimization_barrier``,
``broadcasted_iota``."""

from __future__ import annotations

from jax._src.lib import mosaic_gpu_dialect as mgpu
from jax._src.lib.mlir import ir
from jax.experimental.mosaic.gpu import fragmented_array as fa
from jax.experimental.mosaic.gpu import layouts as mgpu_layouts
from jax.experimental.mosaic.gpu import utils as mgpu_utils

from smalti.constraints import Excludes, Relayout
from smalti.diagnostics import SmaltiValueError
from smalti.layouts import RegisterLayout, describe_register_layout, register_layout_fits
from smalti.plugins.versions import BEFORE_0_12, SINCE_0_12
from smalti.registry import ConstraintRegistry, LoweringRegistry
from smalti.rules import ConstraintBuilder, LoweringContext, default_is_signed, malformed_op


def _layout_cast(op: mgpu.LayoutCastOp, b: ConstraintBuilder, strict: bool) -> None:
    """The result has the requested layout; the operand must be convertible to it."""
    source, result = b.variable(b.operand(0)), b.variable(b.result(0))
    layout = mgpu_layouts.from_layout_attr(op.new_layout)
    shape = tuple(ir.VectorType(op.x.type).shape)
    if not register_layout_fits(shape, layout):
        raise SmaltiValueError(
            "SM102",
            f"Cannot cast to layout {describe_register_layout(layout)}: the layout is not "
            f"compatible with the operand shape {shape}",
            op=op,
            values={"new_layout": str(op.new_layout), "operand shape": shape},
            fix=[f"cast to a splat or strided layout of shape {list(shape)}",
                 "or to a tiled layout whose tile divides the shape"],
        )
    b.assign(result, RegisterLayout.of(layout))
    bitwidth = mgpu_utils.bitwidth(ir.VectorType(op.x.type).element_type)
    b.require(Relayout(source, result, bitwidth, strict=strict))


def layout_cast(op: mgpu.LayoutCastOp, b: ConstraintBuilder) -> None:
    """jax >= 0.12: a ``strict`` cast allows no register conversion (splats aside)."""
    _layout_cast(op, b, strict=op.strict is not None and bool(op.strict.value))


def layout_cast_jax_0_11(op: mgpu.LayoutCastOp, b: ConstraintBuilder) -> None:
    """jax 0.11: casts have no ``strict`` attribute; every one may convert."""
    _layout_cast(op, b, strict=False)


def optimization_barrier(op: mgpu.OptimizationBarrierOp, b: ConstraintBuilder) -> None:
    """Each vector operand keeps its layout through the barrier."""
    operation = op.operation
    if len(operation.results) != len(operation.operands):  # paired up below
        raise malformed_op(
            op, f"mosaic_gpu.optimization_barrier has {len(operation.operands)} operands and "
            f"{len(operation.results)} results: it returns each operand",
            fix="give the barrier one result per operand, of the operand's type")
    for i, operand in enumerate(operation.operands):
        if isinstance(operand.type, ir.VectorType):
            b.variable(b.operand(i), b.result(i))


def broadcasted_iota(op: mgpu.BroadcastedIotaOp, b: ConstraintBuilder) -> None:
    b.require(Excludes(b.variable(b.result(0)), fa.WGSplatFragLayout))


def register_constraints(registry: ConstraintRegistry) -> None:
    registry.constraint_rule("mosaic_gpu.layout_cast", jax=SINCE_0_12)(layout_cast)
    registry.constraint_rule("mosaic_gpu.layout_cast", jax=BEFORE_0_12)(layout_cast_jax_0_11)
    registry.constraint_rule("mosaic_gpu.optimization_barrier")(optimization_barrier)
    registry.constraint_rule("mosaic_gpu.broadcasted_iota")(broadcasted_iota)


def lower_layout_cast(ctx: LoweringContext, op: mgpu.LayoutCastOp) -> list[ir.Value]:
    [in_layout] = ctx.in_layouts(op)
    [out_layout] = ctx.out_layouts(op)
    array = ctx.from_ir(op.x, in_layout)
    return [ctx.to_ir(array.to_layout(mgpu_layouts.from_layout_attr(out_layout)),
                      op.result.type)]


def _is_scalar(ty: ir.Type) -> bool:
    return isinstance(ty, (ir.IntegerType, ir.IndexType, ir.FloatType))


def lower_optimization_barrier(ctx: LoweringContext,
                               op: mgpu.OptimizationBarrierOp) -> list[ir.Value]:
    operands = list(op.operation.operands)
    has_vectors = any(isinstance(v.type, ir.VectorType) for v in operands)
    layouts = iter(ctx.in_layouts(op) if has_vectors else [])
    arrays = []
    for operand in operands:
        if isinstance(operand.type, ir.VectorType):
            arrays.append(ctx.from_ir(operand, next(layouts)))
        elif _is_scalar(operand.type):
            arrays.append(fa.FragmentedArray.splat(
                operand, shape=(), is_signed=default_is_signed(operand.type)))
        else:
            raise ctx.unsupported(op, f"Unsupported optimization barrier for operand "
                                  f"{operand.type}: it holds only vectors and scalars",
                                  fix="pass only vectors and scalars through the barrier")
    barriered = fa.optimization_barrier(*arrays)
    if isinstance(barriered, fa.FragmentedArray):
        barriered = [barriered]
    return [array.registers.item() if _is_scalar(result.type)
            else ctx.to_ir(array, result.type)
            for array, result in zip(barriered, op.operation.results, strict=True)]


def lower_broadcasted_iota(ctx: LoweringContext, op: mgpu.BroadcastedIotaOp) -> list[ir.Value]:
    [layout] = ctx.out_layouts(op)
    vector = ir.VectorType(op.result.type)
    array = fa.FragmentedArray.broadcasted_iota(
        vector.element_type, tuple(vector.shape), op.dimension.value,
        mgpu_layouts.from_layout_attr(layout),
        is_signed=default_is_signed(vector.element_type))
    return [ctx.to_ir(array, vector)]


def register_lowerings(registry: LoweringRegistry) -> None:
    registry.lowering_rule("mosaic_gpu.layout_cast")(lower_layout_cast)
    registry.lowering_rule("mosaic_gpu.optimization_barrier", warp_semantics=True)(
        lower_optimization_barrier)
    registry.lowering_rule("mosaic_gpu.broadcasted_iota")(lower_broadcasted_iota)
