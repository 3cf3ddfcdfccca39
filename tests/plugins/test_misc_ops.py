"""smalti against jax on the remaining generic Mosaic GPU ops: custom primitives,
warp maps, barriers, hints, printing, multimem loads and Ampere-style MMA."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src.lib import mosaic_gpu_dialect as mgpu
from jax._src.lib.mlir import ir
from jax._src.lib.mlir.dialects import arith, builtin, gpu, memref
from jax._src.lib.mlir.dialects import math as mlir_math
from jax.experimental.mosaic import gpu as mosaic_gpu
from jax.experimental.mosaic.gpu import dialect_lowering  # the reference: tests only
from jax.experimental.mosaic.gpu import fragmented_array as fa
from jax.experimental.mosaic.gpu import launch_context as lc
from jax.experimental.mosaic.gpu import layouts as mgpu_layouts
from jax.experimental.mosaic.gpu.mma import MMALayouts

import smalti
from smalti import kernels
from tests.differential import (
    assert_same_as_jax,
    build_twice,
    jax_infer,
    jax_lower,
    normalized,
    ops_named,
    smalti_infer,
    smalti_lower,
)

F32, F16, BF16, I32, I8 = jnp.float32, jnp.float16, jnp.bfloat16, jnp.int32, jnp.int8


def sds(shape, dtype):
    return jax.ShapeDtypeStruct(shape, dtype)


def same_as_jax(body, in_shapes, out_shapes, scratch=(), *, lower=True):
    """Inferred attributes and lowered IR of smalti equal jax's (kernels may
    have SMEM scratch). Returns (jax's kernel, smalti's kernel)."""
    return assert_same_as_jax(body, in_shapes, out_shapes, lower=lower, smem_scratch=scratch)


def splat(like: ir.Value, value) -> ir.Value:
    ty = ir.VectorType(like.type)
    element = ty.element_type
    attr = (ir.IntegerAttr.get(element, int(value)) if isinstance(element, ir.IntegerType)
            else ir.FloatAttr.get(element, float(value)))
    return arith.constant(ty, ir.DenseElementsAttr.get_splat(ty, attr))


def cast(x: ir.Value, layout) -> ir.Value:
    return mgpu.layout_cast(x, mgpu_layouts.to_layout_attr(layout))


#: jax 0.12 removed mosaic_gpu.wait from the dialect: a Warpgroup kernel
#: (Pallas' barrier_wait too) waits with Lane-level code instead.
HAS_WAIT_OP = hasattr(mgpu, "wait")
NO_WAIT_OP = pytest.mark.skipif(not HAS_WAIT_OP,
                                reason="mosaic_gpu.wait is not in this jax's dialect (0.12)")


def wait(barrier: ir.Value, parity: ir.Value) -> None:
    """Waits on ``barrier`` (a barrier memref): the mosaic_gpu.wait op where
    the dialect has it, else the Lane-level wait jax 0.12's Pallas emits."""
    if HAS_WAIT_OP:
        mgpu.wait(barrier, parity)
    else:
        mosaic_gpu.utils.DialectBarrierRef.from_barrier_memref(barrier).wait_parity(parity)


def i1(value: int) -> ir.Value:
    return arith.constant(ir.IntegerType.get_signless(1), value)


def printed(capsys, run: Callable[[], None]) -> str:
    capsys.readouterr()
    run()
    return capsys.readouterr().out


# --- debug_print and print_layout ----------------------------------------------------


@pytest.mark.parametrize("layout", [None, fa.WGMMA_LAYOUT, fa.WGMMA_ROW_LAYOUT])
def test_debug_print_of_a_vector(layout):
    shape = (128,) if layout is fa.WGMMA_ROW_LAYOUT else (128, 64)

    def body(ctx, x_ref, out_ref, smem):
        x = mgpu.vector_load(x_ref)
        if layout is not None:
            x = cast(x, layout)
        mgpu.debug_print("x = {}", x)
        mgpu.vector_store(x, out_ref)

    _, candidate = same_as_jax(body, [sds(shape, F32)], [sds(shape, F32)])
    assert "gpu.printf" in normalized(candidate.module)


def test_debug_print_of_a_splat_is_refused_like_jax():
    """Mosaic GPU cannot print a splat vector per element; both say so."""
    def body(ctx, x_ref, smem):
        mgpu.debug_print("x = {}", splat(mgpu.vector_load(x_ref), 3.0))

    shape = sds((128, 64), F32)
    reference, candidate = build_twice(body, [shape], [])
    jax_infer(reference)
    smalti_infer(candidate)
    with pytest.raises(NotImplementedError):
        jax_lower(reference)
    with pytest.raises(smalti.SmaltiNotImplementedError) as error:
        smalti_lower(candidate)
    assert error.value.code == "SM203"
    assert "mosaic_gpu.debug_print" in str(error.value)


