"""``mosaic_gpu.vector_load`` and ``mosaic_gpu.vector_store``: registers <-> memory.

From global memory any register layout can be loaded or stored. With shared
memory, the register layout and the ref's transforms (tiling, swizzle) must
admit a transfer, preferably free of bank conflicts.
"""

from __future__ import annotations

from jax._src.lib import mosaic_gpu_dialect as mgpu
from jax._src.lib.mlir import ir
from jax.experimental.mosaic.gpu import fragmented_array as fa
from jax.experimental.mosaic.gpu import layouts as mgpu_layouts
from jax.experimental.mosaic.gpu import utils as mgpu_utils

from smalti.constraints import Excludes, TransferableSmem, TransferKind
from smalti.layouts import smem_transforms_from_attribute
from smalti.registry import ConstraintRegistry, LoweringRegistry
from smalti.rules import ConstraintBuilder, LoweringContext, default_is_signed
from smalti.sites import memory_space_of
from smalti.layouts import MemorySpace


def _is_smem(value: ir.Value) -> bool:
    return memory_space_of(value) is MemorySpace.SMEM


def tiled_register_layouts(arch: tuple[int, int]) -> tuple[fa.FragmentedLayout, ...]:
    """Register layouts to try for a value moved to or from a tiled SMEM ref."""
    wgmma = (fa.WGMMA_LAYOUT, fa.WGMMA_TRANSPOSED_LAYOUT)
    if arch >= (10, 0):
        # Larger tcgen05 tiles first; WGMMA tiles also fit smaller shapes.
        return (fa.TCGEN05_LAYOUT, fa.TCGEN05_TRANSPOSED_LAYOUT, *wgmma)
    return wgmma


def transferable(registers, smem, ref: ir.Value, kind: str,
                 arch: tuple[int, int]) -> TransferableSmem:
    ref_type = ir.MemRefType(ref.type)
    strides, _ = ref_type.get_strides_and_offset()
    return TransferableSmem(registers, smem, tuple(ref_type.shape), tuple(strides),
                            mgpu_utils.bitwidth(ref_type.element_type), kind,
                            tiled_register_layouts(arch))


def vector_load(op: mgpu.VectorLoadOp, b: ConstraintBuilder) -> None:
    result = b.variable(b.result(0))
    b.require(Excludes(result, fa.WGSplatFragLayout))  # a load is never uniform
    if _is_smem(op.source):
        kind = TransferKind.UNOPTIMIZED if (op.optimized is not None and not op.optimized.value) \
            else TransferKind.OPTIMIZED
        b.require(transferable(result, b.variable(b.operand(0)), op.source, kind, b.arch))


def vector_store(op: mgpu.VectorStoreOp, b: ConstraintBuilder) -> None:
    value = b.variable(b.operand(0))
    if _is_smem(op.destination):
        if op.optimized is None:
            kind = TransferKind.DOWNGRADABLE
        else:
            kind = TransferKind.OPTIMIZED if op.optimized.value else TransferKind.UNOPTIMIZED
        b.require(transferable(value, b.variable(b.operand(1)), op.destination, kind, b.arch))


def register_constraints(registry: ConstraintRegistry) -> None:
    registry.constraint_rule("mosaic_gpu.vector_load")(vector_load)
    registry.constraint_rule("mosaic_gpu.vector_store")(vector_store)


# --- lowering -------------------------------------------------------------------------


def unwrap_ref(ref: ir.Value, transforms: ir.Attribute) -> ir.Value:
    """The physical (tiled) SMEM ref behind a logical one, as lowered by the
    producer: an unrealized cast that records the transforms."""
    from smalti.refs import unwrap_transformed_ref

    return unwrap_transformed_ref(ref, transforms)


def _optimized(op) -> bool | None:
    return op.optimized.value if op.optimized is not None else None


def retry_unoptimized(transfer, optimized: bool | None):
    """Runs ``transfer(optimized)``; when optimization was only preferred
    (``None``), falls back to an unoptimized transfer if no plan exists. The
    abandoned attempt's IR is dead code, removed by later canonicalization."""
    if optimized is not None:
        return transfer(optimized)
    try:
        return transfer(True)
    except fa.TransferPlanDerivationError:
        return transfer(False)


