"""Ops whose rule is the ready-made ``smalti.rules.same_layout`` get their
variable straight from the rows inference read (``SiteTable.share``),
without a builder or a call of the rule: that must state exactly the
constraints, and write exactly the attributes, that calling the rule
through a builder does, and report the same errors."""

from __future__ import annotations

from types import SimpleNamespace

import jax
import jax.numpy as jnp
import pytest
from jax._src.lib import mosaic_gpu_dialect as mgpu
from jax._src.lib.mlir import ir
from jax._src.lib.mlir.dialects import arith, scf, vector
from jax._src.lib.mlir.dialects import math as mlir_math
from jax.experimental.mosaic.gpu import fragmented_array as fa
from jax.experimental.mosaic.gpu import layouts as mgpu_layouts

import smalti
from smalti import kernels
from smalti.inference import collect
from smalti.pipeline import default_pipeline
from smalti.rules import same_layout
from smalti.sites import SiteKind, ValueSite
from tests.differential import normalized, walk_ops

F32 = jax.ShapeDtypeStruct((128, 128), jnp.float32)
BUILTIN = "smalti.plugins"


def splat(like: ir.Value, value: float) -> ir.Value:
    ty = ir.VectorType(like.type)
    return arith.constant(ty, ir.DenseElementsAttr.get_splat(
        ty, ir.FloatAttr.get(ty.element_type, value)))


def chain(ctx, x_ref, out_ref, smem):
    x = mgpu.vector_load(x_ref)
    two = splat(x, 2.0)  # one constant, many uses
    for i in range(12):
        x = arith.addf(x, two) if i % 2 else mlir_math.exp(x)
    mgpu.vector_store(x, out_ref)


def diamonds_in_wgmma_layout(ctx, x_ref, out_ref, smem):
    x = mgpu.layout_cast(mgpu.vector_load(x_ref), mgpu_layouts.to_layout_attr(fa.WGMMA_LAYOUT))
    for _ in range(4):
        left, right = mlir_math.exp(x), mlir_math.tanh(x)
        x = arith.mulf(arith.maximumf(left, right), splat(x, 0.5))
    mgpu.vector_store(arith.negf(x), out_ref)


def loop_carrying_a_vector(ctx, x_ref, out_ref, smem):
    x = mgpu.vector_load(x_ref)
    index = ir.IndexType.get()
    loop = scf.ForOp(arith.constant(index, 0), arith.constant(index, 4),
                     arith.constant(index, 1), [x])
    with ir.InsertionPoint(loop.body):
        [y] = loop.inner_iter_args
        y = arith.addf(mlir_math.exp(y), splat(y, 1.0))
        scf.yield_([y])
    mgpu.vector_store(arith.mulf(loop.results[0], x), out_ref)


def reduction_broadcast_back(ctx, x_ref, out_ref, smem):
    x = mgpu.layout_cast(mgpu.vector_load(x_ref), mgpu_layouts.to_layout_attr(fa.WGMMA_LAYOUT))
    f32 = ir.F32Type.get()
    rows = ir.VectorType.get([128], f32)
    zero = vector.broadcast(rows, arith.constant(f32, 0.0))
    total = vector.MultiDimReductionOp(vector.CombiningKind.ADD, x, zero, [1]).result
    total = arith.addf(total, total)  # an elementwise op of another shape
    back = mgpu.broadcast_in_dim(x.type, total, [0])
    keep = arith.cmpf(arith.CmpFPredicate.OGT, x, back)  # i1 result, f32 operands
    mgpu.vector_store(arith.select(keep, x, back), out_ref)


KERNELS = [chain, diamonds_in_wgmma_layout, loop_carrying_a_vector, reduction_broadcast_back]


def through_builder(op, b):
    """same_layout as any other rule: called through a builder for each op."""
    same_layout(op, b)


