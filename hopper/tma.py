"""TMA copies between global and shared memory, and expect-tx barriers.

``async_load`` / ``async_store`` / ``async_prefetch`` move tiles with the
Tensor Memory Accelerator (or ``cp.async`` for loads without a barrier). The
SMEM side's tiling must divide the copied slice where the slice starts at a
dynamic offset; gathers and scatters take a vector of row indices along the
leading dimension, in one of the TMA index layouts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple, cast

from jax._src.lib import mosaic_gpu_dialect as mgpu
from jax._src.lib.mlir import ir
from jax._src.lib.mlir.dialects import arith, gpu
from jax.experimental.mosaic.gpu import fragmented_array as fa
from jax.experimental.mosaic.gpu import launch_context as lc
from jax.experimental.mosaic.gpu import utils as mgpu_utils

from smalti.constraints import Divides, MinorDimDivisibleBy, OneOf
from smalti.diagnostics import SmaltiNotImplementedError, SmaltiValueError
from smalti.divisibility import known_gcd
from smalti.hopper import gathers
from smalti.layouts import RegisterLayout, smem_transforms_from_attribute
from smalti.plugins.transfers import unwrap_ref
from smalti.plugins.versions import BEFORE_0_12, SINCE_0_12
from smalti.registry import (
    HOPPER_AND_LATER,
    ConstraintRegistry,
    LoweringOptions,
    LoweringRegistry,
)
from smalti.rules import ConstraintBuilder, LoweringContext, malformed_op

#: The TMA copies; with the prefetch, the TMA ops these rules describe.
type CopyOp = mgpu.AsyncLoadOp | mgpu.AsyncStoreOp
type TmaOp = mgpu.AsyncLoadOp | mgpu.AsyncStoreOp | mgpu.AsyncPrefetchOp

# Operand index of the first GMEM index, per op.
_FIRST_INDEX = {"mosaic_gpu.async_load": 3, "mosaic_gpu.async_store": 2,
                "mosaic_gpu.async_prefetch": 1}


def _gmem_ref(op: TmaOp) -> ir.Value:
    return op.destination if op.operation.name == "mosaic_gpu.async_store" else op.source


def index_layouts(op: TmaOp, b: ConstraintBuilder) -> None:
    """Each vector of gather/scatter row indices is in a TMA index layout."""
    first = _FIRST_INDEX[op.operation.name]
    for i, index in enumerate(op.indices):
        if not isinstance(index.type, ir.VectorType):
            continue
        shape = tuple(ir.VectorType(index.type).shape)
        if len(shape) != 1:  # read as a column of rows below
            raise SmaltiValueError(
                "SM120", f"Unsupported TMA index shape {shape}: gathers and scatters take "
                "a 1-D vector of row indices", op=op, values={"index": str(index.type)},
                fix="pass the row indices as a vector<Nxi32>, N a multiple of 4")
        rows = shape[0]
        allowed = []
        if rows % 16 == 0:
            allowed.append(RegisterLayout.of(fa.TMA_INDICES_LAYOUT))
        if rows % 4 == 0:
            allowed.append(RegisterLayout.of(fa.TMA_INDICES_4_LAYOUT))
        if not allowed:
            raise SmaltiValueError(
                "SM120", f"Unsupported TMA index shape ({rows},): gathers and scatters "
                "take index vectors of a multiple of 4 rows", op=op,
                fix="pad the index vector to a multiple of 4 (16 for the fastest layout)")
        b.require(OneOf(b.variable(b.operand(first + i)), tuple(allowed)))


def check_indices(op: TmaOp) -> None:
    """One GMEM index and one slice length per dimension of the GMEM ref.

    The MLIR verifier says so too, but inference does not run it, and the
    rules below pair indices, lengths and dims up one by one.
    """
    rank = ir.MemRefType(_gmem_ref(op).type).rank
    indices, lengths = len(op.indices), len(op.slice_lengths)
    if indices == rank == lengths:
        return
    values: dict[str, Any] = {"GMEM ref": str(_gmem_ref(op).type), "indices": indices,
              "slice_lengths": list(op.slice_lengths)}
    if rank != 2 and any(isinstance(i.type, ir.VectorType) for i in op.indices):
        # What jax raises for a gather on a GMEM ref that is not 2-D.
        raise SmaltiNotImplementedError(
            "SM120", "Only 2D gathers/scatters for async load/store are supported: smalti "
            f"also gathers from a {rank}-D GMEM ref, but only with one index per "
            f"dimension, and this one has {indices}", op=op, values=values,
            fix=f"index every one of the {rank} GMEM dimensions (0 and a full slice "
                "length for the ones copied whole), or reshape the GMEM ref to 2-D")
    raise malformed_op(
        op, f"The size of `indices` ({indices}) and of `slice_lengths` ({lengths}) must be "
        f"equal to the rank of the GMEM ref ({rank})",
        fix="give one index and one slice length (-1 to squeeze the dim) per GMEM "
            "dimension; module.operation.verify() reports such ops", **values)


def async_copy(op: CopyOp, b: ConstraintBuilder) -> None:
    """The SMEM tile of a TMA copy: its tiling divides the copied slice."""
    check_indices(op)
    multiple = []
    for dim, (size, index) in enumerate(zip(op.slice_lengths, op.indices, strict=True)):
        if size == -1:
            continue  # a squeezed dimension: not in the SMEM ref
        if isinstance(index.type, ir.VectorType):
            _check_gather(op, dim)
            multiple.append(size)
        else:
            multiple.append(known_gcd(size, index))
    smem_operand = 1 if op.operation.name == "mosaic_gpu.async_load" else 0
    smem = b.variable(b.operand(smem_operand))
    b.require(Divides(smem, tuple(multiple)))
    if any(isinstance(i.type, ir.VectorType) for i in op.indices):
        # Gathered rows are moved 4 at a time in 1024-bit chunks: each row
        # must be 256-bit aligned in SMEM.
        bitwidth = mgpu_utils.bitwidth(ir.MemRefType(op.source.type).element_type)
        divisor = 256 // bitwidth
        collapse = gathers.plan(op, ir.MemRefType(_gmem_ref(op).type))
        lengths = [s for s in op.slice_lengths if s != -1]
        row = collapse.row_length if collapse is not None else lengths[-1] if lengths else 0
        if row % divisor:
            what = (f"minor dim={row}" if collapse is None else
                    f"collapsed row of {row} elements")
            raise SmaltiValueError(
                "SM120",
                f"Cannot assign layout to async load with gather indices since {what} "
                f"is not divisible by divisor={divisor} elements "
                "(rows must be 256-bit aligned)",
                op=op, values={"slice_lengths": list(op.slice_lengths)},
                fix=f"make the minor slice length a multiple of {divisor}")
        b.require(MinorDimDivisibleBy(smem, divisor))
        if collapse is not None:
            b.require(gathers.CollapsibleGatherTiling(smem, collapse, divisor, bitwidth))
    index_layouts(op, b)


def _check_gather(op: TmaOp, dim: int) -> None:
    if dim != 0:
        raise SmaltiNotImplementedError(
            "SM120", "Only leading gather dimensions allowed: vector indices must index "
            f"the first GMEM dimension, not dimension {dim}", op=op,
            fix="transpose the GMEM ref so that gathered rows are its leading dimension")
    shape = list(ir.MemRefType(_gmem_ref(op).type).shape)
    if len(shape) < 2:
        raise SmaltiNotImplementedError(
            "SM120", f"Only 2D gathers/scatters for async load/store are supported, the "
            f"GMEM ref has shape {shape}", op=op, values={"GMEM shape": shape},
            fix="reshape the GMEM ref to 2-D (rows x row length) before gathering")
    # N-D refs whose rows collapse to 2-D: checked by gathers.plan.


def prefetch(op: mgpu.AsyncPrefetchOp, b: ConstraintBuilder) -> None:
    check_indices(op)
    index_layouts(op, b)


# --- lowering -------------------------------------------------------------------------


def _gmem_slice(ctx: LoweringContext, op: TmaOp) -> tuple[tuple, dict]:
    """The GMEM slice of a copy, and the predicate arguments for async_copy."""
    kwargs = {"predicate": ctx.lane_predicate(op.predicate)}
    slices = []
    index_type = ir.IndexType.get()
    for index, size in zip(op.indices, op.slice_lengths, strict=True):
        if isinstance(index.type, ir.IntegerType):
            start = arith.index_cast(index_type, index)
            slices.append(start if size < 0 else mgpu_utils.DynamicSlice(start, size))
        elif isinstance(index.type, ir.VectorType):
            [layout] = ctx.in_layouts(op)
            slices.append(ctx.from_ir(index, layout))
            kwargs = {}  # gathers are issued by every thread
        else:
            raise ctx.fail(op, f"unsupported GMEM index type {index.type}",
                           fix="index GMEM with i32 scalars or a vector of i32 rows")
    return tuple(slices), kwargs


def _physical_smem(ctx: LoweringContext, op: CopyOp, ref: ir.Value
                   ) -> tuple[ir.Value, mgpu.SwizzlingMode, tuple]:
    """The tiled SMEM ref, swizzle and GMEM-side transforms of a copy."""
    [transforms] = ctx.in_transforms(op)
    smem = smem_transforms_from_attribute(transforms)
    physical = unwrap_ref(ref, transforms)
    gmem_transforms: tuple = ()
    if smem.tiling is not None:
        gmem_transforms = (lc.TileTransform(smem.tiling),)
    if mgpu_utils.is_memref_transposed(ir.MemRefType(physical.type)):
        # Copy untransposed and let the TMA apply the transpose.
        strides, _ = ir.MemRefType(physical.type).get_strides_and_offset()
        permutation = tuple(sorted(range(len(strides)), key=lambda i: strides[i], reverse=True))
        physical = mgpu_utils.memref_transpose(physical, permutation)
        gmem_transforms = (*gmem_transforms, lc.TransposeTransform(permutation))
    return physical, mgpu.SwizzlingMode(smem.swizzle or 16), gmem_transforms



def _gather_collapse(op: TmaOp) -> gathers.Collapse | None:
    """How a gather/scatter on an N-D GMEM ref collapses; ``None`` otherwise."""
    if not any(isinstance(i.type, ir.VectorType) for i in op.indices):
        return None
    return gathers.plan(op, ir.MemRefType(_gmem_ref(op).type))


def _collapsed_gather(ctx: LoweringContext, op: CopyOp, collapse: gathers.Collapse,
                      gmem: ir.Value, smem_ref: ir.Value, slices: tuple
                      ) -> tuple[ir.Value, ir.Value, mgpu.SwizzlingMode, tuple, tuple]:
    """The 2-D GMEM view, folded physical SMEM ref, swizzle, GMEM transforms
    and slice that jax's 2-D gather takes for a collapsed N-D one."""
    [transforms] = ctx.in_transforms(op)
    smem = smem_transforms_from_attribute(transforms)
    physical = unwrap_ref(smem_ref, transforms)
    if mgpu_utils.is_memref_transposed(ir.MemRefType(physical.type)):
        raise SmaltiNotImplementedError(
            "SM120", "Only 2D gathers/scatters for async load/store are supported, and a "
            "transposed SMEM ref cannot be collapsed to 2-D", op=op,
            fix="gather into an untransposed SMEM ref")
    view = gathers.collapsed_gmem(gmem, collapse)
    if view is None:
        raise SmaltiNotImplementedError(
            "SM120", "Only 2D gathers/scatters for async load/store are supported, and "
            "this N-D GMEM ref is not a kernel argument, so smalti cannot give the TMA a "
            "2-D view of it", op=op, values={"GMEM shape": list(collapse.gmem_shape)},
            fix="gather directly from a kernel argument, or make the GMEM ref 2-D")
    folded, gmem_transforms = gathers.collapsed_smem(physical, collapse, smem)
    return (view, folded, mgpu.SwizzlingMode(smem.swizzle or 16), gmem_transforms,
            gathers.collapsed_slice(op, collapse, slices[0]))


