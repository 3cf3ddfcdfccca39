"""Barriers: ``mosaic_gpu.initialize_barrier``, ``arrive`` and ``wait``.

A barrier counts warpgroup threads, except one that orders the tensor core
(``orders_tensor_core``), which expects one arrival per commit. These ops
have no vectors: they get lowering rules only.
"""

from __future__ import annotations

from jax._src.lib import mosaic_gpu_dialect as mgpu
from jax._src.lib.mlir import ir
from jax._src.lib.mlir.dialects import arith, llvm
from jax.experimental.mosaic.gpu import utils as mgpu_utils

from smalti.plugins.versions import BEFORE_0_12
from smalti.registry import LoweringRegistry
from smalti.rules import LoweringContext

WARP = mgpu_utils.ThreadSubset.WARP


def lower_initialize_barrier(ctx: LoweringContext,
                             op: mgpu.InitializeBarrierOp) -> list[ir.Value]:
    """One ``mbarrier.init`` per barrier, by one thread of the block. Unless the
    barrier orders the tensor core (one arrival per commit), each of the
    declared arrivals is a whole warpgroup of threads."""
    threads_per_arrival = 1 if op.orders_tensor_core.value else mgpu_utils.WARPGROUP_SIZE
    expected = op.arrival_count.value * threads_per_arrival
    for index in range(op.num_barriers.value):
        slot = mgpu_utils.getelementptr(op.base_pointer, [index],
                                        ir.IntegerType.get_signless(64))
        _mbarrier_init(slot, expected, ctx.single_thread_per_block_predicate)
    return []


def _mbarrier_init(slot: ir.Value, expected: int, predicate: ir.Value) -> None:
    count = mgpu_utils.c(expected, ir.IntegerType.get_signless(32))
    llvm.inline_asm(ir.Type.parse("!llvm.void"), [slot, count, predicate],
                    "@$2 mbarrier.init.shared::cta.b64 [$0], $1;", "r,r,b",
                    has_side_effects=True)


def _barrier(value: ir.Value) -> mgpu_utils.DialectBarrierRef:
    return mgpu_utils.DialectBarrierRef.from_barrier_memref(value)


def lower_arrive(ctx: LoweringContext, op: mgpu.ArriveOp) -> list[ir.Value]:
    """Every thread arrives, except on tensor-core barriers, which expect one
    arrival: then a single lane arrives for everyone."""
    barrier = _barrier(op.barrier).barrier_ref
    predicate = op.predicate
    if op.orders_tensor_core.value:
        lane = ctx.single_lane_predicate
        predicate = lane if predicate is None else arith.andi(predicate, lane)
        count = 1
    else:
        # A barrier counts warpgroup threads: under warp semantics each of a
        # warp's 32 threads arrives for the 4 threads of the warpgroup it stands for.
        count = 4 if ctx.thread_semantics == WARP else 1
    barrier.arrive(count, orders_tensor_core=op.orders_tensor_core.value,
                   predicate=predicate, scope=ctx.thread_semantics)
    return []


def lower_wait(ctx: LoweringContext, op: mgpu.WaitOp) -> list[ir.Value]:
    """Blocks until the barrier's phase with ``parity`` completes."""
    barrier = _barrier(op.barrier)
    # A tensor-core barrier also orders the tensor core's work after the wait.
    barrier.barrier_ref.wait_parity(op.parity, orders_tensor_core=barrier.orders_tensor_core)
    return []


def register_lowerings(registry: LoweringRegistry) -> None:
    registry.lowering_rule("mosaic_gpu.initialize_barrier")(lower_initialize_barrier)
    registry.lowering_rule("mosaic_gpu.arrive", warp_semantics=True)(lower_arrive)
    # jax 0.12 removed mosaic_gpu.wait from the dialect (waits are Lane-level).
    registry.lowering_rule("mosaic_gpu.wait", jax=BEFORE_0_12)(lower_wait)
