"""Built-in rules on malformed ops: a smalti error with a code, never a crash.

Each case builds ops that the MLIR verifier accepts (unless marked: jax's
own test of a 3-D gather feeds ops it does not verify) but that break what
a built-in rule relies on: index counts against ranks, 0-d shapes, element
types, operand counts. Inference must raise a smalti error with its code —
jax's exception class and key phrase where jax has them — and leave the
module as it was; it must not report the op as a crash of the plugin
(SM005) or as a misbehaving plugin (SM006).

``test_every_builtin_rule_has_a_malformed_case`` lists the rules of the
built-in plugins: a rule that gets no case here, and no reason why none
exists, fails it.
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import NamedTuple

import jax
import jax.numpy as jnp
import pytest
from jax._src.lib import mosaic_gpu_dialect as mgpu
from jax._src.lib.mlir import ir
from jax._src.lib.mlir.dialects import arith, gpu, memref, vector
from jax.experimental.mosaic.gpu import fragmented_array as fa
from jax.experimental.mosaic.gpu import layouts as mgpu_layouts
from jax.experimental.mosaic.gpu import utils as mgpu_utils

import smalti
from smalti import kernels
from smalti.registry import RuleKind
from smalti.testing import pipeline_of

BUILTIN = ("smalti.plugins", "smalti.hopper", "smalti.blackwell")
HOPPER, BLACKWELL = (9, 0), (10, 0)


# --- values for the ops under test ----------------------------------------------------
#
# "test.undef" makes values of any type and "test.sink" uses them; each of
# their vectors and refs gets a variable of its own, constrained only by the
# ops under test. Unregistered ops pass the verifier, unlike llvm.mlir.undef
# of a memref.


@smalti.hookimpl
def smalti_register_constraint_rules(registry):
    def free(op, b):
        for site in b.layout_sites():
            b.variable(site)

    registry.constraint_rule("test.undef", "test.sink")(free)


VALUES = SimpleNamespace(smalti_register_constraint_rules=smalti_register_constraint_rules)


@pytest.fixture(scope="module")
def pipeline():
    return pipeline_of(*BUILTIN, VALUES)


def undef(ty: ir.Type) -> ir.Value:
    return ir.Operation.create("test.undef", results=[ty]).result


def sink(*values: ir.Value) -> None:
    ir.Operation.create("test.sink", operands=list(values))


def create(name: str, results: list[ir.Type], operands: list[ir.Value], regions: int = 0,
           **attributes: ir.Attribute) -> ir.Operation:
    return ir.Operation.create(name, results=results, operands=operands,
                               attributes=attributes, regions=regions)


def f32() -> ir.Type:
    return ir.F32Type.get()


def f16() -> ir.Type:
    return ir.F16Type.get()


def i32() -> ir.Type:
    return ir.IntegerType.get_signless(32)


def vec(shape, element=None) -> ir.VectorType:
    return ir.VectorType.get(list(shape), element or f32())


def ref(shape, element=None, space=None, layout=None) -> ir.MemRefType:
    return ir.MemRefType.get(list(shape), element or f32(), layout=layout, memory_space=space)


def smem(shape, element=None, layout=None) -> ir.MemRefType:
    return ref(shape, element, mgpu_utils.smem(), layout)


def tmem(shape, element=None) -> ir.MemRefType:
    return ref(shape, element, mgpu_utils.tmem())


def barrier() -> ir.MemRefType:
    return ir.MemRefType.get([], mgpu.BarrierType.get(), memory_space=mgpu_utils.smem())


def i64s(*values: int) -> ir.Attribute:
    return ir.ArrayAttr.get([ir.IntegerAttr.get(ir.IntegerType.get_signless(64), v)
                             for v in values])


def c(value, ty=None) -> ir.Value:
    return arith.constant(ty or i32(), value)


def tmem_alloc(shape, element=None) -> ir.Value:
    return mgpu.TmemAllocOp(tmem(shape, element), undef(smem((), i32())), collective=False,
                            packing=1).result


# --- the cases --------------------------------------------------------------------------


class Case(NamedTuple):
    ops: tuple[str, ...]  # the ops whose constraint rules the case breaks
    build: Callable[[], None]  # makes the ops at the current insertion point
    error: type  # the class raised (jax's built-in class where jax raises too)
    code: str
    phrase: str  # in the message (jax's key phrase where jax has one)
    arch: tuple[int, int] = HOPPER
    verifies: bool = True  # the ops pass the MLIR verifier


def gather_3d_with_two_indices(op_name: str) -> Callable[[], None]:
    """jax's test_infer_transforms_for_async_gather_scatter_indices_non_2d_shape_raises."""
    def build() -> None:
        shape, bf16 = (64, 64, 64), ir.BF16Type.get()
        gmem, smem_ref = undef(ref(shape, bf16)), undef(smem(shape, bf16))
        rows = undef(vec((16,), i32()))
        if op_name == "mosaic_gpu.async_load":
            mgpu.AsyncLoadOp(source=gmem, destination=smem_ref, barrier=undef(barrier()),
                             indices=[rows, c(0)], slice_lengths=(4, 64),
                             collective=ir.ArrayAttr.get([]))
        else:
            mgpu.AsyncStoreOp(source=smem_ref, destination=gmem, indices=[rows, c(0)],
                              slice_lengths=(4, 64))
    return build


