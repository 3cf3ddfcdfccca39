"""smalti against jax on structured control flow (scf.for, scf.while,
scf.index_switch; scf.if, which jax cannot handle with vectors): equal
attributes, equal lowered IR."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import pytest
from jax._src.lib import mosaic_gpu_dialect as mgpu
from jax._src.lib.mlir import ir
from jax._src.lib.mlir.dialects import arith, gpu, scf
from jax._src.lib.mlir.dialects import math as mlir_math
from jax.experimental.mosaic.gpu import fragmented_array as fa
from jax.experimental.mosaic.gpu import layouts as mgpu_layouts

import smalti
from smalti import kernels
from tests.differential import assert_same_as_jax, jax_infer, jax_lower, normalized, ops_named

F32, F16, BF16, I32 = jnp.float32, jnp.float16, jnp.bfloat16, jnp.int32
STRIDED = "strided"


def sds(shape, dtype) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, dtype)


# --- kernel building blocks ----------------------------------------------------------


def splat(like: ir.Value, value: float) -> ir.Value:
    ty = ir.VectorType(like.type)
    element = ty.element_type
    attr = (ir.IntegerAttr.get(element, int(value)) if isinstance(element, ir.IntegerType)
            else ir.FloatAttr.get(element, float(value)))
    return arith.constant(ty, ir.DenseElementsAttr.get_splat(ty, attr))


def add(a: ir.Value, b: ir.Value) -> ir.Value:
    is_int = isinstance(ir.VectorType(a.type).element_type, ir.IntegerType)
    return arith.addi(a, b) if is_int else arith.addf(a, b)


def cast(x: ir.Value, layout) -> ir.Value:
    if layout == STRIDED:
        return x
    return mgpu.layout_cast(x, mgpu_layouts.to_layout_attr(layout))


def index(value: int) -> ir.Value:
    return arith.constant(ir.IndexType.get(), value)


def block_x() -> ir.Value:
    """A scalar the compiler cannot fold: the block index."""
    return gpu.block_id(gpu.Dimension.x)


def fori(count: int, inits: Sequence[ir.Value],
         body: Callable[[ir.Value, list[ir.Value]], Sequence[ir.Value]]) -> list[ir.Value]:
    loop = scf.ForOp(index(0), index(count), index(1), list(inits))
    with ir.InsertionPoint(loop.body):
        scf.yield_(list(body(loop.induction_variable, list(loop.inner_iter_args))))
    return list(loop.results)


def while_loop(inits: Sequence[ir.Value],
               before: Callable[[list[ir.Value]], tuple[ir.Value, Sequence[ir.Value]]],
               after: Callable[[list[ir.Value]], Sequence[ir.Value]],
               result_types: Sequence[ir.Type] | None = None) -> list[ir.Value]:
    init_types = [v.type for v in inits]
    result_types = list(result_types or init_types)
    loop = scf.WhileOp(result_types, list(inits))
    before_block = loop.before.blocks.append(*init_types)
    with ir.InsertionPoint(before_block):
        condition, forwarded = before(list(before_block.arguments))
        scf.condition(condition, list(forwarded))
    after_block = loop.after.blocks.append(*result_types)
    with ir.InsertionPoint(after_block):
        scf.yield_(list(after(list(after_block.arguments))))
    return list(loop.results)


def switch(selector: ir.Value, types: Sequence[ir.Type],
           branches: Sequence[Callable[[], Sequence[ir.Value]]]) -> list[ir.Value]:
    """``branches[:-1]`` are cases 0, 1, ...; the last branch is the default."""
    op = scf.IndexSwitchOp(list(types), selector, list(range(len(branches) - 1)))
    regions = list(op.regions)
    for branch, region in zip(branches, [*regions[1:], regions[0]]):
        with ir.InsertionPoint(region.blocks[0]):
            scf.yield_(list(branch()))
    return list(op.results)


def if_else(condition: ir.Value, types: Sequence[ir.Type],
            then: Callable[[], Sequence[ir.Value]],
            otherwise: Callable[[], Sequence[ir.Value]]) -> list[ir.Value]:
    op = scf.IfOp(condition, list(types), has_else=True)
    with ir.InsertionPoint(op.then_block):
        scf.yield_(list(then()))
    with ir.InsertionPoint(op.else_block):
        scf.yield_(list(otherwise()))
    return list(op.results)


def block_x_is_zero() -> ir.Value:
    return arith.cmpi(arith.CmpIPredicate.eq, block_x(), index(0))


# --- for loops ----------------------------------------------------------------------


@pytest.mark.parametrize("layout", [STRIDED, fa.WGMMA_LAYOUT])
@pytest.mark.parametrize("dtype", [F32, F16, BF16, I32])
def test_fori_accumulates_into_a_splat_init(dtype, layout):
    def body(ctx, x_ref, out_ref, smem):
        x = cast(mgpu.vector_load(x_ref), layout)
        [acc] = fori(4, [splat(x, 0)], lambda i, c: [add(c[0], x)])
        mgpu.vector_store(acc, out_ref)

    shape = sds((128, 128), dtype)
    assert_same_as_jax(body, [shape], [shape])


@pytest.mark.parametrize("shape", [(256,), (2, 128, 64)])
def test_fori_accumulator_of_other_ranks(shape):
    def body(ctx, x_ref, out_ref, smem):
        x = mgpu.vector_load(x_ref)
        [acc] = fori(3, [splat(x, 1.0)], lambda i, c: [arith.mulf(c[0], x)])
        mgpu.vector_store(acc, out_ref)

    assert_same_as_jax(body, [sds(shape, F32)], [sds(shape, F32)])


def test_layout_cast_inside_the_loop_decides_the_carried_layout():
    def body(ctx, x_ref, out_ref, smem):
        x = mgpu.vector_load(x_ref)
        [acc] = fori(4, [splat(x, 0.0)],
                     lambda i, c: [arith.addf(c[0], cast(x, fa.WGMMA_LAYOUT))])
        mgpu.vector_store(acc, out_ref)

    shape = sds((128, 128), F32)
    assert_same_as_jax(body, [shape], [shape])


@pytest.mark.parametrize("after", [fa.WGMMA_LAYOUT, fa.WGMMA_TRANSPOSED_LAYOUT, STRIDED])
def test_carried_layout_is_decided_by_a_use_after_the_loop(after):
    """Inside the loop everything is splat: the layout flows back from the
    use after it (a cast, or an add with a loaded value)."""
    def body(ctx, x_ref, out_ref, smem):
        x = mgpu.vector_load(x_ref)
        [acc] = fori(4, [splat(x, 0.0)], lambda i, c: [arith.addf(c[0], splat(x, 1.0))])
        mgpu.vector_store(arith.addf(cast(acc, after), cast(x, after)), out_ref)

    shape = sds((128, 128), F32)
    # Neither jax nor smalti can store WGMMA_TRANSPOSED registers to GMEM.
    assert_same_as_jax(body, [shape], [shape], lower=after != fa.WGMMA_TRANSPOSED_LAYOUT)


def test_all_splat_loop_stays_splat():
    def body(ctx, out_ref, smem):
        ty = ir.VectorType.get((128, 128), ir.F32Type.get())
        zero = arith.constant(ty, ir.DenseElementsAttr.get_splat(
            ty, ir.FloatAttr.get(ir.F32Type.get(), 0.0)))
        [acc] = fori(4, [zero], lambda i, c: [arith.addf(c[0], splat(c[0], 2.0))])
        mgpu.vector_store(acc, out_ref)

    reference, candidate = assert_same_as_jax(body, [], [sds((128, 128), F32)], lower=False)
    assert "WGSplatFragLayout" in str(candidate.module)


def test_several_carried_values_with_different_layouts_and_a_scalar():
    def body(ctx, x_ref, y_ref, out_ref, out2_ref, smem):
        x = cast(mgpu.vector_load(x_ref), fa.WGMMA_LAYOUT)
        y = mgpu.vector_load(y_ref)

        def step(i, carried):
            a, count, b = carried
            return [arith.addf(a, x), arith.addi(count, i), arith.mulf(b, y)]

        a, count, b = fori(5, [splat(x, 0.0), index(0), splat(y, 1.0)], step)
        mgpu.vector_store(a, out_ref)
        mgpu.vector_store(b, out2_ref)

    shape = sds((128, 128), F32)
    assert_same_as_jax(body, [shape, shape], [shape, shape])


@pytest.mark.parametrize("layout", [STRIDED, fa.WGMMA_LAYOUT])
def test_nested_loops(layout):
    def body(ctx, x_ref, out_ref, smem):
        x = cast(mgpu.vector_load(x_ref), layout)

        def outer(i, carried):
            [inner] = fori(3, [carried[0]], lambda j, c: [arith.addf(c[0], x)])
            return [mlir_math.exp(inner)]

        [acc] = fori(2, [splat(x, 0.0)], outer)
        mgpu.vector_store(acc, out_ref)

    shape = sds((128, 128), F32)
    assert_same_as_jax(body, [shape], [shape])


def test_loop_without_carried_vectors_keeps_its_op():
    """Only the vector ops inside are lowered; the loop is the same op."""
    def body(ctx, x_ref, out_ref, smem):
        def step(i, carried):
            x = mgpu.vector_load(x_ref)
            mgpu.vector_store(mlir_math.exp(x), out_ref)
            return [arith.addi(carried[0], i)]

        fori(4, [index(1)], step)

    shape = sds((128, 128), F32)
    reference, candidate = assert_same_as_jax(body, [shape], [shape])
    assert "scf.for %arg14 = %c0 to %c4 step %c1 iter_args(%arg15 = %c1) -> (index)" in \
        normalized(candidate.module)


def test_loop_of_scalars_only_is_unchanged():
    def body(ctx, x_ref, out_ref, smem):
        [total] = fori(4, [index(1)], lambda i, c: [arith.muli(c[0], i)])
        x = mgpu.vector_load(x_ref)
        mgpu.vector_store(x, out_ref)
        del total

    shape = sds((256,), F32)
    assert_same_as_jax(body, [shape], [shape])


# --- while loops ----------------------------------------------------------------------


def _i32(value: int) -> ir.Value:
    return arith.constant(ir.IntegerType.get_signless(32), value)


@pytest.mark.parametrize("layout", [STRIDED, fa.WGMMA_LAYOUT])
@pytest.mark.parametrize("dtype", [F32, BF16])
def test_while_loop_carries_a_vector(dtype, layout):
    def body(ctx, x_ref, out_ref, smem):
        x = cast(mgpu.vector_load(x_ref), layout)
        limit = arith.index_cast(ir.IntegerType.get_signless(32), block_x())

        def before(args):
            count, acc = args
            return arith.cmpi(arith.CmpIPredicate.slt, count, limit), [count, acc]

        def after(args):
            count, acc = args
            return [arith.addi(count, _i32(1)), arith.addf(acc, x)]

        _, acc = while_loop([_i32(0), splat(x, 0.0)], before, after)
        mgpu.vector_store(acc, out_ref)

    shape = sds((128, 128), dtype)
    assert_same_as_jax(body, [shape], [shape])


def test_while_loop_whose_regions_change_the_values():
    """The before region forwards new values (with another element count);
    layouts flow through both regions and back out of the results."""
    def body(ctx, x_ref, out_ref, smem):
        x = mgpu.vector_load(x_ref)
        limit = arith.index_cast(ir.IntegerType.get_signless(32), block_x())

        def before(args):
            count, acc = args
            return (arith.cmpi(arith.CmpIPredicate.slt, count, limit),
                    [mlir_math.exp(acc), count])

        def after(args):
            doubled, count = args
            return [arith.addi(count, _i32(1)), arith.addf(doubled, x)]

        types = [x.type, ir.IntegerType.get_signless(32)]
        result, _ = while_loop([_i32(0), splat(x, 0.0)], before, after, types)
        mgpu.vector_store(cast(result, fa.WGMMA_LAYOUT), out_ref)

    shape = sds((128, 128), F32)
    assert_same_as_jax(body, [shape], [shape])


# --- index_switch ---------------------------------------------------------------------


@pytest.mark.parametrize("layout", [STRIDED, fa.WGMMA_LAYOUT])
def test_index_switch_yields_splat_loaded_and_computed_vectors(layout):
    def body(ctx, x_ref, y_ref, out_ref, smem):
        x = cast(mgpu.vector_load(x_ref), layout)
        [result] = switch(block_x(), [x.type], [
            lambda: [cast(mgpu.vector_load(y_ref), layout)],
            lambda: [mlir_math.exp(x)],
            lambda: [splat(x, 3.0)],
        ])
        mgpu.vector_store(arith.addf(result, x), out_ref)

    shape = sds((128, 128), F32)
    assert_same_as_jax(body, [shape, shape], [shape])


def test_index_switch_whose_layout_comes_from_after_it():
    def body(ctx, x_ref, out_ref, smem):
        x = mgpu.vector_load(x_ref)
        [a, count] = switch(block_x(), [x.type, ir.IndexType.get()], [
            lambda: [splat(x, 1.0), index(1)],
            lambda: [splat(x, 2.0), index(2)],
        ])
        mgpu.vector_store(cast(arith.addf(a, x), fa.WGMMA_LAYOUT), out_ref)
        del count

    shape = sds((128, 128), F32)
    assert_same_as_jax(body, [shape], [shape])


def test_switch_without_vector_results_is_traversed():
    def body(ctx, x_ref, out_ref, smem):
        def store(value):
            def branch():
                mgpu.vector_store(splat(mgpu.vector_load(x_ref), value), out_ref)
                return []
            return branch

        switch(block_x(), [], [store(1.0), store(2.0)])

    shape = sds((128, 128), F32)
    assert_same_as_jax(body, [shape], [shape])


# --- scf.if (beyond jax) ------------------------------------------------------------


def _if_body(ctx, x_ref, y_ref, out_ref, smem):
    """scf.if yielding a splat in one branch and a loaded vector in the other."""
    x = mgpu.vector_load(x_ref)
    [chosen] = if_else(block_x_is_zero(), [x.type],
                       lambda: [mgpu.vector_load(y_ref)],
                       lambda: [splat(x, 5.0)])
    mgpu.vector_store(arith.addf(chosen, x), out_ref)


def test_if_with_vector_results_which_jax_cannot_infer():
    shape = sds((128, 128), F32)
    reference = kernels.build_kernel(_if_body, [shape, shape], [shape])
    with pytest.raises(NotImplementedError, match="No layout inference rule"):
        jax_infer(reference)

    kernel = kernels.build_kernel(_if_body, [shape, shape], [shape])
    report = smalti.infer_layouts(kernel.module, trace=True)
    [entry] = [e for e in report.trace if e.op == "scf.if"]
    strided = "WGStridedFragLayout<[128, 128], 2>"
    assert strided in entry.layouts["out_layouts"]
    text = str(kernel.module)
    # The splat branch yields a splat that the yield relays out; the loaded
    # branch yields its load as is.
    assert f"scf.yield {{in_layouts = [#mosaic_gpu.{strided}]}}" in text

    smalti.lower(kernel.module, kernel.launch_context)
    kernel.module.operation.verify()
    [if_op] = _ops_named(kernel.module, "scf.if")
    assert [str(r.type) for r in if_op.results] == ["vector<2xf32>"] * 64  # its registers


@pytest.mark.parametrize("layout", [fa.WGMMA_LAYOUT, STRIDED])
def test_if_results_become_registers(layout):
    def with_if(ctx, x_ref, out_ref, smem):
        x = cast(mgpu.vector_load(x_ref), layout)
        [r] = if_else(block_x_is_zero(), [x.type], lambda: [mlir_math.exp(x)],
                      lambda: [splat(x, 1.0)])
        mgpu.vector_store(r, out_ref)

    shape = sds((128, 128), F32)
    kernel = kernels.build_kernel(with_if, [shape], [shape])
    smalti.infer_layouts(kernel.module)
    smalti.lower(kernel.module, kernel.launch_context)
    kernel.module.operation.verify()
    lowered = str(kernel.module)
    [if_op] = _ops_named(kernel.module, "scf.if")
    registers = len(if_op.results)
    chosen = fa.WGMMA_LAYOUT if layout != STRIDED else fa.WGStridedFragLayout((128, 128), 2)
    assert registers == math.prod(chosen.registers_shape((128, 128)))
    assert all(str(r.type) == "vector<2xf32>" for r in if_op.results)
    assert lowered.count("math.exp") == registers  # once per register, in the branch


# --- errors -------------------------------------------------------------------------------


def test_inconsistent_carried_layouts_are_sm101_naming_the_loop():
    def body(ctx, x_ref, out_ref, smem):
        x = cast(mgpu.vector_load(x_ref), fa.WGMMA_LAYOUT)
        [acc] = fori(4, [x], lambda i, c: [cast(arith.addf(c[0], x),
                                                fa.WGMMA_TRANSPOSED_LAYOUT)])
        mgpu.vector_store(acc, out_ref)

    shape = sds((128, 128), F32)
    reference = kernels.build_kernel(body, [shape], [shape])
    with pytest.raises(ValueError, match="Failed to infer a possible set of layouts"):
        jax_infer(reference)
    kernel = kernels.build_kernel(body, [shape], [shape])
    before = str(kernel.module)
    with pytest.raises(smalti.SmaltiError) as error:
        smalti.infer_layouts(kernel.module)
    assert isinstance(error.value, ValueError)
    assert error.value.code == "SM101"
    assert "(ending a region of scf.for)" in str(error.value)
    assert "Failed to infer a possible set of layouts" in str(error.value)
    assert str(kernel.module) == before  # transactional


def test_hand_edited_mismatched_yield_layout_is_sm203():
    def body(ctx, x_ref, out_ref, smem):
        x = mgpu.vector_load(x_ref)
        [acc] = fori(4, [splat(x, 0.0)], lambda i, c: [arith.addf(c[0], x)])
        mgpu.vector_store(acc, out_ref)

    shape = sds((128, 128), F32)
    kernel = kernels.build_kernel(body, [shape], [shape])
    smalti.infer_layouts(kernel.module)
    [loop] = _ops_named(kernel.module, "scf.for")
    yield_op = loop.regions[0].blocks[0].operations[len(loop.regions[0].blocks[0].operations) - 1]
    with kernel.context:
        yield_op.attributes["in_layouts"] = ir.ArrayAttr.get(
            [mgpu_layouts.to_layout_attr(fa.WGMMA_LAYOUT)])
    with pytest.raises(smalti.SmaltiError) as error:
        smalti.lower(kernel.module, kernel.launch_context)
    assert error.value.code == "SM203"
    assert "scf.for" in str(error.value) and "Layout mismatch" in str(error.value)


def _ops_named(module: ir.Module, name: str) -> list[ir.Operation]:
    return ops_named(module, name)


# --- SMEM refs ------------------------------------------------------------------------


def _same_inference_as_jax(body, in_shapes, out_shapes, smem_scratch):
    reference = kernels.build_kernel(body, in_shapes, out_shapes, smem_scratch=smem_scratch)
    candidate = kernels.build_kernel(body, in_shapes, out_shapes, smem_scratch=smem_scratch)
    jax_infer(reference)
    smalti.infer_layouts(candidate.module)
    assert normalized(candidate.module) == normalized(reference.module)
    return reference, candidate


def _double_buffered(layout):
    def body(ctx, x_ref, out_ref, smem):
        first, second = smem
        x = cast(mgpu.vector_load(x_ref), layout)

        def step(i, carried):
            current, other, value = carried
            mgpu.vector_store(value, current)
            return [other, current, mgpu.vector_load(other)]

        last, _, value = fori(4, [first, second, x], step)
        mgpu.vector_store(arith.addf(mgpu.vector_load(last), value), out_ref)

    return body


@pytest.mark.parametrize("layout", [STRIDED, fa.WGMMA_LAYOUT])
def test_smem_refs_carried_with_a_vector_share_transforms(layout):
    """The WGMMA registers stored into the swapped buffers ask for a tiled,
    swizzled SMEM layout: the loop carries it to both buffers."""
    shape = sds((128, 128), F32)
    _, candidate = _same_inference_as_jax(_double_buffered(layout), [shape], [shape],
                                          [shape, shape])
    [loop] = _ops_named(candidate.module, "scf.for")
    tiled = layout != STRIDED
    assert ("#mosaic_gpu.swizzle<128 : i32>" in str(loop.attributes["in_transforms"])) == tiled


def test_smem_refs_carried_through_a_loop_cannot_be_used_after_lowering_like_jax():
    """jax passes loop-carried refs as they are, so an op in the body that
    needs the transformed ref finds a block argument: jax fails with a bare
    ValueError, smalti with SM201."""
    shape = sds((128, 128), F32)
    reference, candidate = _same_inference_as_jax(
        _double_buffered(fa.WGMMA_LAYOUT), [shape], [shape], [shape, shape])
    with pytest.raises(ValueError):
        jax_lower(reference)
    with pytest.raises(smalti.SmaltiError) as error:
        smalti.lower(candidate.module, candidate.launch_context)
    assert isinstance(error.value, ValueError) and error.value.code == "SM201"


def test_smem_refs_in_a_loop_without_vectors():
    def body(ctx, x_ref, out_ref, smem):
        first, second = smem
        x = mgpu.vector_load(x_ref)
        mgpu.vector_store(x, first)
        last, _ = fori(3, [first, second], lambda i, c: [c[1], c[0]])
        mgpu.vector_store(mgpu.vector_load(last), out_ref)

    shape = sds((128, 128), F32)
    reference, candidate = _same_inference_as_jax(body, [shape], [shape], [shape, shape])
    [loop] = _ops_named(candidate.module, "scf.for")
    assert str(loop.attributes["in_transforms"]) == "[[], []]"
