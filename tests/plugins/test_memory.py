"""smalti against jax on shared memory refs and views of them (plugins/memory.py).

Each kernel goes through SMEM scratch (``mosaic_gpu.slice_smem``), optionally
through views (subview, transpose, expand/collapse, cast, with_transforms),
and is built twice: jax infers and lowers one, smalti the other, and the
inferred attributes and lowered IR must be equal.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import pytest
from jax._src.lib import mosaic_gpu_dialect as mgpu
from jax._src.lib.mlir import ir
from jax._src.lib.mlir.dialects import arith, builtin, func, gpu, memref
from jax.experimental.mosaic.gpu import core as mgpu_core
from jax.experimental.mosaic.gpu import fragmented_array as fa
from jax.experimental.mosaic.gpu import layouts as mgpu_layouts
from jax.experimental.mosaic.gpu import tcgen05
from jax.experimental.mosaic.gpu import utils as mgpu_utils

import smalti
from smalti import kernels
from smalti.plugins import memory
from smalti.rules import LoweringContext
from tests.differential import (
    assert_same_as_jax,
    assert_same_refusal,
    jax_infer,
    jax_lower,
    normalized,
    refusal,
    walk_ops,
)

F32, F16, BF16 = jnp.float32, jnp.float16, jnp.bfloat16


def sds(shape, dtype) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, dtype)


class Checked(NamedTuple):
    #: (op name, attribute name) -> that attribute of each such op, after inference
    inferred: dict[tuple[str, str], list[str]]
    lowered: str


def same_as_jax(body, in_shapes, out_shapes, smem, *, grid=(1, 1, 1),
                cluster=(1, 1, 1)) -> Checked:
    """Builds the kernel twice (with SMEM scratch ``smem``); smalti's inferred
    attributes and lowered IR must equal jax's."""

    def build():
        return kernels.build_kernel(body, in_shapes, out_shapes, smem_scratch=smem, grid=grid,
                                    cluster=cluster)

    reference, candidate = build(), build()
    jax_infer(reference)
    smalti.infer_layouts(candidate.module)
    assert normalized(candidate.module) == normalized(reference.module), "inferred layouts differ"
    inferred = attributes(candidate)
    theirs = refusal(lambda: jax_lower(reference))
    if theirs is not None:  # the installed jax refuses it: smalti must too
        assert_same_refusal(theirs, refusal(
            lambda: smalti.lower(candidate.module, candidate.launch_context)))
        return Checked(inferred, "")
    smalti.lower(candidate.module, candidate.launch_context)
    lowered = normalized(candidate.module)
    assert lowered == normalized(reference.module), "lowered IR differs"
    return Checked(inferred, lowered)


def attributes(kernel) -> dict[tuple[str, str], list[str]]:
    """Every attribute of every op of ``kernel``, by op name and attribute name."""
    found: dict[tuple[str, str], list[str]] = {}

    for op in walk_ops(kernel.module):
        for name in op.attributes:
            found.setdefault((op.name, name), []).append(str(op.attributes[name]))
    return found


def wgmma(x: ir.Value) -> ir.Value:
    return mgpu.layout_cast(x, mgpu_layouts.to_layout_attr(fa.WGMMA_LAYOUT))


def through(ref: ir.Value, x_ref: ir.Value, out_ref: ir.Value, *, load_from=None) -> None:
    """x -> WGMMA registers -> ``ref`` -> registers -> out.

    The GMEM transfers are unoptimized, as jax 0.11 lowers them when unset:
    jax 0.12 requires an unset one to be optimized, which no plan allows for
    WGMMA-laid 16-bit values in global memory."""
    mgpu.vector_store(wgmma(mgpu.vector_load(x_ref, optimized=False)), ref)
    mgpu.vector_store(mgpu.vector_load(ref if load_from is None else load_from), out_ref,
                      optimized=False)


def index(value: int) -> ir.Value:
    return arith.constant(ir.IndexType.get(), value)


