"""tcgen05 MMA: dense, block-scaled and sparse, single-CTA or collective.

The accumulator lives in TMEM, in the layout of an accumulator of its shape;
``b`` (and ``a`` unless it is in TMEM) is read from SMEM, tiled like a WGMMA
operand (:func:`smalti.hopper.wgmma.mma_smem_tilings`). Scales and sparse
metadata sit in TMEM in the layouts tcgen05 defines for them.
``tcgen05_commit_arrive`` makes a barrier track the completion of the MMAs
issued so far.
"""

from __future__ import annotations

from jax._src.lib import mosaic_gpu_dialect as mgpu
from jax._src.lib.mlir import ir
from jax._src.lib.mlir.dialects import arith
from jax.experimental.mosaic.gpu import tcgen05
from jax.experimental.mosaic.gpu import utils as mgpu_utils

from smalti.blackwell.archs import TCGEN05, TCGEN05_WARP_ISSUED
from smalti.blackwell.collective import check_collective, is_collective
from smalti.blackwell.tmem_layouts import fitting, required_mma_layout
from smalti.blackwell.tmem_refs import check_tmem_operand, tmem_ref_from_ir
from smalti.constraints import Divides, OneOf
from smalti.diagnostics import SmaltiValueError
from smalti.hopper.wgmma import mma_smem_tilings
from smalti.layouts import MemorySpace, smem_transforms_from_attribute
from smalti.plugins.transfers import unwrap_ref
from smalti.plugins.versions import BEFORE_0_12, SINCE_0_12
from smalti.registry import ConstraintRegistry, LoweringOptions, LoweringRegistry
from smalti.rules import ConstraintBuilder, LoweringContext
from smalti.sites import memory_space_of

_SWIZZLES = (128, 64, 32, 16)  # widest first; 16 is "no swizzle"


def _shape(value: ir.Value) -> tuple[int, ...]:
    return tuple(ir.ShapedType(value.type).shape)


def _bitwidth(value: ir.Value) -> int:
    return mgpu_utils.bitwidth(ir.ShapedType(value.type).element_type)


def _optional_positions(op: mgpu.TcGen05MMAOp) -> dict[str, int]:
    """Operand positions of the optional operands present, which follow
    ``accumulator, a, b, accumulate`` in this order."""
    names = ("a_scale", "b_scale", "a_sparse_metadata")
    present = [n for n in names if getattr(op, n) is not None]
    return {name: 4 + i for i, name in enumerate(present)}


def _check_scales(op: mgpu.TcGen05MMAOp) -> bool:
    """Whether the MMA is block-scaled; both scales or neither."""
    if (op.a_scale is None) != (op.b_scale is None):
        given = "a_scale" if op.a_scale is not None else "b_scale"
        raise SmaltiValueError(
            "SM145",
            f"Expecting neither or both scales to be present. Got only {given}.",
            op=op, fix="pass both a_scale and b_scale (TMEM refs), or neither")
    return op.a_scale is not None