@pytest.mark.parametrize("dtype", [I32, F16])
def test_debug_print_of_a_computed_value(dtype):
    def body(ctx, x_ref, out_ref, smem):
        x = mgpu.vector_load(x_ref)
        y = arith.addi(x, x) if dtype == I32 else arith.addf(x, x)
        mgpu.debug_print("{}", y)
        mgpu.vector_store(y, out_ref)

    same_as_jax(body, [sds((256,), dtype)], [sds((256,), dtype)])


def infer_then_lower_printing(capsys, body, in_shapes, out_shapes, scratch=()) -> str:
    """Both pipelines print the same at lowering and produce the same IR."""
    reference, candidate = build_twice(body, in_shapes, out_shapes, scratch)
    jax_infer(reference)
    smalti_infer(candidate)
    assert normalized(candidate.module) == normalized(reference.module)
    by_jax = printed(capsys, lambda: jax_lower(reference))
    by_smalti = printed(capsys, lambda: smalti_lower(candidate))
    assert by_smalti == by_jax
    assert normalized(candidate.module) == normalized(reference.module)
    return by_smalti


@pytest.mark.parametrize("layout, expected", [
    (fa.WGMMA_LAYOUT, "WGMMA\n"),
    (fa.TCGEN05_LAYOUT, "TCGEN05\n"),
    (fa.TMEM_NATIVE_LAYOUT, "TCGEN05_TMEM_NATIVE\n"),
    (fa.WGStridedFragLayout((128, 128), 4), "WGStridedFragLayout"),
    ("splat", "WGSplatFragLayout"),
])
def test_print_layout_of_a_vector(capsys, layout, expected):
    def body(ctx, x_ref, out_ref, smem):
        # Unoptimized GMEM transfers: what jax 0.11 does when unset, and what
        # jax 0.12 (which requires unset ones optimized) can do for every layout.
        x = mgpu.vector_load(x_ref, optimized=False)
        x = splat(x, 1.0) if layout == "splat" else cast(x, layout)
        mgpu.print_layout("layout: {}", x)
        mgpu.vector_store(x, out_ref, optimized=False)

    shape = sds((128, 128), F32)
    text = infer_then_lower_printing(capsys, body, [shape], [shape])
    assert text.startswith("layout: ") and expected in text


@pytest.mark.parametrize("register_layout", [fa.WGMMA_LAYOUT, None])
def test_print_layout_of_an_smem_ref(capsys, register_layout):
    shape = sds((128, 128), F16)

    def body(ctx, x_ref, out_ref, smem):
        x = mgpu.vector_load(x_ref, optimized=False)  # unoptimized in GMEM, as above
        if register_layout is not None:
            x = cast(x, register_layout)
        mgpu.vector_store(x, smem)
        mgpu.print_layout("smem: {}", smem)
        mgpu.vector_store(mgpu.vector_load(smem), out_ref, optimized=False)

    text = infer_then_lower_printing(capsys, body, [shape], [shape], shape)
    assert text.startswith("smem: (")
    if register_layout is not None:
        assert "TilingTransform" in text and "SwizzleTransform" in text


def _tmem_layouts():
    from jax.experimental.mosaic.gpu import tcgen05

    return [tcgen05.tmem_default_layout(1), tcgen05.tmem_default_layout(2),
            tcgen05.tmem_half_lane_layout(64, 1), tcgen05.tmem_m64_collective_layout(64, 1)]


@pytest.mark.parametrize("index", range(4))
def test_tmem_layouts_are_spelled_like_jax(index):
    """TMEM refs need Blackwell ops to build; check the spelling directly."""
    from jax.experimental.mosaic.gpu import tcgen05

    from smalti.plugins.printing import tmem_layout_text

    with kernels.make_context(), ir.Location.unknown():
        layout = _tmem_layouts()[index]
        module = ir.Module.create()
        with ir.InsertionPoint(module.body):
            address = arith.constant(ir.IntegerType.get_signless(32), 0)
        element = ir.BF16Type.get() if layout.vector_length == 2 else ir.F32Type.get()
        ref = tcgen05.TMEMRef(address, (128, 64), element, layout)
        assert tmem_layout_text(_layout_attr(layout)) == dialect_lowering.pprint_layout(ref)


# --- barriers ---------------------------------------------------------------------------


@pytest.mark.parametrize("arrival_count, num_barriers, orders_tensor_core", [
    (1, 1, False), (3, 2, False), (1, 4, True),
])
def test_initialize_barrier(arrival_count, num_barriers, orders_tensor_core):
    barrier = mosaic_gpu.Barrier(arrival_count=arrival_count, num_barriers=num_barriers,
                                 orders_tensor_core=orders_tensor_core)

    def body(ctx, x_ref, out_ref, barriers):
        mgpu.vector_store(mgpu.vector_load(x_ref), out_ref)

    shape = sds((128,), F32)
    _, candidate = same_as_jax(body, [shape], [shape], barrier)
    text = normalized(candidate.module)
    assert text.count("mbarrier.init.shared::cta.b64") == num_barriers
    assert "mosaic_gpu.initialize_barrier" not in text


