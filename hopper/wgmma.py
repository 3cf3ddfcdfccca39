"""WGMMA: warpgroup matrix multiply-accumulate (sm_90a).

The accumulator lives in registers in the WGMMA layout; ``b`` (and ``a``
when it is not in registers) is read from SMEM, tiled ``(8, swizzle)`` — or
``(swizzle, 8)`` for a transposed ref — with a matching swizzle.
"""

from __future__ import annotations

from collections.abc import Sequence

from jax._src.lib import mosaic_gpu_dialect as mgpu
from jax._src.lib.mlir import ir

# The package re-exports these under the name of their module, which it shadows.
from jax.experimental.mosaic.gpu import WGMMAAccumulator
from jax.experimental.mosaic.gpu import fragmented_array as fa
from jax.experimental.mosaic.gpu import layouts as mgpu_layouts
from jax.experimental.mosaic.gpu import utils as mgpu_utils
from jax.experimental.mosaic.gpu import wgmma as wgmma_instruction

from smalti.caching import per_context
from smalti.constraints import Equal, OneOf, Transposed
from smalti.diagnostics import SmaltiValueError
from smalti.layouts import (
    MemorySpace,
    RegisterLayout,
    SmemTransforms,
    smem_transforms_from_attribute,
)
from smalti.plugins.transfers import unwrap_ref
from smalti.registry import Architectures, ConstraintRegistry, LoweringRegistry
from smalti.rules import ConstraintBuilder, LoweringContext, malformed_op
from smalti.sites import ValueSite, memory_space_of


def mma_smem_tilings(ref_type: ir.Type, op: ir.OpView, *, allow_unswizzled: bool = False
                     ) -> tuple[SmemTransforms, ...]:
    """The SMEM transforms an MMA operand ref of type ``ref_type`` may have:
    ``(8, swizzle-wide)`` tiles (transposed for a transposed ref), widest
    swizzle first."""
    return _mma_smem_operand(ref_type, op, allow_unswizzled)[0]


def _mma_smem_operand(ref_type: ir.Type, op: ir.OpView, allow_unswizzled: bool = False
                      ) -> tuple[tuple[SmemTransforms, ...], bool]:
    """:func:`mma_smem_tilings`, and whether the ref is transposed in memory."""
    allowed, tiling, transposed = _mma_operand(ref_type, allow_unswizzled)
    if not allowed:
        raise SmaltiValueError(
            "SM121",
            f"No valid tiling found for SMEM reference. {tuple(ir.MemRefType(ref_type).shape)} "
            f"not divisible by candidate tiling {tiling}",
            op=op, values={"ref": str(ref_type)},
            fix=f"make the operand's dims multiples of {tiling} (the narrowest MMA tile)")
    return allowed, transposed


@per_context  # kernels issue many MMAs on refs of a few types
def _mma_operand(ref_type: ir.Type, allow_unswizzled: bool = False
                 ) -> tuple[tuple[SmemTransforms, ...], tuple[int, ...], bool]:
    """The allowed transforms, the last tiling tried (for the error), and
    whether the ref is transposed in memory."""
    ref_type = ir.MemRefType(ref_type)
    shape = tuple(ref_type.shape)
    bitwidth = mgpu_utils.bitwidth(ref_type.element_type)
    transposed = mgpu_utils.is_memref_transposed(ref_type)
    allowed, tiling = [], ()
    for swizzle in (128, 64, 32, None) if allow_unswizzled else (128, 64, 32):
        width = (swizzle or 16) * 8 // bitwidth
        tiling = (width, 8) if transposed else (8, width)
        if all(s % t == 0 for s, t in zip(shape, tiling)):
            allowed.append(SmemTransforms(tiling, swizzle))
    return tuple(allowed), tiling, transposed


#: The layout of the accumulator (and of an 'a' operand in registers), by
#: whether 'a' has 8-bit elements: made once, not hashed again for each MMA.
_PINNED = {False: RegisterLayout.of(fa.WGMMA_LAYOUT), True: RegisterLayout.of(fa.WGMMA_LAYOUT_8BIT)}


def _pinned(b: ConstraintBuilder, op: ir.OpView, sites: Sequence[ValueSite], eight_bit: bool,
            what: str) -> None:
    var = b.variable(*sites)
    pinned = _PINNED[eight_bit]
    if not pinned.fits(var.shape):
        raise SmaltiValueError(
            "SM121", f"Cannot assign layout {pinned.layout} to the {what} of a wgmma op: the "
            f"layout is not compatible with the shape {var.shape}", op=op,
            fix="WGMMA operands in registers must have 64-row multiples of the WGMMA tile")
    b.assign(var, pinned)


