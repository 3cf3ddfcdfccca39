"""Ops that change the shape of vectors: broadcasts, shape casts, slices,
concatenation and reductions (``vector.*``, ``mosaic_gpu.broadcast_in_dim``,
``mosaic_gpu.vector_concat``).

Their layouts are linked through derived expressions: a reduction's result
has the :class:`~smalti.constraints.Reduced` layout of its source, a
broadcast's source the reduced layout of its result, a shape cast's result
the :class:`~smalti.constraints.Reshaped` layout of its source.

Beyond jax, these rules also handle vectors of rank > 2 whose leading dims
are not tiled (reductions and broadcasts over them), reductions that keep
the reduced dim as a size-1 dim (``jnp.mean(x, axis=-1, keepdims=True)``),
shape casts that add or drop size-1 dims, shape casts that flatten a tiled
layout to rank 1 (``jnp.sum(x)``, ``jnp.argmax(x)``; see flatten.py), splat
sources of reductions and ``vector.broadcast`` of a vector.
"""

from __future__ import annotations

import functools
import math
import operator
from collections.abc import Callable, Sequence

import numpy as np
from jax._src.lib import mosaic_gpu_dialect as mgpu
from jax._src.lib.mlir import ir
from jax._src.lib.mlir.dialects import arith, gpu, memref, vector
from jax.experimental.mosaic.gpu import fragmented_array as fa
from jax.experimental.mosaic.gpu import layouts as mgpu_layouts
from jax.experimental.mosaic.gpu import utils as mgpu_utils

from smalti import layouts
from smalti.caching import per_context
from smalti.constraints import (
    Divides,
    Equal,
    Excludes,
    Reduced,
    Reshaped,
    SupportedBroadcast,
    Variable,
)
from smalti.diagnostics import SmaltiNotImplementedError, SmaltiValueError
from smalti.layouts import RegisterLayout
from smalti.plugins.flatten import Flattened, FlattenedFrom, flatten_registers, flatten_tiled
from smalti.plugins.versions import BEFORE_0_12, SINCE_0_12
from smalti.registry import ConstraintRegistry, LoweringRegistry
from smalti.rules import ConstraintBuilder, LoweringContext, default_is_signed, malformed_op

Array = fa.FragmentedArray


def _shape(value: ir.Value) -> tuple[int, ...]:
    return tuple(ir.ShapedType(value.type).shape)


@per_context  # kernels repeat the same few dims, offsets and strides
def _ints(attr: ir.Attribute) -> tuple[int, ...]:
    """The values of an ``ArrayAttr`` of integers or of a dense i64 array."""
    return tuple(ir.IntegerAttr(a).value for a in attr) if isinstance(attr, ir.ArrayAttr) \
        else tuple(attr)


def _unsupported(op: ir.OpView, message: str, fix: str | Sequence[str],
                 **values: object) -> SmaltiNotImplementedError:
    return SmaltiNotImplementedError("SM130", message, op=op, values=values, fix=fix)


def _check_unit_strides(op: ir.OpView) -> None:
    strides = _ints(op.strides)
    if any(s != 1 for s in strides):
        raise _unsupported(op, "`strides` must contain only 1s.",
                           fix="slice with unit strides (take every element of the range), "
                               "then select elements with arithmetic or a store to SMEM",
                           strides=strides)


def _sliceable(b: ConstraintBuilder, var) -> None:
    # Slicing moves whole registers: only tiled layouts can be sliced.
    b.require(Excludes(var, fa.WGSplatFragLayout), Excludes(var, fa.WGStridedFragLayout))


# --- constraint rules -----------------------------------------------------------------


def broadcast(op: vector.BroadcastOp, b: ConstraintBuilder) -> None:
    """A scalar broadcast is splat; a vector broadcast is a ``broadcast_in_dim``
    to the trailing dims (beyond jax, which only broadcasts scalars)."""
    if isinstance(op.source.type, ir.VectorType):
        src, dst = b.variable(b.operand(0)), b.variable(b.result(0))
        _broadcast_in_dim(b, src, dst, _trailing_dims(op))
        return
    result = b.variable(b.result(0))
    b.assign(result, RegisterLayout.splat(result.shape))


def _trailing_dims(op: vector.BroadcastOp) -> tuple[int, ...]:
    source, result = _shape(op.source), _shape(op.result)
    return tuple(range(len(result) - len(source), len(result)))


