"""smalti against jax's own pipeline on elementwise kernels: equal attributes, equal IR."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src.lib import mosaic_gpu_dialect as mgpu
from jax._src.lib.mlir import ir
from jax._src.lib.mlir.dialects import arith
from jax._src.lib.mlir.dialects import math as mlir_math
from jax.experimental.mosaic.gpu import fragmented_array as fa
from jax.experimental.mosaic.gpu import layouts as mgpu_layouts

import smalti
from smalti import kernels
from tests.differential import assert_same_as_jax, jax_infer, jax_lower, normalized, smalti_infer

F32, F16, BF16, I32, I8 = jnp.float32, jnp.float16, jnp.bfloat16, jnp.int32, jnp.int8


def sds(shape, dtype):
    return jax.ShapeDtypeStruct(shape, dtype)


def splat(like: ir.Value, value) -> ir.Value:
    ty = ir.VectorType(like.type)
    element = ty.element_type
    attr = (ir.IntegerAttr.get(element, int(value)) if isinstance(element, ir.IntegerType)
            else ir.FloatAttr.get(element, float(value)))
    return arith.constant(ty, ir.DenseElementsAttr.get_splat(ty, attr))


def dense(like: ir.Value) -> ir.Value:
    ty = ir.VectorType(like.type)
    values = np.arange(int(np.prod(ty.shape)), dtype=np.float32).reshape(ty.shape)
    return arith.constant(ty, ir.DenseElementsAttr.get(values, type=ty))


def cast(x: ir.Value, layout) -> ir.Value:
    return mgpu.layout_cast(x, mgpu_layouts.to_layout_attr(layout))


def assert_applied_per_register(kernel, op_names, whole_type):
    """Each op was lowered to ops on registers, none on the whole vector."""
    lines = str(kernel.module).splitlines()
    for name in op_names:
        uses = [line for line in lines if f" {name} " in line]
        assert uses, f"{name} missing from the lowered module"
        assert not any(whole_type in line for line in uses)


FLOAT_SHAPES = [(128,), (256,), (128, 128), (64, 256), (2, 128, 64)]


@pytest.mark.parametrize("dtype", [F32, F16, BF16])
@pytest.mark.parametrize("shape", FLOAT_SHAPES)
def test_chain_with_splat_constant(shape, dtype):
    def body(ctx, x_ref, y_ref, out_ref, smem):
        x, y = mgpu.vector_load(x_ref), mgpu.vector_load(y_ref)
        z = arith.addf(arith.mulf(mlir_math.exp(x), splat(x, 2.0)), y)
        mgpu.vector_store(arith.subf(z, splat(z, 0.5)), out_ref)

    assert_same_as_jax(body, [sds(shape, dtype)] * 2, [sds(shape, dtype)])


@pytest.mark.parametrize("shape", [(128,), (128, 128)])
def test_diamond(shape):
    def body(ctx, x_ref, out_ref, smem):
        a = mgpu.vector_load(x_ref)
        left = mlir_math.exp(a)
        right = mlir_math.tanh(arith.mulf(a, splat(a, 3.0)))
        joined = arith.maximumf(left, right)
        mgpu.vector_store(arith.divf(joined, arith.addf(left, right)), out_ref)

    assert_same_as_jax(body, [sds(shape, F32)], [sds(shape, F32)])


def test_long_chain_of_every_float_op():
    unary = [mlir_math.exp, mlir_math.exp2, mlir_math.log, mlir_math.log2, mlir_math.sin,
             mlir_math.cos, mlir_math.tanh, mlir_math.sqrt, mlir_math.rsqrt, mlir_math.absf,
             mlir_math.round, mlir_math.roundeven, arith.negf]
    binary = [arith.addf, arith.subf, arith.mulf, arith.divf, arith.maximumf, arith.minimumf,
              mlir_math.copysign]

    def body(ctx, x_ref, y_ref, out_ref, smem):
        x, y = mgpu.vector_load(x_ref), mgpu.vector_load(y_ref)
        for op in unary:
            x = op(x)
        for op in binary:
            x = op(x, y)
        mgpu.vector_store(x, out_ref)

    shape = sds((128, 64), F32)
    assert_same_as_jax(body, [shape, shape], [shape])


def test_erf_and_atan2_which_jax_cannot_infer():
    def body(ctx, x_ref, y_ref, out_ref, smem):
        x, y = mgpu.vector_load(x_ref), mgpu.vector_load(y_ref)
        mgpu.vector_store(mlir_math.atan2(mlir_math.erf(x), y), out_ref)

    shape = sds((128, 64), F32)
    reference = kernels.build_kernel(body, [shape, shape], [shape])
    with pytest.raises(NotImplementedError, match="No layout inference rule"):
        jax_infer(reference)
    kernel = kernels.build_kernel(body, [shape, shape], [shape])
    smalti.infer_layouts(kernel.module)
    smalti.lower(kernel.module, kernel.launch_context)
    assert_applied_per_register(kernel, ("math.erf", "math.atan2"), "vector<128x64xf32>")


def test_remf_which_jax_cannot_lower():
    def body(ctx, x_ref, y_ref, out_ref, smem):
        x, y = mgpu.vector_load(x_ref), mgpu.vector_load(y_ref)
        mgpu.vector_store(arith.remf(x, y), out_ref)

    shape = sds((128, 128), F32)
    reference = kernels.build_kernel(body, [shape, shape], [shape])
    jax_infer(reference)
    inferred_by_jax = normalized(reference.module)
    with pytest.raises(TypeError):
        jax_lower(reference)
    kernel = kernels.build_kernel(body, [shape, shape], [shape])
    smalti.infer_layouts(kernel.module)
    assert normalized(kernel.module) == inferred_by_jax
    smalti.lower(kernel.module, kernel.launch_context)
    assert_applied_per_register(kernel, ("arith.remf",), "vector<128x128xf32>")


def test_integer_ops_comparisons_and_select():
    def body(ctx, x_ref, y_ref, out_ref, smem):
        x, y = mgpu.vector_load(x_ref), mgpu.vector_load(y_ref)
        v = arith.addi(x, y)
        for op in (arith.subi, arith.muli, arith.andi, arith.ori, arith.xori, arith.maxsi,
                   arith.minsi, arith.maxui, arith.minui, arith.divsi, arith.divui,
                   arith.remsi, arith.remui, arith.floordivsi):
            v = op(v, y)
        v = arith.shli(v, splat(v, 1))
        v = arith.shrsi(v, splat(v, 2))
        v = arith.shrui(v, splat(v, 1))
        v = mlir_math.absi(v)
        for predicate in (arith.CmpIPredicate.slt, arith.CmpIPredicate.uge, arith.CmpIPredicate.eq):
            mask = arith.cmpi(predicate, v, x)
            v = arith.select(mask, v, y)
        mgpu.vector_store(v, out_ref)

    shape = sds((128, 128), I32)
    assert_same_as_jax(body, [shape, shape], [shape])


def test_float_comparisons():
    def body(ctx, x_ref, y_ref, out_ref, smem):
        x, y = mgpu.vector_load(x_ref), mgpu.vector_load(y_ref)
        for predicate in (arith.CmpFPredicate.OLT, arith.CmpFPredicate.OGE,
                          arith.CmpFPredicate.OEQ, arith.CmpFPredicate.UNE):
            x = arith.select(arith.cmpf(predicate, x, y), x, y)
        mgpu.vector_store(x, out_ref)

    shape = sds((256,), F32)
    assert_same_as_jax(body, [shape, shape], [shape])


def test_conversions_and_bitcast():
    def body(ctx, x_ref, i_ref, out_ref, out_i_ref, smem):
        x, i = mgpu.vector_load(x_ref), mgpu.vector_load(i_ref)
        f16 = ir.VectorType.get(ir.VectorType(x.type).shape, ir.F16Type.get())
        i32 = ir.VectorType.get(ir.VectorType(x.type).shape, ir.IntegerType.get_signless(32))
        i8 = ir.VectorType.get(ir.VectorType(x.type).shape, ir.IntegerType.get_signless(8))
        half = arith.truncf(f16, x)
        back = arith.extf(x.type, half)
        as_int = arith.fptosi(i32, back)
        unsigned = arith.fptoui(i32, back)
        total = arith.addi(arith.addi(as_int, unsigned), i)
        narrow = arith.trunci(i8, total)
        wide = arith.addi(arith.extsi(i32, narrow), arith.extui(i32, narrow))
        floats = arith.addf(arith.sitofp(x.type, wide), arith.uitofp(x.type, wide))
        bits = arith.bitcast(i32, floats)
        mgpu.vector_store(arith.bitcast(x.type, bits), out_ref)
        mgpu.vector_store(bits, out_i_ref)

    shape = (128, 128)
    assert_same_as_jax(body, [sds(shape, F32), sds(shape, I32)],
                       [sds(shape, F32), sds(shape, I32)])


@pytest.mark.parametrize("layout", [fa.WGMMA_LAYOUT, fa.TCGEN05_LAYOUT, "strided"])
def test_layout_cast_propagates(layout):
    def body(ctx, x_ref, out_ref, smem):
        x = mgpu.vector_load(x_ref)
        target = fa.WGStridedFragLayout((128, 128), 4) if layout == "strided" else layout
        y = arith.addf(cast(x, target), splat(x, 1.0))
        mgpu.vector_store(mlir_math.exp(y), out_ref)

    shape = sds((128, 128), F32)
    assert_same_as_jax(body, [shape], [shape])


def test_tiled_to_tiled_cast():
    def body(ctx, x_ref, out_ref, smem):
        x = cast(mgpu.vector_load(x_ref), fa.WGMMA_LAYOUT)
        y = cast(arith.negf(x), fa.WGMMA_TRANSPOSED_LAYOUT)
        mgpu.vector_store(arith.negf(cast(y, fa.WGMMA_LAYOUT)), out_ref)

    shape = sds((128, 128), F32)
    assert_same_as_jax(body, [shape], [shape])


def test_unsupported_global_transfer_is_a_smalti_error():
    """Neither jax nor smalti can store WGMMA_TRANSPOSED registers to GMEM;
    smalti says which op and layouts, with the SM203 code."""
    def body(ctx, x_ref, out_ref, smem):
        x = cast(mgpu.vector_load(x_ref), fa.WGMMA_TRANSPOSED_LAYOUT)
        mgpu.vector_store(arith.negf(x), out_ref)

    shape = sds((128, 128), F32)
    reference, candidate = assert_same_as_jax(body, [shape], [shape], lower=False)
    with pytest.raises(fa.UnsupportedTransferError):
        jax_lower(reference)
    with pytest.raises(smalti.SmaltiError) as error:
        smalti.lower(candidate.module, candidate.launch_context)
    assert error.value.code == "SM203"
    assert "mosaic_gpu.vector_load" in str(error.value)
    assert "Tiled strides" in str(error.value)


def test_splat_broadcast_into_two_layouts():
    def body(ctx, x_ref, y_ref, out_ref, out2_ref, smem):
        one = None
        x = cast(mgpu.vector_load(x_ref), fa.WGMMA_LAYOUT)
        y = mgpu.vector_load(y_ref)
        one = splat(x, 1.0)
        mgpu.vector_store(arith.addf(x, one), out_ref)
        mgpu.vector_store(arith.addf(y, one), out2_ref)

    shape = sds((128, 128), F32)
    assert_same_as_jax(body, [shape, shape], [shape, shape])


def test_iota_and_optimization_barrier():
    def body(ctx, x_ref, out_ref, smem):
        x = mgpu.vector_load(x_ref)
        iota = mgpu.broadcasted_iota(x.type, 1)
        a, b = mgpu.optimization_barrier([x, iota])
        mgpu.vector_store(arith.addi(a, b), out_ref)

    shape = sds((128, 128), I32)
    assert_same_as_jax(body, [shape], [shape])


def test_stored_splat():
    def body(ctx, out_ref, smem):
        ty = ir.VectorType.get((128, 128), ir.F32Type.get())
        value = arith.constant(ty, ir.DenseElementsAttr.get_splat(
            ty, ir.FloatAttr.get(ir.F32Type.get(), 3.0)))
        mgpu.vector_store(mlir_math.exp(value), out_ref)

    assert_same_as_jax(body, [], [sds((128, 128), F32)])


def test_dense_constant_inference_matches_and_lowering_is_refused_like_jax():
    def body(ctx, x_ref, out_ref, smem):
        x = mgpu.vector_load(x_ref)
        mgpu.vector_store(arith.addf(x, dense(x)), out_ref)

    shape = sds((128, 128), F32)
    reference, candidate = assert_same_as_jax(body, [shape], [shape], lower=False)
    with pytest.raises(NotImplementedError):
        jax_lower(reference)
    with pytest.raises(smalti.SmaltiError) as error:
        smalti.lower(candidate.module, candidate.launch_context)
    assert isinstance(error.value, NotImplementedError) or isinstance(error.value, ValueError)
    assert error.value.code == "SM203"
    assert "splat" in str(error.value)


def test_mixing_smalti_inference_with_jax_lowering():
    def body(ctx, x_ref, out_ref, smem):
        x = cast(mgpu.vector_load(x_ref), fa.WGMMA_LAYOUT)
        mgpu.vector_store(arith.mulf(x, splat(x, 4.0)), out_ref)

    shape = sds((128, 128), F32)
    reference = kernels.build_kernel(body, [shape], [shape])
    mixed = kernels.build_kernel(body, [shape], [shape])
    jax_infer(reference)
    jax_lower(reference)
    smalti_infer(mixed)
    jax_lower(mixed)
    assert normalized(mixed.module) == normalized(reference.module)


def test_mixing_jax_inference_with_smalti_lowering():
    def body(ctx, x_ref, y_ref, out_ref, smem):
        x, y = mgpu.vector_load(x_ref), mgpu.vector_load(y_ref)
        mgpu.vector_store(arith.addf(mlir_math.exp(x), y), out_ref)

    shape = sds((256, 64), F16)
    reference = kernels.build_kernel(body, [shape, shape], [shape])
    mixed = kernels.build_kernel(body, [shape, shape], [shape])
    jax_infer(reference)
    jax_lower(reference)
    jax_infer(mixed)
    smalti.lower(mixed.module, mixed.launch_context)
    assert normalized(mixed.module) == normalized(reference.module)
