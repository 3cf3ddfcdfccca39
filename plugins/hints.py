"""Hints for the passes that run before lowering: ``mosaic_gpu.assume_multiple``.

A hint has no vectors (no constraint rule) and vanishes in lowering.
"""

from __future__ import annotations

from jax._src.lib import mosaic_gpu_dialect as mgpu
from jax._src.lib.mlir import ir

from smalti.registry import LoweringRegistry
from smalti.rules import LoweringContext


def lower_assume_multiple(ctx: LoweringContext, op: mgpu.AssumeMultipleOp) -> list[ir.Value]:
    """Only a hint for the passes that run before lowering: the value itself."""
    return [op.value]


def register_lowerings(registry: LoweringRegistry) -> None:
    # Like jax, not under warp semantics (jax refuses it there, smalti too).
    registry.lowering_rule("mosaic_gpu.assume_multiple")(lower_assume_multiple)
