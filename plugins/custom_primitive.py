"""``mosaic_gpu.custom_primitive`` / ``mosaic_gpu.return``: the user's
Lane-level escape hatch.

The op declares the layouts of its vectors and the transforms of its SMEM
refs itself (``in_layouts``, ``in_transforms``, ``out_layouts``); its body is
already Lane-level code, which smalti neither infers nor lowers
(``opaque_regions``): lowering inlines it in place of the op.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import NoReturn

from jax._src.lib import mosaic_gpu_dialect as mgpu
from jax._src.lib.mlir import ir
from jax.experimental.mosaic.gpu import launch_context as lc
from jax.experimental.mosaic.gpu import layouts as mgpu_layouts

from smalti.diagnostics import SmaltiNotImplementedError, SmaltiValueError
from smalti.layouts import (
    MemorySpace,
    SmemTransforms,
    smem_transforms_fit,
    smem_transforms_from_attribute,
)
from smalti.plugins.pinned_layouts import pin_layout
from smalti.registry import ConstraintRegistry, LoweringRegistry
from smalti.rules import ConstraintBuilder, LoweringContext
from smalti.sites import memory_space_of


def _declared(op: ir.OpView, name: str, needed: int, what: str) -> Iterator[ir.Attribute]:
    """The op's own ``name`` attribute entries; at least ``needed`` of them."""
    entries = list(ir.ArrayAttr(op.operation.attributes[name]))
    if len(entries) < needed:
        raise SmaltiValueError(
            "SM107", f"mosaic_gpu.custom_primitive declares {len(entries)} {name} for "
            f"{needed} {what}", op=op, values={name: str(op.operation.attributes[name])},
            fix=f"give {name} one entry per {what.rstrip('s')}, in operand order")
    return iter(entries)


def _declared_transforms(op: ir.OpView, attr: ir.Attribute) -> SmemTransforms:
    """A custom primitive's transforms for one SMEM ref: a tiling, then a swizzle."""
    try:
        decoded = [mgpu_layouts.from_transform_attr(t) for t in ir.ArrayAttr(attr)]
    except NotImplementedError as e:  # jax's decoder: "Unsupported transform ..."
        raise SmaltiNotImplementedError(
            "SM107", f"{e} on a mosaic_gpu.custom_primitive SMEM operand", op=op,
            values={"in_transforms entry": str(attr)},
            fix="declare at most a tiling followed by a swizzle for each SMEM ref") from None
    kinds = [type(t) for t in decoded]
    if kinds not in ([], [lc.TileTransform], [mgpu.SwizzlingMode],
                     [lc.TileTransform, mgpu.SwizzlingMode]):
        raise SmaltiNotImplementedError(
            "SM107", f"Unsupported transforms {decoded} on a mosaic_gpu.custom_primitive "
            "SMEM operand", op=op, values={"in_transforms entry": str(attr)},
            fix="declare at most a tiling followed by a swizzle for each SMEM ref")
    return smem_transforms_from_attribute(attr)


def _check_transforms_fit(op: ir.OpView, ref: ir.Value, transforms: SmemTransforms) -> None:
    if not smem_transforms_fit(ir.MemRefType(ref.type), transforms):
        raise SmaltiValueError(
            "SM102", f"the declared {transforms} do not fit the SMEM ref {ref.type}",
            op=op, fix="declare transforms whose tiling divides the ref's shape, "
            "and whose swizzle fits its minor dimension")


def _reject_tmem(op: ir.OpView, value: ir.Value, kind: str) -> NoReturn:
    raise SmaltiNotImplementedError(
        "SM107", f"mosaic_gpu.custom_primitive cannot take a TMEM ref {kind} ({value.type})",
        op=op, fix="pass the TMEM ref's contents as a vector, or do the TMEM access "
        "outside the custom primitive")


