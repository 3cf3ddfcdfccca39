"""``mosaic_gpu.vector_load`` and ``mosaic_gpu.vector_store``: registers <-> memory.

From global memory any register layout can be loaded or stored. With shared
memory, the register layout and the ref's transforms (tiling, swizzle) must
admit a transfer, preferably free of bank conflicts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from jax._src.lib import mosaic_gpu_dialect as mgpu
from jax._src.lib.mlir import ir
from jax.experimental.mosaic.gpu import fragmented_array as fa
from jax.experimental.mosaic.gpu import layouts as mgpu_layouts
from jax.experimental.mosaic.gpu import utils as mgpu_utils

from smalti.constraints import Excludes, TransferableSmem, TransferKind
from smalti.diagnostics import SmaltiNotImplementedError, SmaltiValueError
from smalti.layouts import MemorySpace, smem_transforms_from_attribute
from smalti.plugins.versions import BEFORE_0_12, SINCE_0_12
from smalti.registry import ConstraintRegistry, LoweringRegistry
from smalti.rules import ConstraintBuilder, LoweringContext, default_is_signed
from smalti.sites import memory_space_of


def _is_smem(value: ir.Value) -> bool:
    return memory_space_of(value) is MemorySpace.SMEM


def tiled_register_layouts(arch: tuple[int, int]) -> tuple[fa.FragmentedLayout, ...]:
    """Register layouts to try for a value moved to or from a tiled SMEM ref."""
    wgmma = (fa.WGMMA_LAYOUT, fa.WGMMA_TRANSPOSED_LAYOUT)
    if arch == (9, 0):
        return wgmma
    # Larger tcgen05 tiles first; WGMMA tiles also fit smaller shapes. Like
    # jax, every architecture but sm_90 is treated so (sm_80 and sm_120 too),
    # so that the same layouts are inferred.
    return (fa.TCGEN05_LAYOUT, fa.TCGEN05_TRANSPOSED_LAYOUT, *wgmma)


def transferable(registers, smem, ref: ir.Value, kind: str,
                 arch: tuple[int, int]) -> TransferableSmem:
    ref_type = ir.MemRefType(ref.type)
    strides, _ = ref_type.get_strides_and_offset()
    return TransferableSmem(registers, smem, tuple(ref_type.shape), tuple(strides),
                            mgpu_utils.bitwidth(ref_type.element_type), kind,
                            tiled_register_layouts(arch))


def _load_kind(op) -> str:
    return TransferKind.UNOPTIMIZED if (op.optimized is not None and not op.optimized.value) \
        else TransferKind.OPTIMIZED


def vector_load(op: mgpu.VectorLoadOp, b: ConstraintBuilder) -> None:
    result = b.variable(b.result(0))
    b.require(Excludes(result, fa.WGSplatFragLayout))  # a load is never uniform
    if _is_smem(op.source):
        b.require(transferable(result, b.variable(b.operand(0)), op.source, _load_kind(op),
                               b.arch))


def store_kind(op, unset: str) -> str:
    """The transfer a store's ``optimized`` attribute asks for; ``unset``
    where it has none (what that means depends on the jax version)."""
    if op.optimized is None:
        return unset
    return TransferKind.OPTIMIZED if op.optimized.value else TransferKind.UNOPTIMIZED


def _vector_store(op: mgpu.VectorStoreOp, b: ConstraintBuilder, unset: str) -> None:
    value = b.variable(b.operand(0))
    if _is_smem(op.destination):
        b.require(transferable(value, b.variable(b.operand(1)), op.destination,
                               store_kind(op, unset), b.arch))


def vector_store(op: mgpu.VectorStoreOp, b: ConstraintBuilder) -> None:
    """jax >= 0.12: a store without ``optimized`` must be optimized, like a load."""
    _vector_store(op, b, unset=TransferKind.OPTIMIZED)


def vector_store_jax_0_11(op: mgpu.VectorStoreOp, b: ConstraintBuilder) -> None:
    """jax 0.11: a store without ``optimized`` may be downgraded to an
    unoptimized one (untiled refs), as its lowering retries."""
    _vector_store(op, b, unset=TransferKind.DOWNGRADABLE)


def register_constraints(registry: ConstraintRegistry) -> None:
    registry.constraint_rule("mosaic_gpu.vector_load")(vector_load)
    registry.constraint_rule("mosaic_gpu.vector_store", jax=SINCE_0_12)(vector_store)
    registry.constraint_rule("mosaic_gpu.vector_store", jax=BEFORE_0_12)(vector_store_jax_0_11)


# --- lowering -------------------------------------------------------------------------


def unwrap_ref(ref: ir.Value, transforms: ir.Attribute) -> ir.Value:
    """The physical (tiled) SMEM ref behind a logical one, as lowered by the
    producer: an unrealized cast that records the transforms."""
    from smalti.refs import unwrap_transformed_ref

    return unwrap_transformed_ref(ref, transforms)


def _optimized(op) -> bool | None:
    return op.optimized.value if op.optimized is not None else None


class Transfers:
    """How a load or store without an ``optimized`` attribute is lowered: the
    one place where jax 0.11 and 0.12 differ for vector_load, vector_store and
    async_store_smem."""

    def __init__(self, gmem_unset: bool,
                 run: Callable[[Callable[[bool], Any], bool | None], Any]) -> None:
        self.gmem_unset = gmem_unset  # GMEM transfers: what unset means
        self._run = run  # SMEM transfers: run(transfer, optimized | None)

    def gmem(self, op: ir.OpView) -> bool:
        optimized = _optimized(op)
        return self.gmem_unset if optimized is None else optimized

    def smem(self, transfer: Callable[[bool], Any], op: ir.OpView) -> Any:
        return self._run(transfer, _optimized(op))


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


def require_optimized(transfer, optimized: bool | None):
    """Runs ``transfer(optimized)``, optimized unless the op says otherwise:
    no fallback (a missing plan is the op's error)."""
    return transfer(True if optimized is None else optimized)


#: jax >= 0.12: an unset ``optimized`` means optimized, in every memory.
JAX_0_12 = Transfers(gmem_unset=True, run=require_optimized)
#: jax 0.11: unoptimized in GMEM; in SMEM optimized if a plan exists.
JAX_0_11 = Transfers(gmem_unset=False, run=retry_unoptimized)


def check_vector_load(op: mgpu.VectorLoadOp) -> None:
    """Before rewriting: the load's layout (and SMEM transforms) are ones it
    can be lowered with."""
    [layout_attr] = LoweringContext.out_layouts(op)
    layout = mgpu_layouts.from_layout_attr(layout_attr)
    if isinstance(layout, fa.WGStridedFragLayout):
        if not _is_smem(op.source):
            return
        [transforms] = LoweringContext.in_transforms(op)
        smem = smem_transforms_from_attribute(transforms)
        if smem.tiling is not None or smem.swizzle is not None:
            raise SmaltiNotImplementedError(
                "SM203", "Transformed or swizzled strided loads are not supported",  # jax's
                op=op, values={"transforms": str(transforms)},
                fix="load with a tiled register layout, or drop the transforms")
    elif not isinstance(layout, fa.TiledLayout):
        raise SmaltiValueError("SM203", f"a load cannot produce the layout {layout_attr}",
                               op=op, fix="load into a strided or tiled layout")


def _lower_vector_load(ctx: LoweringContext, op: mgpu.VectorLoadOp,
                       transfers: Transfers) -> list[ir.Value]:
    """(:func:`check_vector_load` has checked the layout and transforms.)"""
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
        array = fa.FragmentedArray.load_strided(ref, is_signed=signed, vec_size=layout.vec_size)
        return [ctx.to_ir(array, op.result.type)]
    if ir.MemRefType(ref.type).memory_space is None:  # global memory
        array = fa.FragmentedArray.load_untiled(ref, layout=layout, is_signed=signed,
                                                optimized=transfers.gmem(op))
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
    return [ctx.to_ir(transfers.smem(load, op), op.result.type)]


def _lower_vector_store(ctx: LoweringContext, op: mgpu.VectorStoreOp,
                        transfers: Transfers) -> list[ir.Value]:
    atomic = str(mgpu.AtomicOpType(op.atomic_type.value)) if op.atomic_type is not None else None
    [layout] = ctx.in_layouts(op)
    array = ctx.from_ir(op.valueToStore, layout)
    if ctx.auto_barriers:
        mgpu_utils.warpgroup_barrier()  # earlier reads of the ref are done
    ref = op.destination
    memory_space = ir.MemRefType(ref.type).memory_space
    if memory_space is None:  # global memory
        target = mgpu_utils.MultimemRef(ref) if op.multimem.value else ref
        array.store_untiled(target, optimized=transfers.gmem(op), atomic=atomic)
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
        transfers.smem(store, op)
    else:
        raise ctx.fail(op, f"unsupported memory space {memory_space}",
                       fix="store to global or shared memory")
    if ctx.auto_barriers:
        mgpu_utils.warpgroup_barrier()  # the writes are visible to the warpgroup
    return []


def lower_vector_load(ctx: LoweringContext, op: mgpu.VectorLoadOp) -> list[ir.Value]:
    return _lower_vector_load(ctx, op, JAX_0_12)


def lower_vector_load_jax_0_11(ctx: LoweringContext, op: mgpu.VectorLoadOp) -> list[ir.Value]:
    return _lower_vector_load(ctx, op, JAX_0_11)


def lower_vector_store(ctx: LoweringContext, op: mgpu.VectorStoreOp) -> list[ir.Value]:
    return _lower_vector_store(ctx, op, JAX_0_12)


def lower_vector_store_jax_0_11(ctx: LoweringContext, op: mgpu.VectorStoreOp) -> list[ir.Value]:
    return _lower_vector_store(ctx, op, JAX_0_11)


def register_lowerings(registry: LoweringRegistry) -> None:
    rule = registry.lowering_rule
    rule("mosaic_gpu.vector_load", jax=SINCE_0_12, check=check_vector_load)(lower_vector_load)
    rule("mosaic_gpu.vector_load", jax=BEFORE_0_12, check=check_vector_load)(
        lower_vector_load_jax_0_11)
    rule("mosaic_gpu.vector_store", jax=SINCE_0_12)(lower_vector_store)
    rule("mosaic_gpu.vector_store", jax=BEFORE_0_12)(lower_vector_store_jax_0_11)