def builder_plugin(*op_names):
    @smalti.hookimpl
    def smalti_register_constraint_rules(registry):
        registry.constraint_rule(*op_names, overrides=BUILTIN)(through_builder)

    return SimpleNamespace(smalti_register_constraint_rules=smalti_register_constraint_rules)


ELEMENTWISE_USED = ("math.exp", "math.tanh", "arith.addf", "arith.mulf", "arith.maximumf",
                    "arith.negf", "arith.cmpf", "arith.select")


@pytest.mark.parametrize("body", KERNELS, ids=lambda body: body.__name__)
def test_builder_free_path_writes_what_the_rule_writes(body):
    fast, slow, traced = (kernels.build_kernel(body, [F32], [F32]) for _ in range(3))
    report = smalti.infer_layouts(fast.module)
    pipeline = smalti.build_pipeline(plugins={"builder": builder_plugin(*ELEMENTWISE_USED)})
    slow_report = smalti.infer_layouts(slow.module, pipeline=pipeline)
    # With a trace the shared ops are annotated like the builder's.
    traced_report = smalti.infer_layouts(traced.module, trace=True)
    assert normalized(fast.module) == normalized(slow.module) == normalized(traced.module)
    assert "in_layouts" in str(fast.module) and "out_layouts" in str(fast.module)
    assert report.ops == slow_report.ops == traced_report.ops
    assert report.variables == slow_report.variables
    assert sum(report.ops_per_plugin.values()) == report.ops - _terminators(fast.module)


@pytest.mark.parametrize("body", KERNELS, ids=lambda body: body.__name__)
def test_shared_and_builder_run_rule_state_the_same_constraints(body):
    fast, slow = (kernels.build_kernel(body, [F32], [F32]) for _ in range(2))
    pipeline = smalti.build_pipeline(plugins={"builder": builder_plugin(*ELEMENTWISE_USED)})
    statements = []
    for kernel, with_pipeline in ((fast, default_pipeline()), (slow, pipeline)):
        with kernel.context, ir.Location.unknown():
            collected = collect(kernel.module, (9, 0), with_pipeline)
        system = collected.system
        statements.append((
            [(v.id, v.memory_space, v.shape) for v in system.variables],
            [(producer.id, consumer.id, str(ty)) for producer, consumer, ty in system.uses],
            len(system.constraints), len(system.assignments)))
        if kernel is fast:
            assert collected.shared  # the fast case was taken ...
        else:
            assert not collected.shared  # ... and here it was not
    assert statements[0] == statements[1]


def _terminators(module: ir.Module) -> int:
    """Ops with layouts described by their parent's rule (counted for no plugin)."""
    return sum(1 for op in walk_ops(module)
               if op.name == "scf.yield" and "in_layouts" in op.attributes)


def describes_its_producer_too(op, b):
    """Breaks the contract: gives a variable to a site of another op."""
    b.variable(b.operand(0))
    producer = op.operation.operands[0].owner
    b.variable(ValueSite(producer, SiteKind.RESULT, 0))


def test_site_of_an_elementwise_op_described_by_another_rule_is_sm006():
    kernel = kernels.example_kernel()  # ... z = addf(...); vector_store(z)
    before = str(kernel.module)

    @smalti.hookimpl
    def smalti_register_constraint_rules(registry):
        registry.constraint_rule("mosaic_gpu.vector_store", overrides=BUILTIN)(
            describes_its_producer_too)

    pipeline = smalti.build_pipeline(plugins={"nosy": SimpleNamespace(
        smalti_register_constraint_rules=smalti_register_constraint_rules)})
    with pytest.raises(smalti.PluginError) as info:
        smalti.infer_layouts(kernel.module, pipeline=pipeline)
    error = info.value
    assert error.code == "SM006" and "'nosy'" in error.message
    assert "describes_its_producer_too" in error.message and "arith.addf" in error.message
    assert error.op.startswith("mosaic_gpu.vector_store")
    assert str(kernel.module) == before
