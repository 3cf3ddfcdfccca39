"""Elementwise ``arith`` and ``math`` ops on vectors, and ``arith.constant``.

All operands and the result of an elementwise op share one layout; the
lowering applies the matching ``FragmentedArray`` operation register by
register. Signedness is not part of MLIR integer types, so each op's table
entry says how its integer operands are to be read.
"""

from __future__ import annotations

import operator
from collections.abc import Callable

from jax._src.lib.mlir import ir
from jax._src.lib.mlir.dialects import arith
from jax.experimental.mosaic.gpu import fragmented_array as fa
from jax.experimental.mosaic.gpu import layouts as mgpu_layouts

from smalti.constraints import Excludes
from smalti.diagnostics import SmaltiNotImplementedError
from smalti.layouts import RegisterLayout
from smalti.registry import ConstraintRegistry, LoweringRegistry
from smalti.rules import (
    ConstraintBuilder,
    LoweringContext,
    default_is_signed,
    malformed_op,
    same_layout,
)

Array = fa.FragmentedArray

# op name -> (implementation, how integer operands are signed)
BINARY: dict[str, tuple[Callable[[Array, Array], Array], bool | None]] = {
    "arith.addi": (operator.add, False),
    "arith.addf": (operator.add, None),
    "arith.subi": (operator.sub, False),
    "arith.subf": (operator.sub, None),
    "arith.muli": (operator.mul, False),
    "arith.mulf": (operator.mul, None),
    "arith.floordivsi": (operator.floordiv, True),
    "arith.divsi": (Array.trunc_div, True),
    "arith.divui": (Array.trunc_div, False),
    "arith.remsi": (operator.mod, True),
    "arith.remui": (operator.mod, False),
    # FragmentedArray has no float remainder (jax's lowering fails on remf):
    # it is elementwise, so apply arith.remf register by register.
    "arith.remf": (lambda x, y: x._pointwise(arith.remf, y), None),
    "arith.andi": (operator.and_, False),
    "arith.ori": (operator.or_, False),
    "arith.xori": (operator.xor, False),
    "arith.maxsi": (Array.max, True),
    "arith.maxui": (Array.max, False),
    "arith.maximumf": (Array.max, None),
    "arith.minsi": (Array.min, True),
    "arith.minui": (Array.min, False),
    "arith.minimumf": (Array.min, None),
    "arith.shli": (operator.lshift, False),
    "arith.shrui": (operator.rshift, False),
    "arith.shrsi": (operator.rshift, True),
    "math.atan2": (Array.atan2, None),
    "math.copysign": (Array.copysign, None),
}

# op name -> (implementation, signedness, accepts approx=)
UNARY: dict[str, tuple[Callable[..., Array], bool | None, bool]] = {
    "math.rsqrt": (Array.rsqrt, None, True),
    "math.sqrt": (Array.sqrt, None, True),
    "math.exp": (Array.exp, None, True),
    "math.exp2": (Array.exp2, None, True),
    "math.sin": (Array.sin, None, True),
    "math.cos": (Array.cos, None, True),
    "math.log": (Array.log, None, True),
    "math.log2": (Array.log2, None, True),
    "math.tanh": (Array.tanh, None, True),
    "math.absf": (Array.abs, None, False),
    "math.absi": (Array.abs, True, False),
    "math.round": (Array.round, None, False),
    "math.roundeven": (Array.round_even, None, False),
    "math.erf": (Array.erf, None, False),
    "math.ctlz": (lambda x: x._pointwise(_ctlz, restrict_bitwidth=False), None, False),
    "arith.negf": (operator.neg, None, False),
}

# op name -> (source signedness, target signedness)
CONVERSIONS: dict[str, tuple[bool | None, bool | None]] = {
    "arith.extf": (None, None),
    "arith.extsi": (True, True),
    "arith.extui": (False, False),
    "arith.fptosi": (None, True),
    "arith.fptoui": (None, False),
    "arith.sitofp": (True, None),
    "arith.truncf": (None, None),
    "arith.trunci": (False, False),
    "arith.uitofp": (False, None),
}

CMPI = {
    "eq": (operator.eq, False), "ne": (operator.ne, False),
    "slt": (operator.lt, True), "sle": (operator.le, True),
    "sgt": (operator.gt, True), "sge": (operator.ge, True),
    "ult": (operator.lt, False), "ule": (operator.le, False),
    "ugt": (operator.gt, False), "uge": (operator.ge, False),
}
CMPF = {
    "oeq": operator.eq, "une": operator.ne, "olt": operator.lt,
    "ole": operator.le, "ogt": operator.gt, "oge": operator.ge,
}