class _CopyOperands(NamedTuple):
    """What ``LaunchContext.async_copy`` takes for one TMA copy, worked out
    from the op: both refs as the TMA sees them, the swizzle, the GMEM-side
    transforms and slice, and the predicate arguments."""

    gmem: ir.Value
    smem: ir.Value
    swizzle: mgpu.SwizzlingMode
    gmem_transforms: tuple
    slices: tuple
    predicate: dict


def _copy_operands(ctx: LoweringContext, op: CopyOp, gmem: ir.Value, smem: ir.Value
                   ) -> _CopyOperands:
    # The order of the two steps is the order their IR is emitted in, which
    # the differential tests compare with jax's.
    collapse = _gather_collapse(op)
    if collapse is None:
        physical, swizzle, gmem_transforms = _physical_smem(ctx, op, smem)
        slices, predicate = _gmem_slice(ctx, op)
        return _CopyOperands(gmem, physical, swizzle, gmem_transforms, slices, predicate)
    slices, predicate = _gmem_slice(ctx, op)
    view, folded, swizzle, gmem_transforms, slices = _collapsed_gather(
        ctx, op, collapse, gmem, smem, slices)
    return _CopyOperands(view, folded, swizzle, gmem_transforms, slices, predicate)


#: How a multicast load's completion is tracked by the cluster leader, by the
#: attribute the op carries (none: every block tracks its own).
_LEADER_TRACKING: tuple[tuple[type, Callable[[Any], lc.CopyPartition]], ...] = (
    (mgpu.CopyReplicatedAttr, lambda _: lc.CopyPartition.REPLICATED),
    (mgpu.CopyPartitionedAttr, lambda attr: lc.CopyPartition.PARTITIONED(attr.axis)),
)