def lower_vector_load(ctx: LoweringContext, op: mgpu.VectorLoadOp) -> list[ir.Value]:
    [layout_attr] = ctx.out_layouts(op)
    layout = mgpu_layouts.from_layout_attr(layout_attr)
    signed = default_is_signed(ir.VectorType(op.result.type).element_type)
    transforms = None
    ref = op.source
    if _is_smem(ref):
        [transforms] = ctx.in_transforms(op)
        ref = unwrap_ref(ref, transforms)
    smem = smem_transforms_from_attribute(transforms) if transforms is not None else None

    if isinstance(layout, fa.WGStridedFragLayout):
        if smem is not None and (smem.tiling is not None or smem.swizzle is not None):
            raise ctx.unsupported(op, "Transformed or swizzled strided loads are not supported",
                                  transforms=str(transforms),
                                  fix="load with a tiled register layout, or drop the "
                                      "transforms")
        array = fa.FragmentedArray.load_strided(ref, is_signed=signed, vec_size=layout.vec_size)
        return [ctx.to_ir(array, op.result.type)]
    if not isinstance(layout, fa.TiledLayout):
        raise ctx.fail(op, f"a load cannot produce the layout {layout_attr}",
                       fix="load into a strided or tiled layout")
    optimized = _optimized(op)
    if ir.MemRefType(ref.type).memory_space is None:  # global memory
        array = fa.FragmentedArray.load_untiled(ref, layout=layout, is_signed=signed,
                                                optimized=bool(optimized))
        return [ctx.to_ir(array, op.result.type)]
    if smem is None:
        raise ctx.fail(op, f"unsupported memory space {ir.MemRefType(ref.type).memory_space}",
                       fix="load from global or shared memory")
    swizzle = mgpu.SwizzlingMode(smem.swizzle or 16)
    if smem.tiling is not None:
        def load(optimized: bool) -> fa.FragmentedArray:
            return fa.FragmentedArray.load_tiled(ref, swizzle, is_signed=signed, layout=layout,
                                                 optimized=optimized,
                                                 tiling_rank=len(smem.tiling))
    else:
        def load(optimized: bool) -> fa.FragmentedArray:
            return fa.FragmentedArray.load_untiled(ref, layout=layout, swizzle=swizzle,
                                                   is_signed=signed, optimized=optimized)
    return [ctx.to_ir(retry_unoptimized(load, optimized), op.result.type)]


def lower_vector_store(ctx: LoweringContext, op: mgpu.VectorStoreOp) -> list[ir.Value]:
    atomic = str(mgpu.AtomicOpType(op.atomic_type.value)) if op.atomic_type is not None else None
    [layout] = ctx.in_layouts(op)
    array = ctx.from_ir(op.valueToStore, layout)
    if ctx.auto_barriers:
        mgpu_utils.warpgroup_barrier()  # earlier reads of the ref are done
    ref = op.destination
    memory_space = ir.MemRefType(ref.type).memory_space
    optimized = _optimized(op)
    if memory_space is None:  # global memory
        target = mgpu_utils.MultimemRef(ref) if op.multimem.value else ref
        array.store_untiled(target, optimized=bool(optimized), atomic=atomic)
    elif memory_space == mgpu_utils.smem():
        [transforms] = ctx.in_transforms(op)
        smem = smem_transforms_from_attribute(transforms)
        swizzle = mgpu.SwizzlingMode(smem.swizzle or 16)
        if smem.tiling is not None:
            physical = unwrap_ref(ref, transforms)

            def store(optimized: bool) -> None:
                array.store_tiled(physical, swizzle, optimized, tiling_rank=len(smem.tiling),
                                  atomic=atomic)
        else:
            def store(optimized: bool) -> None:
                array.store_untiled(ref, optimized=optimized, swizzle=swizzle, atomic=atomic)
        retry_unoptimized(store, optimized)
    else:
        raise ctx.fail(op, f"unsupported memory space {memory_space}",
                       fix="store to global or shared memory")
    if ctx.auto_barriers:
        mgpu_utils.warpgroup_barrier()  # the writes are visible to the warpgroup
    return []


def register_lowerings(registry: LoweringRegistry) -> None:
    registry.lowering_rule("mosaic_gpu.vector_load")(lower_vector_load)
    registry.lowering_rule("mosaic_gpu.vector_store")(lower_vector_store)