@pytest.mark.parametrize("with_predicate", [False, True])
@pytest.mark.parametrize("orders_tensor_core", [False, True])
def test_arrive_and_wait_around_vector_stores(orders_tensor_core, with_predicate):
    barrier = mosaic_gpu.Barrier(arrival_count=1, num_barriers=2,
                                 orders_tensor_core=orders_tensor_core)

    def body(ctx, x_ref, out_ref, barriers):
        x = mgpu.vector_load(x_ref)
        mgpu.vector_store(x, out_ref)
        predicate = i1(1) if with_predicate else None
        barriers[1].arrive(orders_tensor_core=orders_tensor_core, predicate=predicate)
        if not orders_tensor_core:  # jax cannot lower waits on tensor-core barriers
            wait(barriers[1].as_barrier_memref(), i1(0))
        mgpu.vector_store(mlir_math.exp(x), out_ref)

    shape = sds((128, 128), F32)
    same_as_jax(body, [shape], [shape], barrier)


@NO_WAIT_OP
def test_wait_on_a_tensor_core_barrier_fences_the_tensor_core():
    """jax's lowering asserts here; smalti waits and orders the tensor core."""
    barrier = mosaic_gpu.Barrier(arrival_count=1, num_barriers=1, orders_tensor_core=True)

    def body(ctx, x_ref, out_ref, barriers):
        mgpu.wait(barriers.as_barrier_memref(), i1(1))
        mgpu.vector_store(mgpu.vector_load(x_ref), out_ref)

    shape = sds((128,), F32)
    kernel = kernels.build_kernel(body, [shape], [shape], smem_scratch=barrier)
    smalti_infer(kernel)
    smalti_lower(kernel)
    text = normalized(kernel.module)
    assert "mbarrier.try_wait.parity" in text
    assert "tcgen05.fence" in text


# --- strict layout casts (jax >= 0.12) ------------------------------------------------

#: jax 0.12 added a ``strict`` attribute to mosaic_gpu.layout_cast.
HAS_STRICT_CAST = "strict" in dir(mgpu.LayoutCastOp)
NO_STRICT_CAST = pytest.mark.skipif(
    not HAS_STRICT_CAST, reason="mosaic_gpu.layout_cast has no strict attribute before jax 0.12")


@NO_STRICT_CAST
def test_a_strict_layout_cast_allows_no_relayout():
    def body(ctx, x_ref, out_ref, smem):
        x = cast(mgpu.vector_load(x_ref, optimized=False), fa.WGMMA_LAYOUT)
        y = mgpu.layout_cast(x, mgpu_layouts.to_layout_attr(fa.WGMMA_TRANSPOSED_LAYOUT),
                             strict=True)
        mgpu.vector_store(y, out_ref, optimized=False)

    shape = sds((128, 128), F32)
    reference, candidate = build_twice(body, [shape], [shape])
    with pytest.raises(ValueError, match="Failed to infer a possible set of layouts"):
        jax_infer(reference)
    with pytest.raises(smalti.SmaltiValueError, match="Failed to infer a possible set of layouts"):
        smalti_infer(candidate)


@NO_STRICT_CAST
@pytest.mark.parametrize("strict", [False, True])
def test_a_cast_with_the_strict_attribute_is_inferred_like_jax(strict):
    def body(ctx, x_ref, out_ref, smem):
        x = mgpu.vector_load(x_ref, optimized=False)
        y = mgpu.layout_cast(x, mgpu_layouts.to_layout_attr(fa.WGMMA_LAYOUT), strict=strict)
        mgpu.vector_store(mlir_math.exp(y), out_ref, optimized=False)

    shape = sds((128, 128), F32)
    same_as_jax(body, [shape], [shape])


# --- assume_multiple ------------------------------------------------------------------


def test_assume_multiple_is_replaced_by_its_value():
    def body(ctx, x_ref, out_ref, idx_ref, smem):
        i32 = ir.IntegerType.get_signless(32)
        block = arith.index_cast(i32, gpu.block_id(gpu.Dimension.x))
        hinted = mgpu.assume_multiple(block, 16)
        memref.store(hinted, idx_ref, [arith.constant(ir.IndexType.get(), 0)])
        mgpu.vector_store(mgpu.vector_load(x_ref), out_ref)

    shape = sds((128,), F32)
    reference, candidate = build_twice(body, [shape], [shape, sds((1,), I32)])
    assert "mosaic_gpu.assume_multiple" in normalized(candidate.module)
    jax_infer(reference)
    jax_lower(reference)
    smalti_infer(candidate)
    smalti_lower(candidate)
    assert normalized(candidate.module) == normalized(reference.module)
    assert "mosaic_gpu.assume_multiple" not in normalized(candidate.module)


# --- custom_primitive --------------------------------------------------------------------


def _layout_attr(layout) -> ir.Attribute:
    return mgpu_layouts.to_layout_attr(layout)