def _require_smem(op: mgpu.WGMMAOp, value: ir.Value, what: str) -> None:
    """WGMMA reads its memory operands from shared memory, which is where
    they get transforms: another memory space is the kernel's error."""
    if memory_space_of(value) is not MemorySpace.SMEM:
        raise malformed_op(
            op, f"the {what} of mosaic_gpu.wgmma must be a ref in shared memory "
            f"(#gpu.address_space<workgroup>), not a {value.type}",
            fix=f"copy the {what} to SMEM (e.g. with TMA) and pass the SMEM ref",
            operand=str(value.type))


def wgmma(op: mgpu.WGMMAOp, b: ConstraintBuilder) -> None:
    _require_smem(op, op.b, "'b' operand")
    if not isinstance(op.a.type, ir.VectorType):
        _require_smem(op, op.a, "'a' operand")
    _pinned(b, op, (b.operand(0), b.result(0)), False, "accumulator")
    rhs_site = b.operand(2)
    rhs = b.variable(rhs_site)
    rhs_tilings, rhs_transposed = _mma_smem_operand(rhs_site.type, op)
    b.require(OneOf(rhs, rhs_tilings))
    lhs_site = b.operand(1)
    if isinstance(lhs_site.type, ir.VectorType):
        eight_bit = mgpu_utils.bitwidth(lhs_site.type.element_type) == 8
        _pinned(b, op, (lhs_site,), eight_bit, "'a' operand")
        return
    lhs = b.variable(lhs_site)
    # Tilings are stated on logical shapes: if exactly one operand is
    # transposed in memory, its tiling is the other's, transposed.
    transposed = _mma_operand(lhs_site.type, False)[2] != rhs_transposed
    b.require(Equal(lhs, Transposed(rhs, (1, 0)) if transposed else rhs))


def lower_wgmma(ctx: LoweringContext, op: mgpu.WGMMAOp) -> list[ir.Value]:
    wgmma_attr = mgpu_layouts.to_layout_attr(fa.WGMMA_LAYOUT)
    in_layouts = ctx.in_layouts(op)
    [out_layout] = ctx.out_layouts(op)
    if in_layouts[0] != wgmma_attr or out_layout != wgmma_attr:
        raise ctx.fail(op, "the wgmma accumulator must be in the WGMMA layout",
                       fix="re-run layout inference")
    element = ir.ShapedType(op.a.type).element_type
    # s8 WGMMA accumulates into signed integers.
    signed = True if isinstance(element, ir.IntegerType) else None
    accumulator = WGMMAAccumulator.from_registers(
        ctx.from_ir(op.accumulator, in_layouts[0], signed), sync=False)
    a_in_registers = isinstance(op.a.type, ir.VectorType)
    transforms = ctx.in_transforms(op)
    if a_in_registers:
        [b_transforms] = transforms
        b_ref = unwrap_ref(op.b, b_transforms)
    else:
        a_transforms, b_transforms = transforms
        a_ref = unwrap_ref(op.a, a_transforms)
        b_ref = unwrap_ref(op.b, b_transforms)
    b_swizzle = mgpu.SwizzlingMode(smem_transforms_from_attribute(b_transforms).swizzle or 16)
    if a_in_registers:
        a = ctx.from_ir(op.a, in_layouts[1], signed)
    else:
        a_swizzle = mgpu.SwizzlingMode(
            smem_transforms_from_attribute(a_transforms).swizzle or 16)
        if a_swizzle != b_swizzle:
            raise ctx.fail(op, f"Non-matching swizzles of operands a and b in WGMMA: "
                           f"{a_swizzle} != {b_swizzle}",
                           fix="give both SMEM operands the same swizzle")
        a = a_ref
    result = wgmma_instruction(accumulator, a, b_ref, swizzle=b_swizzle)
    return [ctx.to_ir(result.value.to_layout(fa.WGMMA_LAYOUT), op.accumulator.type)]


#: WGMMA exists on sm_90a only.
SM90_ONLY = Architectures(minimum=(9, 0), maximum=(9, 0))


def register_constraints(registry: ConstraintRegistry) -> None:
    registry.constraint_rule("mosaic_gpu.wgmma", archs=SM90_ONLY)(wgmma)


def register_lowerings(registry: LoweringRegistry) -> None:
    registry.lowering_rule("mosaic_gpu.wgmma", archs=SM90_ONLY)(lower_wgmma)
