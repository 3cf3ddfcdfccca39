"""The remaining generic Mosaic GPU ops.

- ``custom_primitive`` / ``return``: the user's Lane-level escape hatch. The
  op declares the layouts of its vectors and the transforms of its SMEM refs
  itself; its body is already Lane-level code, which smalti neither infers
  nor lowers: lowering inlines it.
- ``warp_map``: a body run once per warp. Its ops are lowered under warp
  semantics (``ctx.thread_semantics`` is WARP), which only some rules support.
- barriers: ``initialize_barrier``, ``arrive``, ``wait``;
- hints and debugging: ``assume_multiple``, ``debug_print``, ``print_layout``;
- ``multimem_load_reduce``: a load from a multicast ref, reduced across devices;
- ``mma``: the Ampere-style synchronous warp-level MMA, in the layouts of
  ``jax.experimental.mosaic.gpu.mma.MMALayouts``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import NoReturn

from jax._src.lib import mosaic_gpu_dialect as mgpu
from jax._src.lib.mlir import ir
from jax._src.lib.mlir.dialects import arith, llvm
from jax.experimental.mosaic.gpu import fragmented_array as fa
from jax.experimental.mosaic.gpu import launch_context as lc
from jax.experimental.mosaic.gpu import layouts as mgpu_layouts
from jax.experimental.mosaic.gpu import tcgen05
from jax.experimental.mosaic.gpu import utils as mgpu_utils
# The package exports a function named `mma` that shadows the module.
from jax.experimental.mosaic.gpu.mma import MMALayouts
from jax.experimental.mosaic.gpu.mma import mma as warp_level_mma

from smalti.constraints import Excludes
from smalti.diagnostics import SmaltiNotImplementedError, SmaltiValueError
from smalti.layouts import (
    MemorySpace,
    RegisterLayout,
    SmemTransforms,
    describe_register_layout,
    register_layout_fits,
    smem_transforms_fit,
    smem_transforms_from_attribute,
)
from smalti.plugins.versions import BEFORE_0_12
from smalti.registry import ConstraintRegistry, LoweringRegistry
from smalti.rules import ConstraintBuilder, LoweringContext, malformed_op
from smalti.sites import memory_space_of

WARP = mgpu_utils.ThreadSubset.WARP


# --- constraint rules ------------------------------------------------------------


def printed_value(op: ir.OpView, b: ConstraintBuilder) -> None:
    """``debug_print`` / ``print_layout`` take whatever layout their operand has."""
    b.variable(b.operand(0))


def multimem_load_reduce(op: mgpu.MultimemLoadReduceOp, b: ConstraintBuilder) -> None:
    """A reduced load is never uniform."""
    b.require(Excludes(b.variable(b.result(0)), fa.WGSplatFragLayout))


def _mma_layouts(op: mgpu.MMAOp) -> MMALayouts:
    shapes = {what: list(ir.ShapedType(v.type).shape)
              for what, v in (("accumulator", op.accumulator), ("a", op.a), ("b", op.b))}
    if any(len(shape) != 2 for shape in shapes.values()):
        raise malformed_op(op, "the accumulator, a and b of mosaic_gpu.mma must be 2-D "
                           "vectors", fix="pass (M, N), (M, K) and (K, N) vectors", **shapes)
    m, n = shapes["accumulator"]
    try:
        return MMALayouts.for_shape(ir.VectorType(op.a.type).element_type, m, n)
    except ValueError as e:
        raise SmaltiValueError(
            "SM102", f"mosaic_gpu.mma has no MMA layouts for an accumulator of shape "
            f"{(m, n)}: {e}", op=op, values={"accumulator": str(op.accumulator.type)},
            fix="use an accumulator whose M is a multiple of 16 and N a multiple of 8 "
            "(e.g. 64x32)") from None


def _pin(b: ConstraintBuilder, op: ir.OpView, what: str, layout: fa.FragmentedLayout,
         value: ir.Value, *sites) -> None:
    """Gives ``sites`` one variable, fixed to ``layout``, which must fit ``value``."""
    shape = tuple(ir.VectorType(value.type).shape)
    if not register_layout_fits(shape, layout):
        raise SmaltiValueError(
            "SM102", f"Cannot assign layout {describe_register_layout(layout)} to {what} "
            f"of {op.operation.name}: the layout is not compatible with its shape {shape}",
            op=op, values={"layout": str(layout), "shape": shape},
            fix=f"give {what} a shape the layout tiles evenly")
    b.assign(b.variable(*sites), RegisterLayout.of(layout))


def mma(op: mgpu.MMAOp, b: ConstraintBuilder) -> None:
    """Accumulator (in and out), A and B are in the MMA layouts for the shape."""
    layouts = _mma_layouts(op)
    _pin(b, op, "the accumulator", layouts.acc, op.accumulator, b.operand(0), b.result(0))
    _pin(b, op, "the 'a' operand", layouts.lhs, op.a, b.operand(1))
    _pin(b, op, "the 'b' operand", layouts.rhs, op.b, b.operand(2))


def _declared(op: ir.OpView, name: str, needed: int, what: str) -> Iterator[ir.Attribute]:
    """The op's own ``name`` attribute entries; at least ``needed`` of them."""
    entries = list(ir.ArrayAttr(op.operation.attributes[name]))
    if len(entries) < needed:
        raise SmaltiValueError(
            "SM107", f"mosaic_gpu.custom_primitive declares {len(entries)} {name} for "
            f"{needed} {what}", op=op, values={name: str(op.operation.attributes[name])},
            fix=f"give {name} one entry per {what.rstrip('s')}, in operand order")
    return iter(entries)