def custom_primitive(operands: Sequence[ir.Value], fn: Callable[..., Sequence], *,
                     in_layouts=(), in_transforms=(), out_types=(), out_layouts=()
                     ) -> list[ir.Value]:
    """Builds a mosaic_gpu.custom_primitive the way Pallas' inline_mgpu does:
    the body gets vectors as FragmentedArrays and SMEM refs as transformed refs,
    and returns FragmentedArrays (or scalars)."""
    op = mgpu.CustomPrimitiveOp(
        result=list(out_types), operands_=list(operands),
        in_layouts=[_layout_attr(layout) for layout in in_layouts],
        in_transforms=[ir.ArrayAttr.get(list(t)) for t in in_transforms],
        out_layouts=[_layout_attr(layout) for layout in out_layouts])
    block = op.body.blocks.append(*[o.type for o in operands])
    with ir.InsertionPoint(block):
        layouts, transforms = iter(in_layouts), iter(in_transforms)
        args = []
        for arg in block.arguments:
            if isinstance(arg.type, ir.VectorType):
                args.append(_unwrap_vector(arg, next(layouts)))
            elif isinstance(arg.type, ir.MemRefType) and arg.type.memory_space is not None:
                attr = ir.ArrayAttr.get(list(next(transforms)))
                physical = dialect_lowering.transform_type(arg.type, attr)
                args.append(builtin.UnrealizedConversionCastOp([physical], [arg]).result)
            else:
                args.append(arg)
        returned = fn(*args)
        mgpu.return_([
            dialect_lowering.fragmented_array_to_ir(r, t) if isinstance(r, fa.FragmentedArray)
            else r for r, t in zip(returned, out_types, strict=True)])
    return list(op.results)


def _unwrap_vector(arg: ir.Value, layout) -> fa.FragmentedArray:
    vector = ir.VectorType(arg.type)
    shape = layout.registers_shape(tuple(vector.shape))
    register = layout.registers_element_type(vector.element_type)
    unwrap = builtin.UnrealizedConversionCastOp([register] * math.prod(shape), [arg])
    unwrap.attributes["layout"] = _layout_attr(layout)
    registers = np.array(list(unwrap.results)).reshape(shape)
    return fa.FragmentedArray(_registers=registers, _layout=layout, _is_signed=None)


STRIDED = fa.WGStridedFragLayout((128, 128), 2)


@pytest.mark.parametrize("in_layout, out_layout", [
    (fa.WGMMA_LAYOUT, fa.WGMMA_LAYOUT), (STRIDED, STRIDED),
    (fa.WGMMA_LAYOUT, fa.TCGEN05_LAYOUT), (STRIDED, fa.WGMMA_LAYOUT),
])
def test_custom_primitive_consuming_and_producing_vectors(in_layout, out_layout):
    def body(ctx, x_ref, y_ref, out_ref, smem):
        x, y = mgpu.vector_load(x_ref), mgpu.vector_load(y_ref)

        def lane_level(a, b):
            if in_layout == out_layout:
                return [a * b]
            one = arith.constant(ir.F32Type.get(), 1.0)
            return [fa.FragmentedArray.splat(one, a.shape, out_layout)]

        [z] = custom_primitive([x, y], lane_level, in_layouts=[in_layout, in_layout],
                               out_types=[x.type], out_layouts=[out_layout])
        mgpu.vector_store(arith.addf(z, splat(z, 1.0)), out_ref)

    shape = sds((128, 128), F32)
    reference, candidate = same_as_jax(body, [shape, shape], [shape])
    assert "mosaic_gpu.custom_primitive" not in normalized(candidate.module)


def test_custom_primitive_with_a_splat_operand_and_a_scalar():
    def body(ctx, x_ref, out_ref, smem):
        x = mgpu.vector_load(x_ref)
        two = splat(x, 2.0)
        scale = arith.constant(ir.F32Type.get(), 0.5)

        def lane_level(a, s):
            return [a * fa.FragmentedArray.splat(s, a.shape, a.layout)]

        [z] = custom_primitive([two, scale], lane_level, in_layouts=[fa.WGMMA_LAYOUT],
                               out_types=[x.type], out_layouts=[fa.WGMMA_LAYOUT])
        mgpu.vector_store(arith.mulf(z, cast(x, fa.WGMMA_LAYOUT)), out_ref)

    shape = sds((128, 128), F32)
    same_as_jax(body, [shape], [shape])


def test_custom_primitive_with_an_smem_ref_pins_its_transforms():
    shape = sds((128, 128), F16)

    def body(ctx, x_ref, out_ref, smem):
        tiling = mgpu_layouts.to_transform_attr(lc.TileTransform((64, 64)))
        swizzle = mgpu_layouts.to_transform_attr(mgpu.SwizzlingMode.k128ByteSwizzle)
        mgpu.vector_store(mgpu.vector_load(x_ref), smem)
        custom_primitive([smem], lambda ref: [], in_transforms=[[tiling, swizzle]])
        mgpu.vector_store(mgpu.vector_load(smem), out_ref)

    _, candidate = same_as_jax(body, [shape], [shape], shape)
    assert "TileTransform" not in normalized(candidate.module)