def _leader_tracking(attr: ir.Attribute | None) -> lc.CopyPartition | None:
    return next((partition(attr) for kind, partition in _LEADER_TRACKING
                 if isinstance(attr, kind)), None)


def lower_async_load(ctx: LoweringContext, op: mgpu.AsyncLoadOp) -> list[ir.Value]:
    # Without a barrier the load is a cp.async, issued by every thread.
    barrier = (None if op.barrier is None
               else mgpu_utils.DialectBarrierRef.from_barrier_memref(op.barrier).barrier_ref)
    copy = _copy_operands(ctx, op, op.source, op.destination)
    if ctx.auto_barriers and ctx.thread_semantics == mgpu_utils.ThreadSubset.WARPGROUP:
        mgpu_utils.warpgroup_barrier()  # earlier accesses to the destination are done
    implementation = lc.AsyncCopyImplementation.CP_ASYNC if barrier is None \
        else lc.AsyncCopyImplementation.TMA
    ctx.launch_context.async_copy(
        src_ref=copy.gmem, dst_ref=copy.smem, gmem_slice=copy.slices, barrier=barrier,
        # A tuple: jax 0.12 compares it with (gpu.Dimension.x,) for leader
        # tracking (0.11 takes any sequence).
        collective=tuple(gpu.Dimension(ir.IntegerAttr(axis).value)
                         for axis in op.collective or []),
        arrive=False, swizzle=copy.swizzle, gmem_transform=copy.gmem_transforms,
        leader_tracked=_leader_tracking(op.leader_tracked),
        oob_mode=lc.OOBFillMode(ir.IntegerAttr(op.oob_fill_mode).value),
        implementation=implementation, gmem_peer_id=getattr(op, "gmem_peer_id", None),
        **(copy.predicate if barrier is not None else {}),
    )
    return []


