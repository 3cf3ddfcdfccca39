"""A misbehaving plugin is named with its rule and op; the others keep working.

Complements tests/core/test_pipeline.py: lowering rules returning the wrong
things, constraint rules stating malformed facts, constraints that crash in
the solver, malformed registrations.
"""

from __future__ import annotations

from types import SimpleNamespace

import jax
import jax.numpy as jnp
import pytest
from jax._src.lib import mosaic_gpu_dialect as mgpu
from jax._src.lib.mlir import ir
from jax._src.lib.mlir.dialects import arith, vector
from jax.experimental.mosaic.gpu import fragmented_array as fa

import smalti
from smalti import kernels
from smalti.constraints import Constraint
from smalti.layouts import RegisterLayout
from smalti.rules import same_layout
from smalti.sites import SiteKind, ValueSite
from tests.differential import normalized

BUILTIN = "smalti.plugins"


def lowering_plugin(op_name, rule, overrides=BUILTIN):
    @smalti.hookimpl
    def smalti_register_lowering_rules(registry):
        registry.lowering_rule(op_name, overrides=overrides)(rule)

    return SimpleNamespace(smalti_register_lowering_rules=smalti_register_lowering_rules)


def constraint_plugin(op_name, rule):
    @smalti.hookimpl
    def smalti_register_constraint_rules(registry):
        registry.constraint_rule(op_name, overrides=BUILTIN)(rule)

    return SimpleNamespace(smalti_register_constraint_rules=smalti_register_constraint_rules)


def with_plugin(name, plugin):
    return smalti.build_pipeline(plugins={name: plugin})


# --- lowering rules ------------------------------------------------------------------------


def returns_none(ctx, op):
    return None


def returns_a_number(ctx, op):
    return [42]


def returns_two_values(ctx, op):
    return [op.operation.operands[0], op.operation.operands[0]]


def raises_runtime_error(ctx, op):
    raise RuntimeError("lowering boom")


@pytest.mark.parametrize("rule, code, phrase", [
    (returns_none, "SM006", "returned None"),
    (returns_a_number, "SM006", "not an IR value: #0: 42"),
    (returns_two_values, "SM006", "returned 2 values for 1 results"),
    (raises_runtime_error, "SM005", "RuntimeError: lowering boom"),
])
def test_misbehaving_lowering_rule_is_named(rule, code, phrase):
    kernel = kernels.example_kernel()
    pipeline = with_plugin("shoddy", lowering_plugin("math.exp", rule))
    smalti.infer_layouts(kernel.module, pipeline=pipeline)
    with pytest.raises(smalti.PluginError) as info:
        smalti.lower(kernel.module, kernel.launch_context, pipeline=pipeline)
    error = info.value
    assert error.code == code
    assert "'shoddy'" in error.message and rule.__name__ in error.message
    assert phrase in error.message
    assert error.op.startswith("math.exp") and error.fixes


def test_other_plugins_keep_working_beside_a_broken_lowering_rule():
    pipeline = with_plugin("shoddy", lowering_plugin("mydialect.unused", returns_none, None))
    ours, theirs = kernels.example_kernel(), kernels.example_kernel()
    for kernel, p in ((ours, pipeline), (theirs, None)):
        smalti.infer_layouts(kernel.module, pipeline=p)
        smalti.lower(kernel.module, kernel.launch_context, pipeline=p)
    assert normalized(ours.module) == normalized(theirs.module)


# --- constraint rules ----------------------------------------------------------------------


def requires_a_string(op, b):
    b.variable(*b.vector_sites())
    b.require("x == WGMMA")


def assigns_a_string(op, b):
    b.assign(b.variable(*b.vector_sites()), "WGMMA")


def assigns_to_a_site(op, b):
    b.variable(*b.vector_sites())
    b.assign(b.operand(0), RegisterLayout(fa.WGMMA_LAYOUT))


def falls_back_to_a_layout_object(op, b):
    b.fallback(b.variable(*b.vector_sites()), fa.WGMMA_LAYOUT)  # not wrapped


def joins_a_site_twice(op, b):
    b.variable(*b.vector_sites())
    b.variable(b.result(0))


def names_a_site_twice(op, b):
    b.variable(*b.vector_sites(), b.result(0))


def describes_its_producer(op, b):
    b.variable(*b.vector_sites())
    producer = op.operation.operands[0].owner
    b.variable(ValueSite(producer, SiteKind.RESULT, 0))


class Exploding(Constraint):
    def __init__(self, var):
        self.var = var

    def expressions(self):
        return (self.var,)

    def check(self, values):
        raise ZeroDivisionError("constraint boom")

    def candidates(self, ctx):
        raise ZeroDivisionError("constraint boom")


def states_an_exploding_constraint(op, b):
    b.require(Exploding(b.variable(*b.vector_sites())))