OTHER = ("arith.cmpi", "arith.cmpf", "arith.bitcast", "arith.select", "arith.divf")
ELEMENTWISE = (*BINARY, *UNARY, *CONVERSIONS, *OTHER)


def _ctlz(x: ir.Value) -> ir.Value:
    from jax._src.lib.mlir.dialects import math as mlir_math

    return mlir_math.ctlz(x)


# --- constraint rules ---------------------------------------------------------------


def constant(op: arith.ConstantOp, b: ConstraintBuilder) -> None:
    """A splat constant is splat; any other vector constant is not."""
    result = b.variable(b.result(0))
    value = op.value
    if isinstance(value, ir.DenseElementsAttr) and ir.DenseElementsAttr(value).is_splat:
        b.assign(result, RegisterLayout.splat(result.shape))
    else:
        b.require(Excludes(result, fa.WGSplatFragLayout))


def register_constraints(registry: ConstraintRegistry) -> None:
    registry.constraint_rule(*ELEMENTWISE)(same_layout)
    registry.constraint_rule("arith.constant")(constant)


# --- lowering rules -------------------------------------------------------------------


def shared_layout(ctx: LoweringContext, op: ir.OpView) -> ir.Attribute:
    """The single layout shared by an elementwise op's operands and result."""
    [layout] = ctx.out_layouts(op)
    if any(operand != layout for operand in ctx.in_layouts(op)):
        raise ctx.fail(op, "operands and result of an elementwise op must share one layout",
                       in_layouts=str(ctx.in_layouts(op)), out_layouts=str(layout),
                       fix="give every operand the result's layout (re-run infer_layouts)")
    return layout


def lower_binary(ctx: LoweringContext, op: ir.OpView) -> list[ir.Value]:
    impl, signed = BINARY[op.operation.name]
    lhs, rhs = ctx.operand_arrays(op, signed, layout=shared_layout(ctx, op))
    return [ctx.to_ir(impl(lhs, rhs), op.result.type)]


def _is_approx(op: ir.OpView) -> bool:
    """Whether the op asks for approximate math (fastmath flags exactly ``afn``)."""
    attributes = op.operation.attributes
    # Compared as text: attributes of different MLIR contexts never compare equal.
    return "fastmath" in attributes and str(attributes["fastmath"]) == "#arith.fastmath<afn>"


def lower_unary(ctx: LoweringContext, op: ir.OpView) -> list[ir.Value]:
    impl, signed, has_approx = UNARY[op.operation.name]
    [x] = ctx.operand_arrays(op, signed, layout=shared_layout(ctx, op))
    result = impl(x, approx=True) if has_approx and _is_approx(op) else impl(x)
    return [ctx.to_ir(result, op.result.type)]


def lower_conversion(ctx: LoweringContext, op: ir.OpView) -> list[ir.Value]:
    source_signed, target_signed = CONVERSIONS[op.operation.name]
    [x] = ctx.operand_arrays(op, source_signed, layout=shared_layout(ctx, op))
    target = ir.VectorType(op.result.type).element_type
    if op.operation.name == "arith.trunci" and target == ir.IntegerType.get_signless(1):
        return [ctx.to_ir(_lowest_bit(x), op.result.type)]
    return [ctx.to_ir(x.astype(target, is_signed=target_signed), op.result.type)]


def _lowest_bit(x: Array) -> Array:
    """``arith.trunci`` to ``i1`` keeps the lowest bit: ``(x & 1) != 0``
    (beyond jax, whose ``FragmentedArray.astype`` has no 1-bit target)."""
    ne = arith.CmpIPredicate.ne
    return (x & 1)._pointwise(lambda a, b: arith.cmpi(ne, a, b), 0, output_is_signed=False,
                              restrict_bitwidth=False)


def lower_cmpi(ctx: LoweringContext, op: arith.CmpIOp) -> list[ir.Value]:
    predicate = str(arith.CmpIPredicate(op.predicate.value)).lower()
    impl, signed = CMPI[predicate]
    lhs, rhs = ctx.operand_arrays(op, signed, layout=shared_layout(ctx, op))
    return [ctx.to_ir(impl(lhs, rhs), op.result.type)]