def copy_with_too_few_indices() -> None:
    mgpu.AsyncLoadOp(source=undef(ref((64, 64))), destination=undef(smem((64,))),
                     barrier=undef(barrier()), indices=[c(0)], slice_lengths=(64,),
                     collective=ir.ArrayAttr.get([]))


def prefetch_of_six_rows() -> None:
    mgpu.AsyncPrefetchOp(source=undef(ref((64, 64))), indices=[undef(vec((6,), i32())), c(0)],
                         slice_lengths=(6, 64), collective=ir.ArrayAttr.get([]))


def addf_of_0d_vectors() -> None:
    x = undef(vec(()))
    sink(arith.addf(x, x))


def reduction_of_a_0d_vector() -> None:
    create("vector.reduction", [f32()], [undef(vec(()))],
           kind=ir.Attribute.parse("#vector.kind<add>"))


def multi_reduction(dims: tuple[int, ...]) -> Callable[[], None]:
    """A reduction of a 128x128 vector along ``dims``: to a scalar if all."""
    def build() -> None:
        result = f32() if len(dims) == 2 else vec((128, 128))
        op = create("vector.multi_reduction", [result], [undef(vec((128, 128))), undef(result)],
                    kind=ir.Attribute.parse("#vector.kind<add>"),
                    reduction_dims=ir.DenseI64ArrayAttr.get(list(dims)))
        if len(dims) != 2:
            sink(op.result)
    return build


def shape_cast_to_0d() -> None:
    sink(vector.shape_cast(vec(()), undef(vec((1,)))))


def broadcast_of_a_0d_vector() -> None:
    sink(vector.broadcast(vec((128,)), undef(vec(()))))


def strided_slice(name: str) -> Callable[[], None]:
    def build() -> None:
        source = undef(vec((128, 128)))
        if name == "vector.extract_strided_slice":
            op = create(name, [vec((64, 128))], [source], offsets=i64s(0, 0),
                        sizes=i64s(64, 128), strides=i64s(2, 1))
        else:
            op = create(name, [vec((128, 128))], [undef(vec((64, 128))), source],
                        offsets=i64s(0, 0), strides=i64s(2, 1))
        sink(op.result)
    return build


def extract_at_a_dynamic_position() -> None:
    index = arith.constant(ir.IndexType.get(), 0)
    sink(vector.extract(undef(vec((4, 128))), [index],
                        [ir.ShapedType.get_dynamic_size()]))


def layout_cast_of_wgmma_to_1d() -> None:
    sink(mgpu.layout_cast(undef(vec((128,))), mgpu_layouts.to_layout_attr(fa.WGMMA_LAYOUT)))