def lower_async_prefetch(ctx: LoweringContext, op: mgpu.AsyncPrefetchOp) -> list[ir.Value]:
    if op.collective:
        raise ctx.unsupported(op, "Collective prefetches are not supported yet",
                              fix="prefetch without the collective attribute")
    slices, predicate = _gmem_slice(ctx, op)
    ctx.launch_context.async_prefetch(gmem_ref=op.source, gmem_slice=slices, swizzle=None,
                                      gmem_transform=(), **predicate)
    return []


def _store_peer(op: mgpu.AsyncStoreOp) -> int | ir.Value | lc.GlobalBroadcast | None:
    """Whose GMEM the store writes: every peer's, one peer's, or (None) its own."""
    if op.is_global_broadcast.value:
        return lc.GLOBAL_BROADCAST
    return op.gmem_peer_id


def lower_async_store(ctx: LoweringContext, op: mgpu.AsyncStoreOp) -> list[ir.Value]:
    copy = _copy_operands(ctx, op, op.destination, op.source)
    reduction = op.reduction_op
    ctx.launch_context.async_copy(
        src_ref=copy.smem, dst_ref=copy.gmem, gmem_slice=copy.slices, swizzle=copy.swizzle,
        gmem_transform=copy.gmem_transforms, **copy.predicate,
        arrive=None if op.commit_group is None else bool(op.commit_group),
        reduction_op=(None if reduction is None else cast(
            lc.TMAReductionOp, mgpu.TMAReduction(reduction.value).name.lower())),
        gmem_peer_id=_store_peer(op), oob_mode=lc.OOBFillMode.UNDEFINED,
    )
    return []