def dynamic_multiple_of(multiple: int) -> ir.Value:
    """A run-time index known to be a multiple of ``multiple`` (block id * multiple)."""
    return arith.muli(gpu.block_id(gpu.Dimension.x), index(multiple))


def smem_type(shape, element: ir.Type) -> ir.MemRefType:
    return ir.MemRefType.get(shape, element, memory_space=mgpu_utils.smem())


def transforms_attr(tiling=None, swizzle=None) -> ir.ArrayAttr:
    parts = []
    if tiling is not None:
        parts.append(mgpu.TileTransformAttr.get(tiling))
    if swizzle is not None:
        parts.append(mgpu.SwizzleTransformAttr.get(swizzle))
    return ir.ArrayAttr.get(parts)


# --- transfers through SMEM scratch ------------------------------------------------------


def smem_transforms(tiling=None, swizzle=None) -> str:
    """The ``in_transforms``/``out_transforms`` text of one SMEM ref."""
    parts = []
    if tiling is not None:
        parts.append(f"#mosaic_gpu.tile<[{', '.join(map(str, tiling))}]>")
    if swizzle is not None:
        parts.append(f"#mosaic_gpu.swizzle<{swizzle} : i32>")
    return f"[[{', '.join(parts)}]]"


@pytest.mark.parametrize("dtype, shape, tiling, swizzle", [
    (F16, (128, 128), (8, 64), 128),
    (BF16, (64, 64), (8, 64), 128),
    (F32, (128, 64), (8, 32), 128),
    (F16, (64, 32), (8, 32), 64),
    (F16, (64, 16), (8, 16), 32),
])
def test_wgmma_values_through_smem_get_tiled_and_swizzled(dtype, shape, tiling, swizzle):
    def body(ctx, x_ref, out_ref, smem):
        through(smem, x_ref, out_ref)

    inferred, _ = same_as_jax(body, [sds(shape, dtype)], [sds(shape, dtype)], sds(shape, dtype))
    assert inferred["mosaic_gpu.slice_smem", "out_transforms"] == [smem_transforms(tiling, swizzle)]


def test_strided_values_leave_smem_untiled():
    def body(ctx, x_ref, out_ref, smem):
        mgpu.vector_store(mgpu.vector_load(x_ref), smem)
        mgpu.vector_store(mgpu.vector_load(smem), out_ref)

    shape = sds((128, 64), F32)
    inferred, _ = same_as_jax(body, [shape], [shape], shape)
    assert inferred["mosaic_gpu.slice_smem", "out_transforms"] == [smem_transforms()]


def test_two_scratch_buffers():
    def body(ctx, x_ref, out_ref, smem):
        a, b = smem
        through(a, x_ref, out_ref)
        mgpu.vector_store(mgpu.vector_load(x_ref), b)

    shape = sds((128, 128), F16)
    same_as_jax(body, [shape], [shape], (shape, shape))


# --- views between the slice and the transfer --------------------------------------------


@pytest.mark.parametrize("offsets, sizes, tiling, swizzle", [
    ((128, 0), (128, 128), (8, 64), 128),  # whole tiles
    ((0, 64), (128, 64), (8, 64), 128),
    ((0, 32), (128, 32), (8, 32), 64),     # narrower windows need narrower tiles
    ((8, 0), (64, 128), (8, 64), 128),
    ((0, 16), (64, 16), (8, 16), 32),
])
def test_static_subview(offsets, sizes, tiling, swizzle):
    def body(ctx, x_ref, out_ref, smem):
        through(memref.subview(smem, list(offsets), list(sizes), [1, 1]), x_ref, out_ref)

    inferred, _ = same_as_jax(body, [sds(sizes, F16)], [sds(sizes, F16)], sds((256, 128), F16))
    assert inferred["memref.subview", "in_transforms"] == [smem_transforms(tiling, swizzle)]


