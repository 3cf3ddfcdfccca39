"""Shared memory refs and views of them.

``mosaic_gpu.slice_smem`` carves a ref out of the kernel's dynamic shared
memory; ``mosaic_gpu.with_transforms`` pins a ref's transforms (tiling,
swizzle); ``mosaic_gpu.get_cluster_ref`` addresses the same ref in another
block of the cluster; ``memref.subview`` / ``cast`` / ``transpose`` /
``expand_shape`` / ``collapse_shape`` re-view a ref; ``memref.load`` /
``store`` access a scalar ref.

Inference: a view has the transforms of the ref it views, seen through the
view (a transpose permutes the tiling, a collapse merges tiled dims), and a
view whose offsets or sizes cut through tiles forbids those tiles. Lowering:
each op rewrites the *physical* (tiled) ref behind its operand — unwrapped
from the cast its producer left (see :mod:`smalti.refs`) — and wraps the
result back into its logical type with its transforms.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from jax._src.lib import mosaic_gpu_dialect as mgpu
from jax._src.lib.mlir import ir
from jax._src.lib.mlir.dialects import arith, builtin, gpu, memref
from jax.experimental.mosaic.gpu import launch_context as lc
from jax.experimental.mosaic.gpu import layouts as mgpu_layouts
from jax.experimental.mosaic.gpu import utils as mgpu_utils

from smalti.constraints import UNSUPPORTED, Collapsed, Divides, Equal, Transposed
from smalti.diagnostics import SmaltiNotImplementedError, SmaltiValueError
from smalti.divisibility import known_gcd
from smalti.layouts import (
    MemorySpace,
    SmemTransforms,
    smem_transforms_fit,
    smem_transforms_from_attribute,
)
from smalti.refs import (
    tmem_ref_from_ir,
    tmem_ref_to_ir,
    transformed_type,
    unwrap_transformed_ref,
    wrap_transformed_ref,
)
from smalti.registry import ConstraintRegistry, LoweringRegistry
from smalti.rules import ConstraintBuilder, LoweringContext
from smalti.sites import memory_space_of

_ALIAS_KEY = "smalti.plugins.memory/slice_smem alias"
_SCALAR_FIXES = (
    "index down to a scalar ref first: memref.subview the element into a ref of "
    "shape [1] (sizes all 1, rank-reduced), then load/store that",
    "or move whole tiles between registers and SMEM with mosaic_gpu.vector_load / "
    "mosaic_gpu.vector_store",
)


def _shape(value: ir.Value) -> tuple[int, ...]:
    return tuple(ir.ShapedType(value.type).shape)


def _strides(ref_type: ir.MemRefType) -> list[int]:
    strides, _ = ref_type.get_strides_and_offset()
    return list(strides)


def _contiguous_strides(shape: Sequence[int]) -> list[int]:
    return [math.prod(shape[i + 1 :]) for i in range(len(shape))]


def _reassociation(attr: ir.Attribute) -> list[list[int]]:
    """``[[0, 1], [2]]`` from a reassociation attribute."""
    return [[ir.IntegerAttr(d).value for d in ir.ArrayAttr(group)] for group in attr]


def _unsupported_view(op: ir.OpView, message: str, fix: str | Sequence[str],
                      **values: object) -> SmaltiNotImplementedError:
    return SmaltiNotImplementedError("SM105", message, op=op, values=values, fix=fix)


# --- what views allow of tiles -------------------------------------------------------


def _subview_tiling_multiple(op: memref.SubViewOp) -> tuple[int, ...]:
    """Per dim, what each tile size must divide for the subview to keep whole
    tiles: its size, the source's size and its offset. Dims up to the last
    dynamically sized one cannot be tiled at all (they are dropped)."""
    source_shape = _shape(op.source)
    dynamic_offsets = iter(op.offsets)
    multiple: list[int] = []
    for dim, (size, offset) in enumerate(zip(op.static_sizes, op.static_offsets)):
        offset_value = next(dynamic_offsets) if ir.ShapedType.is_dynamic_size(offset) else offset
        if ir.ShapedType.is_dynamic_size(size):
            multiple = []
            continue
        gcd = math.gcd(size, source_shape[dim])
        if isinstance(offset_value, int):
            gcd = math.gcd(gcd, offset_value)
        else:
            gcd = known_gcd(gcd, offset_value)
        multiple.append(gcd)
    return tuple(multiple)


# --- constraint rules ----------------------------------------------------------------


def slice_smem(op: mgpu.SliceSMEMOp, b: ConstraintBuilder) -> None:
    """A fresh ref; slices with one ``alias_id`` are one ref and share transforms."""
    result = b.variable(b.result(0))
    if op.alias_id is None:
        return
    alias = ir.IntegerAttr(op.alias_id).value
    first = b.shared.setdefault((_ALIAS_KEY, alias), result)
    if first is result:
        return
    if first.shape != result.shape:
        raise SmaltiValueError(
            "SM106",
            f"Shape mismatch between slices with alias_id {alias}: "
            f"{list(first.shape)} != {list(result.shape)}",
            op=op,
            values={"first slice": first.site.describe(), "alias_id": alias},
            fix=["give slices of different shapes different alias ids",
                 "or slice the same shape under both"],
        )
    b.require(Equal(first, result))


def _transform(op: ir.OpView, attr: ir.Attribute) -> object:
    """One transform of ``op``'s transforms, decoded (the verifier accepts any
    attribute in the list; jax's decoder refuses the unknown ones)."""
    try:
        return mgpu_layouts.from_transform_attr(attr)
    except NotImplementedError:
        raise _unsupported_view(
            op, f"Unsupported transform {attr}: a transform is a tile, swizzle or transpose "
            "transform attribute", fix="use #mosaic_gpu.tile<...> and #mosaic_gpu.swizzle<...>",
            transform=str(attr)) from None