def _n_split_tiling(op: mgpu.TcGen05MMAOp) -> tuple[int, int]:
    """An M=64 single-CTA MMA splits N over two lane groups: ``b``'s tiles
    must not straddle them."""
    n = _shape(op.b)[1]
    bitwidth = _bitwidth(op.b)
    widest = next((8 * s // bitwidth for s in _SWIZZLES if 8 * s // bitwidth <= n // 2), None)
    if widest is None:  # the narrowest tile is wider than a lane group's half of N
        raise SmaltiValueError(
            "SM121", f"N={n} of an M=64 tcgen05_mma is too narrow: each half of N must hold "
            f"a tile of {128 // bitwidth} columns", op=op, values={"b": str(op.b.type)},
            fix=f"use N of at least {2 * 128 // bitwidth}")
    return (widest, 8) if mgpu_utils.is_memref_transposed(ir.MemRefType(op.b.type)) else (8, widest)


def tcgen05_mma(op: mgpu.TcGen05MMAOp, b: ConstraintBuilder) -> None:
    collective = is_collective(op)
    check_tmem_operand(op, op.accumulator, "accumulator")
    accumulator = b.variable(b.operand(0))
    b.assign(accumulator, required_mma_layout(op, "accumulator", op.accumulator, collective, 1))

    rhs = b.variable(b.operand(2))
    b.require(OneOf(rhs, tuple(mma_smem_tilings(op.b.type, op))))
    if _shape(op.accumulator)[0] == 64 and not collective:
        b.require(Divides(rhs, _n_split_tiling(op)))

    lhs = b.variable(b.operand(1))
    if memory_space_of(op.a) is MemorySpace.SMEM:
        b.require(OneOf(lhs, tuple(mma_smem_tilings(op.a.type, op))))
    else:
        check_tmem_operand(op, op.a, "'a' operand")
        packing = 32 // _bitwidth(op.a)
        b.assign(lhs, required_mma_layout(op, "'a' operand", op.a, collective, packing))

    if op.a_sparse_metadata is not None:
        check_tmem_operand(op, op.a_sparse_metadata, "a_sparse_metadata")
        meta = b.variable(b.operand(_optional_positions(op)["a_sparse_metadata"]))
        b.assign(meta, fitting(op, "a_sparse_metadata", _shape(op.a_sparse_metadata),
                               tcgen05.sparse_meta_layout()))

    if _check_scales(op):
        m64_collective = collective and _shape(op.accumulator)[0] == 64
        for name, scale in (("a_scale", op.a_scale), ("b_scale", op.b_scale)):
            check_tmem_operand(op, scale, name)
            variable = b.variable(b.operand(_optional_positions(op)[name]))
            if name == "b_scale" and m64_collective:
                layout = tcgen05.b_scales_m64_collective_layout()
            else:
                layout = tcgen05.scales_layout()
            b.assign(variable, fitting(op, name, _shape(scale), layout))


def _swizzle(transforms: ir.Attribute) -> int:
    return mgpu.SwizzlingMode(smem_transforms_from_attribute(transforms).swizzle or 16)


def lower_tcgen05_mma(ctx: LoweringContext, op: mgpu.TcGen05MMAOp) -> list[ir.Value]:
    """One lane issues the MMA (per warpgroup, or per warp inside warp_map)."""
    check_collective(ctx, op)
    operands = list(op.operation.operands)
    tmem_positions = [i for i, v in enumerate(operands) if memory_space_of(v) is MemorySpace.TMEM]
    layout_at = dict(zip(tmem_positions, ctx.in_tmem_layouts(op)))

    positions = {"accumulator": 0, "'a' operand": 1, **_optional_positions(op)}

    def tmem(value: ir.Value, what: str) -> tcgen05.TMEMRef:
        check_tmem_operand(op, value, what)
        return tmem_ref_from_ir(op, value, layout_at[positions[what]], what)

    accumulator = tmem(op.accumulator, "accumulator")
    sparse_metadata = None
    if op.a_sparse_metadata is not None:
        sparse_metadata = tmem(op.a_sparse_metadata, "a_sparse_metadata")
    a_scale = b_scale = None
    if _check_scales(op):
        a_scale, b_scale = tmem(op.a_scale, "a_scale"), tmem(op.b_scale, "b_scale")
    if memory_space_of(op.a) is MemorySpace.SMEM:
        a_transforms, b_transforms = ctx.in_transforms(op)
        a_swizzle = _swizzle(a_transforms)
        a = unwrap_ref(op.a, a_transforms)
    else:
        a = tmem(op.a, "'a' operand")
        [b_transforms] = ctx.in_transforms(op)
        a_swizzle = None
    b_swizzle = _swizzle(b_transforms)
    rhs = unwrap_ref(op.b, b_transforms)
    with mgpu_utils.when(ctx.single_lane_predicate):
        tcgen05.mma(accumulator, a, rhs,
                    a_swizzle=b_swizzle if a_swizzle is None else a_swizzle,
                    b_swizzle=b_swizzle, a_scale=a_scale, b_scale=b_scale,
                    accumulate=op.accumulate, collective=is_collective(op),
                    a_sparse_metadata=sparse_metadata)
    return []


def lower_tcgen05_commit_arrive(ctx: LoweringContext,
                                op: mgpu.TcGen05CommitArriveOp) -> list[ir.Value]:
    """The barrier completes once the MMAs issued so far have (jax >= 0.12:
    one lane commits, where the op's own predicate also holds; the code
    generator guards the commit itself, after reading the barrier)."""
    check_collective(ctx, op)
    barrier = mgpu_utils.DialectBarrierRef.from_barrier_memref(op.barrier)
    predicate = ctx.single_lane_predicate
    if op.predicate is not None:
        predicate = arith.andi(predicate, op.predicate)
    tcgen05.commit_arrive(barrier.barrier_ref, is_collective(op), ctx.launch_context,
                          predicate=predicate)
    return []


def lower_tcgen05_commit_arrive_jax_0_11(ctx: LoweringContext,
                                         op: mgpu.TcGen05CommitArriveOp) -> list[ir.Value]:
    """jax 0.11: the op has no predicate; the whole commit, barrier read
    included, runs on one lane."""
    check_collective(ctx, op)
    barrier = mgpu_utils.DialectBarrierRef.from_barrier_memref(op.barrier)
    with mgpu_utils.when(ctx.single_lane_predicate):
        tcgen05.commit_arrive(barrier.barrier_ref, is_collective(op), ctx.launch_context)
    return []


def register_constraints(registry: ConstraintRegistry) -> None:
    registry.constraint_rule("mosaic_gpu.tcgen05_mma", archs=TCGEN05)(tcgen05_mma)


def register_lowerings(registry: LoweringRegistry) -> None:
    rule = registry.lowering_rule
    # MMAs and commits may also be issued by a single warp.
    rule("mosaic_gpu.tcgen05_mma", **TCGEN05_WARP_ISSUED)(lower_tcgen05_mma)
    since_0_12: LoweringOptions = {**TCGEN05_WARP_ISSUED, "jax": SINCE_0_12}
    before_0_12: LoweringOptions = {**TCGEN05_WARP_ISSUED, "jax": BEFORE_0_12}
    rule("mosaic_gpu.tcgen05_commit_arrive", **since_0_12)(lower_tcgen05_commit_arrive)
    rule("mosaic_gpu.tcgen05_commit_arrive", **before_0_12)(
        lower_tcgen05_commit_arrive_jax_0_11)
