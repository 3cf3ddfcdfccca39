"""Vector-shaped ops (broadcasts, shape casts, slices, concatenation, reductions)
against jax's own pipeline, and the kernels smalti lowers beyond jax.

Where jax accepts a kernel, smalti's attributes and lowered IR must equal
jax's. Where jax rejects a valid kernel, the test first asserts jax's
rejection, then checks smalti's lowering: per-thread code equal (up to value
names and the dead casts that carried whole vectors) to what jax emits for
an equivalent kernel it accepts, or the expected register structure.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src.lib import mosaic_gpu_dialect as mgpu
from jax._src.lib.mlir import ir
from jax._src.lib.mlir.dialects import arith, vector
from jax._src.lib.mlir.dialects import math as mlir_math
from jax.experimental.mosaic.gpu import fragmented_array as fa
from jax.experimental.mosaic.gpu import layouts as mgpu_layouts

import smalti
from smalti import kernels, layouts
from smalti.constraints import Reduced, Reshaped
from smalti.layouts import RegisterLayout
from tests import differential
from tests.differential import (
    jax_infer,
    jax_lower,
    normalized,
    smalti_infer,
    smalti_lower,
)

F32, F16, BF16, I32 = jnp.float32, jnp.float16, jnp.bfloat16, jnp.int32
KIND = vector.CombiningKind
SCRATCH = jax.ShapeDtypeStruct((2048,), jnp.int8)  # dynamic SMEM for cross-warp reductions
TILED = [fa.WGMMA_LAYOUT, fa.TCGEN05_LAYOUT]


def sds(shape, dtype=F32):
    return jax.ShapeDtypeStruct(shape, dtype)


# --- kernel building blocks --------------------------------------------------------------


def cast(x: ir.Value, layout) -> ir.Value:
    return mgpu.layout_cast(x, mgpu_layouts.to_layout_attr(layout))


def element_type(x: ir.Value) -> ir.Type:
    return ir.VectorType(x.type).element_type


def scalar(ty: ir.Type, value) -> ir.Value:
    return arith.constant(ty, int(value) if isinstance(ty, ir.IntegerType) else float(value))


def splat(shape, ty: ir.Type, value) -> ir.Value:
    return vector.broadcast(ir.VectorType.get(list(shape), ty), scalar(ty, value))


def i32_attr(value: int) -> ir.Attribute:
    return ir.IntegerAttr.get(ir.IntegerType.get_signless(32), value)


def reduce(kind, x: ir.Value, axis: int, init) -> ir.Value:
    """A multi_reduction as Pallas emits it: splat accumulator, scratch attributes."""
    shape = [d for i, d in enumerate(ir.VectorType(x.type).shape) if i != axis]
    op = vector.MultiDimReductionOp(kind, x, splat(shape, element_type(x), init), [axis])
    op.attributes["offset"] = i32_attr(0)
    op.attributes["scratch_size"] = i32_attr(SCRATCH.shape[0])
    return op.result


def reduce_all(kind, x: ir.Value) -> ir.Value:
    op = vector.ReductionOp(element_type(x), kind, x)
    op.attributes["offset"] = i32_attr(0)
    return op.result


def bcast(x: ir.Value, shape, dims) -> ir.Value:
    return mgpu.broadcast_in_dim(ir.VectorType.get(list(shape), element_type(x)), x, list(dims))


def shape_cast(x: ir.Value, shape) -> ir.Value:
    return vector.shape_cast(ir.VectorType.get(list(shape), element_type(x)), x)


def load(ref: ir.Value, layout=None) -> ir.Value:
    x = mgpu.vector_load(ref)
    return x if layout is None else cast(x, layout)


def is_float(x: ir.Value) -> bool:
    return not isinstance(element_type(x), ir.IntegerType)


def add(a, b):
    return arith.addf(a, b) if is_float(a) else arith.addi(a, b)


def sub(a, b):
    return arith.subf(a, b) if is_float(a) else arith.subi(a, b)


# --- checking what jax rejects -------------------------------------------------------------


def skeleton(module: ir.Module) -> list[str]:
    """The per-thread code: without the (dead) casts that carried whole vectors
    between rules, with values renamed in order of appearance."""
    names: dict[str, str] = {}

    def rename(match: re.Match) -> str:
        return names.setdefault(match.group(0), f"%v{len(names)}")

    lines = [line for line in normalized(module).splitlines()
             if not ("unrealized_conversion_cast" in line and "layout =" in line)]
    return [re.sub(r"%[A-Za-z0-9_]+", rename, line) for line in lines]


def assert_same_as_jax(body, ins, outs, *, lower: bool = True, scratch=SCRATCH):
    """tests.differential.assert_same_as_jax, with dynamic SMEM for reductions."""
    return differential.assert_same_as_jax(body, ins, outs, lower=lower, smem_scratch=scratch)


def jax_rejects(body, ins, outs, error, match, *, scratch=()) -> None:
    reference = kernels.build_kernel(body, ins, outs, smem_scratch=scratch)
    with pytest.raises(error, match=match):
        jax_infer(reference)
        jax_lower(reference)


def smalti_lowers(body, ins, outs, *, scratch=()) -> kernels.Kernel:
    kernel = kernels.build_kernel(body, ins, outs, smem_scratch=scratch)
    smalti_infer(kernel)
    smalti_lower(kernel)
    return kernel


def jax_lowers(body, ins, outs, *, scratch=()) -> kernels.Kernel:
    kernel = kernels.build_kernel(body, ins, outs, smem_scratch=scratch)
    jax_infer(kernel)
    jax_lower(kernel)
    return kernel


def assert_no_memory_relayout(kernel: kernels.Kernel) -> None:
    """Registers never go through SMEM: nothing is loaded from or stored to it."""
    accesses = [line for line in normalized(kernel.module).splitlines()
                if re.search(r"(vector|memref|llvm)\.(load|store)", line)
                and "workgroup" in line]
    assert not accesses


# --- each op alone -------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [F32, F16, I32])
def test_scalar_broadcast_is_splat(dtype):
    def body(ctx, x_ref, out_ref, smem):
        x = load(x_ref)
        mgpu.vector_store(add(x, splat((128, 64), element_type(x), 3)), out_ref)

    assert_same_as_jax(body, [sds((128, 64), dtype)], [sds((128, 64), dtype)])


REDUCTIONS = [
    (KIND.ADD, F32, 0.0), (KIND.MAXIMUMF, F32, float("-inf")), (KIND.MINIMUMF, F16, 1e4),
    (KIND.ADD, BF16, 0.0), (KIND.ADD, I32, 0), (KIND.MAXSI, I32, -(2**31)),
    (KIND.MINUI, I32, 2**31 - 1),
]


@pytest.mark.parametrize("layout", TILED, ids=["WGMMA", "TCGEN05"])
@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("kind,dtype,init", REDUCTIONS, ids=lambda v: str(v))
def test_multi_reduction(kind, dtype, init, axis, layout):
    def body(ctx, x_ref, out_ref, smem):
        mgpu.vector_store(reduce(kind, load(x_ref, layout), axis, init), out_ref)

    assert_same_as_jax(body, [sds((128, 128), dtype)], [sds((128,), dtype)])


@pytest.mark.parametrize("acc_ilp", [1, 2, 4])
@pytest.mark.parametrize("whole", [False, True], ids=["multi_reduction", "reduction"])
def test_reductions_with_an_acc_ilp_attribute(acc_ilp, whole):
    """Pallas sets ``acc_ilp`` (accumulators in flight per thread): jax 0.12's
    lowering passes it to the code generator, jax 0.11's ignores it."""
    def body(ctx, x_ref, out_ref, smem):
        if whole:
            x = load(x_ref)
            total = reduce_all(KIND.ADD, x)
            total.owner.attributes["acc_ilp"] = i32_attr(acc_ilp)
            mgpu.vector_store(add(x, vector.broadcast(x.type, total)), out_ref)
        else:
            reduced = reduce(KIND.ADD, load(x_ref, fa.WGMMA_LAYOUT), 1, 0.0)
            reduced.owner.attributes["acc_ilp"] = i32_attr(acc_ilp)
            mgpu.vector_store(reduced, out_ref)

    # (64, 256) rows: 32 registers per thread to accumulate, where acc_ilp
    # changes the code.
    shapes = ([sds((512,), F32)], [sds((512,), F32)]) if whole else \
        ([sds((64, 256), F32)], [sds((64,), F32)])
    assert_same_as_jax(body, *shapes)