def barrier_with_fewer_results() -> None:
    x = undef(vec((128,)))
    create("mosaic_gpu.optimization_barrier", [vec((128,))], [x, x])


def mma_with_an_untileable_accumulator() -> None:
    acc, a, b = undef(vec((60, 32))), undef(vec((60, 16), f16())), undef(vec((16, 32), f16()))
    sink(create("mosaic_gpu.mma", [vec((60, 32))], [acc, a, b]).result)


def mma_of_1d_vectors() -> None:
    acc, x = undef(vec((64,))), undef(vec((64,), f16()))
    sink(create("mosaic_gpu.mma", [vec((64,))], [acc, x, x]).result)


def warp_map_capturing_a_vector() -> None:
    op = create("mosaic_gpu.warp_map", [], [undef(vec((128,)))], regions=1)
    op.regions[0].blocks.append(vec((128,)))


def with_transforms_of_an_unknown_transform() -> None:
    sink(create("mosaic_gpu.with_transforms", [smem((128,))], [undef(smem((128,)))],
                transforms=ir.ArrayAttr.get([ir.IntegerAttr.get(i32(), 3)])).result)


def cast_to_a_dynamic_shape(name: str) -> Callable[[], None]:
    def build() -> None:
        source = undef(smem((128,)))
        if name == "memref.cast":
            sink(memref.cast(smem((ir.ShapedType.get_dynamic_size(),)), source))
        else:
            sink(create(name, [smem((64,))], [source, c(1)]).result)
    return build


def collapse_to_0d() -> None:
    sink(create("memref.collapse_shape", [smem(())], [undef(smem((1,)))],
                reassociation=ir.ArrayAttr.get([])).result)


def expand_of_a_transposed_ref() -> None:
    transposed = ir.Attribute.parse("strided<[1, 64]>")
    sink(create("memref.expand_shape", [smem((2, 32, 64), layout=ir.Attribute.parse(
        "strided<[32, 1, 64]>"))], [undef(smem((64, 64), layout=transposed))],
        reassociation=ir.ArrayAttr.get([i64s(0, 1), i64s(2)]),
        static_output_shape=ir.DenseI64ArrayAttr.get([2, 32, 64])).result)


def load_of_a_vector_ref(name: str) -> Callable[[], None]:
    def build() -> None:
        source = undef(smem((64,)))
        index = arith.constant(ir.IndexType.get(), 0)
        if name == "memref.load":
            sink(memref.load(source, [index]))
        else:
            memref.store(undef(f32()), source, [index])
    return build


def subview_with_strides() -> None:
    sink(create("memref.subview", [smem((32,), layout=ir.Attribute.parse("strided<[2]>"))],
                [undef(smem((64,)))], static_offsets=ir.DenseI64ArrayAttr.get([0]),
                static_sizes=ir.DenseI64ArrayAttr.get([32]),
                static_strides=ir.DenseI64ArrayAttr.get([2]),
                operandSegmentSizes=ir.DenseI32ArrayAttr.get([1, 0, 0, 0])).result)


def slices_sharing_an_alias(shapes=((128,), (64,))) -> None:
    for shape in shapes:
        sink(create("mosaic_gpu.slice_smem", [smem(shape)], [],
                    offset=ir.IntegerAttr.get(i32(), 0),
                    alias_id=ir.IntegerAttr.get(ir.IntegerType.get_signless(64), 0)).result)


def wgmma_with_a_narrow_b() -> None:
    acc = undef(vec((64, 24)))
    op = create("mosaic_gpu.wgmma", [vec((64, 24))],
                [acc, undef(smem((64, 64), f16())), undef(smem((64, 24), f16()))])
    sink(op.result)


def wgmma_with_b_in_gmem() -> None:
    acc = undef(vec((64, 64)))
    op = create("mosaic_gpu.wgmma", [vec((64, 64))],
                [acc, undef(smem((64, 64), f16())), undef(ref((64, 64), f16()))])
    sink(op.result)