def _decode_transforms(op: mgpu.WithTransformsOp) -> SmemTransforms:
    """The transforms of a ``with_transforms``: a tiling, a swizzle, or a
    tiling then a swizzle — nothing else."""
    kinds = [type(_transform(op, t)).__name__ for t in op.transforms]
    if kinds not in ([], ["TileTransform"], ["SwizzlingMode"], ["TileTransform", "SwizzlingMode"]):
        raise _unsupported_view(
            op, f"Unsupported transforms {[str(t) for t in op.transforms]}",
            fix="use a tiling, a swizzle, or a tiling followed by a swizzle",
            transforms=str(op.transforms))
    return smem_transforms_from_attribute(op.transforms)


def _describe_transforms(transforms: SmemTransforms) -> str:
    tiling = f"tiling {transforms.tiling}" if transforms.tiling else "empty tiling"
    swizzle = f"{transforms.swizzle} swizzle" if transforms.swizzle else "no swizzle"
    return f"{tiling} with {swizzle}"


def with_transforms(op: mgpu.WithTransformsOp, b: ConstraintBuilder) -> None:
    """The ref (and every view sharing its variable) has exactly these transforms."""
    ref = b.variable(b.operand(0), b.result(0))
    transforms = _decode_transforms(op)
    ref_type = ir.MemRefType(op.ref.type)
    if not smem_transforms_fit(ref_type, transforms):
        shape = list(ref_type.shape)
        raise SmaltiValueError(
            "SM102",
            f"Cannot apply {_describe_transforms(transforms)} to memref with shape {shape}.",
            op=op,
            values={"ref": str(ref_type), "transforms": str(op.transforms)},
            fix=["use a tiling whose dims divide the trailing dims of the ref, and a "
                 "swizzle (in bytes) that the minor tile dim spans exactly",
                 "or drop the with_transforms and let inference choose"],
        )
    b.assign(ref, transforms)


def same_ref(op: ir.OpView, b: ConstraintBuilder) -> None:
    """The result is the operand seen differently (another block's copy, an
    offset cast away): one layout for both."""
    if _shape(op.operands[0]) != _shape(op.results[0]):
        raise SmaltiValueError(
            "SM105",
            f"Shape mismatch between the operand {list(_shape(op.operands[0]))} and the "
            f"result {list(_shape(op.results[0]))}",
            op=op,
            fix="cast only between ref types of the same static shape (offsets may differ)",
        )
    b.variable(b.operand(0), b.result(0))


def subview(op: memref.SubViewOp, b: ConstraintBuilder) -> None:
    """A window of the source: same transforms, and its offsets and sizes must
    not cut through tiles."""
    strides = list(op.static_strides)
    if any(s != 1 for s in strides):
        raise _unsupported_view(
            op, f"Only unit strides are supported but got {strides}.",
            fix="take a unit-stride subview and skip elements when transferring",
            strides=strides)
    source, result = b.variable(b.operand(0)), b.variable(b.result(0))
    b.require(Divides(source, _subview_tiling_multiple(op)), Equal(source, result))