@pytest.mark.parametrize("layout", TILED, ids=["WGMMA", "TCGEN05"])
def test_broadcast_back_of_a_reduction_follows_from_the_reduced_value(layout):
    """A reduction of a value that is never splat is never splat, and neither
    is what broadcasts it back (its reduction is that value): the solver
    links both to their users instead of searching the broadcast's layout,
    as it did once per reduction. Same layouts as jax's."""
    def body(ctx, x_ref, out_ref, smem):
        x = load(x_ref, layout)
        for _ in range(3):
            back = bcast(reduce(KIND.ADD, x, 1, 0.0), (128, 128), (0,))
            x = arith.subf(x, back)
        mgpu.vector_store(x, out_ref)

    assert_same_as_jax(body, [sds((128, 128))], [sds((128, 128))])
    kernel = kernels.build_kernel(body, [sds((128, 128))], [sds((128, 128))],
                                  smem_scratch=SCRATCH)
    report = smalti.infer_layouts(kernel.module, trace=True)
    why = [w for e in report.trace if e.op == "mosaic_gpu.broadcast_in_dim"
           for w in e.why["out_layouts"]]
    assert len(why) == 3
    assert all(w.startswith("forced by mosaic_gpu.layout_cast") for w in why), why


@pytest.mark.parametrize("dtype", [F32, I32])
def test_reduction_to_scalar_of_a_strided_vector(dtype):
    def body(ctx, x_ref, out_ref, smem):
        x = load(x_ref)
        total = reduce_all(KIND.ADD, x)
        mgpu.vector_store(add(x, vector.broadcast(x.type, total)), out_ref)

    assert_same_as_jax(body, [sds((512,), dtype)], [sds((512,), dtype)], )