@pytest.mark.parametrize("multiple, tile_rows", [(128, 8), (64, 8), (8, 8), (4, 4), (1, 1)])
def test_dynamic_subview_offset(multiple, tile_rows):
    """Tiles never straddle the window's start: fewer rows when less is known."""
    def body(ctx, x_ref, out_ref, smem):
        row = dynamic_multiple_of(multiple)
        through(memref.subview(smem, [row, 0], [128, 128], [1, 1]), x_ref, out_ref)

    shape = sds((128, 128), F16)
    inferred, _ = same_as_jax(body, [shape], [shape], sds((256, 128), F16))
    assert inferred["memref.subview", "in_transforms"] == [smem_transforms((tile_rows, 64), 128)]


def test_rank_reducing_subview():
    def body(ctx, x_ref, out_ref, smem):
        result = ir.MemRefType.get((128, 128), ir.F16Type.get(),
                                   ir.StridedLayoutAttr.get(128 * 128, [128, 1]),
                                   mgpu_utils.smem())
        view = memref.subview(smem, [1, 0, 0], [1, 128, 128], [1, 1, 1], result_type=result)
        through(view, x_ref, out_ref)

    shape = sds((128, 128), F16)
    same_as_jax(body, [shape], [shape], sds((2, 128, 128), F16))


def test_transpose():
    def body(ctx, x_ref, out_ref, smem):
        transposed = mgpu_utils.memref_transpose(smem, (1, 0))
        through(transposed, x_ref, out_ref)

    shape = sds((128, 128), F16)
    inferred, _ = same_as_jax(body, [shape], [shape], shape)
    # The transposed view is tiled (64, 8): the slice itself (8, 64).
    assert inferred["memref.transpose", "in_transforms"] == [smem_transforms((8, 64), 128)]
    assert inferred["memref.transpose", "out_transforms"] == [
        "[[#mosaic_gpu.tile<[64, 8]>, #mosaic_gpu.swizzle<128 : i32>]]"]


def test_transposed_f32_is_rejected_like_jax():
    def body(ctx, x_ref, out_ref, smem):
        through(mgpu_utils.memref_transpose(smem, (1, 0)), x_ref, out_ref)

    shape = sds((128, 128), F32)

    def build():
        return kernels.build_kernel(body, [shape], [shape], smem_scratch=shape)

    with pytest.raises(ValueError, match="Failed to infer a possible set of layouts"):
        jax_infer(build())
    with pytest.raises(smalti.SmaltiError) as error:
        smalti.infer_layouts(build().module)
    assert isinstance(error.value, ValueError) and error.value.code == "SM101"


def test_store_plain_load_transposed():
    def body(ctx, x_ref, out_ref, smem):
        transposed = mgpu_utils.memref_transpose(smem, (1, 0))
        through(smem, x_ref, out_ref, load_from=transposed)

    shape = sds((128, 128), F16)
    same_as_jax(body, [shape], [shape], shape)


def test_expand_then_subview():
    def body(ctx, x_ref, out_ref, smem):
        expanded = memref.expand_shape(
            ir.MemRefType.get((2, 2, 64, 128), ir.F16Type.get(), memory_space=mgpu_utils.smem()),
            smem, [[0, 1], [2], [3]], [], [2, 2, 64, 128])
        result = ir.MemRefType.get((64, 128), ir.F16Type.get(),
                                   ir.StridedLayoutAttr.get(3 * 64 * 128, [128, 1]),
                                   mgpu_utils.smem())
        view = memref.subview(expanded, [1, 1, 0, 0], [1, 1, 64, 128], [1, 1, 1, 1],
                              result_type=result)
        through(view, x_ref, out_ref)

    shape = sds((64, 128), F16)
    same_as_jax(body, [shape], [shape], sds((4, 64, 128), F16))


