"""smalti.testing, the test kit for plugin authors: loaded by pytest through
the pytest11 entry point; its fixtures build kernels, restrict pipelines to
chosen plugins, and compare a pipeline's IR with jax's or another pipeline's."""

from __future__ import annotations

from importlib import metadata
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import pytest
from jax._src.lib import mosaic_gpu_dialect as mgpu
from jax._src.lib.mlir import ir
from jax._src.lib.mlir.dialects import math as mlir_math

import smalti
import smalti.plugins
from smalti import testing

F32 = jax.ShapeDtypeStruct((128, 128), jnp.float32)


def exp_body(ctx, x_ref, out_ref, smem):
    mgpu.vector_store(mlir_math.exp(mgpu.vector_load(x_ref)), out_ref)


def cube_body(ctx, x_ref, out_ref, smem):
    x = mgpu.vector_load(x_ref)
    y = ir.Operation.create("kit_ops.cube", results=[x.type], operands=[x]).result
    mgpu.vector_store(y, out_ref)


class Cube:
    """A plugin for an op of an unregistered dialect."""

    @smalti.hookimpl
    def smalti_register_constraint_rules(self, registry):
        registry.constraint_rule("kit_ops.cube")(lambda op, b: b.variable(*b.vector_sites()))

    @smalti.hookimpl
    def smalti_register_lowering_rules(self, registry):
        @registry.lowering_rule("kit_ops.cube")
        def lower(ctx, op):
            [x] = ctx.operand_arrays(op)
            return [ctx.to_ir(x * x * x, op.result.type)]


def exp_as_exp2(registry):
    """Overrides math.exp's lowering with a different (valid) one."""
    @registry.lowering_rule("math.exp", overrides="smalti.plugins")
    def lower(ctx, op):
        [x] = ctx.operand_arrays(op)
        return [ctx.to_ir((x * 1.4426950408889634).exp2(), op.result.type)]


def test_pytest_loads_the_kit_through_its_entry_point(pytestconfig):
    [ep] = [e for e in metadata.entry_points(group="pytest11") if e.value == "smalti.testing"]
    assert pytestconfig.pluginmanager.get_plugin(ep.name) is testing


def test_build_accepts_ops_of_unregistered_dialects(smalti_build):
    kernel = smalti_build(cube_body, [F32], [F32])
    assert "kit_ops.cube" in kernel.text()
    assert kernel.context.allow_unregistered_dialects


def test_pipeline_holds_exactly_the_chosen_plugins(smalti_pipeline):
    pipeline = smalti_pipeline("smalti.plugins", Cube())
    assert [p.name for p in pipeline.plugins] == ["smalti.plugins", "Cube"]
    assert [p.name for p in smalti_pipeline(smalti.plugins).plugins] == ["smalti.plugins"]


def test_lower_reports_which_plugin_lowered_what(smalti_build, smalti_pipeline, smalti_lower):
    kernel = smalti_build(cube_body, [F32], [F32])
    lowered = smalti_lower(kernel, smalti_pipeline("smalti.plugins", Cube()))
    assert lowered.inference.ops_per_plugin["Cube"] == 1
    assert lowered.lowering.ops_per_plugin["Cube"] == 1
    [entry] = [e for e in lowered.inference.trace if e.op == "kit_ops.cube"]
    assert entry.plugin == "Cube"
    assert "kit_ops.cube" not in lowered.text


def test_compare_with_jax_passes_for_the_builtin_rules(smalti_compare, smalti_pipeline):
    text = smalti_compare(exp_body, [F32], [F32], pipeline=smalti_pipeline("smalti.plugins"))
    assert "math.exp" in text


def test_compare_shows_where_two_pipelines_differ(smalti_compare, smalti_pipeline):
    builtin = smalti_pipeline("smalti.plugins")
    other = smalti_pipeline("smalti.plugins",
                            SimpleNamespace(__name__="exp2",
                                            smalti_register_lowering_rules=smalti.hookimpl(
                                                exp_as_exp2)))
    with pytest.raises(AssertionError) as error:
        smalti_compare(exp_body, [F32], [F32], pipeline=other, reference=builtin)
    message = str(error.value)
    assert "lowers the kernel differently" in message
    assert "--- reference" in message and "+++ pipeline" in message
    assert "more lines" in message  # long diffs are cut short
    with pytest.raises(AssertionError):
        smalti_compare(exp_body, [F32], [F32], pipeline=other, reference="jax")


def test_an_unknown_plugin_name_is_sm012(smalti_pipeline):
    with pytest.raises(smalti.PluginError) as error:
        smalti_pipeline("smalti.plugins", "no_such_plugin")
    assert error.value.code == "SM012"
    assert "'no_such_plugin'" in error.value.message
    assert "smalti.plugins" in error.value.values["installed"]


def test_a_broken_plugin_raises_instead_of_being_skipped(smalti_pipeline):
    def smalti_register_constraint_rules(registry):
        raise RuntimeError("broken")

    broken = SimpleNamespace(__name__="broken", smalti_register_constraint_rules=smalti.hookimpl(
        smalti_register_constraint_rules))
    with pytest.raises(smalti.PluginError) as error:
        smalti_pipeline("smalti.plugins", broken)
    assert error.value.code == "SM007" and "broken" in error.value.message