def custom_primitive(vectors: int, layout: fa.FragmentedLayout) -> Callable[[], None]:
    """A custom primitive on ``vectors`` vector<128xf32>, declaring one ``layout``."""
    def build() -> None:
        operands = [undef(vec((128,))) for _ in range(vectors)]
        op = create("mosaic_gpu.custom_primitive", [], operands, 1,
                    in_layouts=ir.ArrayAttr.get([mgpu_layouts.to_layout_attr(layout)]),
                    in_transforms=ir.ArrayAttr.get([]), out_layouts=ir.ArrayAttr.get([]))
        block = op.regions[0].blocks.append(*[v.type for v in operands])
        with ir.InsertionPoint(block):
            create("mosaic_gpu.return", [], [])
    return build


def smem_to_tmem_of_f64() -> None:
    f64 = ir.F64Type.get()
    create("mosaic_gpu.async_store_smem_to_tmem", [],
           [undef(smem((128, 128), f64)), tmem_alloc((128, 128), f64)])


def tcgen05_mma_with_64_by_8_accumulator() -> None:
    accumulate = arith.constant(ir.IntegerType.get_signless(1), 1)
    mgpu.TcGen05MMAOp(tmem_alloc((64, 8)), undef(smem((64, 64), f16())),
                      undef(smem((64, 8), f16())), accumulate, collective=False)


def tmem_op_on_smem(name: str) -> Callable[[], None]:
    """A TMEM op given an SMEM ref where it needs a TMEM one."""
    def build() -> None:
        shared = undef(smem((128, 128)))
        if name == "mosaic_gpu.tmem_dealloc":
            create(name, [], [shared])
        elif name == "mosaic_gpu.slice_tmem":
            sink(create(name, [tmem((128, 64))], [shared],
                        offset=ir.IntegerAttr.get(i32(), 0)).result)
        elif name == "mosaic_gpu.tmem_layout_cast":
            layout = mgpu_layouts.to_layout_attr(fa.TCGEN05_LAYOUT)
            sink(create(name, [smem((128, 128))], [shared], new_layout=layout).result)
        elif name == "mosaic_gpu.async_load_tmem":
            sink(create(name, [vec((128, 128))], [shared]).result)
        elif name == "mosaic_gpu.async_store_tmem":
            create(name, [], [undef(vec((128, 128))), shared])
        else:  # the SMEM-to-TMEM copies, to SMEM
            create(name, [], [undef(smem((128, 128))), shared])
    return build


TMEM_OPS = ("mosaic_gpu.tmem_dealloc", "mosaic_gpu.slice_tmem", "mosaic_gpu.tmem_layout_cast",
            "mosaic_gpu.async_load_tmem", "mosaic_gpu.async_store_tmem",
            "mosaic_gpu.async_store_scales_smem_to_tmem",
            "mosaic_gpu.async_store_sparse_metadata_smem_to_tmem")

NIE, VE = smalti.SmaltiNotImplementedError, smalti.SmaltiValueError
FAILED_TO_INFER = "Failed to infer a possible set of layouts"