def _declared_transforms(op: ir.OpView, attr: ir.Attribute) -> SmemTransforms:
    """A custom primitive's transforms for one SMEM ref: a tiling, then a swizzle."""
    try:
        decoded = [mgpu_layouts.from_transform_attr(t) for t in ir.ArrayAttr(attr)]
    except NotImplementedError as e:  # jax's decoder: "Unsupported transform ..."
        raise SmaltiNotImplementedError(
            "SM107", f"{e} on a mosaic_gpu.custom_primitive SMEM operand", op=op,
            values={"in_transforms entry": str(attr)},
            fix="declare at most a tiling followed by a swizzle for each SMEM ref") from None
    kinds = [type(t) for t in decoded]
    if kinds not in ([], [lc.TileTransform], [mgpu.SwizzlingMode],
                     [lc.TileTransform, mgpu.SwizzlingMode]):
        raise SmaltiNotImplementedError(
            "SM107", f"Unsupported transforms {decoded} on a mosaic_gpu.custom_primitive "
            "SMEM operand", op=op, values={"in_transforms entry": str(attr)},
            fix="declare at most a tiling followed by a swizzle for each SMEM ref")
    return smem_transforms_from_attribute(attr)


def _check_transforms_fit(op: ir.OpView, ref: ir.Value, transforms: SmemTransforms) -> None:
    if not smem_transforms_fit(ir.MemRefType(ref.type), transforms):
        raise SmaltiValueError(
            "SM102", f"the declared {transforms} do not fit the SMEM ref {ref.type}",
            op=op, fix="declare transforms whose tiling divides the ref's shape, "
            "and whose swizzle fits its minor dimension")


def _reject_tmem(op: ir.OpView, value: ir.Value, kind: str) -> NoReturn:
    raise SmaltiNotImplementedError(
        "SM107", f"mosaic_gpu.custom_primitive cannot take a TMEM ref {kind} ({value.type})",
        op=op, fix="pass the TMEM ref's contents as a vector, or do the TMEM access "
        "outside the custom primitive")


def custom_primitive(op: mgpu.CustomPrimitiveOp, b: ConstraintBuilder) -> None:
    """Every vector and SMEM ref has the layout the op declares; the body is
    Lane-level code that inference does not enter."""
    b.opaque_regions()
    operands = list(op.operation.operands)
    spaces = [memory_space_of(v) for v in operands]
    in_layouts = _declared(op, "in_layouts", spaces.count(MemorySpace.REG), "vector operands")
    in_transforms = _declared(op, "in_transforms", spaces.count(MemorySpace.SMEM),
                              "SMEM ref operands")
    for i, (operand, space) in enumerate(zip(operands, spaces)):
        if space is MemorySpace.REG:
            layout = mgpu_layouts.from_layout_attr(next(in_layouts))
            _pin(b, op, f"operand #{i}", layout, operand, b.operand(i))
        elif space is MemorySpace.SMEM:
            transforms = _declared_transforms(op, next(in_transforms))
            _check_transforms_fit(op, operand, transforms)
            b.assign(b.variable(b.operand(i)), transforms)
        elif space is MemorySpace.TMEM:
            _reject_tmem(op, operand, "operand")
    results = list(op.operation.results)
    result_spaces = [memory_space_of(r) for r in results]
    out_layouts = _declared(op, "out_layouts", result_spaces.count(MemorySpace.REG),
                            "vector results")
    for i, (result, space) in enumerate(zip(results, result_spaces)):
        if space is MemorySpace.REG:
            layout = mgpu_layouts.from_layout_attr(next(out_layouts))
            _pin(b, op, f"result #{i}", layout, result, b.result(i))
        elif space is not None:
            raise SmaltiNotImplementedError(
                "SM107", "mosaic_gpu.custom_primitive can only return vectors and scalars, "
                f"not a ref ({result.type})", op=op,
                fix="allocate the ref outside the custom primitive and pass it in")


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
    registry.constraint_rule("mosaic_gpu.debug_print", "mosaic_gpu.print_layout")(printed_value)
    registry.constraint_rule("mosaic_gpu.multimem_load_reduce")(multimem_load_reduce)
    registry.constraint_rule("mosaic_gpu.mma")(mma)
    registry.constraint_rule("mosaic_gpu.custom_primitive", opaque_regions=True)(
        custom_primitive)
    registry.constraint_rule("mosaic_gpu.warp_map")(warp_map)