def test_collapse_with_forced_tiling():
    def body(ctx, x_ref, out_ref, smem):
        tiled = mgpu.with_transforms(smem, transforms_attr((1, 8, 64), 128))
        collapsed = memref.collapse_shape(smem_type((128, 128), ir.F16Type.get()), tiled,
                                          [[0, 1], [2]])
        through(collapsed, x_ref, out_ref)

    shape = sds((128, 128), F16)
    same_as_jax(body, [shape], [shape], sds((2, 64, 128), F16))


def test_collapse_untiled():
    def body(ctx, x_ref, out_ref, smem):
        collapsed = memref.collapse_shape(smem_type((128, 128), ir.F16Type.get()), smem,
                                          [[0, 1], [2]])
        mgpu.vector_store(mgpu.vector_load(x_ref), collapsed)
        mgpu.vector_store(mgpu.vector_load(collapsed), out_ref)

    shape = sds((128, 128), F16)
    same_as_jax(body, [shape], [shape], sds((2, 64, 128), F16))


@pytest.mark.parametrize("tiling, swizzle", [((8, 64), 128), ((8, 32), 64), ((8, 16), 32)])
def test_with_transforms_forces_transforms(tiling, swizzle):
    def body(ctx, x_ref, out_ref, smem):
        through(mgpu.with_transforms(smem, transforms_attr(tiling, swizzle)), x_ref, out_ref)

    shape = sds((128, 128), F16)
    inferred, _ = same_as_jax(body, [shape], [shape], shape)
    expected = (f"[[#mosaic_gpu.tile<[{tiling[0]}, {tiling[1]}]>, "
                f"#mosaic_gpu.swizzle<{swizzle} : i32>]]")
    assert inferred["mosaic_gpu.slice_smem", "out_transforms"] == [expected]



def test_cast_to_a_dynamic_offset():
    def body(ctx, x_ref, out_ref, smem):
        view = memref.subview(smem, [128, 0], [128, 128], [1, 1])
        dynamic = ir.MemRefType.get(
            (128, 128), ir.F16Type.get(),
            ir.StridedLayoutAttr.get(ir.ShapedType.get_dynamic_stride_or_offset(), [128, 1]),
            mgpu_utils.smem())
        through(memref.cast(dynamic, view), x_ref, out_ref)

    shape = sds((128, 128), F16)
    inferred, lowered = same_as_jax(body, [shape], [shape], sds((256, 128), F16))
    assert inferred["memref.cast", "out_transforms"] == [smem_transforms((8, 64), 128)]
    assert "memref.cast" in lowered


# --- aliases and cluster refs ---------------------------------------------------------------


@pytest.mark.parametrize("alias", [(0, 0), (0, 1), (None, None)])
def test_slices_with_one_alias_id_share_transforms(alias):
    def body(ctx, x_ref, out_ref, smem):
        ty = smem_type((128, 128), ir.F16Type.get())
        # Overlapping, and at different offsets so that CSE keeps both.
        first = mgpu.slice_smem(ty, 0, alias_id=alias[0])
        second = mgpu.slice_smem(ty, 1024, alias_id=alias[1])
        mgpu.vector_store(wgmma(mgpu.vector_load(x_ref)), first)
        mgpu.vector_store(mgpu.vector_load(second), out_ref)

    shape, scratch = sds((128, 128), F16), sds((256, 128), F16)
    inferred, _ = same_as_jax(body, [shape], [shape], scratch)
    first, second = inferred["mosaic_gpu.slice_smem", "out_transforms"]
    assert first == smem_transforms((8, 64), 128)
    assert (second == first) == (alias == (0, 0))