def lower_cmpf(ctx: LoweringContext, op: arith.CmpFOp) -> list[ir.Value]:
    predicate = str(arith.CmpFPredicate(op.predicate.value)).lower()
    if predicate not in CMPF:
        raise ctx.fail(op, f"the float comparison {predicate!r} is not supported on vectors",
                       supported=", ".join(CMPF),
                       fix="use one of the ordered comparisons or une")
    lhs, rhs = ctx.operand_arrays(op, layout=shared_layout(ctx, op))
    return [ctx.to_ir(CMPF[predicate](lhs, rhs), op.result.type)]


def lower_bitcast(ctx: LoweringContext, op: arith.BitcastOp) -> list[ir.Value]:
    [x] = ctx.operand_arrays(op, layout=shared_layout(ctx, op))
    target = ir.VectorType(op.result.type).element_type
    return [ctx.to_ir(x.bitcast(target, output_is_signed=default_is_signed(target)),
                      op.result.type)]


def lower_select(ctx: LoweringContext, op: arith.SelectOp) -> list[ir.Value]:
    if not isinstance(op.condition.type, ir.VectorType):
        # MLIR allows one i1 for a whole vector; FragmentedArray.select needs a vector.
        raise malformed_op(
            op, f"arith.select on vectors with a scalar condition ({op.condition.type}) cannot "
            "be lowered: the condition must be a vector of i1 of the operands' shape",
            fix="broadcast the condition with vector.broadcast first", lowering=True,
            condition=str(op.condition.type), operands=str(op.result.type))
    condition, on_true, on_false = ctx.operand_arrays(op, layout=shared_layout(ctx, op))
    return [ctx.to_ir(condition.select(on_true, on_false), op.result.type)]


def _is_splat_one(value: ir.Value) -> bool:
    """Whether ``value`` is a lowered splat of the scalar constant 1.0."""
    cast = value.owner
    if isinstance(cast, ir.Block) or "layout" not in cast.attributes:
        return False
    if not isinstance(mgpu_layouts.from_layout_attr(cast.attributes["layout"]),
                      fa.WGSplatFragLayout):
        return False
    [scalar] = cast.operands
    source = scalar.owner
    return (not isinstance(source, ir.Block) and isinstance(source.opview, arith.ConstantOp)
            and float(ir.FloatAttr(source.opview.value)) == 1.0)


def lower_divf(ctx: LoweringContext, op: arith.DivFOp) -> list[ir.Value]:
    layout = shared_layout(ctx, op)
    element = ir.VectorType(op.lhs.type).element_type
    # E8M0 has no general division, but 1 / x (a reciprocal scale) exists.
    if isinstance(element, ir.Float8E8M0FNUType) and _is_splat_one(op.lhs):
        return [ctx.to_ir(1 / ctx.from_ir(op.rhs, layout), op.result.type)]
    lhs, rhs = ctx.operand_arrays(op, layout=layout)
    return [ctx.to_ir(lhs / rhs, op.result.type)]


def lower_constant(ctx: LoweringContext, op: arith.ConstantOp) -> list[ir.Value]:
    value = op.value
    if not (isinstance(value, ir.DenseElementsAttr) and ir.DenseElementsAttr(value).is_splat):
        # jax raises NotImplementedError here: keep its class and key phrase.
        raise SmaltiNotImplementedError(
            "SM203", "Unsupported constant op: only splat vector constants can be "
            "materialized in registers", op=op, values={"layout": str(ctx.out_layouts(op))},
            fix=["use a splat constant (every element equal)",
                 "or keep the non-uniform constant in memory and vector_load it"])
    vector = ir.VectorType(op.result.type)
    [layout] = ctx.out_layouts(op)
    scalar = arith.constant(vector.element_type, ir.DenseElementsAttr(value).get_splat_value())
    array = Array.splat(scalar, tuple(vector.shape), mgpu_layouts.from_layout_attr(layout),
                        is_signed=default_is_signed(vector.element_type))
    return [ctx.to_ir(array, op.result.type)]


def register_lowerings(registry: LoweringRegistry) -> None:
    registry.lowering_rule(*BINARY)(lower_binary)
    registry.lowering_rule(*UNARY)(lower_unary)
    registry.lowering_rule(*CONVERSIONS)(lower_conversion)
    registry.lowering_rule("arith.cmpi")(lower_cmpi)
    registry.lowering_rule("arith.cmpf")(lower_cmpf)
    registry.lowering_rule("arith.bitcast")(lower_bitcast)
    registry.lowering_rule("arith.select")(lower_select)
    registry.lowering_rule("arith.divf")(lower_divf)
    registry.lowering_rule("arith.constant")(lower_constant)