CASES: dict[str, Case] = {
    # jax raises NotImplementedError with this phrase (and IndexError'd smalti).
    **{f"{name.split('.')[1]} 3-D gather with 2 indices": Case(
        (name,), gather_3d_with_two_indices(name), NIE, "SM120",
        "Only 2D gathers/scatters for async load/store are supported", verifies=False)
       for name in ("mosaic_gpu.async_load", "mosaic_gpu.async_store")},
    "async_load with fewer indices than GMEM dims": Case(
        ("mosaic_gpu.async_load",), copy_with_too_few_indices, VE, "SM108",
        "must be equal to the rank of the GMEM ref", verifies=False),
    "async_prefetch of 6 rows": Case(
        ("mosaic_gpu.async_prefetch",), prefetch_of_six_rows, VE, "SM120",
        "Unsupported TMA index shape (6,)"),
    "addf of 0-d vectors": Case(("arith.addf",), addf_of_0d_vectors, VE, "SM101",
                                FAILED_TO_INFER),
    "reduction of a 0-d vector": Case(("vector.reduction",), reduction_of_a_0d_vector, VE,
                                      "SM101", FAILED_TO_INFER),
    "multi_reduction to a scalar": Case(
        ("vector.multi_reduction",), multi_reduction((0, 1)), NIE, "SM130",
        "vector.multi_reduction to a scalar is not supported"),
    "multi_reduction along no dims": Case(
        ("vector.multi_reduction",), multi_reduction(()),
        NIE, "SM130", "with no reduction dims"),
    "multi_reduction along a dim the source lacks": Case(
        ("vector.multi_reduction",), multi_reduction((5,)), VE, "SM108",
        "reduction dims (5,) are not distinct dims of the rank-2 source", verifies=False),
    "shape_cast to 0-d": Case(("vector.shape_cast",), shape_cast_to_0d, VE, "SM101",
                              FAILED_TO_INFER),
    "broadcast of a 0-d vector": Case(("vector.broadcast",), broadcast_of_a_0d_vector, VE,
                                      "SM101", FAILED_TO_INFER),
    **{f"{name} with strides": Case((name,), strided_slice(name), NIE, "SM130",
                                     "`strides` must contain only 1s.", verifies=False)
       for name in ("vector.extract_strided_slice", "vector.insert_strided_slice")},
    "extract at a dynamic position": Case(
        ("vector.extract",), extract_at_a_dynamic_position, NIE, "SM130",
        "Only slicing with static indices allowed."),
    "layout_cast of WGMMA to a 1-D vector": Case(
        ("mosaic_gpu.layout_cast",), layout_cast_of_wgmma_to_1d, VE, "SM102",
        "Cannot cast to layout"),
    "optimization_barrier with fewer results": Case(
        ("mosaic_gpu.optimization_barrier",), barrier_with_fewer_results, VE, "SM108",
        "it returns each operand", verifies=False),
    "mma with an untileable accumulator": Case(
        ("mosaic_gpu.mma",), mma_with_an_untileable_accumulator, VE, "SM102",
        "has no MMA layouts"),
    "mma of 1-D vectors": Case(("mosaic_gpu.mma",), mma_of_1d_vectors, VE, "SM108",
                               "must be 2-D vectors", verifies=False),
    "warp_map capturing a vector": Case(("mosaic_gpu.warp_map",), warp_map_capturing_a_vector,
                                        VE, "SM107", "captures the vector", verifies=False),
    "custom_primitive missing a layout": Case(
        ("mosaic_gpu.custom_primitive",), custom_primitive(2, fa.WGStridedFragLayout((128,), 1)),
        VE, "SM107", "declares 1 in_layouts for 2 vector operands", verifies=False),
    "custom_primitive declaring a layout of another shape": Case(
        ("mosaic_gpu.custom_primitive",), custom_primitive(1, fa.WGMMA_LAYOUT), VE, "SM102",
        "the layout is not compatible with its shape (128,)"),
    "with_transforms of an unknown transform": Case(
        ("mosaic_gpu.with_transforms",), with_transforms_of_an_unknown_transform, NIE, "SM105",
        "Unsupported transform 3 : i32"),
    "memref.cast to a dynamic shape": Case(
        ("memref.cast",), cast_to_a_dynamic_shape("memref.cast"), VE, "SM105",
        "Shape mismatch"),
    "get_cluster_ref of another shape": Case(
        ("mosaic_gpu.get_cluster_ref",), cast_to_a_dynamic_shape("mosaic_gpu.get_cluster_ref"),
        VE, "SM105", "Shape mismatch", verifies=False),
    "collapse_shape to 0-d": Case(
        ("memref.collapse_shape",), collapse_to_0d, NIE, "SM105",
        "CollapseShapeOp with empty reassociation is not supported."),
    "expand_shape of a transposed ref": Case(
        ("memref.expand_shape",), expand_of_a_transposed_ref, NIE, "SM105",
        "Transposed memrefs are not supported in ExpandShapeOp."),
    **{f"{name} of a vector ref": Case((name,), load_of_a_vector_ref(name), NIE, "SM105",
                                        "Only scalar memrefs are supported")
       for name in ("memref.load", "memref.store")},
    "subview with strides": Case(("memref.subview",), subview_with_strides, NIE, "SM105",
                                 "Only unit strides are supported"),
    "slices of two shapes under one alias": Case(
        ("mosaic_gpu.slice_smem",), slices_sharing_an_alias, VE, "SM106",
        "Shape mismatch between slices with alias_id 0"),
    "wgmma with b in global memory": Case(("mosaic_gpu.wgmma",), wgmma_with_b_in_gmem, VE,
                                          "SM108", "must be a ref in shared memory"),
    "wgmma with a narrow b": Case(("mosaic_gpu.wgmma",), wgmma_with_a_narrow_b, VE, "SM121",
                                  "No valid tiling found for SMEM reference"),
    "async_store_smem_to_tmem of f64": Case(
        ("mosaic_gpu.async_store_smem_to_tmem",), smem_to_tmem_of_f64, VE, "SM143",
        "Packing must be a power of 2", arch=BLACKWELL),
    "tcgen05_mma with a 64x8 accumulator": Case(
        ("mosaic_gpu.tcgen05_mma", "mosaic_gpu.tmem_alloc"),
        tcgen05_mma_with_64_by_8_accumulator, VE, "SM143", "Columns must be a multiple of 16",
        arch=BLACKWELL),
    **{f"{name} on an SMEM ref": Case((name,), tmem_op_on_smem(name), VE, "SM141",
                                       "that is not TMEM", arch=BLACKWELL, verifies=False)
       for name in TMEM_OPS},
}