@pytest.mark.parametrize("source_layout,dims,shape", [
    (fa.WGMMA_ROW_LAYOUT, (0,), (128, 64)),
    (fa.WGMMA_COL_LAYOUT, (1,), (128, 64)),
    (fa.TCGEN05_ROW_LAYOUT, (0,), (128, 32)),
])
def test_broadcast_in_dim_of_tiled_rows_and_columns(source_layout, dims, shape):
    source_shape = tuple(shape[d] for d in dims)

    def body(ctx, v_ref, x_ref, out_ref, smem):
        v = load(v_ref, source_layout)
        mgpu.vector_store(arith.addf(load(x_ref), bcast(v, shape, dims)), out_ref)

    assert_same_as_jax(body, [sds(source_shape), sds(shape)], [sds(shape)])


@pytest.mark.parametrize("source,shape,dims", [
    ((256,), (4, 256), (1,)),
    ((1, 256), (8, 256), (0, 1)),
    ((128,), (2, 4, 128), (2,)),
])
def test_broadcast_in_dim_of_strided_leading_dims(source, shape, dims):
    def body(ctx, v_ref, out_ref, smem):
        mgpu.vector_store(mlir_math.exp(bcast(load(v_ref), shape, dims)), out_ref)

    assert_same_as_jax(body, [sds(source)], [sds(shape)])