# --- lowering rules: barriers and hints -------------------------------------------


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


def lower_assume_multiple(ctx: LoweringContext, op: mgpu.AssumeMultipleOp) -> list[ir.Value]:
    """Only a hint for the passes that run before lowering: the value itself."""
    return [op.value]


# --- lowering rules: printing --------------------------------------------------------

_PRINTED_NAMES = (
    (fa.WGMMA_LAYOUT, "WGMMA"),
    (fa.WGMMA_ROW_LAYOUT, "WGMMA_ROW"),
    (fa.WGMMA_TRANSPOSED_LAYOUT, "WGMMA_TRANSPOSED"),
    (fa.TCGEN05_LAYOUT, "TCGEN05"),
    (fa.TCGEN05_TRANSPOSED_LAYOUT, "TCGEN05_TRANSPOSED"),
    (fa.TMEM_NATIVE_LAYOUT, "TCGEN05_TMEM_NATIVE"),
)


def register_layout_text(layout: fa.FragmentedLayout) -> str:
    """How ``print_layout`` names a register layout (jax's spelling)."""
    for known, name in _PRINTED_NAMES:
        if layout == known:
            return name
    return str(layout)


def smem_transforms_text(transforms: SmemTransforms) -> str:
    """How ``print_layout`` spells SMEM transforms (jax's spelling)."""
    parts = []
    if transforms.tiling is not None:
        parts.append(f"TilingTransform(tiling={tuple(transforms.tiling)})")
    if transforms.swizzle is not None:
        parts.append(f"SwizzleTransform(swizzle={transforms.swizzle})")
    return "(" + ", ".join(parts) + ")"


def tmem_layout_text(attr: ir.Attribute) -> str:
    tiled = mgpu_layouts.from_layout_attr(attr)
    layout = tcgen05.TMEMLayout(tiled.tiling, tiled.warp_dims, tiled.lane_dims,
                                tiled.vector_dim)
    if layout == tcgen05.tmem_default_layout(packing=layout.vector_length):
        return f"TMEM_DEFAULT(packing={layout.vector_length})"
    return str(layout)


def lower_debug_print(ctx: LoweringContext, op: mgpu.DebugPrintOp) -> list[ir.Value]:
    """Prints the vector at run time, one line per register."""
    [layout] = ctx.in_layouts(op)
    ctx.from_ir(op.value, layout).debug_print(op.format.value)
    return []


def lower_print_layout(ctx: LoweringContext, op: mgpu.PrintLayoutOp) -> list[ir.Value]:
    """Prints, at compile time, the layout inference chose for the operand."""
    space = memory_space_of(op.value)
    if space is MemorySpace.REG:
        [layout] = ctx.in_layouts(op)
        text = register_layout_text(ctx.from_ir(op.value, layout).layout)
    elif space is MemorySpace.SMEM:
        [transforms] = ctx.in_transforms(op)
        text = smem_transforms_text(smem_transforms_from_attribute(transforms))
    elif space is MemorySpace.TMEM:
        [layout] = ctx.in_tmem_layouts(op)
        text = tmem_layout_text(layout)
    else:
        raise ctx.fail(op, f"mosaic_gpu.print_layout cannot print the layout of a "
                       f"{op.value.type}: it has none",
                       fix="print the layout of a vector, an SMEM ref or a TMEM ref")
    print(op.format.value.format(text))
    return []


# --- lowering rules: loads and MMA -------------------------------------------------


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