def test_custom_primitive_without_layouts_keeps_inference_out_of_its_body():
    """Pallas wraps Lane-level code (inline PTX, semaphores) in custom
    primitives with no vector operands: the body's register vectors must not
    be mistaken for Warpgroup vectors."""
    def body(ctx, x_ref, out_ref, smem):
        def lane_level():
            registers = fa.FragmentedArray.splat(
                arith.constant(ir.F32Type.get(), 1.0), (128, 128),
                fa.WGMMA_LAYOUT)
            dialect_lowering.fragmented_array_to_ir(registers, ir.VectorType.get(
                (128, 128), ir.F32Type.get()))
            return []

        custom_primitive([], lane_level)
        mgpu.vector_store(mgpu.vector_load(x_ref), out_ref)

    shape = sds((128, 128), F32)
    reference, candidate = build_twice(body, [shape], [shape])
    assert "vector<128x128xf32>" in str(candidate.module.body)
    same_as_jax(body, [shape], [shape])


# --- warp_map ---------------------------------------------------------------------------


def warp_map(operands: Sequence[ir.Value], fn: Callable[..., None]) -> None:
    op = mgpu.WarpMapOp(list(operands))
    with ir.InsertionPoint(op.body):
        fn(*op.body.arguments)


@pytest.mark.parametrize("orders_tensor_core", [False, True])
def test_warp_map_arrives_per_warp(orders_tensor_core):
    barrier = mosaic_gpu.Barrier(arrival_count=1, num_barriers=1,
                                 orders_tensor_core=orders_tensor_core)

    def body(ctx, x_ref, out_ref, barriers):
        mgpu.vector_store(mgpu.vector_load(x_ref), out_ref)
        ref = barriers.as_barrier_memref()

        def per_warp(bar):
            mgpu.ArriveOp(bar, orders_tensor_core=orders_tensor_core)
            mgpu.ArriveOp(bar, orders_tensor_core=orders_tensor_core, predicate=i1(1))

        warp_map([ref], per_warp)
        if not orders_tensor_core:
            wait(ref, i1(0))

    shape = sds((128, 128), F32)
    _, candidate = same_as_jax(body, [shape], [shape], barrier)
    assert "mosaic_gpu.warp_map" not in normalized(candidate.module)


def test_warp_map_with_a_custom_primitive_and_an_smem_ref():
    shape = sds((128, 128), F16)

    def body(ctx, x_ref, out_ref, smem):
        mgpu.vector_store(mgpu.vector_load(x_ref), smem)

        def per_warp(ref):
            custom_primitive([ref], lambda r: [], in_transforms=[[]])

        warp_map([smem], per_warp)
        mgpu.vector_store(mgpu.vector_load(smem), out_ref)

    same_as_jax(body, [shape], [shape], shape)


def test_vector_op_inside_a_warp_map_is_refused_before_lowering_starts():
    shape = sds((128,), F32)

    def body(ctx, x_ref, out_ref, smem):
        warp_map([x_ref, out_ref], lambda x, out: mgpu.vector_store(mgpu.vector_load(x), out))

    reference, candidate = build_twice(body, [shape], [shape])
    jax_infer(reference)
    smalti_infer(candidate)
    with pytest.raises(NotImplementedError, match="does not support warp semantics"):
        jax_lower(reference)
    inferred = normalized(candidate.module)
    with pytest.raises(smalti.SmaltiNotImplementedError) as error:
        smalti_lower(candidate)
    assert error.value.code == "SM204"
    assert "mosaic_gpu.vector_load" in str(error.value)
    assert normalized(candidate.module) == inferred  # nothing was rewritten


@pytest.mark.parametrize("op", ["debug_print", "assume_multiple",
                                pytest.param("wait", marks=NO_WAIT_OP), "mma"])
def test_ops_jax_does_not_lower_per_warp_are_refused(op):
    barrier = mosaic_gpu.Barrier(arrival_count=1, num_barriers=1)
    shape = sds((64, 32), F32)

    def body(ctx, x_ref, out_ref, barriers):
        ref = barriers.as_barrier_memref()

        def per_warp(bar, x_ref, out_ref):
            if op == "debug_print":
                mgpu.debug_print("{}", mgpu.vector_load(x_ref))
            elif op == "assume_multiple":
                hinted = mgpu.assume_multiple(arith.constant(ir.IndexType.get(), 32), 16)
                memref.store(arith.constant(ir.F32Type.get(), 0.0), out_ref, [hinted, hinted])
            elif op == "wait":
                mgpu.wait(bar, i1(0))
            else:
                acc = mgpu.vector_load(x_ref)
                a = arith.constant(splat_type(F16, (64, 16)), _splat_attr(F16, (64, 16), 1))
                b = arith.constant(splat_type(F16, (16, 32)), _splat_attr(F16, (16, 32), 1))
                mgpu.vector_store(mgpu.mma(acc, a, b), out_ref)

        warp_map([ref, x_ref, out_ref], per_warp)

    reference, candidate = build_twice(body, [shape], [shape], barrier)
    jax_infer(reference)
    smalti_infer(candidate)
    with pytest.raises(NotImplementedError, match="does not support warp semantics"):
        jax_lower(reference)
    with pytest.raises(smalti.SmaltiNotImplementedError) as error:
        smalti_lower(candidate)
    assert error.value.code == "SM204"