@pytest.mark.parametrize("layout,target", [
    (fa.WGMMA_LAYOUT, (2, 64, 128)),
    (fa.WGMMA_LAYOUT, (1, 128, 128)),
    (None, (16384,)),
    (None, (64, 256)),
])
def test_shape_cast(layout, target):
    def body(ctx, x_ref, out_ref, smem):
        mgpu.vector_store(mlir_math.exp(shape_cast(load(x_ref, layout), target)), out_ref)

    assert_same_as_jax(body, [sds((128, 128))], [sds(target)])


@pytest.mark.parametrize("dtype", [F32, F16])
def test_extract_strided_slice_and_insert_strided_slice(dtype):
    def body(ctx, x_ref, out_ref, smem):
        x = load(x_ref, fa.WGMMA_LAYOUT)
        ty = ir.VectorType.get([64, 128], element_type(x))
        bottom = vector.extract_strided_slice(ty, x, [64, 0], [64, 128], [1, 1])
        doubled = arith.addf(bottom, bottom)
        mgpu.vector_store(vector.insert_strided_slice(doubled, x, [0, 0], [1, 1]), out_ref)

    assert_same_as_jax(body, [sds((128, 128), dtype)], [sds((128, 128), dtype)])


def test_extract_of_a_sub_vector_and_of_a_scalar():
    def body(ctx, x_ref, out_ref, smem):
        x = load(x_ref, fa.WGMMA_LAYOUT)
        second = vector.extract(x, dynamic_position=[], static_position=[1])
        ty = element_type(x)
        one = vector.extract(splat((128, 128), ty, 1.0), dynamic_position=[],
                             static_position=[0, 0])
        mgpu.vector_store(arith.addf(second, vector.broadcast(second.type, one)), out_ref)

    assert_same_as_jax(body, [sds((2, 128, 128))], [sds((128, 128))])


@pytest.mark.parametrize("layout", TILED, ids=["WGMMA", "TCGEN05"])
@pytest.mark.parametrize("dimension", [0, 1])
def test_vector_concat(layout, dimension):
    half = (64, 128) if dimension == 0 else (128, 64)
    if layout == fa.TCGEN05_LAYOUT and dimension == 0:
        half = (128, 128)

    def body(ctx, a_ref, b_ref, out_ref, smem):
        a, b = load(a_ref, layout), load(b_ref, layout)
        mgpu.vector_store(mgpu.vector_concat([a, b], dimension), out_ref)

    out = tuple(s * (1 + (i == dimension)) for i, s in enumerate(half))
    assert_same_as_jax(body, [sds(half), sds(half)], [sds(out)])


# --- realistic combinations ------------------------------------------------------------------


def softmax_rows(layout, *, rank3=False):
    """Row softmax; with ``rank3`` the (256, 128) input is viewed as (2, 128, 128)."""
    def body(ctx, x_ref, out_ref, smem):
        x = load(x_ref, layout)
        if rank3:
            x = shape_cast(x, (2, 128, 128))
        shape = tuple(ir.VectorType(x.type).shape)
        last, rows = len(shape) - 1, tuple(range(len(shape) - 1))
        top = reduce(KIND.MAXIMUMF, x, last, float("-inf"))
        e = mlir_math.exp(arith.subf(x, bcast(top, shape, rows)))
        total = reduce(KIND.ADD, e, last, 0.0)
        y = arith.divf(e, bcast(total, shape, rows))
        mgpu.vector_store(shape_cast(y, (256, 128)) if rank3 else y, out_ref)
    return body


@pytest.mark.parametrize("dtype", [F32, F16, BF16])
@pytest.mark.parametrize("layout", TILED, ids=["WGMMA", "TCGEN05"])
def test_softmax_rows(layout, dtype):
    assert_same_as_jax(softmax_rows(layout), [sds((128, 128), dtype)], [sds((128, 128), dtype)])


