"""Tensor memory: allocation, views, and moving registers in and out.

``tmem_alloc`` asks the hardware for TMEM columns (one warp per block does
it, the address lands in an SMEM word); ``tmem_dealloc`` and
``tmem_relinquish_alloc_permit`` give them back and let other blocks
allocate. ``slice_tmem`` views a column range, ``tmem_layout_cast`` pins a
ref's layout, ``async_load_tmem`` / ``async_store_tmem`` copy between TMEM
and registers (``tcgen05.ld`` / ``tcgen05.st``).

Inference: an allocation defaults to the layout an MMA accumulator of its
shape has; TMEM and registers must be transferable.
"""

from __future__ import annotations

from jax._src.lib import mosaic_gpu_dialect as mgpu
from jax._src.lib.mlir import ir
from jax._src.lib.mlir.dialects import arith, builtin, gpu, memref
from jax.experimental.mosaic.gpu import fragmented_array as fa
from jax.experimental.mosaic.gpu import layouts as mgpu_layouts
from jax.experimental.mosaic.gpu import tcgen05
from jax.experimental.mosaic.gpu import utils as mgpu_utils

from smalti.blackwell.archs import TCGEN05, TCGEN05_WARP_ISSUED
from smalti.blackwell.collective import check_collective, is_collective
from smalti.blackwell.tmem_layouts import fitting, mma_tmem_layout
from smalti.blackwell.tmem_refs import check_tmem_operand, tmem_ref_from_ir
from smalti.constraints import Equal, Excludes, Reduced, TransferableTmem
from smalti.diagnostics import SmaltiValueError
from smalti.layouts import SmemTransforms, TmemLayout
from smalti.refs import tmem_address_cast as address_cast
from smalti.refs import tmem_layout_from_attribute
from smalti.registry import ConstraintRegistry, LoweringRegistry
from smalti.rules import ConstraintBuilder, LoweringContext, default_is_signed

_ALIAS_KEY = "smalti.blackwell/slice_tmem alias"


def _shape(value: ir.Value) -> tuple[int, ...]:
    return tuple(ir.ShapedType(value.type).shape)


def _bitwidth(value: ir.Value) -> int:
    return mgpu_utils.bitwidth(ir.ShapedType(value.type).element_type)


# --- constraint rules ----------------------------------------------------------------


def tmem_alloc(op: mgpu.TmemAllocOp, b: ConstraintBuilder) -> None:
    """A fresh TMEM ref; unless its users decide, it has the layout of an MMA
    accumulator of its shape. The SMEM word receiving the address is plain."""
    b.assign(b.variable(b.operand(0)), SmemTransforms(None, None))
    result = b.variable(b.result(0))
    try:
        default = mma_tmem_layout(_shape(op.result), is_collective(op), packing=1)
    except ValueError:
        return  # no default: the users must decide
    b.fallback(result, TmemLayout(default))


def tmem_dealloc(op: mgpu.TmemDeallocOp, b: ConstraintBuilder) -> None:
    check_tmem_operand(op, op.tmem_ref, "tmem_ref")
    b.variable(b.operand(0))


def tmem_layout_cast(op: mgpu.TmemLayoutCastOp, b: ConstraintBuilder) -> None:
    """The ref (operand and result alike) has the requested layout."""
    check_tmem_operand(op, op.ref, "ref")
    ref = b.variable(b.operand(0), b.result(0))
    layout = tmem_layout_from_attribute(op.new_layout)
    b.assign(ref, fitting(op, "ref", _shape(op.ref), layout, cast=True))


def slice_tmem(op: mgpu.SliceTmemOp, b: ConstraintBuilder) -> None:
    """A view of the allocation; slices with one ``alias_id`` share a layout."""
    check_tmem_operand(op, op.source, "source")
    b.variable(b.operand(0))
    result = b.variable(b.result(0))
    if "alias_id" not in op.attributes:
        return
    alias = ir.IntegerAttr(op.attributes["alias_id"]).value
    first = b.shared.setdefault((_ALIAS_KEY, alias), result)
    if first is not result:
        b.require(Equal(first, result))