def test_warp_map_cannot_capture_a_vector():
    """The dialect's verifier forbids it; inference of an unverified module
    says so too, before writing anything."""
    shape = sds((128,), F32)

    def body(ctx, x_ref, out_ref, smem):
        mgpu.vector_store(mgpu.vector_load(x_ref), out_ref)

    kernel = kernels.build_kernel(body, [shape], [shape])
    [load] = find_ops(kernel, "mosaic_gpu.vector_load")
    with kernel.context, ir.Location.unknown():
        [store] = find_ops(kernel, "mosaic_gpu.vector_store")
        with ir.InsertionPoint(store):
            mgpu.WarpMapOp([load.result])
    before = normalized(kernel.module)
    with pytest.raises(smalti.SmaltiValueError) as error:
        smalti_infer(kernel)
    assert error.value.code == "SM107"
    assert "mosaic_gpu.warp_map" in str(error.value)
    assert normalized(kernel.module) == before


# --- multimem_load_reduce -----------------------------------------------------------------


@pytest.mark.parametrize("dtype, reduction", [
    (F32, "Add"), (F16, "Max"), (BF16, "Min"),
    (I32, "Smax"), (I32, "Umin"), (I32, "And"), (I32, "Xor"), (I32, "Add"),
])
@pytest.mark.parametrize("layout", [None, fa.WGMMA_LAYOUT])
def test_multimem_load_reduce(dtype, reduction, layout):
    def body(ctx, x_ref, out_ref, smem):
        kind = getattr(mgpu.MultimemLoadReductionType, reduction)
        y = mgpu.multimem_load_reduce(x_ref, kind)
        if layout is not None:
            y = cast(y, layout)
        # Unoptimized, as jax 0.11 lowers an unset GMEM store: jax 0.12 has
        # no optimized plan for WGMMA-laid 16-bit values in GMEM.
        mgpu.vector_store(y, out_ref, optimized=False)

    shape = sds((128, 128), dtype)
    _, candidate = same_as_jax(body, [shape], [shape])
    assert "multimem.ld_reduce" in normalized(candidate.module)


# --- mma ---------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype, acc_dtype, m, n, k", [
    (F16, F32, 64, 32, 16),
    (BF16, F32, 64, 8, 32),
    (F16, F32, 32, 16, 16),
    (F16, F32, 16, 32, 16),
    (I8, I32, 64, 32, 32),
])
def test_mma_on_small_tiles(dtype, acc_dtype, m, n, k):
    def body(ctx, acc_ref, out_ref, smem):
        acc = mgpu.vector_load(acc_ref)
        # MMA operand layouts cannot be loaded from GMEM: splats relayout to them.
        a = arith.constant(splat_type(dtype, (m, k)), _splat_attr(dtype, (m, k), 1))
        b = arith.constant(splat_type(dtype, (k, n)), _splat_attr(dtype, (k, n), 2))
        mgpu.vector_store(mgpu.mma(acc, a, b), out_ref)

    shape = sds((m, n), acc_dtype)
    _, candidate = same_as_jax(body, [shape], [shape])
    assert "mma.sync" in normalized(candidate.module)


def splat_type(dtype, shape) -> ir.Type:
    element = mosaic_gpu.utils.dtype_to_ir_type(dtype)
    return ir.VectorType.get(shape, element)


def _splat_attr(dtype, shape, value) -> ir.Attribute:
    ty = splat_type(dtype, shape)
    element = ty.element_type
    scalar = (ir.IntegerAttr.get(element, value) if isinstance(element, ir.IntegerType)
              else ir.FloatAttr.get(element, float(value)))
    return ir.DenseElementsAttr.get_splat(ty, scalar)


def find_ops(kernel: kernels.Kernel, name: str) -> list[ir.Operation]:
    return ops_named(kernel.module, name)


def test_mma_infers_the_mma_layouts():
    m, n, k = 64, 32, 16

    def body(ctx, acc_ref, out_ref, smem):
        acc = mgpu.vector_load(acc_ref)
        a = arith.constant(splat_type(F16, (m, k)), _splat_attr(F16, (m, k), 1))
        b = arith.constant(splat_type(F16, (k, n)), _splat_attr(F16, (k, n), 1))
        mgpu.vector_store(mgpu.mma(acc, a, b), out_ref)

    kernel = kernels.build_kernel(body, [sds((m, n), F32)], [sds((m, n), F32)])
    smalti.infer_layouts(kernel.module)
    [op] = find_ops(kernel, "mosaic_gpu.mma")
    with kernel.context:
        layouts = MMALayouts.for_shape(ir.F16Type.get(), m, n)
        expected = [_layout_attr(layouts.acc), _layout_attr(layouts.lhs),
                    _layout_attr(layouts.rhs)]
        assert list(ir.ArrayAttr(op.attributes["in_layouts"])) == expected
        assert list(ir.ArrayAttr(op.attributes["out_layouts"])) == expected[:1]