def custom_primitive(op: mgpu.CustomPrimitiveOp, b: ConstraintBuilder) -> None:
    """Every vector and SMEM ref has the layout the op declares; the body is
    Lane-level code that inference does not enter."""
    b.opaque_regions()
    operands = list(op.operation.operands)
    spaces = [memory_space_of(v) for v in operands]
    in_layouts = _declared(op, "in_layouts", spaces.count(MemorySpace.REG), "vector operands")
    in_transforms = _declared(op, "in_transforms", spaces.count(MemorySpace.SMEM),
                              "SMEM ref operands")
    for i, (operand, space) in enumerate(zip(operands, spaces)):
        if space is MemorySpace.REG:
            layout = mgpu_layouts.from_layout_attr(next(in_layouts))
            pin_layout(b, op, f"operand #{i}", layout, operand, b.operand(i))
        elif space is MemorySpace.SMEM:
            transforms = _declared_transforms(op, next(in_transforms))
            _check_transforms_fit(op, operand, transforms)
            b.assign(b.variable(b.operand(i)), transforms)
        elif space is MemorySpace.TMEM:
            _reject_tmem(op, operand, "operand")
    results = list(op.operation.results)
    result_spaces = [memory_space_of(r) for r in results]
    out_layouts = _declared(op, "out_layouts", result_spaces.count(MemorySpace.REG),
                            "vector results")
    for i, (result, space) in enumerate(zip(results, result_spaces)):
        if space is MemorySpace.REG:
            layout = mgpu_layouts.from_layout_attr(next(out_layouts))
            pin_layout(b, op, f"result #{i}", layout, result, b.result(i))
        elif space is not None:
            raise SmaltiNotImplementedError(
                "SM107", "mosaic_gpu.custom_primitive can only return vectors and scalars, "
                f"not a ref ({result.type})", op=op,
                fix="allocate the ref outside the custom primitive and pass it in")


def register_constraints(registry: ConstraintRegistry) -> None:
    registry.constraint_rule("mosaic_gpu.custom_primitive", opaque_regions=True)(
        custom_primitive)


def entry_block(op: ir.OpView) -> ir.Block:
    return op.operation.regions[0].blocks[0]


def bind_arguments(block: ir.Block, values: Sequence[ir.Value]) -> None:
    for argument, value in zip(block.arguments, values, strict=True):
        argument.replace_all_uses_with(value)


def lower_custom_primitive(ctx: LoweringContext,
                           op: mgpu.CustomPrimitiveOp) -> list[ir.Value]:
    """Inlines the Lane-level body in place of the op; what its
    ``mosaic_gpu.return`` returns replaces the op's results."""
    body = entry_block(op)
    terminators = [o for o in body.operations if o.operation.name == "mosaic_gpu.return"]
    if len(terminators) != 1:
        raise ctx.fail(op, "the body of a mosaic_gpu.custom_primitive must end with one "
                       "mosaic_gpu.return", fix="terminate the body with mosaic_gpu.return")
    [terminator] = terminators
    bind_arguments(body, list(op.operation.operands))
    here = ir.InsertionPoint.current
    for inner in list(body.operations):
        if inner.operation != terminator.operation:
            inner.detach_from_parent()
            here.insert(inner)
    return list(terminator.operation.operands)


def lower_return(ctx: LoweringContext, op: mgpu.ReturnOp) -> list[ir.Value]:
    """Only reached if something lowers a custom primitive's body op by op."""
    raise ctx.fail(op, "mosaic_gpu.return is lowered with its mosaic_gpu.custom_primitive, "
                   "never on its own",
                   fix="lower the enclosing mosaic_gpu.custom_primitive as a whole")


def register_lowerings(registry: LoweringRegistry) -> None:
    registry.lowering_rule("mosaic_gpu.custom_primitive", opaque_regions=True,
                           warp_semantics=True)(lower_custom_primitive)
    registry.lowering_rule("mosaic_gpu.return")(lower_return)