def test_cluster_ref():
    def body(ctx, x_ref, out_ref, smem):
        mgpu.vector_store(wgmma(mgpu.vector_load(x_ref, optimized=False)), smem)
        one = arith.constant(ir.IntegerType.get_signless(32), 1)
        remote = mgpu.get_cluster_ref(smem, x=one)
        # Unoptimized in GMEM under every jax (see through()).
        mgpu.vector_store(mgpu.vector_load(remote), out_ref, optimized=False)

    shape = sds((128, 128), F16)
    inferred, lowered = same_as_jax(body, [shape], [shape], shape, grid=(2, 1, 1),
                                    cluster=(2, 1, 1))
    tiled = smem_transforms((8, 64), 128)
    assert inferred["mosaic_gpu.get_cluster_ref", "out_transforms"] == [tiled]
    assert "mapa" in lowered


# --- scalars ----------------------------------------------------------------------------------


def test_scalar_load_and_store():
    def body(ctx, out_ref, smem):
        scalar, single = smem
        value = memref.load(scalar, [])
        memref.store(arith.addf(value, value), single, [index(0)])
        memref.store(memref.load(single, [index(0)]), scalar, [])

    inferred, _ = same_as_jax(body, [], [sds((128,), F32)], (sds((), F32), sds((1,), F32)))
    assert inferred["memref.load", "in_transforms"] == ["[[]]", "[[]]"]


def test_scalar_access_to_global_memory_is_left_alone():
    def body(ctx, x_ref, out_ref, smem):
        value = memref.load(x_ref, [index(3)])
        memref.store(value, out_ref, [index(0)])

    inferred, lowered = same_as_jax(body, [sds((64,), F32)], [sds((64,), F32)], ())
    assert ("memref.load", "in_transforms") not in inferred
    assert "memref.load" in lowered


def test_scalar_access_to_a_subview_element():
    def body(ctx, x_ref, out_ref, smem):
        mgpu.vector_store(mgpu.vector_load(x_ref), smem)
        element = ir.MemRefType.get(
            (1,), ir.F32Type.get(),
            ir.StridedLayoutAttr.get(ir.ShapedType.get_dynamic_stride_or_offset(), [1]),
            mgpu_utils.smem())
        view = memref.subview(smem, [dynamic_multiple_of(1), index(5)], [1, 1], [1, 1],
                              result_type=element)
        memref.store(memref.load(view, [index(0)]), view, [index(0)])
        mgpu.vector_store(mgpu.vector_load(smem), out_ref)

    shape = sds((128, 64), F32)
    same_as_jax(body, [shape], [shape], shape)


# --- errors -------------------------------------------------------------------------------


def jax_and_smalti_errors(body, in_shapes, out_shapes, smem, *, stage="infer"):
    """The errors jax and smalti raise for the kernel, at inference or lowering."""

    def build():
        return kernels.build_kernel(body, in_shapes, out_shapes, smem_scratch=smem)

    reference, candidate = build(), build()
    with pytest.raises(Exception) as jax_error:
        jax_infer(reference)
        if stage == "lower":
            jax_lower(reference)
    before = normalized(candidate.module)
    with pytest.raises(smalti.SmaltiError) as smalti_error:
        smalti.infer_layouts(candidate.module)
        if stage == "lower":
            smalti.lower(candidate.module, candidate.launch_context)
    if stage == "infer":
        assert normalized(candidate.module) == before  # transactional
    assert isinstance(smalti_error.value, type(jax_error.value))
    return jax_error.value, smalti_error.value


@pytest.mark.parametrize("access", ["load", "store"])
def test_scalar_access_to_a_non_scalar_ref_is_a_smalti_error(access):
    def body(ctx, x_ref, out_ref, smem):
        if access == "load":
            memref.store(memref.load(smem, [index(3)]), out_ref, [index(0)])
        else:
            memref.store(memref.load(x_ref, [index(0)]), smem, [index(3)])

    shape = sds((64,), F32)
    jax_error, error = jax_and_smalti_errors(body, [shape], [shape], shape)
    assert isinstance(error, NotImplementedError)
    phrase = "Only scalar memrefs are supported, got [64]"
    assert phrase in str(jax_error) and phrase in str(error)
    assert error.code == "SM105"
    assert f"memref.{access}" in error.op
    text = str(error)
    assert "memref.subview" in text and "mosaic_gpu.vector_load" in text
    assert "mosaic_gpu.vector_store" in text and "[64]" in text