def test_mma_with_a_shape_mma_layouts_cannot_tile():
    def body(ctx, acc_ref, out_ref, smem):
        acc = mgpu.vector_load(acc_ref)
        a = arith.constant(splat_type(F16, (8, 16)), _splat_attr(F16, (8, 16), 1))
        b = arith.constant(splat_type(F16, (16, 8)), _splat_attr(F16, (16, 8), 1))
        mgpu.vector_store(mgpu.mma(acc, a, b), out_ref)

    shape = sds((8, 8), F32)
    reference, candidate = build_twice(body, [shape], [shape])
    with pytest.raises(ValueError, match="m_warps"):
        jax_infer(reference)
    with pytest.raises(smalti.SmaltiValueError) as error:
        smalti_infer(candidate)
    assert error.value.code == "SM102"
    assert "mosaic_gpu.mma" in str(error.value)


# --- custom primitives whose declarations do not fit -------------------------------------


def _custom_primitive_kernel(layout=fa.WGMMA_LAYOUT):
    def body(ctx, x_ref, out_ref, smem):
        x = mgpu.vector_load(x_ref)
        [z] = custom_primitive([x], lambda a: [a], in_layouts=[layout], out_types=[x.type],
                               out_layouts=[layout])
        mgpu.vector_store(z, out_ref)

    shape = sds((128, 128), F32)
    return kernels.build_kernel(body, [shape], [shape])


def _redeclare(kernel: kernels.Kernel, name: str, layouts: list) -> None:
    """Rewrites a declared attribute after verification (what a buggy
    producer of the IR could hand to inference)."""
    [op] = find_ops(kernel, "mosaic_gpu.custom_primitive")
    with kernel.context:
        op.attributes[name] = ir.ArrayAttr.get([_layout_attr(layout) for layout in layouts])


@pytest.mark.parametrize("name, layouts, code", [
    ("in_layouts", [], "SM107"),
    ("out_layouts", [], "SM107"),
    ("in_layouts", [fa.WGStridedFragLayout((64, 128), 2)], "SM102"),
    ("out_layouts", [fa.WGSplatFragLayout((128,))], "SM102"),
])
def test_custom_primitive_declarations_that_do_not_fit(name, layouts, code):
    kernel = _custom_primitive_kernel()
    _redeclare(kernel, name, layouts)
    before = normalized(kernel.module)
    with pytest.raises(smalti.SmaltiValueError) as error:
        smalti_infer(kernel)
    assert error.value.code == code
    assert "mosaic_gpu.custom_primitive" in str(error.value)
    assert normalized(kernel.module) == before


def test_custom_primitive_transforms_must_be_a_tiling_then_a_swizzle():
    shape = sds((128, 128), F16)

    def body(ctx, x_ref, out_ref, smem):
        tiling = mgpu_layouts.to_transform_attr(lc.TileTransform((64, 64)))
        swizzle = mgpu_layouts.to_transform_attr(mgpu.SwizzlingMode.k128ByteSwizzle)
        mgpu.vector_store(mgpu.vector_load(x_ref), smem)
        custom_primitive([smem], lambda ref: [], in_transforms=[[swizzle, tiling]])

    reference, candidate = build_twice(body, [shape], [shape], shape)
    with pytest.raises(NotImplementedError, match="Unsupported transforms"):
        jax_infer(reference)
    with pytest.raises(smalti.SmaltiNotImplementedError, match="Unsupported transforms") as error:
        smalti_infer(candidate)
    assert error.value.code == "SM107"


def test_one_ref_declared_with_two_transforms_is_unsatisfiable():
    shape = sds((128, 128), F16)

    def body(ctx, x_ref, out_ref, smem):
        tiling = mgpu_layouts.to_transform_attr(lc.TileTransform((64, 64)))
        mgpu.vector_store(mgpu.vector_load(x_ref), smem)
        custom_primitive([smem], lambda ref: [], in_transforms=[[tiling]])
        custom_primitive([smem], lambda ref: [], in_transforms=[[]])

    reference, candidate = build_twice(body, [shape], [shape], shape)
    with pytest.raises(ValueError, match="Failed to infer"):
        jax_infer(reference)
    with pytest.raises(smalti.UnsatisfiableLayoutsError) as error:
        smalti_infer(candidate)
    assert "mosaic_gpu.custom_primitive" in str(error.value)


# --- everything together --------------------------------------------------------------------


