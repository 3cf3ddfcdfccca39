"""The plugin shown in the README works as shown: a new op, end to end."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax._src.lib import mosaic_gpu_dialect as mgpu
from jax._src.lib.mlir import ir

import smalti
from smalti import hookimpl, kernels
from smalti.rules import same_layout


class XTanhX:
    """The README's example plugin, verbatim."""

    @hookimpl
    def smalti_register_constraint_rules(self, registry):
        registry.constraint_rule("mydialect.x_tanh_x")(same_layout)

    @hookimpl
    def smalti_register_lowering_rules(self, registry):
        @registry.lowering_rule("mydialect.x_tanh_x")
        def lower_x_tanh_x(ctx, op):
            [x] = ctx.operand_arrays(op)
            return [ctx.to_ir(x * x.tanh(), op.result.type)]


def test_readme_plugin_adds_an_op_from_another_dialect():
    context = kernels.make_context()
    context.allow_unregistered_dialects = True

    def body(ctx, x_ref, out_ref, smem):
        x = mgpu.vector_load(x_ref)
        y = ir.Operation.create("mydialect.x_tanh_x", results=[x.type], operands=[x]).result
        mgpu.vector_store(y, out_ref)

    shape = jax.ShapeDtypeStruct((128, 64), jnp.float32)
    kernel = kernels.build_kernel(body, [shape], [shape], context=context)
    pipeline = smalti.build_pipeline(plugins={"x_tanh_x": XTanhX()})
    report = smalti.infer_layouts(kernel.module, pipeline=pipeline)
    assert report.ops_per_plugin["x_tanh_x"] == 1
    smalti.lower(kernel.module, kernel.launch_context, pipeline=pipeline)
    text = str(kernel.module)
    assert "mydialect.x_tanh_x" not in text
    assert "math.tanh" in text