@pytest.mark.parametrize("rule, code, phrase", [
    (requires_a_string, "SM006", "require() got 'x == WGMMA', not a smalti Constraint"),
    (assigns_a_string, "SM006", "assign() got 'WGMMA', not a smalti layout constant"),
    (assigns_to_a_site, "SM006", "not a Variable"),
    (falls_back_to_a_layout_object, "SM006", "fallback() got"),
    (joins_a_site_twice, "SM006", "was given two variables"),
    (names_a_site_twice, "SM006", "variable() got a site twice"),
    (describes_its_producer, "SM006", "is not a site of math.exp or of an op in its regions"),
    (states_an_exploding_constraint, "SM005", "ZeroDivisionError: constraint boom"),
])
def test_misbehaving_constraint_rule_is_named_and_changes_nothing(rule, code, phrase):
    kernel = kernels.example_kernel()
    before = str(kernel.module)
    pipeline = with_plugin("shoddy", constraint_plugin("math.exp", rule))
    with pytest.raises(smalti.PluginError) as info:
        smalti.infer_layouts(kernel.module, pipeline=pipeline)
    error = info.value
    assert error.code == code
    assert "'shoddy'" in error.message and rule.__name__ in error.message
    assert phrase in error.message
    if code == "SM006":
        assert error.op.startswith("math.exp")
    else:
        assert "math.exp" in error.values["stated by"]
    assert str(kernel.module) == before


def test_rule_may_name_its_sites_itself():
    """A rule may make its op's sites rather than ask the builder for them."""
    def own_sites(op, b):
        b.variable(ValueSite(op, SiteKind.OPERAND, 0), ValueSite(op, SiteKind.RESULT, 0))

    ours, theirs = kernels.example_kernel(), kernels.example_kernel()
    smalti.infer_layouts(ours.module, pipeline=with_plugin("own", constraint_plugin(
        "math.exp", own_sites)))
    smalti.infer_layouts(theirs.module)
    assert normalized(ours.module) == normalized(theirs.module)


# --- registration --------------------------------------------------------------------------


@pytest.mark.parametrize("register, phrase", [
    (lambda r: r.add(42, lambda op, b: None), "op name 42"),
    (lambda r: r.add("", lambda op, b: None), "op name ''"),
    (lambda r: r.add("fake.op", lambda op, b: None, archs=(9, 0)), "archs=(9, 0)"),
    (lambda r: r.add("fake.op", lambda op, b: None, overrides=3), "overrides=3"),
])
def test_malformed_registration_drops_only_that_plugin(register, phrase):
    @smalti.hookimpl
    def smalti_register_constraint_rules(registry):
        register(registry)

    bad = SimpleNamespace(smalti_register_constraint_rules=smalti_register_constraint_rules)
    pipeline = smalti.build_pipeline(plugins={"bad": bad})
    [problem] = [p for p in pipeline.problems if p.plugin == "bad"]
    assert problem.error.code == "SM006" and phrase in problem.error.message
    assert "'bad'" in problem.error.message
    kernel = kernels.example_kernel()
    smalti.infer_layouts(kernel.module, pipeline=pipeline)  # the built-ins still work
    smalti.lower(kernel.module, kernel.launch_context, pipeline=pipeline)


def test_ready_made_same_layout_rule_is_checked_like_any_rule():
    """Core applies smalti.rules.same_layout without calling it, but an op it
    cannot describe (sites of different shapes) is still the plugin's SM006."""
    f32 = ir.F32Type.get

    def body(ctx, x_ref, out_ref, smem):
        x = mgpu.vector_load(x_ref)
        rows = ir.VectorType.get([128], f32())
        zero = arith.constant(rows,
                              ir.DenseElementsAttr.get_splat(rows, ir.FloatAttr.get(f32(), 0)))
        total = vector.MultiDimReductionOp(vector.CombiningKind.ADD, x, zero, [1]).result
        mgpu.vector_store(total, out_ref)

    kernel = kernels.build_kernel(body, [jax.ShapeDtypeStruct((128, 128), jnp.float32)],
                                  [jax.ShapeDtypeStruct((128,), jnp.float32)])
    before = str(kernel.module)
    pipeline = with_plugin("shoddy", constraint_plugin("vector.multi_reduction", same_layout))
    with pytest.raises(smalti.PluginError) as info:
        smalti.infer_layouts(kernel.module, pipeline=pipeline)
    error = info.value
    assert error.code == "SM006" and error.op.startswith("vector.multi_reduction")
    assert "'shoddy'" in error.message and "same_layout" in error.message
    assert "different shapes" in error.message
    assert str(kernel.module) == before
    # The same rule describes an elementwise op of another plugin's choosing.
    kernel = kernels.example_kernel()
    pipeline = with_plugin("tidy", constraint_plugin("arith.mulf", same_layout))
    smalti.infer_layouts(kernel.module, pipeline=pipeline)
    assert normalized(kernel.module) == normalized(_inferred_with_builtin_rules())


def _inferred_with_builtin_rules():
    kernel = kernels.example_kernel()
    smalti.infer_layouts(kernel.module)
    return kernel.module