def _uniform_tx_bytes(ctx: LoweringContext, op: mgpu.ArriveExpectTxOp, lanes: int) -> ir.Value:
    """What each lane adds to the barrier's expected bytes: an equal share when
    the (constant) count divides among the lanes, else all of it on one lane."""
    i32 = ir.IntegerType.get_signless(32)
    expected = op.expect_tx
    if isinstance(expected, ir.Value):
        owner = expected.owner
        constant = (int(owner.opview.value) if not isinstance(owner, ir.Block)
                    and isinstance(owner.opview, arith.ConstantOp) else None)
        dynamic = expected
    else:
        constant = int(expected)
        dynamic = None
    if constant is not None and constant % lanes == 0:
        # Every lane arrives with its share: cheaper than a single arrival.
        return mgpu_utils.c(constant // lanes, i32)
    total = dynamic if dynamic is not None else mgpu_utils.c(int(expected), i32)
    return arith.select(ctx.single_lane_predicate, total, mgpu_utils.c(0, i32))


def _lanes(ctx: LoweringContext) -> tuple[bool, int]:
    warp = ctx.thread_semantics == mgpu_utils.ThreadSubset.WARP
    return warp, mgpu_utils.WARP_SIZE if warp else mgpu_utils.WARPGROUP_SIZE


def lower_arrive_expect_tx(ctx: LoweringContext, op: mgpu.ArriveExpectTxOp) -> list[ir.Value]:
    """jax >= 0.12: the barrier is read first; a tensor-core barrier expects the
    whole count from one lane, ordered after the threads' earlier work."""
    warp, lanes = _lanes(ctx)
    barrier = mgpu_utils.DialectBarrierRef.from_barrier_memref(op.barrier)
    if barrier.orders_tensor_core:
        barrier.barrier_ref.arrive_expect_tx(op.expect_tx, predicate=ctx.single_lane_predicate,
                                             tensor_core_order_scope=ctx.thread_semantics)
        return []
    tx_bytes = _uniform_tx_bytes(ctx, op, lanes)
    if warp:
        # The barrier expects 128 arrivals; a warp's 32 threads arrive 4 times.
        barrier.barrier_ref.arrive(arrival_count=3, can_complete=False)
    barrier.barrier_ref.arrive_expect_tx(tx_bytes)
    return []


def lower_arrive_expect_tx_jax_0_11(ctx: LoweringContext,
                                    op: mgpu.ArriveExpectTxOp) -> list[ir.Value]:
    """jax 0.11: the share is computed before the barrier is read, and every
    barrier (tensor-core ones too) gets per-lane shares."""
    warp, lanes = _lanes(ctx)
    tx_bytes = _uniform_tx_bytes(ctx, op, lanes)
    barrier = mgpu_utils.DialectBarrierRef.from_barrier_memref(op.barrier)
    if warp:
        barrier.barrier_ref.arrive(arrival_count=3, can_complete=False)
    barrier.barrier_ref.arrive_expect_tx(tx_bytes)
    return []


def register_constraints(registry: ConstraintRegistry) -> None:
    rule = registry.constraint_rule
    rule("mosaic_gpu.async_load", "mosaic_gpu.async_store", archs=HOPPER_AND_LATER)(async_copy)
    rule("mosaic_gpu.async_prefetch", archs=HOPPER_AND_LATER)(prefetch)


def register_lowerings(registry: LoweringRegistry) -> None:
    rule = registry.lowering_rule
    # TMA copies and expect-tx arrivals may also be issued by a single warp.
    warp: LoweringOptions = {"archs": HOPPER_AND_LATER, "warp_semantics": True}
    rule("mosaic_gpu.async_load", **warp)(lower_async_load)
    rule("mosaic_gpu.async_store", **warp)(lower_async_store)
    rule("mosaic_gpu.async_prefetch", **warp)(lower_async_prefetch)
    warp_since_0_12: LoweringOptions = {**warp, "jax": SINCE_0_12}
    warp_before_0_12: LoweringOptions = {**warp, "jax": BEFORE_0_12}
    rule("mosaic_gpu.arrive_expect_tx", **warp_since_0_12)(lower_arrive_expect_tx)
    rule("mosaic_gpu.arrive_expect_tx", **warp_before_0_12)(lower_arrive_expect_tx_jax_0_11)
