"""``mosaic_gpu.multimem_load_reduce``: a load from a multicast ref, reduced
across devices by the instruction itself."""

from __future__ import annotations

from jax._src.lib import mosaic_gpu_dialect as mgpu
from jax._src.lib.mlir import ir
from jax.experimental.mosaic.gpu import fragmented_array as fa
from jax.experimental.mosaic.gpu import layouts as mgpu_layouts
from jax.experimental.mosaic.gpu import utils as mgpu_utils

from smalti.constraints import Excludes
from smalti.registry import ConstraintRegistry, LoweringRegistry
from smalti.rules import ConstraintBuilder, LoweringContext


def multimem_load_reduce(op: mgpu.MultimemLoadReduceOp, b: ConstraintBuilder) -> None:
    """A reduced load is never uniform."""
    b.require(Excludes(b.variable(b.result(0)), fa.WGSplatFragLayout))


def register_constraints(registry: ConstraintRegistry) -> None:
    registry.constraint_rule("mosaic_gpu.multimem_load_reduce")(multimem_load_reduce)


def _reduction(op: mgpu.MultimemLoadReduceOp) -> tuple[str, bool | None]:
    """The PTX reduction and how to read integers: ``smin``/``umax``... name
    the signedness, which the instruction takes separately."""
    reduction = str(mgpu.MultimemLoadReductionType(op.reduction_type.value))
    if not isinstance(ir.MemRefType(op.source.type).element_type, ir.IntegerType):
        return reduction, None
    if reduction in ("smin", "smax", "umin", "umax"):
        return reduction[1:], reduction[0] == "s"
    return reduction, False


def lower_multimem_load_reduce(ctx: LoweringContext,
                               op: mgpu.MultimemLoadReduceOp) -> list[ir.Value]:
    [layout_attr] = ctx.out_layouts(op)
    layout = mgpu_layouts.from_layout_attr(layout_attr)
    if not isinstance(layout, (fa.TiledLayout, fa.WGStridedFragLayout)):
        raise ctx.fail(op, f"a multimem load cannot produce the layout {layout_attr}",
                       fix="load into a strided or tiled layout")
    reduction, is_signed = _reduction(op)
    array = fa.FragmentedArray.load_reduce_untiled(
        mgpu_utils.MultimemRef(op.source), layout, reduction, is_signed=is_signed)
    return [ctx.to_ir(array, op.result.type)]


def register_lowerings(registry: LoweringRegistry) -> None:
    registry.lowering_rule("mosaic_gpu.multimem_load_reduce")(lower_multimem_load_reduce)
