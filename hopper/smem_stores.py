"""``async_store_smem``: registers to local or remote (cluster) SMEM, tracked
by an expect-tx barrier (sm_90a)."""

from __future__ import annotations

import math
from collections.abc import Callable

from jax._src.lib import mosaic_gpu_dialect as mgpu
from jax._src.lib.mlir import ir
from jax._src.lib.mlir.dialects import arith, gpu
from jax.experimental.mosaic.gpu import fragmented_array as fa
from jax.experimental.mosaic.gpu import layouts as mgpu_layouts
from jax.experimental.mosaic.gpu import utils as mgpu_utils

from smalti.constraints import Excludes, TransferKind
from smalti.layouts import smem_transforms_from_attribute
from smalti.plugins.transfers import (
    JAX_0_11,
    JAX_0_12,
    Transfers,
    store_kind,
    transferable,
    unwrap_ref,
)
from smalti.plugins.versions import BEFORE_0_12, SINCE_0_12
from smalti.registry import (
    HOPPER_AND_LATER,
    ConstraintRegistry,
    LoweringRegistry,
    PallasRegistry,
    deferred,
)
from smalti.rules import ConstraintBuilder, LoweringContext


def _async_store_smem(op: mgpu.AsyncStoreSmemOp, b: ConstraintBuilder, unset: str) -> None:
    value = b.variable(b.operand(0))
    b.require(transferable(value, b.variable(b.operand(1)), op.destination,
                           store_kind(op, unset), b.arch))
    b.require(Excludes(value, fa.WGStridedFragLayout), Excludes(value, fa.WGSplatFragLayout))


def async_store_smem(op: mgpu.AsyncStoreSmemOp, b: ConstraintBuilder) -> None:
    """Like vector_store to SMEM, but only from tiled register layouts
    (jax >= 0.12: unset ``optimized`` means optimized)."""
    _async_store_smem(op, b, unset=TransferKind.OPTIMIZED)


def async_store_smem_jax_0_11(op: mgpu.AsyncStoreSmemOp, b: ConstraintBuilder) -> None:
    """jax 0.11: unset ``optimized`` may be downgraded, like vector_store."""
    _async_store_smem(op, b, unset=TransferKind.DOWNGRADABLE)