def _permutation(op: memref.TransposeOp) -> tuple[int, ...]:
    return tuple(ir.AffineDimExpr(e).position for e in op.permutation.value.results)


def transpose(op: memref.TransposeOp, b: ConstraintBuilder) -> None:
    """The result's tiling is the source's, permuted (both ways, so either
    side can decide the other)."""
    source, result = b.variable(b.operand(0)), b.variable(b.result(0))
    permutation = _permutation(op)
    inverse = tuple(permutation.index(d) for d in range(len(permutation)))
    b.require(Equal(Transposed(source, permutation), result),
              Equal(source, Transposed(result, inverse)))


def _expand_tiling_multiple(op: memref.ExpandShapeOp) -> tuple[int, ...]:
    """The trailing output dims that are not split from a larger source dim,
    paired (from the end) with the source's groups: only these may be tiled."""
    trailing: list[int] = []
    pairs = zip(reversed(list(op.static_output_shape)), reversed(_reassociation(op.reassociation)))
    for dim, group in pairs:
        if ir.ShapedType.is_dynamic_size(dim) or len(group) > 1:
            break
        trailing.append(dim)
    return tuple(reversed(trailing))


def expand_shape(op: memref.ExpandShapeOp, b: ConstraintBuilder) -> None:
    """Same transforms as the source, with only unsplit minor dims tiled."""
    if mgpu_utils.is_memref_transposed(ir.MemRefType(op.src.type)):
        raise _unsupported_view(
            op, "Transposed memrefs are not supported in ExpandShapeOp.",
            fix="expand the ref before transposing it", source=str(op.src.type))
    source, result = b.variable(b.operand(0)), b.variable(b.result(0))
    b.require(Divides(source, _expand_tiling_multiple(op)), Equal(source, result))


def collapse_shape(op: memref.CollapseShapeOp, b: ConstraintBuilder) -> None:
    """The result's tiling is the source's with the collapsed groups merged."""
    groups = tuple(len(g) for g in _reassociation(op.reassociation))
    if not groups:
        raise _unsupported_view(
            op, "CollapseShapeOp with empty reassociation is not supported.",
            fix="index the single element with memref.load instead of collapsing to rank 0")
    ref_type = ir.MemRefType(op.src.type)
    source, result = b.variable(b.operand(0)), b.variable(b.result(0))
    if _strides(ref_type) != _contiguous_strides(ref_type.shape):
        raise _unsupported_view(
            op, "CollapseShapeOp with non-contiguous strides is not supported.",
            fix="collapse a contiguous ref (before taking a subview or transpose of it)",
            source=str(ref_type))
    b.require(Equal(result, Collapsed(source, tuple(ref_type.shape), groups)))


def scalar_access(op: memref.LoadOp | memref.StoreOp, b: ConstraintBuilder) -> None:
    """A scalar SMEM ref is never tiled nor swizzled."""
    shape = list(ir.MemRefType(op.memref.type).shape)
    if shape and shape != [1]:
        raise _unsupported_view(
            op, f"Only scalar memrefs are supported, got {shape}: {op.operation.name} "
            f"of an SMEM ref needs a ref of shape [] or [1]",
            fix=_SCALAR_FIXES, ref=str(op.memref.type))
    index = 0 if isinstance(op, memref.LoadOp) else 1
    b.assign(b.variable(b.operand(index)), SmemTransforms(None, None))


def register_constraints(registry: ConstraintRegistry) -> None:
    registry.constraint_rule("mosaic_gpu.slice_smem")(slice_smem)
    registry.constraint_rule("mosaic_gpu.with_transforms")(with_transforms)
    registry.constraint_rule("mosaic_gpu.get_cluster_ref", "memref.cast")(same_ref)
    registry.constraint_rule("memref.subview")(subview)
    registry.constraint_rule("memref.transpose")(transpose)
    registry.constraint_rule("memref.expand_shape")(expand_shape)
    registry.constraint_rule("memref.collapse_shape")(collapse_shape)
    registry.constraint_rule("memref.load", "memref.store")(scalar_access)


# --- lowering: helpers ---------------------------------------------------------------


def _not_implemented(op: ir.OpView, message: str, fix: str | Sequence[str],
                     **values: object) -> SmaltiNotImplementedError:
    return SmaltiNotImplementedError("SM203", message, op=op, values=values, fix=fix)


_DEFAULT_FIX = "let layout inference choose the transforms of the whole kernel"


