"""``mosaic_gpu.warp_map``: a body run once per warp.

The captured SMEM and TMEM refs are the same refs inside the body (a vector
cannot be captured: the body runs per warp). Lowering puts the body in place
of the op, as for a custom primitive, and lowers its ops under warp
semantics (``ctx.thread_semantics`` is WARP), which only the rules
registered with ``warp_semantics=True`` support.
"""

from __future__ import annotations

from jax._src.lib import mosaic_gpu_dialect as mgpu
from jax._src.lib.mlir import ir
from jax.experimental.mosaic.gpu import utils as mgpu_utils

from smalti.diagnostics import SmaltiValueError
from smalti.layouts import MemorySpace
from smalti.plugins.custom_primitive import bind_arguments, entry_block
from smalti.registry import ConstraintRegistry, LoweringRegistry
from smalti.rules import ConstraintBuilder, LoweringContext
from smalti.sites import memory_space_of

WARP = mgpu_utils.ThreadSubset.WARP


def warp_map(op: mgpu.WarpMapOp, b: ConstraintBuilder) -> None:
    """Each captured SMEM or TMEM ref is the same ref inside the body."""
    for i, operand in enumerate(op.operation.operands):
        space = memory_space_of(operand)
        if space is MemorySpace.REG:
            raise SmaltiValueError(
                "SM107", f"mosaic_gpu.warp_map captures the vector {operand.type}: its body "
                "runs per warp and cannot use warpgroup vectors", op=op,
                values={"operand": f"#{i}"},
                fix=["store the vector to SMEM before the warp_map and capture the ref",
                     "or compute the vector outside the warp_map"])
        if space is not None:
            b.variable(b.operand(i), b.argument(0, i))


def register_constraints(registry: ConstraintRegistry) -> None:
    registry.constraint_rule("mosaic_gpu.warp_map")(warp_map)


def lower_warp_map(ctx: LoweringContext, op: mgpu.WarpMapOp) -> list[ir.Value]:
    """Lowers the body in place of the op, under warp semantics."""
    body = entry_block(op)
    bind_arguments(body, list(op.operation.operands))
    # Warps may start async copies on their own: all reads and writes of the
    # warpgroup must be done before, and the warps' effects visible after.
    if ctx.auto_barriers:
        mgpu_utils.warpgroup_barrier()
    here = ir.InsertionPoint.current
    outer = ctx.thread_semantics
    ctx.thread_semantics = WARP
    try:
        for inner in list(body.operations):
            inner.detach_from_parent()
            here.insert(inner)
            ctx.lower_op(inner)
    finally:
        ctx.thread_semantics = outer
    if ctx.auto_barriers:
        mgpu_utils.warpgroup_barrier()
    return []


def register_lowerings(registry: LoweringRegistry) -> None:
    registry.lowering_rule("mosaic_gpu.warp_map", warp_regions=True)(lower_warp_map)