#: Constraint rules no op the verifier accepts can break, and why.
NO_MALFORMED_FORM: dict[str, str] = {
    "arith.constant": "reads only whether the value is a splat; the verifier gives the value "
                      "the result's type",
    "mosaic_gpu.broadcast_in_dim": "the verifier checks the dims against both shapes "
                                   "(the rule checks them again: SM130)",
    "mosaic_gpu.broadcasted_iota": "the verifier requires a vector result and a dimension "
                                   "within its rank",
    "mosaic_gpu.vector_concat": "the verifier requires one or more operands whose shapes "
                                "add up to the result's",
    "mosaic_gpu.vector_load": "the verifier gives the result the ref's shape and element type",
    "mosaic_gpu.vector_store": "the verifier gives the vector the ref's shape and element type",
    "mosaic_gpu.async_store_smem": "the verifier gives the vector the ref's shape",
    "mosaic_gpu.debug_print": "gives its one vector operand a variable, nothing more",
    "mosaic_gpu.print_layout": "gives its one vector or ref operand a variable, nothing more",
    "mosaic_gpu.multimem_load_reduce": "gives its result a variable, nothing more",
    "memref.transpose": "the verifier checks the permutation against both ranks",
    "mosaic_gpu.try_cluster_cancel": "assigns its SMEM operand plain transforms, nothing more",
    "mosaic_gpu.query_cluster_cancel": "assigns its SMEM operand plain transforms, nothing more",
    "scf.for": "the verifier pairs inits, block arguments, yielded values and results",
    "scf.while": "the verifier pairs inits, block arguments, yielded values and results",
    "scf.if": "the verifier gives each region a yield of the op's results",
    "scf.index_switch": "the verifier gives each region a yield of the op's results",
}


def _build(case: Case) -> tuple[ir.Context, ir.Module]:
    context = kernels.make_context()
    context.allow_unregistered_dialects = True
    with context, ir.Location.file("kernel.py", 3, 1):
        module = ir.Module.create()
        with ir.InsertionPoint(module.body):
            case.build()
    return context, module