def _fail(op: ir.OpView, message: str, fix: str | Sequence[str] = _DEFAULT_FIX,
          **values: object) -> SmaltiValueError:
    """An SM203 error, for helpers that have no lowering context at hand."""
    return SmaltiValueError("SM203", message, op=op, values=values, fix=fix)


def _only(attributes: list[ir.Attribute]) -> ir.Attribute:
    [attribute] = attributes
    return attribute


def _transforms(attr: ir.Attribute) -> SmemTransforms:
    return smem_transforms_from_attribute(attr)


def _physical(ctx: LoweringContext, op: ir.OpView, ref: ir.Value) -> ir.Value:
    """The physical ref behind ``ref``, the op's only SMEM operand."""
    return unwrap_transformed_ref(ref, _only(ctx.in_transforms(op)))


def _wrap_result(ctx: LoweringContext, op: ir.OpView, physical: ir.Value) -> ir.Value:
    return wrap_transformed_ref(physical, op.results[0].type, _only(ctx.out_transforms(op)))


# --- lowering: slices and transforms -------------------------------------------------


def _carve(ctx: LoweringContext, op: ir.OpView, ref_type: ir.MemRefType, offset: int) -> ir.Value:
    """A view of the dynamic shared memory at byte ``offset``, of ``ref_type``."""
    size = math.prod(ref_type.shape) * mgpu_utils.bitwidth(ref_type.element_type) // 8
    if offset + size > ctx.smem_requested_bytes:
        raise ctx.fail(
            op, f"Ran out of shared memory: the slice needs bytes [{offset}, {offset + size}) "
            f"but the kernel has {ctx.smem_requested_bytes}",
            fix="request more shared memory (smem_scratch) or slice less",
            offset=offset, size=size)
    i8 = ir.IntegerType.get_signless(8)
    base = gpu.dynamic_shared_memory(
        ir.MemRefType.get((mgpu_utils.DYNAMIC,), i8, memory_space=mgpu_utils.smem()))
    byte_offset = arith.constant(ir.IndexType.get(), offset)
    if not isinstance(ref_type.element_type, mgpu.BarrierType):
        return memref.view(ref_type, base, byte_offset, [])
    # Barriers live in SMEM as 64-bit words.
    words = ir.MemRefType.get(ref_type.shape, ir.IntegerType.get_signless(64),
                              memory_space=mgpu_utils.smem())
    view = memref.view(words, base, byte_offset, [])
    return builtin.unrealized_conversion_cast([ref_type], [view])


def _require_transforms(op: ir.OpView, name: str, ref: ir.Value) -> None:
    """``op`` carries ``name`` with one entry for ``ref``, or SM201 now.

    Inference gives transforms only to refs in ``#gpu.address_space<workgroup>``
    (like jax): a ref in another spelling of it (``3``) or another space gets
    none, and the rule would fail after others rewrote the module."""
    attributes = op.operation.attributes
    if name in attributes and len(ir.ArrayAttr(attributes[name])) == 1:
        return
    space = ir.MemRefType(ref.type).memory_space
    reason = ("" if memory_space_of(ref) is MemorySpace.SMEM else
              f": its ref is in memory space {space}, not #gpu.address_space<workgroup>, "
              "so layout inference gives it no transforms")
    raise SmaltiValueError(
        "SM201", f"{op.operation.name} does not have an {name} attribute{reason}",
        op=op, values={"ref": str(ref.type)},
        fix=["allocate the ref in #gpu.address_space<workgroup> (not 3 or another space)",
             "run smalti.infer_layouts(module) before lowering",
             f"or set {name} by hand with one entry"])


def _check_slice_smem(op: mgpu.SliceSMEMOp) -> None:
    if memory_space_of(op.result) is not None or isinstance(
            ir.MemRefType(op.result.type).element_type, mgpu.BarrierType):
        return  # barriers take no transforms; SMEM ones are checked by core
    _require_transforms(op, "out_transforms", op.result)


def _check_with_transforms(op: mgpu.WithTransformsOp) -> None:
    _require_transforms(op, "in_transforms", op.ref)
    _require_transforms(op, "out_transforms", op.result)