def test_with_transforms_that_do_not_fit():
    def body(ctx, x_ref, out_ref, smem):
        mgpu.vector_store(mgpu.vector_load(x_ref),
                          mgpu.with_transforms(smem, transforms_attr((8, 64), 128)))

    shape = sds((64, 32), F16)
    jax_error, error = jax_and_smalti_errors(body, [shape], [shape], shape)
    assert "Cannot apply" in str(jax_error)
    assert error.code == "SM102"
    message = "Cannot apply tiling (8, 64) with 128 swizzle to memref with shape [64, 32]"
    assert message in str(error)
    assert "mosaic_gpu.with_transforms" in error.op


def test_with_transforms_in_an_unsupported_order():
    def body(ctx, x_ref, out_ref, smem):
        transforms = ir.ArrayAttr.get([mgpu.SwizzleTransformAttr.get(128),
                                       mgpu.TileTransformAttr.get((8, 64))])
        mgpu.vector_store(mgpu.vector_load(x_ref), mgpu.with_transforms(smem, transforms))

    shape = sds((128, 128), F16)
    jax_error, error = jax_and_smalti_errors(body, [shape], [shape], shape)
    assert "Unsupported transforms" in str(jax_error) and "Unsupported transforms" in str(error)


def test_aliased_slices_of_different_shapes():
    def body(ctx, x_ref, out_ref, smem):
        first = mgpu.slice_smem(smem_type((128, 128), ir.F16Type.get()), 0, alias_id=7)
        second = mgpu.slice_smem(smem_type((64, 128), ir.F16Type.get()), 0, alias_id=7)
        mgpu.vector_store(mgpu.vector_load(x_ref), first)
        mgpu.vector_store(mgpu.vector_load(second), out_ref)

    jax_error, error = jax_and_smalti_errors(
        body, [sds((128, 128), F16)], [sds((64, 128), F16)], sds((128, 128), F16))
    assert "Shape mismatch" in str(jax_error) and "Shape mismatch" in str(error)
    assert error.code == "SM106" and "alias_id 7" in str(error)


def test_strided_subview_is_unsupported():
    def body(ctx, out_ref, smem):
        view = memref.subview(smem, [0, 0], [64, 128], [2, 1])
        mgpu.vector_store(mgpu.vector_load(view), out_ref)

    jax_error, error = jax_and_smalti_errors(
        body, [], [sds((64, 128), F16)], sds((128, 128), F16))
    assert "Only unit strides are supported" in str(error) and error.code == "SM105"


def test_expanding_a_transposed_ref_is_unsupported():
    def body(ctx, x_ref, smem):
        transposed = mgpu_utils.memref_transpose(smem, (1, 0))
        ty = ir.MemRefType.get((2, 64, 128), ir.F16Type.get(),
                               ir.StridedLayoutAttr.get(0, [64, 1, 128]), mgpu_utils.smem())
        expanded = memref.expand_shape(ty, transposed, [[0, 1], [2]], [], [2, 64, 128])
        mgpu.vector_store(mgpu.vector_load(x_ref), expanded)

    jax_error, error = jax_and_smalti_errors(
        body, [sds((2, 64, 128), F16)], [], sds((128, 128), F16))
    assert "Transposed memrefs are not supported in ExpandShapeOp" in str(error)


def test_collapsing_a_non_contiguous_ref_is_unsupported():
    def body(ctx, x_ref, smem):
        view = memref.subview(smem, [0, 0, 0], [2, 64, 64], [1, 1, 1])
        ty = ir.MemRefType.get((128, 64), ir.F16Type.get(),
                               ir.StridedLayoutAttr.get(0, [128, 1]), mgpu_utils.smem())
        collapsed = memref.collapse_shape(ty, view, [[0, 1], [2]])
        mgpu.vector_store(mgpu.vector_load(x_ref), collapsed)

    jax_error, error = jax_and_smalti_errors(
        body, [sds((128, 64), F16)], [], sds((2, 64, 128), F16))
    assert "non-contiguous strides is not supported" in str(error)