def layer_norm(layout, axis=1):
    """(x - mean) * rsqrt(var + eps) along ``axis``, mean and var by reductions."""
    def body(ctx, x_ref, out_ref, smem):
        x = load(x_ref, layout)
        shape = tuple(ir.VectorType(x.type).shape)
        f32 = element_type(x)
        kept = tuple(i for i in range(len(shape)) if i != axis)
        reduced = tuple(shape[i] for i in kept)
        n = splat(reduced, f32, shape[axis])
        mean = arith.divf(reduce(KIND.ADD, x, axis, 0.0), n)
        centered = arith.subf(x, bcast(mean, shape, kept))
        var = arith.divf(reduce(KIND.ADD, arith.mulf(centered, centered), axis, 0.0), n)
        scale = mlir_math.rsqrt(arith.addf(var, splat(reduced, f32, 1e-5)))
        mgpu.vector_store(arith.mulf(centered, bcast(scale, shape, kept)), out_ref)
    return body


@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("layout", TILED, ids=["WGMMA", "TCGEN05"])
def test_layer_norm(layout, axis):
    assert_same_as_jax(layer_norm(layout, axis), [sds((128, 128))], [sds((128, 128))])


@pytest.mark.parametrize("layout", TILED, ids=["WGMMA", "TCGEN05"])
def test_reduction_over_an_untiled_leading_dim(layout):
    """jax lowers this one (slicing scratch it does not need): same IR."""
    def body(ctx, x_ref, out_ref, smem):
        mgpu.vector_store(reduce(KIND.ADD, load(x_ref, layout), 0, 0.0), out_ref)

    assert_same_as_jax(body, [sds((2, 128, 128))], [sds((128, 128))])


def test_strided_total_broadcast_back():
    """The strided variant: a whole-vector reduction broadcast back as a splat."""
    def body(ctx, x_ref, out_ref, smem):
        x = load(x_ref)
        top = vector.broadcast(x.type, reduce_all(KIND.MAXIMUMF, x))
        e = mlir_math.exp(arith.subf(x, top))
        total = vector.broadcast(x.type, reduce_all(KIND.ADD, e))
        mgpu.vector_store(arith.divf(e, total), out_ref)

    for shape in [(1024,), (256,)]:
        reference = jax_lowers(body, [sds(shape)], [sds(shape)], scratch=SCRATCH)
        kernel = smalti_lowers(body, [sds(shape)], [sds(shape)], scratch=SCRATCH)
        assert normalized(kernel.module) == normalized(reference.module)


# --- errors ------------------------------------------------------------------------------------


def with_attribute(kernel: kernels.Kernel, op_name: str, name: str, value: str) -> None:
    """Sets an attribute the verifier would reject (as a hand-written or
    transformed module may carry): the rules must refuse it themselves."""
    def visit(op: ir.Operation) -> None:
        if op.name == op_name:
            op.attributes[name] = ir.Attribute.parse(value, kernel.context)
        for region in op.regions:
            for block in region.blocks:
                for child in block.operations:
                    visit(child.operation)

    visit(kernel.module.operation)


def test_non_unit_strides_are_refused_like_jax():
    def body(ctx, x_ref, out_ref, smem):
        x = load(x_ref, fa.WGMMA_LAYOUT)
        ty = ir.VectorType.get([64, 64], element_type(x))
        mgpu.vector_store(vector.extract_strided_slice(ty, x, [0, 0], [64, 64], [1, 1]),
                          out_ref)

    ins, outs = [sds((128, 128))], [sds((64, 64))]
    reference, kernel = (kernels.build_kernel(body, ins, outs) for _ in range(2))
    for k in (reference, kernel):
        with_attribute(k, "vector.extract_strided_slice", "strides", "[2, 1]")
    with pytest.raises(NotImplementedError, match="strides` must contain only 1s"):
        jax_infer(reference)
    before = normalized(kernel.module)
    with pytest.raises(NotImplementedError, match="strides` must contain only 1s") as error:
        smalti_infer(kernel)
    assert isinstance(error.value, smalti.SmaltiError) and error.value.code == "SM130"
    assert "vector.extract_strided_slice" in str(error.value) and error.value.fixes
    assert normalized(kernel.module) == before