def _expect_tx(ctx: LoweringContext, op: mgpu.AsyncStoreSmemOp, value: fa.FragmentedArray,
               orders_tensor_core: bool, barrier: mgpu_utils.BarrierRef) -> None:
    """jax >= 0.12: the bytes, per lane; a tensor-core barrier expects all of
    them from one lane, ordered after the threads' earlier work."""
    total = math.prod(value.shape) * mgpu_utils.bitwidth(value.mlir_dtype) // 8
    if total % mgpu_utils.WARPGROUP_SIZE:
        raise ctx.unsupported(op, f"Transfer of {total} bytes is not divisible by "
                              f"{mgpu_utils.WARPGROUP_SIZE}",
                              fix="store a value whose size is a multiple of 128 bytes")
    if orders_tensor_core:
        barrier.arrive_expect_tx(total, predicate=ctx.single_lane_predicate,
                                 tensor_core_order_scope=ctx.thread_semantics)
    else:
        barrier.arrive_expect_tx(total // mgpu_utils.WARPGROUP_SIZE)


def _expect_tx_jax_0_11(ctx: LoweringContext, op: mgpu.AsyncStoreSmemOp, value: fa.FragmentedArray,
                        orders_tensor_core: bool, barrier: mgpu_utils.BarrierRef) -> None:
    """jax 0.11: counted in bits; every barrier gets per-lane shares."""
    bits = math.prod(value.shape) * mgpu_utils.bitwidth(value.mlir_dtype)
    if bits % (8 * mgpu_utils.WARPGROUP_SIZE):
        raise ctx.unsupported(op, f"Transfer of {bits} bits is not divisible by "
                              f"{8 * mgpu_utils.WARPGROUP_SIZE}",
                              fix="store a value whose size is a multiple of 128 bytes")
    barrier.arrive_expect_tx(bits // 8 // mgpu_utils.WARPGROUP_SIZE)


def _lower_async_store_smem(ctx: LoweringContext, op: mgpu.AsyncStoreSmemOp,
                            expect_tx: Callable[..., None], transfers: Transfers
                            ) -> list[ir.Value]:
    index = ir.IndexType.get()
    [layout_attr] = ctx.in_layouts(op)
    value = ctx.from_ir(op.valueToStore, layout_attr)
    if not isinstance(mgpu_layouts.from_layout_attr(layout_attr), fa.TiledLayout):
        raise ctx.fail(op, f"async_store_smem needs a tiled layout, got {layout_attr}",
                       fix="re-run layout inference")
    [transforms] = ctx.in_transforms(op)
    smem = smem_transforms_from_attribute(transforms)
    ref = unwrap_ref(op.destination, transforms)
    if smem.tiling is None:
        raise ctx.fail(op, "async_store_smem needs a tiled SMEM ref", transforms=str(transforms),
                       fix="re-run layout inference")
    dialect_barrier = mgpu_utils.DialectBarrierRef.from_barrier_memref(op.barrier)
    barrier = dialect_barrier.barrier_ref
    cluster_dim = gpu.Dimension(op.cluster_dim.value)
    cluster_idx = arith.index_cast(index, op.cluster_idx)
    remote_barrier = barrier.remap_to_cluster(cluster_dim, cluster_idx)
    expect_tx(ctx, op, value, dialect_barrier.orders_tensor_core, remote_barrier)
    atomic = str(mgpu.AtomicOpType(op.atomic_type.value)) if op.atomic_type is not None else None

    def store(optimized: bool) -> None:
        value.store_tiled_async(ref, barrier, cluster_dim=cluster_dim, cluster_idx=cluster_idx,
                                swizzle=smem.swizzle, optimized=optimized,
                                tiling_rank=len(smem.tiling), atomic=atomic)

    transfers.smem(store, op)
    return []


def lower_async_store_smem(ctx: LoweringContext, op: mgpu.AsyncStoreSmemOp) -> list[ir.Value]:
    return _lower_async_store_smem(ctx, op, _expect_tx, JAX_0_12)


def lower_async_store_smem_jax_0_11(ctx: LoweringContext,
                                    op: mgpu.AsyncStoreSmemOp) -> list[ir.Value]:
    return _lower_async_store_smem(ctx, op, _expect_tx_jax_0_11, JAX_0_11)


def register_constraints(registry: ConstraintRegistry) -> None:
    rule = registry.constraint_rule
    rule("mosaic_gpu.async_store_smem", archs=HOPPER_AND_LATER, jax=SINCE_0_12)(async_store_smem)
    rule("mosaic_gpu.async_store_smem", archs=HOPPER_AND_LATER, jax=BEFORE_0_12)(
        async_store_smem_jax_0_11)


def register_lowerings(registry: LoweringRegistry) -> None:
    rule = registry.lowering_rule
    rule("mosaic_gpu.async_store_smem", archs=HOPPER_AND_LATER, jax=SINCE_0_12)(
        lower_async_store_smem)
    rule("mosaic_gpu.async_store_smem", archs=HOPPER_AND_LATER, jax=BEFORE_0_12)(
        lower_async_store_smem_jax_0_11)


def register_pallas_lowerings(registry: PallasRegistry) -> None:
    # Scalars (which jax refuses) by st.async; everything else by jax's rule.
    # Both referenced by name: Pallas is only imported once smalti is installed.
    registry.pallas_lowering("jax._src.pallas.mosaic_gpu.primitives:async_store_smem_p")(
        deferred("smalti.hopper.pallas_stores:lower_async_store_smem"))