def test_running_out_of_shared_memory():
    def body(ctx, x_ref, smem):
        beyond = mgpu.slice_smem(smem_type((128, 128), ir.F16Type.get()), 1024)
        mgpu.vector_store(mgpu.vector_load(x_ref), beyond)

    shape = sds((128, 128), F16)
    jax_error, error = jax_and_smalti_errors(body, [shape], [], shape, stage="lower")
    assert "Ran out of shared memory" in str(jax_error)
    assert "Ran out of shared memory" in str(error) and error.code == "SM203"
    assert "mosaic_gpu.slice_smem" in error.op


def test_barrier_slices_carry_no_transforms():
    def body(ctx, x_ref, out_ref, smem):
        buffer, _ = smem
        through(buffer, x_ref, out_ref)

    shape = sds((128, 128), F16)
    scratch = (shape, mgpu_core.Barrier(1, num_barriers=2))
    inferred, lowered = same_as_jax(body, [shape], [shape], scratch)
    assert inferred["mosaic_gpu.slice_smem", "out_transforms"] == [smem_transforms((8, 64), 128)]
    assert "memref<2xi64, #gpu.address_space<workgroup>>" in lowered


def test_transpose_of_the_two_minor_dims_of_a_3d_ref():
    def body(ctx, x_ref, out_ref, smem):
        transposed = mgpu_utils.memref_transpose(smem, (0, 2, 1))
        result = ir.MemRefType.get((128, 64), ir.F16Type.get(),
                                   ir.StridedLayoutAttr.get(128 * 64, [1, 128]),
                                   mgpu_utils.smem())
        view = memref.subview(transposed, [1, 0, 0], [1, 128, 64], [1, 1, 1],
                              result_type=result)
        through(view, x_ref, out_ref)

    shape = sds((128, 64), F16)
    inferred, _ = same_as_jax(body, [shape], [shape], sds((2, 64, 128), F16))
    assert inferred["mosaic_gpu.slice_smem", "out_transforms"] == [smem_transforms((8, 64), 128)]


def test_reinterpret_cast_has_no_rule_like_in_jax():
    """jax 0.11.2 has the op but no rules (of a slice it is folded away before
    inference; of a view it stays, and both reject it)."""
    dynamic = ir.ShapedType.get_dynamic_stride_or_offset()

    def body(ctx, x_ref, out_ref, smem):
        f16 = ir.F16Type.get()
        view_type = ir.MemRefType.get((128, 128), f16, ir.StridedLayoutAttr.get(dynamic, [128, 1]),
                                      mgpu_utils.smem())
        view = memref.subview(smem, [dynamic_multiple_of(1), 0, 0], [1, 128, 128], [1, 1, 1],
                              result_type=view_type)
        split_type = ir.MemRefType.get((2, 64, 128), f16,
                                       ir.StridedLayoutAttr.get(dynamic, [8192, 128, 1]),
                                       mgpu_utils.smem())
        mgpu.vector_store(mgpu.vector_load(mgpu.reinterpret_cast(split_type, view)), out_ref)

    shape = sds((2, 64, 128), F16)
    jax_error, error = jax_and_smalti_errors(body, [shape], [shape], sds((2, 128, 128), F16))
    assert "No layout inference rule defined" in str(jax_error)
    assert error.code == "SM003" and "mosaic_gpu.reinterpret_cast" in str(error)