def test_unsupported_reduction_kind_is_a_smalti_error():
    def body(ctx, x_ref, out_ref, smem):
        x = load(x_ref, fa.WGMMA_LAYOUT)
        mgpu.vector_store(reduce(KIND.XOR, x, 1, 0), out_ref)

    jax_rejects(body, [sds((128, 128), I32)], [sds((128,), I32)], NotImplementedError,
                "Unsupported reduction kind")
    kernel = kernels.build_kernel(body, [sds((128, 128), I32)], [sds((128,), I32)])
    smalti_infer(kernel)
    with pytest.raises(NotImplementedError, match="Unsupported reduction kind") as error:
        smalti_lower(kernel)  # jax's class and phrase
    assert error.value.code == "SM203" and "vector.multi_reduction" in str(error.value)


def test_bad_broadcast_dimensions_are_a_smalti_error():
    def body(ctx, v_ref, out_ref, smem):
        v = load(v_ref, fa.WGMMA_ROW_LAYOUT)
        mgpu.vector_store(bcast(v, (128, 128), (0,)), out_ref)

    kernel = kernels.build_kernel(body, [sds((128,))], [sds((128, 128))])
    with_attribute(kernel, "mosaic_gpu.broadcast_in_dim", "broadcast_dimensions",
                   "array<i64: 0, 1>")
    with pytest.raises(ValueError, match="cannot broadcast") as error:
        smalti_infer(kernel)
    assert isinstance(error.value, smalti.SmaltiError) and error.value.code == "SM130"


# --- beyond jax ----------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", TILED, ids=["WGMMA", "TCGEN05"])
def test_rank3_softmax_lowers_like_jax_does_rank2(layout):
    """(2, 128, 128) elementwise ops and last-axis reductions with an untiled
    leading dim: jax infers them but its lowering rejects the reduction.
    smalti's per-thread code is jax's for the same data viewed as (256, 128)."""
    ins, outs = [sds((256, 128))], [sds((256, 128))]
    jax_rejects(softmax_rows(layout, rank3=True), ins, outs, ValueError, "Invalid dimension")
    kernel = smalti_lowers(softmax_rows(layout, rank3=True), ins, outs)
    reference = jax_lowers(softmax_rows(layout), ins, outs)
    assert skeleton(kernel.module) == skeleton(reference.module)
    assert_no_memory_relayout(kernel)


# jax leaves a keep-dims reduction of a tiled layout unsolved: it either finds
# no layouts or trips over the unsolved constraint.
KEEP_DIMS_REJECTED = "Failed to infer|remaining unsatisfied constraints"


def mean_centered(layout, shape, axis, *, keep_dims):
    """x - mean(x, axis); with ``keep_dims`` as Pallas emits jnp.mean(...,
    keepdims=True): reduce, broadcast_in_dim to a size-1 dim, divide,
    broadcast_in_dim back."""
    def body(ctx, x_ref, out_ref, smem):
        x = load(x_ref, layout)
        f32 = element_type(x)
        others = tuple(i for i in range(len(shape)) if i != axis)
        total = reduce(KIND.ADD, x, axis, 0.0)
        if keep_dims:
            kept = tuple(1 if i == axis else d for i, d in enumerate(shape))
            mean = arith.divf(bcast(total, kept, others), splat(kept, f32, shape[axis]))
            back = bcast(mean, shape, range(len(shape)))
        else:
            reduced = tuple(shape[i] for i in others)
            back = bcast(arith.divf(total, splat(reduced, f32, shape[axis])), shape, others)
        mgpu.vector_store(arith.subf(x, back), out_ref)
    return body