def lower_slice_smem(ctx: LoweringContext, op: mgpu.SliceSMEMOp) -> list[ir.Value]:
    """A view of the dynamic SMEM; non-barrier refs in their tiled form."""
    ref_type = ir.MemRefType(op.result.type)
    offset = ir.IntegerAttr(op.offset).value
    if memory_space_of(op.result) is None:  # barriers carry no transforms
        return [_carve(ctx, op, ref_type, offset)]
    transforms = _only(ctx.out_transforms(op))
    physical = _carve(ctx, op, transformed_type(ref_type, transforms), offset)
    return [wrap_transformed_ref(physical, op.result.type, transforms)]


def lower_with_transforms(ctx: LoweringContext, op: mgpu.WithTransformsOp) -> list[ir.Value]:
    """Nothing to do at run time: the producer already laid the ref out."""
    return [_wrap_result(ctx, op, _physical(ctx, op, op.ref))]



def lower_get_cluster_ref(ctx: LoweringContext, op: mgpu.GetClusterRefOp) -> list[ir.Value]:
    """The same (tiled) ref in the block of the cluster chosen along one dim."""
    chosen = [(index, dim) for index, dim in zip((op.x, op.y, op.z), gpu.Dimension)
              if index is not None]
    if len(chosen) != 1:
        raise ctx.fail(
            op, f"Exactly one cluster dimension must be specified, got {len(chosen)}",
            fix="pass exactly one of x, y, z: the block index along that cluster dim")
    [(index, dim)] = chosen
    physical = _physical(ctx, op, op.source)
    remote = mgpu_utils.get_cluster_ref(
        physical, dim, arith.index_cast(ir.IndexType.get(), index), generic=False)
    return [_wrap_result(ctx, op, remote)]


# --- lowering: views -----------------------------------------------------------------


def _offsets(op: memref.SubViewOp) -> list[int | ir.Value]:
    """Each dim's offset: the static value, or the dynamic operand."""
    dynamic = iter(op.offsets)
    return [next(dynamic) if ir.ShapedType.is_dynamic_size(o) else o for o in op.static_offsets]


def _check_swizzled_window(op: memref.SubViewOp, swizzle: int) -> None:
    """A swizzled (unit-stride) dim must be cut at whole swizzle atoms."""
    source_type = ir.MemRefType(op.source.type)
    atom = swizzle * 8 // mgpu_utils.bitwidth(source_type.element_type)
    for stride, offset, size in zip(_strides(source_type), _offsets(op), op.static_sizes):
        if stride != 1:
            continue
        fix = f"cut the swizzled minor dim at multiples of {atom} elements"
        if size % atom:
            raise _fail(op, f"Swizzled dimension of size={size} is not a multiple of "
                        f"swizzle_elems={atom}.", fix=fix)
        if isinstance(offset, ir.Value):
            if not mgpu_utils.is_known_divisible(offset, atom):
                raise _fail(op, "subview dynamic offset is not a known multiple of "
                            f"swizzle_elems={atom}.",
                            fix=[fix, "prove it with mosaic_gpu.assume_multiple"])
        elif offset % atom:
            raise _fail(op, f"subview offset={offset} is not a multiple of "
                        f"swizzle_elems={atom}.", fix=fix)


