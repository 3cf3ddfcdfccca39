"""Debug printing: ``mosaic_gpu.debug_print`` (a vector, at run time) and
``mosaic_gpu.print_layout`` (the layout inference chose, at compile time,
spelled as jax spells it).
"""

from __future__ import annotations

from jax._src.lib import mosaic_gpu_dialect as mgpu
from jax._src.lib.mlir import ir
from jax.experimental.mosaic.gpu import fragmented_array as fa
from jax.experimental.mosaic.gpu import layouts as mgpu_layouts
from jax.experimental.mosaic.gpu import tcgen05

from smalti.layouts import MemorySpace, SmemTransforms, smem_transforms_from_attribute
from smalti.registry import ConstraintRegistry, LoweringRegistry
from smalti.rules import ConstraintBuilder, LoweringContext
from smalti.sites import memory_space_of


def printed_value(op: ir.OpView, b: ConstraintBuilder) -> None:
    """``debug_print`` / ``print_layout`` take whatever layout their operand has."""
    b.variable(b.operand(0))


def register_constraints(registry: ConstraintRegistry) -> None:
    registry.constraint_rule("mosaic_gpu.debug_print", "mosaic_gpu.print_layout")(printed_value)


_PRINTED_NAMES = (
    (fa.WGMMA_LAYOUT, "WGMMA"),
    (fa.WGMMA_ROW_LAYOUT, "WGMMA_ROW"),
    (fa.WGMMA_TRANSPOSED_LAYOUT, "WGMMA_TRANSPOSED"),
    (fa.TCGEN05_LAYOUT, "TCGEN05"),
    (fa.TCGEN05_TRANSPOSED_LAYOUT, "TCGEN05_TRANSPOSED"),
    (fa.TMEM_NATIVE_LAYOUT, "TCGEN05_TMEM_NATIVE"),
)


def register_layout_text(layout: fa.FragmentedLayout) -> str:
    """How ``print_layout`` names a register layout (jax's spelling)."""
    for known, name in _PRINTED_NAMES:
        if layout == known:
            return name
    return str(layout)


def smem_transforms_text(transforms: SmemTransforms) -> str:
    """How ``print_layout`` spells SMEM transforms (jax's spelling)."""
    parts = []
    if transforms.tiling is not None:
        parts.append(f"TilingTransform(tiling={tuple(transforms.tiling)})")
    if transforms.swizzle is not None:
        parts.append(f"SwizzleTransform(swizzle={transforms.swizzle})")
    return "(" + ", ".join(parts) + ")"


def tmem_layout_text(attr: ir.Attribute) -> str:
    tiled = mgpu_layouts.from_layout_attr(attr)
    layout = tcgen05.TMEMLayout(tiled.tiling, tiled.warp_dims, tiled.lane_dims,
                                tiled.vector_dim)
    if layout == tcgen05.tmem_default_layout(packing=layout.vector_length):
        return f"TMEM_DEFAULT(packing={layout.vector_length})"
    return str(layout)


def lower_debug_print(ctx: LoweringContext, op: mgpu.DebugPrintOp) -> list[ir.Value]:
    """Prints the vector at run time, one line per register."""
    [layout] = ctx.in_layouts(op)
    ctx.from_ir(op.value, layout).debug_print(op.format.value)
    return []


def lower_print_layout(ctx: LoweringContext, op: mgpu.PrintLayoutOp) -> list[ir.Value]:
    """Prints, at compile time, the layout inference chose for the operand."""
    space = memory_space_of(op.value)
    if space is MemorySpace.REG:
        [layout] = ctx.in_layouts(op)
        text = register_layout_text(ctx.from_ir(op.value, layout).layout)
    elif space is MemorySpace.SMEM:
        [transforms] = ctx.in_transforms(op)
        text = smem_transforms_text(smem_transforms_from_attribute(transforms))
    elif space is MemorySpace.TMEM:
        [layout] = ctx.in_tmem_layouts(op)
        text = tmem_layout_text(layout)
    else:
        raise ctx.fail(op, f"mosaic_gpu.print_layout cannot print the layout of a "
                       f"{op.value.type}: it has none",
                       fix="print the layout of a vector, an SMEM ref or a TMEM ref")
    print(op.format.value.format(text))
    return []


def register_lowerings(registry: LoweringRegistry) -> None:
    registry.lowering_rule("mosaic_gpu.debug_print")(lower_debug_print)
    registry.lowering_rule("mosaic_gpu.print_layout")(lower_print_layout)