@pytest.mark.parametrize("layout", TILED, ids=["WGMMA", "TCGEN05"])
@pytest.mark.parametrize("axis", [0, 1])
def test_keep_dims_mean_lowers_like_the_plain_mean(layout, axis):
    shape, ins = (128, 128), [sds((128, 128))]
    jax_rejects(mean_centered(layout, shape, axis, keep_dims=True), ins, ins,
                (ValueError, AssertionError), KEEP_DIMS_REJECTED, scratch=SCRATCH)
    kernel = smalti_lowers(mean_centered(layout, shape, axis, keep_dims=True), ins, ins,
                           scratch=SCRATCH)
    reference = jax_lowers(mean_centered(layout, shape, axis, keep_dims=False), ins, ins,
                           scratch=SCRATCH)
    assert skeleton(kernel.module) == skeleton(reference.module)
    # The size-1 dim lives in the tiling: (128, 1) is held like (128,).
    kept = "1x128" if axis == 0 else "128x1"
    assert f"vector<{kept}xf32> {{layout = #mosaic_gpu.TiledLayout" in normalized(kernel.module)


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_rank3_keep_dims_mean_lowers_like_the_plain_one(axis):
    shape, ins = (2, 128, 128), [sds((2, 128, 128))]
    jax_rejects(mean_centered(fa.WGMMA_LAYOUT, shape, axis, keep_dims=True), ins, ins,
                (ValueError, AssertionError), KEEP_DIMS_REJECTED, scratch=SCRATCH)
    jax_rejects(mean_centered(fa.WGMMA_LAYOUT, shape, axis, keep_dims=False), ins, ins,
                (ValueError, NotImplementedError),
                "Invalid dimension|scratch must be provided|Tiling rank different",
                scratch=SCRATCH)
    kept = smalti_lowers(mean_centered(fa.WGMMA_LAYOUT, shape, axis, keep_dims=True), ins, ins,
                         scratch=SCRATCH)
    plain = smalti_lowers(mean_centered(fa.WGMMA_LAYOUT, shape, axis, keep_dims=False), ins,
                          ins, scratch=SCRATCH)
    assert skeleton(kept.module) == skeleton(plain.module)
    if axis != 1:  # only the rows of the WGMMA layout are spread over warps
        assert_no_memory_relayout(kept)
    else:
        assert "gpu.barrier" in normalized(kept.module) or "bar.sync" in normalized(kept.module)


def test_shape_casts_adding_and_dropping_size_one_dims():
    """(128,) -> (128, 1) -> (1, 128, 1) -> (128,) around a row sum: jax
    cannot reshape tiled layouts there; smalti moves no register."""
    def body(ctx, x_ref, out_ref, smem, *, casts=True):
        x = load(x_ref, fa.WGMMA_LAYOUT)
        rows = reduce(KIND.ADD, x, 1, 0.0)
        for unary, shape in ((mlir_math.exp, (128, 1)), (mlir_math.tanh, (1, 128, 1)),
                             (arith.negf, (128,))):
            if casts:
                rows = shape_cast(rows, shape)
            rows = unary(rows)  # keeps the casts from folding into one
        mgpu.vector_store(arith.mulf(x, bcast(rows, (128, 128), (0,))), out_ref)

    ins = [sds((128, 128))]
    jax_rejects(body, ins, ins, ValueError, "Failed to infer")
    kernel = smalti_lowers(body, ins, ins)
    reference = jax_lowers(lambda *a: body(*a, casts=False), ins, ins)
    assert skeleton(kernel.module) == skeleton(reference.module)


def test_shape_cast_unit_dims_keep_registers():
    expanded = Reshaped(None, (128,), (128, 1)).apply(RegisterLayout(fa.WGMMA_ROW_LAYOUT))
    assert expanded.layout == layouts.insert_unit_dims(fa.WGMMA_ROW_LAYOUT, (1,))
    assert expanded.layout.registers_shape((128, 1)) != fa.WGMMA_ROW_LAYOUT.registers_shape((128,))
    assert np.prod(expanded.layout.registers_shape((128, 1))) == np.prod(
        fa.WGMMA_ROW_LAYOUT.registers_shape((128,)))
    back = Reshaped(None, (128, 1), (128,)).apply(expanded)
    assert back.layout == fa.WGMMA_ROW_LAYOUT
    # A reduction that keeps its dim gives the same layout as the reshape.
    kept = Reduced(None, (1,), 2, keep_dims=True).apply(RegisterLayout(fa.WGMMA_LAYOUT))
    assert kept == expanded