def broadcast_in_dim(op: mgpu.BroadcastInDimOp, b: ConstraintBuilder) -> None:
    """The source is the result reduced along the broadcast dims."""
    dims = _ints(op.broadcast_dimensions)
    src, dst = b.variable(b.operand(0)), b.variable(b.result(0))
    _check_broadcast(op, src.shape, dst.shape, dims)
    _broadcast_in_dim(b, src, dst, dims)


def _check_broadcast(op: ir.OpView, source: tuple[int, ...], result: tuple[int, ...],
                     dims: tuple[int, ...]) -> None:
    if not _broadcastable(source, result, dims):
        raise SmaltiValueError(
            "SM130", f"cannot broadcast a vector of shape {source} to {result} along "
            f"dims {dims}", op=op, values={"broadcast_dimensions": dims},
            fix="give one increasing result dim per source dim, where the source dim "
                "has size 1 or the size of the result dim")


@functools.lru_cache(maxsize=256)
def _broadcastable(source: tuple[int, ...], result: tuple[int, ...], dims: tuple[int, ...]
                   ) -> bool:
    return (len(dims) == len(source) and list(dims) == sorted(set(dims))
            and all(0 <= d < len(result) for d in dims)
            and all(s in (1, result[d]) for s, d in zip(source, dims)))


def _broadcast_in_dim(b: ConstraintBuilder, src: Variable, dst: Variable,
                      dims: tuple[int, ...]) -> None:
    kept, dropped = _broadcast_reductions(src.shape, dst.shape, dims)
    if not kept and not dropped:  # beyond jax: an identity broadcast
        b.require(Equal(src, dst))
        return
    expr = dst
    if kept:
        expr = Reduced(expr, kept, len(dst.shape), keep_dims=True)
    if dropped:
        expr = Reduced(expr, dropped, len(dst.shape))
    b.require(Equal(src, expr), SupportedBroadcast(src, dst, dims))