def test_cluster_ref_needs_exactly_one_dimension():
    def body(ctx, x_ref, out_ref, smem):
        one = arith.constant(ir.IntegerType.get_signless(32), 1)
        remote = mgpu.get_cluster_ref(smem, x=one, y=one)
        mgpu.vector_store(mgpu.vector_load(remote), out_ref)

    shape = sds((128, 128), F16)
    jax_error, error = jax_and_smalti_errors(body, [shape], [shape], shape, stage="lower")
    phrase = "Exactly one cluster dimension must be specified, got 2"
    assert phrase in str(jax_error) and phrase in str(error)
    assert error.code == "SM203" and "mosaic_gpu.get_cluster_ref" in error.op


# --- TMEM views (no TMEM allocation rules in this plugin: compared rule to rule) -----------


def tmem_view_module(view: str):
    """A function holding a TMEM ref (an address cast to a ref, as lowered TMEM
    refs are) and a ``view`` of it annotated with the TMEM layouts."""
    context = kernels.make_context()
    with context, ir.Location.unknown():
        module = ir.Module.create()
        with ir.InsertionPoint(module.body):
            function = func.FuncOp("f", ir.FunctionType.get([], []))
            with ir.InsertionPoint(function.add_entry_block()):
                address = arith.constant(ir.IntegerType.get_signless(32), 0)
                ref_type = ir.MemRefType.get((128, 256), ir.F32Type.get(),
                                             memory_space=mgpu_utils.tmem())
                layout = mgpu_layouts.to_layout_attr(tcgen05.tmem_default_layout(1))
                ref = builtin.UnrealizedConversionCastOp([ref_type], [address])
                ref.attributes["layout"] = layout
                if view == "subview":
                    result = memref.subview(ref.result, [0, 128], [128, 128], [1, 1])
                else:
                    dynamic = ir.ShapedType.get_dynamic_stride_or_offset()
                    result = memref.cast(ir.MemRefType.get(
                        (128, 256), ir.F32Type.get(), ir.StridedLayoutAttr.get(dynamic, [256, 1]),
                        mgpu_utils.tmem()), ref.result)
                result.owner.attributes["in_tmem_layouts"] = ir.ArrayAttr.get([layout])
                result.owner.attributes["out_tmem_layouts"] = ir.ArrayAttr.get([layout])
                func.ReturnOp([])
    return context, module, result.owner


@pytest.mark.parametrize("view", ["subview", "cast"])
def test_tmem_views_lower_like_jax(view):
    from jax.experimental.mosaic.gpu import dialect_lowering as reference_lowering

    jax_rule = {"subview": reference_lowering._memref_subview_op_lowering_rule,
                "cast": reference_lowering._memref_cast_op_lowering_rule}[view]
    smalti_rule = {"subview": memory.lower_subview, "cast": memory.lower_cast}[view]
    texts = []
    for rule in (jax_rule, smalti_rule):
        context, module, op = tmem_view_module(view)
        with context, ir.Location.unknown(), ir.InsertionPoint(op):
            [new] = rule(LoweringContext, op)  # TMEM layouts are read statically
            op.result.replace_all_uses_with(new)
            op.erase()
        texts.append(str(module))
    assert texts[0] == texts[1]
    assert "memref.subview" not in texts[1] and "memref.cast" not in texts[1]


@pytest.mark.parametrize("arch", [(8, 0), (9, 0), (10, 0), (12, 0)])
def test_tiled_smem_loads_get_jaxs_register_layout_on_every_architecture(arch):
    """jax's inference tries WGMMA layouts first for tiled SMEM only on sm_90
    and TCGEN05 ones everywhere else: smalti infers the same attributes."""
    def body(ctx, x_ref, out_ref, smem):
        transforms = ir.ArrayAttr.get([mgpu.TileTransformAttr.get((64, 64)),
                                       mgpu.SwizzleTransformAttr.get(128)])
        tiled = mgpu.with_transforms(smem, transforms)
        mgpu.vector_store(mgpu.vector_load(tiled), out_ref, optimized=False)

    shape = sds((128, 128), F16)
    assert_same_as_jax(body, [shape], [shape], lower=False, arch=arch, smem_scratch=shape)