@pytest.mark.parametrize("name", sorted(CASES))
def test_malformed_op_is_a_user_error_and_changes_nothing(pipeline, name):
    case = CASES[name]
    context, module = _build(case)
    with context:
        if case.verifies:
            module.operation.verify()  # the verifier lets it through
        else:
            with pytest.raises(ir.MLIRError):
                module.operation.verify()
        before = str(module)
        with pytest.raises(smalti.SmaltiError) as raised:
            smalti.infer_layouts(module, arch=case.arch, pipeline=pipeline)
        error = raised.value
        assert str(module) == before  # inference is transactional
    assert error.code not in ("SM005", "SM006"), str(error)
    assert isinstance(error, case.error), str(error)
    assert error.code == case.code, str(error)
    assert case.phrase in error.message, str(error)
    # Where the op is and how to fix it.
    assert error.location == "kernel.py:3:1" and error.fixes


# --- lowering ---------------------------------------------------------------------------


def select_with_a_scalar_condition(ctx, x_ref, out_ref, smem_ref):
    x = mgpu.vector_load(x_ref)
    # Known only at run time: canonicalization cannot fold the select away.
    thread = arith.index_cast(i32(), gpu.thread_id(gpu.Dimension.x))
    flag = arith.cmpi(arith.CmpIPredicate.eq, thread, c(0))
    mgpu.vector_store(arith.select(flag, x, arith.negf(x)), out_ref)


#: Lowering rules' malformed ops: kernels that inference accepts.
LOWERING_CASES = {
    "arith.select": (select_with_a_scalar_condition, "SM205",
                     "with a scalar condition (i1) cannot be lowered"),
}


@pytest.mark.parametrize("name", sorted(LOWERING_CASES))
def test_malformed_op_is_refused_by_its_lowering_rule(name):
    body, code, phrase = LOWERING_CASES[name]
    f32_128 = jax.ShapeDtypeStruct((128,), jnp.float32)
    kernel = kernels.build_kernel(body, [f32_128], [f32_128])
    smalti.infer_layouts(kernel.module)
    with pytest.raises(smalti.SmaltiError) as raised:
        smalti.lower(kernel.module, kernel.launch_context)
    error = raised.value
    assert isinstance(error, ValueError) and error.code == code, str(error)
    assert phrase in error.message and error.fixes and name in error.op


#: Lowering rules run on ops their constraint rule accepted (checked above)
#: and whose layout attributes core checked (one entry per vector, SMEM and
#: TMEM operand and result, register layouts fitting their vectors: SM201),
#: so what the verifier lets through is refused before they run. These
#: lowering rules read nothing more of the op than that.
LOWERED_AS_INFERRED = "checked by its constraint rule and by core's attribute checks (SM201)"
#: Ops without vectors or refs: no constraint rule, nothing inferred; the
#: verifier types their operands (barrier refs, scalars).
NO_LAYOUTS = "carries no vector or ref to lay out; the verifier types its operands"


def _lowering_exemptions() -> dict[str, str]:
    without_layouts = ("mosaic_gpu.arrive", "mosaic_gpu.arrive_expect_tx",
                       "mosaic_gpu.assume_multiple", "mosaic_gpu.initialize_barrier",
                       "mosaic_gpu.return", "mosaic_gpu.tcgen05_commit_arrive",
                       "mosaic_gpu.tmem_relinquish_alloc_permit", "scf.yield", "scf.condition")
    # jax 0.12 removed mosaic_gpu.wait: its rule is only in pipelines for jax 0.11.
    if hasattr(mgpu, "wait"):
        without_layouts += ("mosaic_gpu.wait",)
    return {name: NO_LAYOUTS for name in without_layouts}


def builtin_rules(kind: RuleKind) -> dict[str, Callable]:
    pipeline = pipeline_of(*BUILTIN)
    return {name: records[0].function for name, records in pipeline.rules[kind].items()
            if records[0].plugin in BUILTIN}


