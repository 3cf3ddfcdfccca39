"""Copies from SMEM into TMEM (``tcgen05.cp``): MMA operands, block scales
and sparse metadata.

An operand copy reads its SMEM ref tiled like an MMA operand (unswizzled
allowed) and writes TMEM in the default layout, packed as densely as the
element type allows. Scales and metadata are copied from plain SMEM into the
layouts tcgen05 defines for them.
"""

from __future__ import annotations

from jax._src.lib import mosaic_gpu_dialect as mgpu
from jax._src.lib.mlir import ir
from jax.experimental.mosaic.gpu import tcgen05
from jax.experimental.mosaic.gpu import utils as mgpu_utils

from smalti.blackwell.archs import TCGEN05, TCGEN05_WARP_ISSUED
from smalti.blackwell.collective import check_collective, is_collective
from smalti.blackwell.tmem_layouts import fitting
from smalti.blackwell.tmem_refs import check_tmem_operand, tmem_ref_from_ir
from smalti.constraints import OneOf
from smalti.diagnostics import SmaltiValueError
from smalti.hopper.wgmma import mma_smem_tilings
from smalti.layouts import SmemTransforms, TmemLayout, smem_transforms_from_attribute
from smalti.plugins.transfers import unwrap_ref
from smalti.registry import ConstraintRegistry, LoweringRegistry
from smalti.rules import ConstraintBuilder, LoweringContext

Copy = mgpu.AsyncStoreSmemToTmemOp | mgpu.AsyncStoreScalesSmemToTmemOp | \
    mgpu.AsyncStoreSparseMetadataSmemToTmemOp


def _shape(value: ir.Value) -> tuple[int, ...]:
    return tuple(ir.ShapedType(value.type).shape)


def _variables(op: Copy, b: ConstraintBuilder):
    check_tmem_operand(op, op.destination, "destination")
    return b.variable(b.operand(0)), b.variable(b.operand(1))


# --- constraint rules ----------------------------------------------------------------


def async_store_smem_to_tmem(op: mgpu.AsyncStoreSmemToTmemOp, b: ConstraintBuilder) -> None:
    source, destination = _variables(op, b)
    bitwidth = mgpu_utils.bitwidth(ir.MemRefType(op.destination.type).element_type)
    if bitwidth > 32:  # TMEM cells are 32 bits: no packing holds the elements
        raise SmaltiValueError(
            "SM143", f"Packing must be a power of 2, got: {32 // bitwidth}: TMEM holds "
            f"elements of at most 32 bits, and the destination has {bitwidth}-bit elements",
            op=op, values={"destination": str(op.destination.type)},
            fix="copy 32-bit or narrower elements (convert them before storing to SMEM)")
    layout = tcgen05.tmem_default_layout(32 // bitwidth)
    b.assign(destination, fitting(op, "destination", _shape(op.destination), layout))
    b.require(OneOf(source, tuple(mma_smem_tilings(op.source.type, op, allow_unswizzled=True))))


def async_store_scales_smem_to_tmem(op: mgpu.AsyncStoreScalesSmemToTmemOp,
                                    b: ConstraintBuilder) -> None:
    """Scales for ``b`` of a collective M=64 MMA come as (1, k/4, 64, 16)
    and take their own layout."""
    source, destination = _variables(op, b)
    b.assign(source, SmemTransforms(None, None))
    k_tiles = _shape(op.destination)[1] // 4
    if _shape(op.source) == (1, k_tiles, 64, 16):
        layout = tcgen05.b_scales_m64_collective_layout()
    else:
        layout = tcgen05.scales_layout()
    b.assign(destination, TmemLayout(layout))


def async_store_sparse_metadata_smem_to_tmem(op: mgpu.AsyncStoreSparseMetadataSmemToTmemOp,
                                             b: ConstraintBuilder) -> None:
    source, destination = _variables(op, b)
    b.assign(destination, TmemLayout(tcgen05.sparse_meta_layout()))
    b.assign(source, SmemTransforms(None, None))


# --- lowering rules ------------------------------------------------------------------


def _destination(ctx: LoweringContext, op: Copy) -> tcgen05.TMEMRef:
    [layout] = ctx.in_tmem_layouts(op)
    return tmem_ref_from_ir(op, op.destination, layout, "destination")


def lower_async_store_smem_to_tmem(ctx: LoweringContext,
                                   op: mgpu.AsyncStoreSmemToTmemOp) -> list[ir.Value]:
    check_collective(ctx, op)
    [transforms] = ctx.in_transforms(op)
    swizzle = mgpu.SwizzlingMode(smem_transforms_from_attribute(transforms).swizzle or 16)
    source = unwrap_ref(op.source, transforms)
    destination = _destination(ctx, op)
    with mgpu_utils.when(ctx.single_lane_predicate):
        tcgen05.async_copy_smem_to_tmem(source, destination, swizzle,
                                        collective=is_collective(op))
    return []


def lower_async_store_scales_smem_to_tmem(ctx: LoweringContext,
                                          op: mgpu.AsyncStoreScalesSmemToTmemOp
                                          ) -> list[ir.Value]:
    check_collective(ctx, op)
    destination = _destination(ctx, op)
    source = unwrap_ref(op.source, ir.ArrayAttr.get([]))
    with mgpu_utils.when(ctx.single_lane_predicate):
        tcgen05.async_copy_scales_smem_to_tmem(source, destination,
                                               collective=is_collective(op))
    return []


def lower_async_store_sparse_metadata_smem_to_tmem(
        ctx: LoweringContext, op: mgpu.AsyncStoreSparseMetadataSmemToTmemOp) -> list[ir.Value]:
    check_collective(ctx, op)
    destination = _destination(ctx, op)
    source = unwrap_ref(op.source, ir.ArrayAttr.get([]))
    with mgpu_utils.when(ctx.single_lane_predicate):
        tcgen05.async_copy_sparse_metadata_smem_to_tmem(source, destination,
                                                        collective=is_collective(op))
    return []


def register_constraints(registry: ConstraintRegistry) -> None:
    rule = registry.constraint_rule
    rule("mosaic_gpu.async_store_smem_to_tmem", archs=TCGEN05)(async_store_smem_to_tmem)
    rule("mosaic_gpu.async_store_scales_smem_to_tmem", archs=TCGEN05)(
        async_store_scales_smem_to_tmem)
    rule("mosaic_gpu.async_store_sparse_metadata_smem_to_tmem", archs=TCGEN05)(
        async_store_sparse_metadata_smem_to_tmem)


def register_lowerings(registry: LoweringRegistry) -> None:
    rule = registry.lowering_rule
    # The copies may also be issued by a single warp.
    rule("mosaic_gpu.async_store_smem_to_tmem", **TCGEN05_WARP_ISSUED)(
        lower_async_store_smem_to_tmem)
    rule("mosaic_gpu.async_store_scales_smem_to_tmem", **TCGEN05_WARP_ISSUED)(
        lower_async_store_scales_smem_to_tmem)
    rule("mosaic_gpu.async_store_sparse_metadata_smem_to_tmem", **TCGEN05_WARP_ISSUED)(
        lower_async_store_sparse_metadata_smem_to_tmem)
