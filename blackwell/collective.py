"""One kernel, one kind of tcgen05 op: all collective (2-CTA) or none."""

from __future__ import annotations

from jax._src.lib.mlir import ir

from smalti.diagnostics import SmaltiValueError
from smalti.rules import LoweringContext


def is_collective(op: ir.OpView) -> bool:
    attributes = op.operation.attributes
    return "collective" in attributes and ir.BoolAttr(attributes["collective"]).value


def check_collective(ctx: LoweringContext, op: ir.OpView) -> None:
    """The first tcgen05 op lowered decides whether the kernel is collective;
    every later one must agree."""
    if "collective" not in op.operation.attributes:
        return
    collective = is_collective(op)
    if ctx.is_collective_kernel is None:
        ctx.is_collective_kernel = collective
    elif ctx.is_collective_kernel != collective:
        raise SmaltiValueError(
            "SM144",
            "Collective attributes are inconsistent across operations in the kernel.",
            op=op,
            values={"this op": "collective" if collective else "single-CTA",
                    "earlier tcgen05 ops": "collective" if ctx.is_collective_kernel
                    else "single-CTA"},
            fix="make every tcgen05 op of the kernel collective, or none (in Pallas: "
                "collective_axis= on every tcgen05 call and collective=True on the plgpu.TMEM "
                "scratch, or on none of them)",
        )
