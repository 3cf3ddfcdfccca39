"""Cluster launch control: cancel a cluster not yet launched and take over
its work (``clusterlaunchcontrol.try_cancel`` / ``query_cancel``).

The 16-byte response lives in a plain (untiled, unswizzled) SMEM ref.
"""

from __future__ import annotations

from jax._src.lib import mosaic_gpu_dialect as mgpu
from jax._src.lib.mlir import ir
from jax.experimental.mosaic.gpu import utils as mgpu_utils

from smalti.layouts import SmemTransforms
from smalti.registry import BLACKWELL_AND_LATER, ConstraintRegistry, LoweringRegistry
from smalti.rules import ConstraintBuilder, LoweringContext


def cancellation_result(op: mgpu.TryClusterCancelOp | mgpu.QueryClusterCancelOp,
                        b: ConstraintBuilder) -> None:
    b.assign(b.variable(b.operand(0)), SmemTransforms(None, None))


def lower_try_cluster_cancel(ctx: LoweringContext, op: mgpu.TryClusterCancelOp
                             ) -> list[ir.Value]:
    """One lane asks; the barrier completes when the response has arrived.
    The response goes to the logical ref: untransformed, it has the type of
    the physical one."""
    barrier = mgpu_utils.DialectBarrierRef.from_barrier_memref(op.barrier).barrier_ref
    mgpu_utils.try_cluster_cancel(op.cancellation_result, barrier,
                                  ctx.lane_predicate(op.predicate))
    return []


def lower_query_cluster_cancel(ctx: LoweringContext, op: mgpu.QueryClusterCancelOp
                               ) -> list[ir.Value]:
    """The first CTA id of the cancelled cluster, and whether one was cancelled."""
    return list(mgpu_utils.query_cluster_cancel(op.cancellation_result))


def register_constraints(registry: ConstraintRegistry) -> None:
    registry.constraint_rule("mosaic_gpu.try_cluster_cancel", "mosaic_gpu.query_cluster_cancel",
                             archs=BLACKWELL_AND_LATER)(cancellation_result)


def register_lowerings(registry: LoweringRegistry) -> None:
    rule = registry.lowering_rule
    rule("mosaic_gpu.try_cluster_cancel", archs=BLACKWELL_AND_LATER)(lower_try_cluster_cancel)
    rule("mosaic_gpu.query_cluster_cancel", archs=BLACKWELL_AND_LATER)(
        lower_query_cluster_cancel)