def async_load_tmem(op: mgpu.AsyncLoadTmemOp, b: ConstraintBuilder) -> None:
    """Registers loadable from the ref's TMEM layout (never splat nor
    strided); a reduced load also yields the rows reduced along columns."""
    check_tmem_operand(op, op.source, "source")
    source = b.variable(b.operand(0))
    loaded = b.variable(b.result(0))
    b.require(TransferableTmem(loaded, source, _shape(op.source), _bitwidth(op.source)),
              # Implied by the transfer; stated to prune the search early.
              Excludes(loaded, fa.WGSplatFragLayout),
              Excludes(loaded, fa.WGStridedFragLayout))
    if getattr(op, "reduce", None) is not None:
        reduced = b.variable(b.result(1))
        b.require(Equal(reduced, Reduced(loaded, axes=(1,), rank=2)))


def async_store_tmem(op: mgpu.AsyncStoreTmemOp, b: ConstraintBuilder) -> None:
    """Registers storable into the ref's TMEM layout."""
    check_tmem_operand(op, op.destination, "destination")
    source = b.variable(b.operand(0))
    destination = b.variable(b.operand(1))
    b.require(TransferableTmem(source, destination, _shape(op.source), _bitwidth(op.source)))


# --- lowering rules ------------------------------------------------------------------


def lower_tmem_alloc(ctx: LoweringContext, op: mgpu.TmemAllocOp) -> list[ir.Value]:
    """One warp allocates; after a block barrier everyone reads the address."""
    check_collective(ctx, op)
    columns = ir.MemRefType(op.result.type).shape[1] // op.packing.value
    with mgpu_utils.when(ctx.single_warp_per_block_predicate):
        tcgen05.tmem_alloc(op.smem_ptr, columns, is_collective(op), exact=False)
    gpu.barrier()
    address = memref.load(op.smem_ptr, [])
    cast = builtin.UnrealizedConversionCastOp([op.result.type], [address])
    # tmem_dealloc reads these back from the cast.
    cast.attributes["collective"] = op.collective
    cast.attributes["packing"] = op.packing
    [cast.attributes["layout"]] = ctx.out_tmem_layouts(op)
    return [cast.result]


def lower_tmem_relinquish_alloc_permit(ctx: LoweringContext,
                                       op: mgpu.TmemRelinquishAllocPermitOp) -> list[ir.Value]:
    check_collective(ctx, op)
    with mgpu_utils.when(ctx.single_warp_per_block_predicate):
        tcgen05.tmem_relinquish_alloc_permit(is_collective(op))
    return []


def _not_an_allocation(op: mgpu.TmemDeallocOp) -> SmaltiValueError:
    return SmaltiValueError(
        "SM146", f"{op.tmem_ref.get_name()} is not a TMEM allocation: tmem_dealloc frees "
        "what tmem_alloc returned, not a view of it",
        op=op, values={"tmem_ref": str(op.tmem_ref.type)},
        fix="pass the result of mosaic_gpu.tmem_alloc itself to tmem_dealloc")


def check_tmem_dealloc(op: mgpu.TmemDeallocOp) -> None:
    """Before rewriting: the freed ref is a tmem_alloc's result (not a cast or
    a view of it), whose lowering records what tmem_dealloc needs."""
    owner = op.tmem_ref.owner
    if isinstance(owner, ir.Block) or owner.name != "mosaic_gpu.tmem_alloc":
        raise _not_an_allocation(op)


def lower_tmem_dealloc(ctx: LoweringContext, op: mgpu.TmemDeallocOp) -> list[ir.Value]:
    """Frees the columns of the allocation, as recorded by ``tmem_alloc``."""
    check_tmem_operand(op, op.tmem_ref, "tmem_ref")
    cast = address_cast(op.tmem_ref)
    if "collective" not in cast.attributes or "packing" not in cast.attributes:
        raise _not_an_allocation(op)
    collective = ir.BoolAttr(cast.attributes["collective"]).value
    packing = ir.IntegerAttr(cast.attributes["packing"]).value
    columns = ir.MemRefType(op.tmem_ref.type).shape[1] // packing
    with mgpu_utils.when(ctx.single_warp_per_block_predicate):
        tcgen05.tmem_dealloc(cast.operands[0], columns, collective, exact=False)
    return []



def lower_tmem_layout_cast(ctx: LoweringContext, op: mgpu.TmemLayoutCastOp) -> list[ir.Value]:
    """Nothing to do at run time: TMEM cannot be relaid out, so the ref must
    already have the layout."""
    [layout] = ctx.in_tmem_layouts(op)
    ref = tmem_ref_from_ir(op, op.ref, layout, "ref")
    if mgpu_layouts.to_layout_attr(ref.layout) != op.new_layout:
        raise ctx.fail(op, f"TMEM cannot be relaid out: the ref has layout {layout}, the cast "
                       f"asks for {op.new_layout}",
                       fix="re-run layout inference: it gives the ref the cast's layout")
    return [op.ref]