def test_barriers_custom_primitive_warp_map_and_printing_in_one_kernel(capsys):
    barrier = mosaic_gpu.Barrier(arrival_count=1, num_barriers=2)
    shape = sds((128, 128), F32)

    def body(ctx, x_ref, out_ref, barriers):
        x = mgpu.vector_load(x_ref)
        [y] = custom_primitive([x], lambda a: [a * a], in_layouts=[fa.WGMMA_LAYOUT],
                               out_types=[x.type], out_layouts=[fa.WGMMA_LAYOUT])
        mgpu.print_layout("y: {}", y)
        mgpu.debug_print("y = {}", y)
        mgpu.vector_store(y, out_ref)
        first, second = barriers[0].as_barrier_memref(), barriers[1].as_barrier_memref()
        warp_map([first], lambda bar: mgpu.ArriveOp(bar, orders_tensor_core=False))
        wait(first, i1(0))
        barriers[1].arrive()
        wait(second, i1(0))
        mgpu.vector_store(mlir_math.exp(y), out_ref)

    text = infer_then_lower_printing(capsys, body, [shape], [shape], barrier)
    assert text == "y: WGMMA\n"


# --- through Pallas ----------------------------------------------------------------------------


def _pallas_same_as_jax(body, out_type, *args, **kernel_params) -> str:
    from jax.experimental.pallas import mosaic_gpu as plgpu

    import smalti.jax
    from tests.core.test_jax_integration import WARPGROUP, lower_capturing_modules

    call = plgpu.kernel(body, out_type=out_type, compiler_params=WARPGROUP, **kernel_params)
    by_jax = lower_capturing_modules(call, *args)
    with smalti.jax.installed():
        by_smalti = lower_capturing_modules(call, *args)
    assert len(by_smalti) == len(by_jax) == 1
    assert by_smalti == by_jax
    return by_smalti[0]


def test_pallas_print_layout_and_debug_print(capsys):
    from jax.experimental.pallas import mosaic_gpu as plgpu

    def kernel(x_ref, o_ref):
        x = x_ref[...]
        plgpu.print_layout("x: {}", x)
        jax.debug.print("x = {}", x)
        o_ref[...] = x + 1.0

    shape = sds((128, 128), F32)
    capsys.readouterr()
    _pallas_same_as_jax(kernel, shape, shape)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and lines[0] == lines[1] and lines[0].startswith("x: ")


@pytest.mark.parametrize("returned", ["same", "other"])
def test_pallas_inline_mgpu(returned):
    from jax.experimental.pallas import mosaic_gpu as plgpu

    strided = plgpu.Layout.WG_STRIDED((128, 128), vec_size=2)
    out_layout = strided if returned == "same" else plgpu.Layout.WGMMA

    def kernel(x_ref, o_ref):
        @plgpu.inline_mgpu(arg_types=(strided,), return_type=plgpu.ShapeDtypeStruct(
            (128, 128), jnp.float32, out_layout))
        def lane_level(ctx, x):
            if returned == "same":
                return x * 2.0
            two = arith.constant(ir.F32Type.get(), 2.0)
            return fa.FragmentedArray.splat(two, (128, 128), fa.WGMMA_LAYOUT)

        o_ref[...] = lane_level(x_ref[...]) + 1.0

    shape = sds((128, 128), F32)
    text = _pallas_same_as_jax(kernel, shape, shape)
    assert "mosaic_gpu.custom_primitive" not in text


def test_pallas_barriers_and_warp_map():
    from jax.experimental.pallas import mosaic_gpu as plgpu

    def kernel(x_ref, o_ref, barrier):
        @plgpu.warp_map
        def _(warp_id):
            plgpu.barrier_arrive(barrier)

        plgpu.barrier_wait(barrier)
        plgpu.barrier_arrive(barrier)
        plgpu.barrier_wait(barrier)
        o_ref[...] = x_ref[...] + 1.0

    shape = sds((128, 128), F32)
    text = _pallas_same_as_jax(kernel, shape, shape,
                               scratch_types=[plgpu.Barrier(num_arrivals=1)])
    assert "mbarrier.init" in text and "mosaic_gpu.warp_map" not in text


def test_pallas_multiple_of():
    from jax.experimental import pallas as pl

    def kernel(x_ref, o_ref):
        start = pl.multiple_of(jax.lax.axis_index("x") * 128, 128)
        o_ref[pl.ds(start, 128)] = x_ref[pl.ds(start, 128)] + 1.0

    shape = sds((256,), F32)
    _pallas_same_as_jax(kernel, shape, shape, grid=(2,), grid_names=("x",))


def test_pallas_mma():
    from jax.experimental.pallas import mosaic_gpu as plgpu

    def kernel(acc_ref, o_ref):
        product = plgpu.mma(jnp.zeros((64, 32), F32), jnp.ones((64, 16), F16),
                            jnp.ones((16, 32), F16))
        o_ref[...] = product

    shape = sds((64, 32), F32)
    text = _pallas_same_as_jax(kernel, shape, shape)
    assert "mma.sync" in text