def lower_mma(ctx: LoweringContext, op: mgpu.MMAOp) -> list[ir.Value]:
    """``acc + a @ b`` with warp-level ``mma.sync`` instructions."""
    acc_layout, a_layout, b_layout = ctx.in_layouts(op)
    [out_layout] = ctx.out_layouts(op)
    m, n = ir.VectorType(op.accumulator.type).shape
    element_type = ir.VectorType(op.a.type).element_type
    expected = mgpu_layouts.to_layout_attr(
        MMALayouts.for_shape(element_type, m, n).acc)
    if acc_layout != expected or out_layout != expected:
        raise ctx.fail(op, "the accumulator of mosaic_gpu.mma must be in the MMA "
                       "accumulator layout for its shape", expected=str(expected),
                       fix="let layout inference choose the accumulator's layout")
    # Integer MMAs multiply signed operands into a signed accumulator.
    signed = True if isinstance(element_type, ir.IntegerType) else None
    acc = ctx.from_ir(op.accumulator, acc_layout, signed)
    a = ctx.from_ir(op.a, a_layout, signed)
    b = ctx.from_ir(op.b, b_layout, signed)
    return [ctx.to_ir(warp_level_mma(acc, a, b), op.result.type)]


# --- lowering rules: regions ----------------------------------------------------------


def _entry_block(op: ir.OpView) -> ir.Block:
    return op.operation.regions[0].blocks[0]


def _bind_arguments(block: ir.Block, values: Sequence[ir.Value]) -> None:
    for argument, value in zip(block.arguments, values, strict=True):
        argument.replace_all_uses_with(value)


def lower_custom_primitive(ctx: LoweringContext,
                           op: mgpu.CustomPrimitiveOp) -> list[ir.Value]:
    """Inlines the Lane-level body in place of the op; what its
    ``mosaic_gpu.return`` returns replaces the op's results."""
    body = _entry_block(op)
    terminators = [o for o in body.operations if o.operation.name == "mosaic_gpu.return"]
    if len(terminators) != 1:
        raise ctx.fail(op, "the body of a mosaic_gpu.custom_primitive must end with one "
                       "mosaic_gpu.return", fix="terminate the body with mosaic_gpu.return")
    [terminator] = terminators
    _bind_arguments(body, list(op.operation.operands))
    here = ir.InsertionPoint.current
    for inner in list(body.operations):
        if inner.operation != terminator.operation:
            inner.detach_from_parent()
            here.insert(inner)
    return list(terminator.operation.operands)


def lower_warp_map(ctx: LoweringContext, op: mgpu.WarpMapOp) -> list[ir.Value]:
    """Lowers the body in place of the op, under warp semantics."""
    body = _entry_block(op)
    _bind_arguments(body, list(op.operation.operands))
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


def lower_return(ctx: LoweringContext, op: mgpu.ReturnOp) -> list[ir.Value]:
    """Only reached if something lowers a custom primitive's body op by op."""
    raise ctx.fail(op, "mosaic_gpu.return is lowered with its mosaic_gpu.custom_primitive, "
                   "never on its own",
                   fix="lower the enclosing mosaic_gpu.custom_primitive as a whole")


def register_lowerings(registry: LoweringRegistry) -> None:
    registry.lowering_rule("mosaic_gpu.initialize_barrier")(lower_initialize_barrier)
    registry.lowering_rule("mosaic_gpu.arrive", warp_semantics=True)(lower_arrive)
    # jax 0.12 removed mosaic_gpu.wait from the dialect (waits are Lane-level).
    registry.lowering_rule("mosaic_gpu.wait", jax=BEFORE_0_12)(lower_wait)
    # Like jax, not under warp semantics (jax refuses it there, smalti too).
    registry.lowering_rule("mosaic_gpu.assume_multiple")(lower_assume_multiple)
    registry.lowering_rule("mosaic_gpu.debug_print")(lower_debug_print)
    registry.lowering_rule("mosaic_gpu.print_layout")(lower_print_layout)
    registry.lowering_rule("mosaic_gpu.multimem_load_reduce")(lower_multimem_load_reduce)
    registry.lowering_rule("mosaic_gpu.mma")(lower_mma)
    registry.lowering_rule("mosaic_gpu.custom_primitive", opaque_regions=True,
                           warp_semantics=True)(lower_custom_primitive)
    registry.lowering_rule("mosaic_gpu.warp_map", warp_regions=True)(lower_warp_map)
    registry.lowering_rule("mosaic_gpu.return")(lower_return)
