"""Ops a GPU compiler removes before anything runs: pure ops whose results
no live op reads.

jax's Lane-level lowering leaves values nobody uses (index arithmetic of
its transfers, constants, casts, a vocabulary rule's unread result); LLVM
and ptxas delete them, so the hardware never executes them. The emulator
skips them too (:class:`..compiler.Compiler`), so its profiler counts what
the hardware would and it spends no time on them.

An op is *pure* here when its dialect has no side effects (``arith``,
``math``, ``index``) or it is one of the listed moves, casts and address
computations; everything else (memory, barriers, control flow, inline
PTX, calls) is live whatever its results. A pure op is dead when every use
of every result is by a dead op. SSA dominance puts every use after its
definition in a pre-order walk (in the same block or nested in a later
op), so one walk backwards decides every op."""

from __future__ import annotations

from typing import Any

PURE_DIALECTS = ("arith.", "math.", "index.")
PURE_OPS = frozenset({
    "builtin.unrealized_conversion_cast",
    "vector.broadcast", "vector.splat", "vector.extract", "vector.insert",
    "vector.shape_cast", "vector.from_elements", "vector.extract_strided_slice",
    "vector.bitcast",
    "llvm.mlir.constant", "llvm.mlir.undef", "llvm.mlir.poison", "llvm.mlir.zero",
    "llvm.insertvalue", "llvm.extractvalue", "llvm.getelementptr", "llvm.ptrtoint",
    "llvm.inttoptr", "llvm.bitcast",
    "gpu.thread_id", "gpu.block_id", "gpu.block_dim", "gpu.grid_dim", "gpu.lane_id",
    "memref.subview", "memref.view", "memref.reinterpret_cast", "memref.cast",
    "memref.collapse_shape", "memref.expand_shape", "memref.extract_aligned_pointer_as_index",
})


def is_pure(name: str) -> bool:
    """Whether an op of this name has no effect but its results."""
    return name.startswith(PURE_DIALECTS) or name in PURE_OPS


def dead_ops(root: Any) -> set[Any]:
    """The operations (``ir.Operation``) nested in ``root`` that no live op
    needs."""
    order: list[Any] = []

    def walk(op: Any) -> None:
        for region in op.regions:
            for block in region.blocks:
                for child in block.operations:
                    order.append(child.operation)
                    walk(child.operation)

    walk(root.operation)  # (an Operation's .operation is itself, as an OpView's is its op)
    dead: set[Any] = set()
    for op in reversed(order):
        if op.results and is_pure(op.name) and all(
                use.owner.operation in dead for result in op.results for use in result.uses):
            dead.add(op)
    return dead