@functools.lru_cache(maxsize=256)
def _broadcast_reductions(source: tuple[int, ...], result: tuple[int, ...],
                          dims: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The result dims to reduce keeping them, then to reduce away, to get
    the source of a broadcast back."""
    mapped = dict(zip(dims, source))
    # Dims the source has with size 1 are reduced keeping them; new dims are
    # reduced away. Keeping dims first leaves the indices of the others valid.
    kept = tuple(d for d in range(len(result)) if mapped.get(d) == 1 and result[d] > 1)
    dropped = tuple(d for d in range(len(result)) if d not in mapped)
    return kept, dropped


def vector_reduction(op: vector.ReductionOp, b: ConstraintBuilder) -> None:
    """A reduction to a scalar accepts any layout."""
    b.variable(b.operand(0))


def multi_reduction(op: vector.MultiDimReductionOp, b: ConstraintBuilder) -> None:
    """The result (and the accumulator) has the source's layout, reduced."""
    _check_reduction(op)
    source = b.variable(b.operand(0))
    result = b.variable(b.operand(1), b.result(0))
    rank = len(source.shape)
    b.require(
        Excludes(source, fa.WGStridedFragLayout),
        Equal(result, Reduced(source, _sorted_ints(op.reduction_dims), rank)),
    )


def _check_reduction(op: vector.MultiDimReductionOp) -> None:
    """A reduction to a vector along some of the source's dims (the verifier
    allows reducing every dim to a scalar, or none)."""
    rank = len(_shape(op.source))
    dims = _ints(op.reduction_dims)
    if not isinstance(op.result.type, ir.VectorType):
        raise _unsupported(op, "vector.multi_reduction to a scalar is not supported",
                           fix="reduce the whole vector with vector.reduction",
                           reduction_dims=dims, result=str(op.result.type))
    if not dims:
        raise _unsupported(op, "vector.multi_reduction with no reduction dims is not "
                           "supported: it reduces nothing",
                           fix="use the source itself (combined with the accumulator)")
    if len(set(dims)) != len(dims) or not all(0 <= d < rank for d in dims):
        raise malformed_op(op, f"reduction dims {dims} are not distinct dims of the "
                           f"rank-{rank} source", reduction_dims=dims,
                           fix=f"reduce along distinct dims in [0, {rank})")


@per_context
def _sorted_ints(attr: ir.Attribute) -> tuple[int, ...]:
    return tuple(sorted(_ints(attr)))


def vector_concat(op: mgpu.VectorConcatOp, b: ConstraintBuilder) -> None:
    """Every operand has the result's (tiled) layout."""
    result = b.variable(b.result(0))
    _sliceable(b, result)
    for i in range(len(op.operation.operands)):
        b.require(Equal(b.variable(b.operand(i)), result))


def shape_cast(op: vector.ShapeCastOp, b: ConstraintBuilder) -> None:
    """Source and result layouts are each other's reshapes."""
    source_shape, result_shape = _shape(op.source), _shape(op.result)
    source, result = b.variable(b.operand(0)), b.variable(b.result(0))
    if len(result_shape) == 1 and len(source_shape) > 1:
        # Beyond jax: a tiled source flattens too (flatten.py), one way.
        b.require(Equal(result, Flattened(source, source_shape, result_shape)),
                  FlattenedFrom(source, result, source_shape, result_shape))
        return
    # Stated both ways, so that either side determines the other.
    b.require(Equal(result, Reshaped(source, source_shape, result_shape)),
              Equal(source, Reshaped(result, result_shape, source_shape)))


def extract_strided_slice(op: vector.ExtractStridedSliceOp, b: ConstraintBuilder) -> None:
    """A tiled slice keeps the source's layout; offsets must fall on tiles."""
    _check_unit_strides(op)
    source, result = b.variable(b.operand(0)), b.variable(b.result(0))
    b.require(Divides(source, _ints(op.offsets)), Equal(source, result))
    _sliceable(b, result)


def extract(op: vector.ExtractOp, b: ConstraintBuilder) -> None:
    """A scalar is read from a splat vector; a sub-vector from a tiled one."""
    source = b.variable(b.operand(0))
    if not isinstance(op.result.type, ir.VectorType):
        b.assign(source, RegisterLayout.splat(source.shape))
        return
    if len(op.dynamic_position):
        raise _unsupported(op, "Only slicing with static indices allowed.",
                           fix="index with constants, or store the vector to SMEM and "
                               "load the part at a dynamic index")
    result = b.variable(b.result(0))
    b.require(Equal(source, result), Divides(source, _shape(op.source)),
              Divides(result, _shape(op.result)))
    _sliceable(b, result)


def insert_strided_slice(op: vector.InsertStridedSliceOp, b: ConstraintBuilder) -> None:
    """The slice, the destination and the result share one tiled layout."""
    _check_unit_strides(op)
    src, dst, result = b.variable(b.operand(0)), b.variable(b.operand(1)), b.variable(b.result(0))
    b.require(Divides(dst, _ints(op.offsets)), Equal(dst, src), Equal(dst, result),
              Equal(src, result))
    _sliceable(b, dst)


def register_constraints(registry: ConstraintRegistry) -> None:
    registry.constraint_rule("vector.broadcast")(broadcast)
    registry.constraint_rule("mosaic_gpu.broadcast_in_dim")(broadcast_in_dim)
    registry.constraint_rule("vector.reduction")(vector_reduction)
    registry.constraint_rule("vector.multi_reduction")(multi_reduction)
    registry.constraint_rule("mosaic_gpu.vector_concat")(vector_concat)
    registry.constraint_rule("vector.shape_cast")(shape_cast)
    registry.constraint_rule("vector.extract_strided_slice")(extract_strided_slice)
    registry.constraint_rule("vector.extract")(extract)
    registry.constraint_rule("vector.insert_strided_slice")(insert_strided_slice)


# --- lowering: helpers ----------------------------------------------------------------


def _layout(attr: ir.Attribute) -> fa.FragmentedLayout:
    return mgpu_layouts.from_layout_attr(attr)


def _one_layout(ctx: LoweringContext, op: ir.OpView) -> ir.Attribute:
    """The layout an op's operands and result must share (a slice keeps its layout)."""
    [out_layout] = ctx.out_layouts(op)
    if any(layout != out_layout for layout in ctx.in_layouts(op)):
        raise ctx.fail(op, "a slice must have the layout of the vector it slices",
                       in_layouts=str(ctx.in_layouts(op)), out_layouts=str(out_layout),
                       fix="give the operands and the result one tiled layout "
                           "(re-run infer_layouts)")
    return out_layout


def _with_registers(array: Array, registers: np.ndarray,
                    layout: fa.FragmentedLayout) -> Array:
    return Array(_registers=registers, _layout=layout, _is_signed=array.is_signed)


def _smem_scratch(ctx: LoweringContext, op: ir.OpView, element_type: ir.Type,
                  elements: int) -> ir.Value:
    """The op's scratch: ``elements`` values at byte ``offset`` of dynamic SMEM."""
    if "offset" not in op.operation.attributes:
        raise ctx.fail(op, "a reduction across warps needs SMEM scratch, but the op has no "
                       "`offset` attribute",
                       fix="set `offset` (and `scratch_size`, in bytes) to a free region of "
                           "the kernel's dynamic SMEM, as Pallas does")
    offset = ir.IntegerAttr(op.operation.attributes["offset"]).value
    ty = ir.MemRefType.get([elements], element_type, memory_space=mgpu_utils.smem())
    size = elements * mgpu_utils.bitwidth(element_type) // 8
    if offset + size > ctx.smem_requested_bytes:
        raise ctx.fail(op, "Ran out of shared memory.", offset=offset, bytes=size,
                       smem_requested_bytes=ctx.smem_requested_bytes,
                       fix="request more dynamic SMEM for the kernel or lower the offset")
    base = gpu.dynamic_shared_memory(
        ir.MemRefType.get((mgpu_utils.DYNAMIC,), ir.IntegerType.get_signless(8),
                          memory_space=mgpu_utils.smem()))
    return memref.view(ty, base, arith.constant(ir.IndexType.get(), offset), [])


# --- lowering: broadcasts and shape casts -----------------------------------------------


def lower_broadcast(ctx: LoweringContext, op: vector.BroadcastOp) -> list[ir.Value]:
    if isinstance(op.source.type, ir.VectorType):
        return [_lower_broadcast_in_dim(ctx, op, op.source, _trailing_dims(op))]
    ty = ir.VectorType(op.result.type)
    [layout] = ctx.out_layouts(op)
    array = Array.splat(op.source, tuple(ty.shape), _layout(layout),
                        is_signed=default_is_signed(ty.element_type))
    return [ctx.to_ir(array, ty)]


def lower_broadcast_in_dim(ctx: LoweringContext, op: mgpu.BroadcastInDimOp) -> list[ir.Value]:
    return [_lower_broadcast_in_dim(ctx, op, op.operand, _ints(op.broadcast_dimensions))]


def _lower_broadcast_in_dim(ctx: LoweringContext, op: ir.OpView, operand: ir.Value,
                            dims: tuple[int, ...]) -> ir.Value:
    ty = ir.VectorType(op.result.type)
    shape = tuple(ty.shape)
    [in_layout] = ctx.in_layouts(op)
    [out_layout] = ctx.out_layouts(op)
    source = ctx.from_ir(operand, in_layout)
    target = _layout(out_layout)
    if _needs_own_broadcast(source, shape, dims, target):
        return ctx.to_ir(_broadcast_tiled(ctx, op, source, shape, dims, target), ty)
    return ctx.to_ir(source.broadcast_in_dim(shape, dims, target), ty)


def _needs_own_broadcast(source: Array, shape: tuple[int, ...], dims: tuple[int, ...],
                         target: fa.FragmentedLayout) -> bool:
    """Whether the broadcast is one Mosaic GPU's ``broadcast_in_dim`` lacks:
    tiled, with untiled leading dims or size-1 source dims in the tiling."""
    if not (isinstance(source.layout, fa.TiledLayout) and isinstance(target, fa.TiledLayout)):
        return False
    if len(target.base_tile_shape) != len(shape):
        return True
    return any(s == 1 and shape[d] > 1 for s, d in zip(source.shape, dims))


def _broadcast_tiled(ctx: LoweringContext, op: ir.OpView, source: Array,
                     shape: tuple[int, ...], dims: tuple[int, ...],
                     target: fa.TiledLayout) -> Array:
    """A tiled broadcast, leading (untiled) dims by repeating registers, the
    tiled part with Mosaic GPU's ``broadcast_in_dim``."""
    lead = len(shape) - len(target.base_tile_shape)
    source_lead = sum(1 for d in dims if d < lead)
    if len(source.shape) - len(source.layout.base_tile_shape) != source_lead:
        raise ctx.fail(op, "the source's untiled dims must be the ones broadcast into the "
                       "result's untiled dims", source_shape=source.shape,
                       fix="let layout inference choose the layouts")
    tiled_shape = shape[lead:]
    tiled_dims = tuple(d - lead for d in dims[source_lead:])
    parts = [
        _broadcast_tile(_with_registers(source, source.registers[index], source.layout),
                        tiled_shape, tiled_dims, target).registers
        for index in np.ndindex(source.shape[:source_lead])
    ]
    tile_registers = target.registers_shape(tiled_shape)
    registers = np.empty((len(parts), *tile_registers), dtype=object)
    for i, part in enumerate(parts):
        registers[i] = part
    registers = registers.reshape(*source.shape[:source_lead], *tile_registers)
    # Put the source's leading dims where they go and repeat along the rest.
    placed = [1] * lead
    for i, d in enumerate(dims[:source_lead]):
        placed[d] = source.shape[i]
    registers = registers.reshape(*placed, *tile_registers)
    registers = np.broadcast_to(registers, (*shape[:lead], *tile_registers))
    return _with_registers(source, registers, target)


def _broadcast_tile(part: Array, shape: tuple[int, ...], dims: tuple[int, ...],
                    target: fa.TiledLayout) -> Array:
    """Broadcasts ``part`` (tiled in all its dims) to ``shape``, whose rank is the tiling's."""
    squeezed = tuple(i for i, d in enumerate(dims) if part.shape[i] == 1 and shape[d] > 1)
    if squeezed:
        # Size-1 dims in the tiling hold no registers of their own: drop them.
        layout = layouts.remove_unit_dims(part.layout, squeezed)
        new_shape = tuple(s for i, s in enumerate(part.shape) if i not in squeezed)
        part = _with_registers(part, part.registers.reshape(layout.registers_shape(new_shape)),
                               layout)
        dims = tuple(d for i, d in enumerate(dims) if i not in squeezed)
    return part.broadcast_in_dim(shape, dims, target)


def lower_shape_cast(ctx: LoweringContext, op: vector.ShapeCastOp) -> list[ir.Value]:
    [in_layout] = ctx.in_layouts(op)
    [out_layout] = ctx.out_layouts(op)
    ty = ir.VectorType(op.result.type)
    shape = tuple(ty.shape)
    array = ctx.from_ir(op.source, in_layout)
    target = _layout(out_layout)
    flat = _flattening(array, shape, target)
    if flat is not None:
        return [ctx.to_ir(_with_registers(array, flat, target), ty)]
    if isinstance(target, fa.TiledLayout) and target != array.layout:
        # Beyond jax: only size-1 dims change, and with them the tiling; the
        # registers stay as they are.
        registers_shape = target.registers_shape(shape)
        if math.prod(registers_shape) != array.registers.size:
            raise ctx.fail(op, f"cannot reshape {array.shape} in {array.layout} to {shape} "
                           f"in {target}", fix="let layout inference choose the layouts")
        return [ctx.to_ir(_with_registers(array, array.registers.reshape(registers_shape),
                                          target), ty)]
    return [ctx.to_ir(array.reshape(shape), ty)]


def _flattening(array: Array, shape: tuple[int, ...], target: fa.FragmentedLayout
                ) -> np.ndarray | None:
    """Beyond jax: the registers of a tiled ``array`` flattened to the 1-D
    tiled ``target`` (a transpose of the register array, see flatten.py)."""
    if len(shape) != 1 or len(array.shape) < 2 or not isinstance(array.layout, fa.TiledLayout) \
            or not isinstance(target, fa.TiledLayout):
        return None
    found = flatten_tiled(array.layout, array.shape)
    if found is None or found[0] != target:
        return None
    return flatten_registers(array.registers, found[1], target, shape[0])


# --- lowering: slices and concatenation ----------------------------------------------------


def lower_extract_strided_slice(ctx: LoweringContext,
                                op: vector.ExtractStridedSliceOp) -> list[ir.Value]:
    _check_unit_strides(op)
    layout = _one_layout(ctx, op)
    array = ctx.from_ir(op.source, layout)
    index = tuple(mgpu_utils.DynamicSlice(offset, size)
                  for offset, size in zip(_ints(op.offsets), _ints(op.sizes), strict=True))
    return [ctx.to_ir(array[index], op.result.type)]


def lower_extract(ctx: LoweringContext, op: vector.ExtractOp) -> list[ir.Value]:
    if len(op.dynamic_position):
        raise ctx.unsupported(op, "Only slicing with static indices allowed.",
                              fix="index with constants")
    [in_layout] = ctx.in_layouts(op)
    array = ctx.from_ir(op.source, in_layout)
    position = tuple(op.static_position)
    if not isinstance(op.result.type, ir.VectorType):
        element = array[position]
        if not isinstance(element.layout, fa.WGSplatFragLayout):
            raise ctx.fail(op, "a scalar can only be extracted from a splat vector",
                           layout=str(in_layout), fix="re-run infer_layouts")
        return [element.registers.item()]
    _one_layout(ctx, op)
    # jax unpacks the source a second time here; a relayout out of a splat
    # producer is emitted twice, and the IR must match.
    array = ctx.from_ir(op.source, in_layout)
    return [ctx.to_ir(array[position], op.result.type)]


def lower_insert_strided_slice(ctx: LoweringContext,
                               op: vector.InsertStridedSliceOp) -> list[ir.Value]:
    _check_unit_strides(op)
    layout = _one_layout(ctx, op)
    value = ctx.from_ir(op.valueToStore, layout)
    result = ctx.from_ir(op.dest, layout)
    index = tuple(slice(offset, offset + size)
                  for offset, size in zip(_ints(op.offsets), value.shape, strict=True))
    result[index] = value
    return [ctx.to_ir(result, op.result.type)]


def lower_vector_concat(ctx: LoweringContext, op: mgpu.VectorConcatOp) -> list[ir.Value]:
    arrays = [ctx.from_ir(operand, layout)
              for operand, layout in zip(op.operation.operands, ctx.in_layouts(op), strict=True)]
    return [ctx.to_ir(fa.concatenate(arrays, axis=op.dimension.value), op.result.type)]


# --- lowering: reductions -----------------------------------------------------------------

# combining kind -> (FragmentedArray reduction, signedness, how to fold in the accumulator)
KINDS: dict[str, tuple[str, bool | None, Callable[[Array, Array], Array]]] = {
    "add": ("add", None, operator.add),
    "mul": ("prod", None, operator.mul),  # jax 0.12 too (beyond jax 0.11)
    "maxsi": ("max", True, Array.max),
    "maxui": ("max", False, Array.max),
    "maximumf": ("max", None, Array.max),
    "minsi": ("min", True, Array.min),
    "minui": ("min", False, Array.min),
    "minimumf": ("min", None, Array.min),
}


def _kind(ctx: LoweringContext, op: ir.OpView) -> tuple[str, bool | None, Callable]:
    name = str(op.kind).removeprefix("#vector.kind<").removesuffix(">")
    if name not in KINDS:
        raise ctx.unsupported(op, f"Unsupported reduction kind: {op.kind}",
                              supported=", ".join(KINDS),
                              fix="reduce with add, mul, max* or min*, and apply the rest "
                                  "elementwise")
    return KINDS[name]


def acc_ilp(op: ir.OpView) -> int | None:
    """jax >= 0.12: the accumulators each thread keeps in flight (Pallas sets
    ``acc_ilp``; the code generator picks when it is absent)."""
    attributes = op.operation.attributes
    return ir.IntegerAttr(attributes["acc_ilp"]).value if "acc_ilp" in attributes else None


def no_acc_ilp(op: ir.OpView) -> int | None:
    """jax 0.11: ``acc_ilp`` is not read; the code generator always picks."""
    return None


def _lower_vector_reduction(ctx: LoweringContext, op: vector.ReductionOp,
                            ilp: Callable[[ir.OpView], int | None]) -> list[ir.Value]:
    """A reduction of the whole vector to a scalar, through 4 elements of SMEM scratch."""
    kind, signed, _ = _kind(ctx, op)
    [layout] = ctx.in_layouts(op)
    ty = ir.VectorType(op.vector.type)
    scratch = _smem_scratch(ctx, op, ty.element_type, 4)
    array = ctx.from_ir(op.vector, layout, signed)
    result = array.reduce(kind, range(ty.rank), scratch, acc_ilp=ilp(op))
    return [result.registers.item()]


def _lower_multi_reduction(ctx: LoweringContext, op: vector.MultiDimReductionOp,
                           ilp: Callable[[ir.OpView], int | None]) -> list[ir.Value]:
    """Reduces the source along one dim, then folds in the accumulator."""
    kind, signed, fold = _kind(ctx, op)
    [in_layout, acc_layout] = ctx.in_layouts(op)
    [out_layout] = ctx.out_layouts(op)
    if out_layout != acc_layout:
        raise ctx.fail(op, f"Output layout {out_layout} must match the accumulator layout "
                       f"{acc_layout}", fix="give the accumulator the result's layout")
    dims = _ints(op.reduction_dims)
    if len(dims) != 1:
        raise ctx.unsupported(op, "Only 1 reduction dimension is supported.",
                              reduction_dims=dims, fix="reduce one dim at a time")
    source = ctx.from_ir(op.source, in_layout, signed)
    acc = ctx.from_ir(op.acc, acc_layout, signed)
    if not isinstance(source.layout, (fa.TiledLayout, fa.WGSplatFragLayout)):
        raise ctx.unsupported(op, f"Unsupported layout: {source.layout}",
                              fix="reduce a vector in a tiled layout (layout_cast it)")
    scratch = None
    if _crosses_warps(source.layout, len(source.shape), dims[0]):
        element_type = ir.VectorType(op.source.type).element_type
        if "scratch_size" not in op.operation.attributes:
            raise ctx.fail(op, "a reduction across warps needs SMEM scratch, but the op has "
                           "no `scratch_size` attribute",
                           fix="set `scratch_size` (bytes) and `offset`, as Pallas does")
        size = ir.IntegerAttr(op.operation.attributes["scratch_size"]).value
        scratch = _smem_scratch(ctx, op, element_type,
                                size * 8 // mgpu_utils.bitwidth(element_type))
    result = fold(source.reduce(kind, dims[0], scratch, acc_ilp=ilp(op)), acc)
    return [ctx.to_ir(result, op.result.type)]


def lower_vector_reduction(ctx: LoweringContext, op: vector.ReductionOp) -> list[ir.Value]:
    return _lower_vector_reduction(ctx, op, acc_ilp)


def lower_vector_reduction_jax_0_11(ctx: LoweringContext,
                                    op: vector.ReductionOp) -> list[ir.Value]:
    return _lower_vector_reduction(ctx, op, no_acc_ilp)


def lower_multi_reduction(ctx: LoweringContext,
                          op: vector.MultiDimReductionOp) -> list[ir.Value]:
    return _lower_multi_reduction(ctx, op, acc_ilp)


def lower_multi_reduction_jax_0_11(ctx: LoweringContext,
                                   op: vector.MultiDimReductionOp) -> list[ir.Value]:
    return _lower_multi_reduction(ctx, op, no_acc_ilp)


def _crosses_warps(layout: fa.FragmentedLayout, rank: int, axis: int) -> bool:
    """Whether reducing ``axis`` needs scratch: it combines values held by
    different warps, or jax would slice scratch for it anyway."""
    if not isinstance(layout, fa.TiledLayout):
        return False
    tile_rank = len(layout.base_tile_shape)
    untiled = rank - tile_rank
    # jax reads the tiled dim at the *logical* axis, which is off by the
    # untiled dims; where that gives it scratch, the IR must slice it too.
    if axis < tile_rank and _warp_partitioned(layout, axis):
        return True
    # Untiled dims are spread over registers, not threads.
    return axis >= untiled and _warp_partitioned(layout, axis - untiled)


def _warp_partitioned(layout: fa.TiledLayout, tiled_axis: int) -> bool:
    reduced = layout.tiling.tile_dimension(tiled_axis)
    return any(reduced[d] for d in layout.partitioned_warp_dims)


def register_lowerings(registry: LoweringRegistry) -> None:
    registry.lowering_rule("vector.broadcast")(lower_broadcast)
    registry.lowering_rule("mosaic_gpu.broadcast_in_dim")(lower_broadcast_in_dim)
    registry.lowering_rule("vector.shape_cast")(lower_shape_cast)
    registry.lowering_rule("vector.extract_strided_slice")(lower_extract_strided_slice)
    registry.lowering_rule("vector.extract")(lower_extract)
    registry.lowering_rule("vector.insert_strided_slice")(lower_insert_strided_slice)
    registry.lowering_rule("mosaic_gpu.vector_concat")(lower_vector_concat)
    rule = registry.lowering_rule
    rule("vector.reduction", jax=SINCE_0_12)(lower_vector_reduction)
    rule("vector.reduction", jax=BEFORE_0_12)(lower_vector_reduction_jax_0_11)
    rule("vector.multi_reduction", jax=SINCE_0_12)(lower_multi_reduction)
    rule("vector.multi_reduction", jax=BEFORE_0_12)(lower_multi_reduction_jax_0_11)