def lower_slice_tmem(ctx: LoweringContext, op: mgpu.SliceTmemOp) -> list[ir.Value]:
    """The source's address advanced by ``offset`` columns."""
    [in_layout], [out_layout] = ctx.in_tmem_layouts(op), ctx.out_tmem_layouts(op)
    source = tmem_ref_from_ir(op, op.source, in_layout, "source")
    i32 = ir.IntegerType.get_signless(32)
    address = arith.addi(source.address, arith.constant(i32, op.offset))
    cast = builtin.UnrealizedConversionCastOp([op.result.type], [address])
    cast.attributes["layout"] = out_layout
    return [cast.result]


def lower_async_load_tmem(ctx: LoweringContext, op: mgpu.AsyncLoadTmemOp) -> list[ir.Value]:
    """``tcgen05.ld`` into the result's register layout (and a row reduction)."""
    [in_layout] = ctx.in_tmem_layouts(op)
    ref = tmem_ref_from_ir(op, op.source, in_layout, "source")
    out_layouts = ctx.out_layouts(op)
    layout = mgpu_layouts.from_layout_attr(out_layouts[0])
    element = ir.MemRefType(op.source.type).element_type
    if getattr(op, "reduce", None) is None:
        loaded = ref.load(layout, default_is_signed(element))
        return [ctx.to_ir(loaded, op.results[0].type)]
    reduction = str(mgpu.TMEMLoadReduction(op.reduce.value))
    is_signed = None
    if isinstance(element, ir.IntegerType):
        # |x| reductions read integers as unsigned; the instruction names the type.
        is_signed = not reduction.startswith("abs")
        reduction = reduction[-3:]
    loaded, reduced = ref.load(layout, is_signed, reduce=reduction)
    return [ctx.to_ir(loaded, op.results[0].type), ctx.to_ir(reduced, op.results[1].type)]


def lower_async_store_tmem(ctx: LoweringContext, op: mgpu.AsyncStoreTmemOp) -> list[ir.Value]:
    """``tcgen05.st`` of the registers."""
    [tmem_layout] = ctx.in_tmem_layouts(op)
    ref = tmem_ref_from_ir(op, op.destination, tmem_layout, "destination")
    [layout] = ctx.in_layouts(op)
    ref.store(ctx.from_ir(op.source, layout))
    return []


def register_constraints(registry: ConstraintRegistry) -> None:
    rule = registry.constraint_rule
    rule("mosaic_gpu.tmem_alloc", archs=TCGEN05)(tmem_alloc)
    rule("mosaic_gpu.tmem_dealloc", archs=TCGEN05)(tmem_dealloc)
    rule("mosaic_gpu.tmem_layout_cast", archs=TCGEN05)(tmem_layout_cast)
    rule("mosaic_gpu.slice_tmem", archs=TCGEN05)(slice_tmem)
    rule("mosaic_gpu.async_load_tmem", archs=TCGEN05)(async_load_tmem)
    rule("mosaic_gpu.async_store_tmem", archs=TCGEN05)(async_store_tmem)


def register_lowerings(registry: LoweringRegistry) -> None:
    rule = registry.lowering_rule
    rule("mosaic_gpu.tmem_alloc", archs=TCGEN05)(lower_tmem_alloc)
    rule("mosaic_gpu.tmem_dealloc", archs=TCGEN05, check=check_tmem_dealloc)(
        lower_tmem_dealloc)
    rule("mosaic_gpu.tmem_relinquish_alloc_permit", archs=TCGEN05)(
        lower_tmem_relinquish_alloc_permit)
    # Views of TMEM may also be taken by a single warp.
    rule("mosaic_gpu.tmem_layout_cast", **TCGEN05_WARP_ISSUED)(lower_tmem_layout_cast)
    rule("mosaic_gpu.slice_tmem", **TCGEN05_WARP_ISSUED)(lower_slice_tmem)
    rule("mosaic_gpu.async_load_tmem", archs=TCGEN05)(lower_async_load_tmem)
    rule("mosaic_gpu.async_store_tmem", archs=TCGEN05)(lower_async_store_tmem)
