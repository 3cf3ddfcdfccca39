"""TMEM refs: checking operands that must be TMEM refs, and the lowered form.

A lowered TMEM ref is its 32-bit TMEM address, wrapped in an unrealized cast
back to the ref's type; the cast records the ref's TMEM layout (and, for an
allocation, ``collective`` and ``packing``). This is the protocol Mosaic
GPU's own lowering uses (and ``smalti.plugins``' TMEM views), so the two can
be mixed.
"""

from __future__ import annotations

from jax._src.lib.mlir import ir
from jax.experimental.mosaic.gpu import tcgen05
from jax.experimental.mosaic.gpu import utils as mgpu_utils

from smalti import refs
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


def tmem_ref_from_ir(op: ir.OpView, ref: ir.Value, expected: ir.Attribute,
                     what: str = "TMEM operand") -> tcgen05.TMEMRef:
    """The TMEM ref behind lowered ``ref`` (operand ``what`` of ``op``), which
    must be a TMEM memref with layout ``expected``."""
    check_tmem_operand(op, ref, what)
    return refs.tmem_ref_from_ir(ref, expected, op=op)