def _tiled_offsets(tiling: tuple[int, ...], op: memref.SubViewOp
                   ) -> tuple[list[int], list[ir.Value]]:
    """Static and dynamic offsets of the window in the tiled ref: tile indices in
    the tiled dims (dynamic ones divided at run time), 0 within the tile."""
    n = len(tiling)
    dynamic_marker = ir.ShapedType.get_dynamic_stride_or_offset()
    static: list[int] = []
    dynamic: list[ir.Value] = []
    offsets = _offsets(op)
    for offset in offsets[:-n]:
        static.append(dynamic_marker if isinstance(offset, ir.Value) else offset)
        if isinstance(offset, ir.Value):
            dynamic.append(offset)
    for tile, offset in zip(tiling, offsets[-n:]):
        if isinstance(offset, ir.Value):
            # Inference only tiled this dim if the offset is a known multiple.
            static.append(dynamic_marker)
            dynamic.append(arith.divui(offset, mgpu_utils.c(tile, ir.IndexType.get())))
        elif offset % tile:
            raise _fail(op, f"Offset {offset} is not divisible by tile size {tile}",
                        fix="start the window at a tile boundary")
        else:
            static.append(offset // tile)
    return static + [0] * n, dynamic


def _lower_tmem_subview(ctx: LoweringContext, op: memref.SubViewOp) -> list[ir.Value]:
    [source_layout], [result_layout] = ctx.in_tmem_layouts(op), ctx.out_tmem_layouts(op)
    if source_layout != result_layout:
        raise ctx.fail(op, "a TMEM subview must keep its layout",
                       source=str(source_layout), result=str(result_layout))
    ref = tmem_ref_from_ir(op.source, source_layout, op=op)
    window = [mgpu_utils.DynamicSlice(o, s) for o, s in zip(_offsets(op), op.static_sizes)]
    return [tmem_ref_to_ir(ref.slice(*window), op.result.type)]


def lower_subview(ctx: LoweringContext, op: memref.SubViewOp) -> list[ir.Value]:
    """The same window of the tiled ref, in tile units along the tiled dims."""
    if any(s != 1 for s in op.static_strides):
        raise _not_implemented(op, "SubViewOp only supports static strides of 1.",
                               fix="take a unit-stride subview")
    if len(op.sizes):
        raise _not_implemented(op, "SubViewOp only supports static sizes.",
                               fix="give the subview static sizes")
    if memory_space_of(op.source) is MemorySpace.TMEM:
        return _lower_tmem_subview(ctx, op)
    source_attr, result_attr = _only(ctx.in_transforms(op)), _only(ctx.out_transforms(op))
    if source_attr != result_attr:
        raise _not_implemented(
            op, "SubViewOp transforms for the input and output refs must be identical.",
            fix="let inference choose the transforms of both",
            in_transforms=str(source_attr), out_transforms=str(result_attr))
    transforms = _transforms(result_attr)
    if transforms.swizzle is not None:
        _check_swizzled_window(op, transforms.swizzle)
    physical = unwrap_transformed_ref(op.source, source_attr)
    if transforms.tiling is None:
        window = memref.SubViewOp(
            op.result.type, physical, op.offsets, sizes=[], strides=[],
            static_offsets=op.static_offsets, static_sizes=op.static_sizes,
            static_strides=op.static_strides)
    else:
        tiling = transforms.tiling
        static_offsets, dynamic_offsets = _tiled_offsets(tiling, op)
        rank = len(ir.MemRefType(physical.type).shape)
        window = memref.SubViewOp(
            transformed_type(ir.MemRefType(op.result.type), result_attr), physical,
            dynamic_offsets, sizes=[], strides=[], static_offsets=static_offsets,
            static_sizes=lc.TileTransform(tiling).transform_shape(list(op.static_sizes)),
            static_strides=[1] * rank)
    return [wrap_transformed_ref(window.result, op.result.type, result_attr)]


def _without_offset(ref_type: ir.MemRefType) -> ir.MemRefType:
    layout = ir.StridedLayoutAttr.get(0, _strides(ref_type))
    return ir.MemRefType.get(ref_type.shape, ref_type.element_type,
                             memory_space=ref_type.memory_space, layout=layout)


def _cast_smem(ctx: LoweringContext, op: memref.CastOp) -> ir.Value:
    source_attr, result_attr = _only(ctx.in_transforms(op)), _only(ctx.out_transforms(op))
    if source_attr != result_attr:
        raise _not_implemented(
            op, "memref.cast transforms must have identical transforms for both input and "
            "output", fix="let inference choose the transforms of both",
            in_transforms=str(source_attr), out_transforms=str(result_attr))
    physical = unwrap_transformed_ref(op.source, source_attr)
    cast = memref.cast(transformed_type(ir.MemRefType(op.result.type), result_attr), physical)
    return wrap_transformed_ref(cast, op.result.type, result_attr)


def _cast_tmem(ctx: LoweringContext, op: memref.CastOp) -> ir.Value:
    [source_layout], [result_layout] = ctx.in_tmem_layouts(op), ctx.out_tmem_layouts(op)
    if source_layout != result_layout:
        raise _not_implemented(op, "memref.cast tmem layouts must be identical for both input "
                               "and output", fix="let inference choose the layouts of both",
                               in_layout=str(source_layout), out_layout=str(result_layout))
    return tmem_ref_to_ir(tmem_ref_from_ir(op.source, source_layout, op=op), op.result.type)


def lower_cast(ctx: LoweringContext, op: memref.CastOp) -> list[ir.Value]:
    """A cast that only changes the (static/dynamic) offset of the type."""
    source_type, result_type = ir.MemRefType(op.source.type), ir.MemRefType(op.result.type)
    if _without_offset(source_type) != _without_offset(result_type):
        raise _not_implemented(
            op, "Only support memref.cast where the input and output types are the same up "
            f"to offset, but got {source_type} and {result_type}.",
            fix="cast only the offset; take a subview to change the shape or strides")
    if result_type.memory_space == mgpu_utils.smem():
        return [_cast_smem(ctx, op)]
    if result_type.memory_space == mgpu_utils.tmem():
        return [_cast_tmem(ctx, op)]
    raise _not_implemented(
        op, f"Unsupported memory space when lowering memref.cast: {result_type.memory_space}",
        fix="cast refs in shared or tensor memory only")


def _tiled_permutation(op: memref.TransposeOp, source: tuple[int, ...],
                       result: tuple[int, ...]) -> list[int]:
    """The permutation of the tiled ref: the logical one, then the in-tile dims
    permuted like the tiled dims they belong to."""
    permutation = list(_permutation(op))
    n = len(source)
    first_tiled = len(permutation) - n
    moved = permutation[-n:]
    if any(d < first_tiled for d in moved):
        raise _fail(op, f"Cannot tile a transpose ({permutation}). Tiling dims ({moved}) "
                    f"cannot contain non-tiled dims. All of them must be >= {first_tiled}.",
                    fix="transpose only among the tiled (minor) dims")
    if tuple(source[d - first_tiled] for d in moved) != result:
        raise _fail(op, f"Invalid in/out transforms. In tiling: {source}, out tiling: {result}",
                    fix="let inference choose the transforms of both")
    return permutation + [d + n for d in moved]


def lower_transpose(ctx: LoweringContext, op: memref.TransposeOp) -> list[ir.Value]:
    """The tiled ref transposed: tile indices and in-tile dims alike."""
    source_attr, result_attr = _only(ctx.in_transforms(op)), _only(ctx.out_transforms(op))
    physical = unwrap_transformed_ref(op.in_, source_attr)
    source, result = _transforms(source_attr), _transforms(result_attr)
    if source.swizzle != result.swizzle:
        raise _fail(op, f"Swizzle mismatch. In transforms swizzle: {source.swizzle}, out "
                    f"transforms swizzle {result.swizzle}.",
                    fix="let inference choose the transforms of both")
    if (source.tiling is None) != (result.tiling is None):
        raise _fail(op, f"Size mismatch for in/out transforms. In transforms: {source_attr}, "
                    f"out transforms: {result_attr}.",
                    fix="let inference choose the transforms of both")
    permutation = op.permutation
    if source.tiling is not None:
        tiled = _tiled_permutation(op, source.tiling, result.tiling)
        permutation = ir.AffineMapAttr.get(ir.AffineMap.get_permutation(tiled))
    transposed = memref.TransposeOp(
        transformed_type(ir.MemRefType(op.result.type), result_attr), physical, permutation)
    return [wrap_transformed_ref(transposed.result, op.result.type, result_attr)]


def lower_expand_shape(ctx: LoweringContext, op: memref.ExpandShapeOp) -> list[ir.Value]:
    """The tiled ref expanded the same way; its in-tile dims stay as they are."""
    source_attr, result_attr = _only(ctx.in_transforms(op)), _only(ctx.out_transforms(op))
    physical = unwrap_transformed_ref(op.src, source_attr)
    result_type = transformed_type(ir.MemRefType(op.result.type), result_attr)
    groups = _reassociation(op.reassociation)
    in_tile_dims = len(ir.MemRefType(physical.type).shape) - len(_shape(op.src))
    if in_tile_dims > 0 and any(len(g) > 1 for g in groups[-in_tile_dims:]):
        raise _not_implemented(op, "Expanding tiled dimensions is not supported.",
                               fix="expand only untiled (major) dims")
    rank = len(op.static_output_shape)
    groups += [[rank + i] for i in range(in_tile_dims)]
    expanded = memref.ExpandShapeOp(result_type, physical, groups, output_shape=op.output_shape,
                                    static_output_shape=result_type.shape)
    return [wrap_transformed_ref(expanded.result, op.result.type, result_attr)]


def _check_collapse(ctx: LoweringContext, op: memref.CollapseShapeOp,
                    source: SmemTransforms, result: SmemTransforms,
                    groups: list[list[int]]) -> None:
    fix = "let inference choose the transforms of both"
    if source.swizzle != result.swizzle:
        raise ctx.fail(op, f"Swizzle mismatch. In transforms swizzle: {source.swizzle}, out "
                       f"transforms swizzle {result.swizzle}.", fix=fix)
    if (source.tiling is None) != (result.tiling is None):
        raise ctx.fail(op, "Expected the same number of in/out transforms, but got "
                       f"{source} and {result}", fix=fix)
    if source.tiling is None:
        return
    source_type = ir.MemRefType(op.src.type)
    if _strides(source_type) != _contiguous_strides(source_type.shape):
        raise _not_implemented(
            op, "Collapsing the shape of a memref with non-contiguous strides is not supported",
            fix="collapse a contiguous ref")
    tiled = SmemTransforms(source.tiling)
    groups_sizes = tuple(len(g) for g in groups)
    collapsed = Collapsed(tiled, tuple(source_type.shape), groups_sizes).apply(tiled)
    if collapsed is UNSUPPORTED:
        raise ctx.fail(op, f"Input tiling {source.tiling} is not compatible with {op}", fix=fix)
    if collapsed.tiling != result.tiling:
        raise ctx.fail(op, "Input/output tiling mismatch when attempting to collapse a shape. "
                       f"Expected output tiling to be {collapsed.tiling} for input tiling "
                       f"{source.tiling}, but got {result.tiling}", fix=fix)


def _tiled_reassociation(groups: list[list[int]], tiling_rank: int) -> list[list[int]]:
    """The groups of the tiled ref: the logical ones, then the groups of the
    tiled dims again, for the in-tile dims."""
    covered, start = 0, len(groups)
    while covered < tiling_rank:
        start -= 1
        covered += len(groups[start])
    return groups + [[d + tiling_rank for d in g] for g in groups[start:]]


def lower_collapse_shape(ctx: LoweringContext, op: memref.CollapseShapeOp) -> list[ir.Value]:
    """The tiled ref collapsed the same way, in-tile dims collapsed alongside."""
    source_attr, result_attr = _only(ctx.in_transforms(op)), _only(ctx.out_transforms(op))
    source, result = _transforms(source_attr), _transforms(result_attr)
    groups = _reassociation(op.reassociation)
    _check_collapse(ctx, op, source, result, groups)
    if source.tiling is not None:
        groups = _tiled_reassociation(groups, len(source.tiling))
    collapsed = memref.collapse_shape(
        transformed_type(ir.MemRefType(op.result.type), result_attr),
        unwrap_transformed_ref(op.src, source_attr), groups)
    return [wrap_transformed_ref(collapsed, op.result.type, result_attr)]


# --- lowering: scalar access -----------------------------------------------------------


def _scalar_ref(ctx: LoweringContext, op: memref.LoadOp | memref.StoreOp) -> ir.Value:
    transforms = _only(ctx.in_transforms(op))
    if len(ir.ArrayAttr(transforms)):
        raise _not_implemented(
            op, f"{op.operation.name} does not support transforms: {transforms}",
            fix="scalar refs are never tiled nor swizzled: drop the transforms")
    return unwrap_transformed_ref(op.memref, transforms)


def lower_load(ctx: LoweringContext, op: memref.LoadOp) -> list[ir.Value]:
    """The same load, from the plain ref behind the logical one."""
    load = memref.LoadOp(memref=_scalar_ref(ctx, op), indices=op.indices,
                         nontemporal=op.nontemporal)
    return [load.result]


def lower_store(ctx: LoweringContext, op: memref.StoreOp) -> list[ir.Value]:
    """The same store, to the plain ref behind the logical one."""
    memref.StoreOp(value=op.value, memref=_scalar_ref(ctx, op), indices=op.indices,
                   nontemporal=op.nontemporal)
    return []


def register_lowerings(registry: LoweringRegistry) -> None:
    rule = registry.lowering_rule
    # Views and slices are also taken by a single warp (inside warp_map);
    # their checks run before lowering rewrites anything.
    rule("mosaic_gpu.slice_smem", warp_semantics=True, check=_check_slice_smem)(
        lower_slice_smem)
    rule("mosaic_gpu.with_transforms", warp_semantics=True, check=_check_with_transforms)(
        lower_with_transforms)
    rule("mosaic_gpu.get_cluster_ref")(lower_get_cluster_ref)
    rule("memref.subview", warp_semantics=True)(lower_subview)
    rule("memref.cast", warp_semantics=True)(lower_cast)
    rule("memref.transpose", warp_semantics=True)(lower_transpose)
    rule("memref.expand_shape")(lower_expand_shape)
    rule("memref.collapse_shape", warp_semantics=True)(lower_collapse_shape)
    rule("memref.load")(lower_load)
    rule("memref.store", warp_semantics=True)(lower_store)
