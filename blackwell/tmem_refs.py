"""TMEM refs: checking operands that must be TMEM refs, and the lowered form.

A lowered TMEM ref is its 32-bit TMEM address, wrapped in an unrealized cast
back to the ref's type; the cast records the ref's TMEM layout (and, for an
allocation, ``collective`` and ``packing``). This is the protocol Mosaic
GPU's own lowering uses (and ``smalti.plugins``' TMEM views), so the two can
be mixed.
"""

from __future__ import annotations

from jax._src.lib.mlir import ir
from jax._src.lib.mlir.dialects import builtin
from jax.experimental.mosaic.gpu import layouts as mgpu_layouts
from jax.experimental.mosaic.gpu import tcgen05
from jax.experimental.mosaic.gpu import utils as mgpu_utils

from smalti.blackwell.tmem_layouts import tmem_layout_from_attribute
from smalti.diagnostics import SmaltiValueError, describe_op, format_location

ALLOCATE_FIX = (
    "allocate the TMEM with mosaic_gpu.tmem_alloc (in Pallas: a plgpu.TMEM(...) scratch "
    "buffer) and pass that ref, or a mosaic_gpu.slice_tmem of the allocation"
)


def producer_of(value: ir.Value) -> str:
    """The op that made ``value``, with its location: what a user can go and fix."""
    owner = value.owner
    if isinstance(owner, ir.Block):
        parent = owner.owner
        return f"a block argument of {parent.name}" if parent is not None else "a block argument"
    where = format_location(owner.location)
    return describe_op(owner) + (f" at {where}" if where else "")


def check_tmem_operand(op: ir.OpView, value: ir.Value, what: str) -> None:
    """Raises unless ``value`` (operand ``what`` of ``op``) is a memref in TMEM."""
    if not isinstance(value.type, ir.MemRefType):
        raise SmaltiValueError(
            "SM140",
            f"{value.get_name()} is not a memref. The {what} of {op.operation.name} must be "
            f"a TMEM ref, got a {value.type}",
            op=op, values={what: str(value.type), "produced by": producer_of(value)},
            fix=[ALLOCATE_FIX,
                 "to use a vector, store it to TMEM first with mosaic_gpu.async_store_tmem"],
        )
    memory_space = ir.MemRefType(value.type).memory_space
    if memory_space != mgpu_utils.tmem():
        raise SmaltiValueError(
            "SM141",
            f"{value.get_name()} has a memory space {memory_space} that is not TMEM. The "
            f"{what} of {op.operation.name} must be in tensor memory",
            op=op, values={what: str(value.type), "produced by": producer_of(value)},
            fix=[ALLOCATE_FIX,
                 "or copy SMEM data to TMEM first with mosaic_gpu.async_store_smem_to_tmem"],
        )


def address_cast(ref: ir.Value) -> builtin.UnrealizedConversionCastOp:
    """The cast its producer left around a lowered TMEM ref's address."""
    cast = ref.owner
    i32 = ir.IntegerType.get_signless(32)
    if (isinstance(cast, ir.Block) or not isinstance(cast, builtin.UnrealizedConversionCastOp)
            or len(cast.operands) != 1 or cast.operands[0].type != i32
            or "layout" not in cast.attributes):
        raise SmaltiValueError(
            "SM201", f"the TMEM ref {ref.get_name()} reached lowering without its address: "
            f"its producer {producer_of(ref)} was not lowered",
            fix="lower the whole module with smalti.lower (or jax's pipeline), not parts of it")
    return cast


def tmem_ref_from_ir(op: ir.OpView, ref: ir.Value, expected: ir.Attribute,
                     what: str = "TMEM operand") -> tcgen05.TMEMRef:
    """The TMEM ref behind lowered ``ref``, which must have layout ``expected``."""
    check_tmem_operand(op, ref, what)
    cast = address_cast(ref)
    actual = cast.attributes["layout"]
    if actual != expected:
        raise SmaltiValueError(
            "SM142",
            f"{ref.get_name()} has a layout {actual} that does not match the expected layout "
            f"{expected}.",
            op=op, values={what: str(ref.type)},
            fix=["re-run smalti.infer_layouts on the whole module so that the ref's producer "
                 "and its users agree",
                 "or pin the layout once with mosaic_gpu.tmem_layout_cast after the allocation"],
        )
    ref_type = ir.MemRefType(ref.type)
    return tcgen05.TMEMRef(cast.operands[0], tuple(ref_type.shape), ref_type.element_type,
                           tmem_layout_from_attribute(actual))


def tmem_ref_to_ir(ref: tcgen05.TMEMRef, ty: ir.Type) -> ir.Value:
    """Wraps a TMEM ref's address back into the ref type ``ty``."""
    cast = builtin.UnrealizedConversionCastOp([ty], [ref.address])
    cast.attributes["layout"] = mgpu_layouts.to_layout_attr(ref.layout)
    return cast.result