def test_every_builtin_rule_has_a_malformed_case():
    """A constraint rule is covered by a case for its op, or for another op
    it also serves (one function, e.g. smalti.rules.same_layout for every
    elementwise op); otherwise NO_MALFORMED_FORM must say why it needs none."""
    rules = builtin_rules(RuleKind.CONSTRAINT)
    covered = {op for case in CASES.values() for op in case.ops}
    assert covered <= set(rules), covered - set(rules)  # cases name real ops
    assert not covered & set(NO_MALFORMED_FORM), covered & set(NO_MALFORMED_FORM)
    covered_functions = {rules[op] for op in covered}
    missing = sorted(name for name, rule in rules.items()
                     if rule not in covered_functions and name not in NO_MALFORMED_FORM)
    assert not missing, f"constraint rules without a malformed case: {missing}"
    assert set(NO_MALFORMED_FORM) <= set(rules), set(NO_MALFORMED_FORM) - set(rules)


def test_every_builtin_lowering_rule_is_accounted_for():
    """Each lowering rule has a malformed case, serves an op with a
    constraint rule (whose cases cover the op's form), or carries no layouts."""
    lowering = builtin_rules(RuleKind.LOWERING)
    constraint = builtin_rules(RuleKind.CONSTRAINT)
    exempt = _lowering_exemptions()
    assert set(LOWERING_CASES) <= set(lowering)
    assert set(exempt) <= set(lowering) and not set(exempt) & set(constraint)
    unaccounted = sorted(name for name in lowering if name not in LOWERING_CASES
                         and name not in constraint and name not in exempt)
    assert not unaccounted, (f"lowering rules with no malformed case, none of them "
                             f"{LOWERED_AS_INFERRED}, and no reason: {unaccounted}")


# --- ops the verifier rejects -----------------------------------------------------------


def test_a_rule_crashing_on_an_op_the_verifier_rejects_reports_the_verifier(pipeline):
    """Inference does not verify up front; a rule that crashes on an invalid
    op is the op's fault, said in the verifier's words, not the plugin's."""
    context = kernels.make_context()
    context.allow_unregistered_dialects = True
    with context, ir.Location.file("kernel.py", 3, 1):
        module = ir.Module.create()
        with ir.InsertionPoint(module.body):
            # No new_layout: the layout_cast rule cannot read the layout it casts to.
            cast = create("mosaic_gpu.layout_cast", [vec((128,))], [undef(vec((128,)))])
            sink(cast.result)
        before = str(module)
        with pytest.raises(smalti.SmaltiValueError) as raised:
            smalti.infer_layouts(module, pipeline=pipeline)
        assert str(module) == before
    error = raised.value
    assert error.code == "SM108", str(error)
    assert error.message.startswith("mosaic_gpu.layout_cast fails the MLIR verifier: ")
    assert "new_layout" in error.message  # what the verifier says is missing
    assert error.location == "kernel.py:3:1"


def test_a_lowering_rule_crashing_on_an_op_the_verifier_rejects_reports_the_verifier():
    def body(ctx, x_ref, out_ref, smem_ref):
        iota = mgpu.broadcasted_iota(vec((128,), i32()), 0)
        mgpu.vector_store(arith.addi(mgpu.vector_load(x_ref), iota), out_ref)

    i32_128 = jax.ShapeDtypeStruct((128,), jnp.int32)
    kernel = kernels.build_kernel(body, [i32_128], [i32_128])
    smalti.infer_layouts(kernel.module)
    [iota] = [op for op in _walk(kernel.module) if op.name == "mosaic_gpu.broadcasted_iota"]
    del iota.attributes["dimension"]  # which the verifier requires, and the rule reads
    with pytest.raises(smalti.SmaltiValueError) as raised:
        smalti.lower(kernel.module, kernel.launch_context)
    error = raised.value
    assert error.code == "SM205", str(error)
    assert error.message.startswith("mosaic_gpu.broadcasted_iota fails the MLIR verifier: ")
    assert "dimension" in error.message


def _walk(module: ir.Module) -> list[ir.Operation]:
    found = []

    def visit(op):
        found.append(op)
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return found
