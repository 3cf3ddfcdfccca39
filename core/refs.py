"""SMEM refs across lowering: logical refs and the tiled physical refs behind them.

An op that produces an SMEM ref with transforms lowers to the *physical* ref
(tiled shape, tiled strides) wrapped in an unrealized cast back to the
*logical* type; the cast records the transforms. Consumers unwrap it and
check the transforms match what inference chose for them. This is the
protocol Mosaic GPU's own lowering uses, so the two can be mixed.
"""

from __future__ import annotations

import typing

from jax._src.lib.mlir import ir
from jax._src.lib.mlir.dialects import builtin
from jax.experimental.mosaic.gpu import fragmented_array as fa
from jax.experimental.mosaic.gpu import layouts as mgpu_layouts
from jax.experimental.mosaic.gpu import tcgen05
from jax.experimental.mosaic.gpu import utils as mgpu_utils

from smalti.caching import per_context
from smalti.diagnostics import SmaltiValueError
from smalti.layouts import smem_transforms_from_attribute, tiled_strides


def _tile_offset(offsets: list[int], tiling: tuple[int, ...]) -> list[int]:
    n = len(tiling)
    head, tail = offsets[:-n], offsets[-n:]
    if any(o % t for o, t in zip(tail, tiling)):
        raise ValueError(f"offsets {offsets} are not aligned to tiles {tiling}")
    return [*head, *(o // t for o, t in zip(tail, tiling)), *([0] * n)]


@per_context
def transformed_type(ref_type: ir.MemRefType, transforms: ir.Attribute) -> ir.MemRefType:
    """The physical type of an SMEM ref of logical type ``ref_type`` with ``transforms``."""
    if mgpu_utils.is_cluster_smem_ref(ref_type):
        ref_type = ir.MemRefType.get(
            ref_type.shape, ref_type.element_type, ref_type.layout,
            memory_space=ir.IntegerAttr.get(ir.IntegerType.get_signless(32), 7))
    elif not mgpu_utils.is_smem_ref(ref_type):
        raise SmaltiValueError("SM203", f"only shared memory refs carry transforms, got {ref_type}")
    tiling = smem_transforms_from_attribute(transforms).tiling
    if tiling is None:
        return ref_type
    shape = list(ref_type.shape)
    n = len(tiling)
    tiled_shape = [*shape[:-n], *(s // t for s, t in zip(shape[-n:], tiling)), *tiling]
    strides, offset = ref_type.get_strides_and_offset()
    new_strides = tiled_strides(tuple(strides), tiling)
    if offset == ir.ShapedType.get_dynamic_stride_or_offset():
        new_offset = offset
    else:
        position = [0] * len(strides)
        for i, stride in sorted(enumerate(strides), key=lambda e: e[1], reverse=True):
            position[i], offset = divmod(offset, stride)
        new_offset = sum(o * s for o, s in zip(_tile_offset(position, tiling), new_strides))
    layout = (ir.StridedLayoutAttr.get(new_offset, new_strides)
              if isinstance(ref_type.layout, ir.StridedLayoutAttr) else None)
    return ir.MemRefType.get(tiled_shape, ref_type.element_type,
                             memory_space=ref_type.memory_space, layout=layout)


def wrap_transformed_ref(physical: ir.Value, logical_type: ir.Type,
                         transforms: ir.Attribute) -> ir.Value:
    """Presents a physical ref as its logical type, recording ``transforms``."""
    cast = builtin.UnrealizedConversionCastOp([logical_type], [physical])
    cast.attributes["transforms"] = transforms
    return cast.result


def unwrap_transformed_ref(ref: ir.Value, transforms: ir.Attribute) -> ir.Value:
    """The physical ref behind logical ``ref``, which must carry ``transforms``."""
    cast = ref.owner
    expected = transformed_type(ir.MemRefType(ref.type), transforms)
    if (isinstance(cast, ir.Block) or not isinstance(cast, builtin.UnrealizedConversionCastOp)
            or len(cast.operands) != 1 or cast.operands[0].type != expected):
        raise SmaltiValueError(
            "SM201",
            f"the SMEM ref {ref.get_name()} was not lowered with transforms {transforms}",
            fix="run inference and lowering on the whole module")
    if cast.attributes["transforms"] != transforms:
        raise SmaltiValueError(
            "SM201",
            f"SMEM ref transforms disagree: its producer has {cast.attributes['transforms']}, "
            f"its user expects {transforms}",
            fix="re-run smalti.infer_layouts so that producer and users agree")
    return cast.operands[0]


# --- TMEM refs ----------------------------------------------------------------------
#
# A lowered TMEM ref is its 32-bit TMEM address, wrapped in an unrealized cast
# back to the ref's type; the cast records the ref's TMEM layout. This too is
# Mosaic GPU's own protocol.


def tmem_layout_from_attribute(attr: ir.Attribute) -> tcgen05.TMEMLayout:
    """Decodes a TMEM layout attribute (a tiled layout attribute)."""
    tiled = mgpu_layouts.from_layout_attr(attr)
    if not isinstance(tiled, fa.TiledLayout):
        raise ValueError(f"{attr} is not a tiled layout, so not a TMEM layout")
    return tcgen05.TMEMLayout(tiled.tiling, tiled.warp_dims, tiled.lane_dims, tiled.vector_dim)


def tmem_address_cast(ref: ir.Value) -> builtin.UnrealizedConversionCastOp:
    """The cast its producer left around a lowered TMEM ref's address."""
    cast = ref.owner
    i32 = ir.IntegerType.get_signless(32)
    if (isinstance(cast, ir.Block) or not isinstance(cast, builtin.UnrealizedConversionCastOp)
            or len(cast.operands) != 1 or cast.operands[0].type != i32
            or "layout" not in cast.attributes):
        raise SmaltiValueError(
            "SM201", f"the TMEM ref {ref.get_name()} reached lowering without its address: "
            "its producer was not lowered",
            fix="lower the whole module with smalti.lower (or jax's pipeline), not parts of it")
    return cast


def tmem_ref_from_ir(ref: ir.Value, expected: ir.Attribute, *,
                     op: ir.OpView | None = None) -> tcgen05.TMEMRef:
    """The TMEM ref behind lowered ``ref``, which must have layout ``expected``."""
    cast = tmem_address_cast(ref)
    actual = cast.attributes["layout"]
    if actual != expected:
        raise SmaltiValueError(
            "SM142",
            f"{ref.get_name()} has a layout {actual} that does not match the expected layout "
            f"{expected}.",
            op=op, values={"ref": str(ref.type)},
            fix=["re-run smalti.infer_layouts on the whole module so that the ref's producer "
                 "and its users agree",
                 "or pin the layout once with mosaic_gpu.tmem_layout_cast after the allocation"],
        )
    ref_type = ir.MemRefType(ref.type)
    shape = typing.cast(tuple[int, int], tuple(ref_type.shape))  # TMEM refs are 2-D
    return tcgen05.TMEMRef(cast.operands[0], shape, ref_type.element_type,
                           tmem_layout_from_attribute(actual))


def tmem_ref_to_ir(ref: tcgen05.TMEMRef, ty: ir.Type) -> ir.Value:
    """Wraps a TMEM ref's address back into the ref type ``ty``."""
    cast = builtin.UnrealizedConversionCastOp([ty], [ref.address])
    cast.attributes["layout"] = mgpu_layouts.to_layout_attr(ref.layout)
    return cast.result