@pytest.mark.parametrize("source,dims", [((128,), (1,)), ((2, 128), (0, 1))])
def test_rank3_broadcast_repeats_registers(source, dims):
    """Broadcasting into (2, 128, 128) WGMMA: jax's lowering rejects a tiling
    of lower rank than the result. smalti repeats the 2-D broadcast's
    registers along the untiled leading dim."""
    shape = (2, 128, 128)

    def body(ctx, v_ref, out_ref, smem):
        mgpu.vector_store(bcast(load(v_ref, fa.WGMMA_ROW_LAYOUT), shape, dims), out_ref)

    ins, outs = [sds(source)], [sds(shape)]
    jax_rejects(body, ins, outs, NotImplementedError, "Tiling rank different")
    kernel = smalti_lowers(body, ins, outs)
    assert_no_memory_relayout(kernel)
    registers = _broadcast_registers(kernel)
    per_batch = int(np.prod(fa.WGMMA_LAYOUT.registers_shape((128, 128))))
    rows_per_thread = int(np.prod(fa.WGMMA_ROW_LAYOUT.registers_shape((128,))))
    assert len(registers) == 2 * per_batch
    first, second = registers[:per_batch], registers[per_batch:]
    assert len(set(first)) == len(set(second)) == rows_per_thread  # one register per row
    assert (first == second) == (source == (128,))  # shared rows, or each batch its own


def _broadcast_registers(kernel: kernels.Kernel) -> list[str]:
    """The registers of the (2, 128, 128) result: operands of the (dead) cast
    that carried it to the store."""
    [line] = [line for line in normalized(kernel.module).splitlines()
              if "unrealized_conversion_cast" in line and "to vector<2x128x128xf32>" in line]
    operands = line.split("unrealized_conversion_cast ")[1].split(" : ")[0]
    return [v.strip() for v in operands.split(",")]


def test_reduction_of_a_splat():
    """jax infers a splat source for a reduction of a splat but cannot lower it;
    smalti multiplies the value by the number of elements."""
    def body(ctx, out_ref, smem):
        ones = splat((128, 64), ir.F32Type.get(), 1.0)
        mgpu.vector_store(reduce(KIND.ADD, ones, 1, 0.0), out_ref)

    jax_rejects(body, [], [sds((128,))], NotImplementedError, "Unsupported layout")
    kernel = smalti_lowers(body, [], [sds((128,))])
    text = normalized(kernel.module)
    assert "arith.constant 6.400000e+01 : f32" in text and "arith.mulf" in text
    assert_no_memory_relayout(kernel)


def test_vector_broadcast_of_a_vector():
    """vector.broadcast of a vector is broadcast_in_dim along the trailing dims;
    jax only broadcasts scalars."""
    def body(ctx, v_ref, x_ref, out_ref, smem, *, as_vector_broadcast=True):
        v = load(v_ref, fa.WGMMA_COL_LAYOUT)
        x = load(x_ref, fa.WGMMA_LAYOUT)
        if as_vector_broadcast:
            b = vector.broadcast(x.type, v)
        else:
            b = bcast(v, (128, 128), (1,))
        mgpu.vector_store(arith.addf(x, b), out_ref)

    ins, outs = [sds((128,)), sds((128, 128))], [sds((128, 128))]
    jax_rejects(body, ins, outs, NotImplementedError, "Only vector broadcasts from scalars")
    kernel = smalti_lowers(body, ins, outs)
    reference = jax_lowers(lambda *a: body(*a, as_vector_broadcast=False), ins, outs)
    assert skeleton(kernel.module) == skeleton(reference.module)
