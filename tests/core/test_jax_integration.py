"""smalti.jax: jax's own pipeline (mgpu.as_gpu_kernel, Pallas) routed through smalti."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax import lax
from jax._src.pallas.mosaic_gpu import core as gpu_core
from jax._src.pallas.mosaic_gpu import lowering as pallas_lowering
from jax.experimental.mosaic.gpu import core as mgpu_core
from jax.experimental.pallas import mosaic_gpu as plgpu

import smalti
import smalti.jax
from smalti.registry import PallasRegistry, RuleKind
from tests.official import capture_modules as lower_capturing_modules

WARPGROUP = plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup)


def elementwise_kernel(x_ref, y_ref, o_ref):
    x = x_ref[...]
    o_ref[...] = jnp.where(x > 0, jnp.exp(x), y_ref[...] * 2.0) + 1.0


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float16])
def test_pallas_elementwise_kernel_lowers_to_the_same_module(dtype):
    shape = jax.ShapeDtypeStruct((128, 256), dtype)
    call = plgpu.kernel(elementwise_kernel, out_type=shape, compiler_params=WARPGROUP)
    by_jax = lower_capturing_modules(call, shape, shape)
    with smalti.jax.installed():
        assert smalti.jax.is_installed()
        by_smalti = lower_capturing_modules(call, shape, shape)
    assert not smalti.jax.is_installed()
    assert len(by_jax) == len(by_smalti) == 1
    assert "mosaic_gpu.vector_load" not in by_smalti[0]  # really lowered
    assert by_smalti[0] == by_jax[0]


def test_smalti_does_the_work_when_installed(monkeypatch):
    calls = []
    original = smalti.jax.infer_layouts

    def counting(module, **kw):
        calls.append(module)
        return original(module, **kw)

    monkeypatch.setattr(smalti.jax, "infer_layouts", counting)
    shape = jax.ShapeDtypeStruct((128,), jnp.float32)
    call = plgpu.kernel(lambda x, o: o.__setitem__(..., x[...] + 1.0),
                        out_type=shape, compiler_params=WARPGROUP)
    lower_capturing_modules(call, shape)
    assert not calls
    with smalti.jax.installed():
        lower_capturing_modules(call, shape)
    assert len(calls) == 1


def test_uninstall_restores_jax_exactly():
    original = mgpu_core.lower_mgpu_module
    rules = dict(pallas_lowering.mosaic_lowering_rules[gpu_core.WGxWG_SEMANTICS])
    smalti.jax.install()
    smalti.jax.install()  # reentrant
    assert mgpu_core.lower_mgpu_module is not original
    smalti.jax.uninstall()
    assert smalti.jax.is_installed()
    smalti.jax.uninstall()
    assert mgpu_core.lower_mgpu_module is original
    assert pallas_lowering.mosaic_lowering_rules[gpu_core.WGxWG_SEMANTICS] == rules
    smalti.jax.uninstall()  # extra uninstall is harmless
    assert mgpu_core.lower_mgpu_module is original


def test_pallas_lowerings_of_plugins_are_in_force_and_removed_after():
    from jax._src.pallas.mosaic_gpu import primitives

    primitive = primitives.print_layout_p
    seen = []

    class Plugin:
        @smalti.hookimpl
        def smalti_register_pallas_lowerings(self, registry: PallasRegistry) -> None:
            @registry.pallas_lowering(primitive)
            def lowering(ctx, *args, **params):
                seen.append(params)
                return []

            lowering_of_plugin.append(lowering)

    lowering_of_plugin = []
    pipeline = smalti.build_pipeline(plugins={"printer": Plugin()}, autoload=False)
    def table():
        return pallas_lowering.mosaic_lowering_rules[gpu_core.WGxWG_SEMANTICS]

    before = table().get(primitive)
    with smalti.jax.installed(pipeline):
        assert table()[primitive] is not before
        assert table()[primitive].__wrapped__ is lowering_of_plugin[0]
    assert table().get(primitive) is before


def test_resource_estimators_of_plugins_size_the_kernel_and_are_removed_after():
    """A plugin's resource estimator is what Pallas' resource estimation
    consults for its primitive while smalti is installed: here it reserves
    scratch SMEM for a primitive Pallas counts as free; uninstalling restores
    Pallas' table."""
    from jax._src.pallas.mosaic_gpu import primitives

    primitive = primitives.print_layout_p
    estimators = pallas_lowering._resource_estimators

    class Plugin:
        @smalti.hookimpl
        def smalti_register_pallas_lowerings(self, registry: PallasRegistry) -> None:
            @registry.resource_estimator(primitive)
            def estimate(ctx, *avals, **params):
                return pallas_lowering.Resources(smem_scratch_bytes=4096)

    def body(x):
        plgpu.print_layout("{}", x)
        return x

    jaxpr = jax.make_jaxpr(body)(jnp.ones((128,), jnp.float32)).jaxpr
    ctx = pallas_lowering.ResourceEstimatorContext(
        reduction_scratch_bytes=0, axis_names=pallas_lowering._AxisNames(grid=()),
        lowering_semantics=plgpu.LoweringSemantics.Warpgroup)
    pipeline = smalti.build_pipeline(plugins={"estimator": Plugin()}, autoload=False)
    assert [r.key for r in pipeline.ops("estimator")[RuleKind.PALLAS_RESOURCES]] == \
        ["print_layout"]
    assert primitive not in estimators
    assert pallas_lowering._estimate_resources(ctx, jaxpr).smem_scratch_bytes == 0
    with smalti.jax.installed(pipeline):
        assert pallas_lowering._estimate_resources(ctx, jaxpr).smem_scratch_bytes == 4096
    assert primitive not in estimators


def _rewriting_plugin(seen: list, name: str = "neg_to_abs"):
    """A plugin whose jaxpr rewrite records each jaxpr it is given and
    turns every ``neg`` into ``abs``."""

    class Plugin:
        @smalti.hookimpl
        def smalti_register_pallas_lowerings(self, registry: PallasRegistry) -> None:
            @registry.jaxpr_rewrite(name)
            def rewrite(jaxpr):
                seen.append(jaxpr)
                if not any(e.primitive is lax.neg_p for e in jaxpr.eqns):
                    return None
                return jaxpr.replace(eqns=[e.replace(primitive=lax.abs_p)
                                           if e.primitive is lax.neg_p else e
                                           for e in jaxpr.eqns])

    return Plugin()


def test_jaxpr_rewrites_of_plugins_apply_to_every_jaxpr_and_are_removed_after():
    """A plugin's jaxpr rewrite sees the kernel's body and the jaxprs nested
    in it (a fori_loop's body) before Pallas lowers their equations, and what
    it returns is what is lowered; uninstalling puts Pallas' function back."""
    seen: list = []
    pipeline = smalti.build_pipeline(plugins={"rewriter": _rewriting_plugin(seen)})
    assert [r.key for r in pipeline.ops("rewriter")[RuleKind.PALLAS_REWRITE]] == ["neg_to_abs"]
    shape = jax.ShapeDtypeStruct((128,), jnp.float32)

    def body(x_ref, o_ref):
        o_ref[...] = lax.fori_loop(0, 2, lambda i, v: -v, x_ref[...])

    call = plgpu.kernel(body, out_type=shape, compiler_params=WARPGROUP)
    [plain] = lower_capturing_modules(call, shape)
    original = pallas_lowering.lower_jaxpr_to_mosaic_gpu
    with smalti.jax.installed(pipeline):
        assert pallas_lowering.lower_jaxpr_to_mosaic_gpu is not original
        [rewritten] = lower_capturing_modules(call, shape)
    assert pallas_lowering.lower_jaxpr_to_mosaic_gpu is original
    assert any(any(e.primitive is lax.neg_p for e in j.eqns) for j in seen)  # the loop body
    assert any(any(e.primitive.name == "scan" or e.primitive.name == "while" for e in j.eqns)
               for j in seen)  # the kernel's body
    assert "abs.f32" in rewritten and "abs.f32" not in plain  # jax's abs: inline PTX
    assert "arith.negf" in plain and "arith.negf" not in rewritten


def test_jaxpr_rewrites_reach_branches_and_scopes():
    """The jaxprs of ``lax.cond``'s branches and of ``pl.run_scoped``'s body
    are rewritten too (Pallas lowers each through the same function)."""
    from jax.experimental import pallas as pl

    seen: list = []
    pipeline = smalti.build_pipeline(plugins={"rewriter": _rewriting_plugin(seen)})
    shape = jax.ShapeDtypeStruct((128,), jnp.float32)

    def body(x_ref, o_ref):
        def scoped(tmp_ref):
            v = x_ref[...]
            tmp_ref[...] = lax.cond(jnp.max(v) > 0, lambda a: -a, lambda a: a * 2.0, v)
            o_ref[...] = tmp_ref[...]

        pl.run_scoped(scoped, plgpu.SMEM((128,), jnp.float32))

    call = plgpu.kernel(body, out_type=shape, compiler_params=WARPGROUP)
    with smalti.jax.installed(pipeline):
        [rewritten] = lower_capturing_modules(call, shape)
    names = [[e.primitive.name for e in j.eqns] for j in seen]
    assert any("cond" in n for n in names)  # the scope's body
    assert any(n == ["neg"] for n in names)  # the branch, before its rewrite
    assert "arith.negf" not in rewritten and "abs.f32" in rewritten


def test_two_plugins_rewriting_under_one_name_conflict():
    from smalti.diagnostics import PluginError

    with pytest.raises(PluginError, match="SM001.*'a' and 'b' both register a pallas jaxpr "
                                          "rewrite rule for 'neg_to_abs'"):
        smalti.build_pipeline(plugins={"a": _rewriting_plugin([]), "b": _rewriting_plugin([])},
                              autoload=False)


@pytest.mark.parametrize("bad, why", [
    (lambda jaxpr: {}["missing"], "raised KeyError: 'missing'"),
    (lambda jaxpr: jaxpr.replace(invars=jaxpr.invars[:-1]),
     "returned Jaxpr, not None or a jaxpr with the same"),
    (lambda jaxpr: "a jaxpr", "returned str, not None or a jaxpr"),
])
def test_a_broken_rewrite_is_its_plugin_s_error(bad, why):
    """A rewrite that raises or returns something else than a jaxpr with the
    same variables is SM006, naming the plugin, not a bare error from deep
    in Pallas."""
    from smalti.diagnostics import PluginError

    class Plugin:
        @smalti.hookimpl
        def smalti_register_pallas_lowerings(self, registry: PallasRegistry) -> None:
            registry.jaxpr_rewrite("broken")(bad)

    shape = jax.ShapeDtypeStruct((128,), jnp.float32)
    call = plgpu.kernel(lambda x, o: o.__setitem__(..., x[...] + 1.0),
                        out_type=shape, compiler_params=WARPGROUP)
    with smalti.jax.installed(smalti.build_pipeline(plugins={"breaker": Plugin()})):
        with pytest.raises(PluginError, match=f"SM006.*'breaker'.*'broken' {why}"):
            lower_capturing_modules(call, shape)


def test_a_pipeline_without_rewrites_leaves_pallas_function_alone():
    original = pallas_lowering.lower_jaxpr_to_mosaic_gpu
    with smalti.jax.installed(smalti.build_pipeline(autoload=False)):
        assert pallas_lowering.lower_jaxpr_to_mosaic_gpu is original


def test_replaced_rule_is_jax_s_own_while_installed():
    """``smalti.jax.replaced_rule``: what a plugin's Pallas lowering replaced
    (for handing jax the cases it handles), and Pallas' current rule for a
    primitive no plugin replaces."""
    from jax._src.pallas.mosaic_gpu import primitives

    primitive = primitives.print_layout_p
    rules = pallas_lowering.mosaic_lowering_rules[gpu_core.WGxWG_SEMANTICS]
    jax_rule = rules[primitive]

    class Plugin:
        @smalti.hookimpl
        def smalti_register_pallas_lowerings(self, registry: PallasRegistry) -> None:
            registry.pallas_lowering(primitive)(lambda ctx, *args, **params: [])

    pipeline = smalti.build_pipeline(plugins={"p": Plugin()}, autoload=False)
    with smalti.jax.installed(pipeline):
        rules = pallas_lowering.mosaic_lowering_rules[gpu_core.WGxWG_SEMANTICS]
        assert rules[primitive] is not jax_rule
        assert smalti.jax.replaced_rule(primitive) is jax_rule
        assert smalti.jax.replaced_rule(lax.exp_p) is rules[lax.exp_p]
    assert smalti.jax.replaced_rule(primitive) is jax_rule


def test_a_primitive_nothing_lowers_is_a_smalti_error_with_jax_s_phrase():
    """A primitive that neither Pallas nor a plugin lowers (``lax.zeta``):
    jax raises its bare NotImplementedError; with smalti installed it is
    SM206, still a NotImplementedError with jax's phrase, with the kernel's
    line, the operands and fixes. Pallas' table is jax's again afterwards."""
    shape = jax.ShapeDtypeStruct((64, 128), jnp.float32)

    def body(x_ref, o_ref):
        o_ref[...] = lax.zeta(x_ref[...], x_ref[...])

    call = plgpu.kernel(body, out_type=shape, compiler_params=WARPGROUP)
    phrase = "Unimplemented primitive in Pallas Mosaic GPU lowering: zeta"
    with pytest.raises(NotImplementedError, match=phrase) as bare:
        lower_capturing_modules(call, shape)
    assert not isinstance(bare.value, smalti.SmaltiError)
    with smalti.jax.installed(), pytest.raises(smalti.SmaltiError) as error:
        lower_capturing_modules(call, shape)
    assert isinstance(error.value, NotImplementedError) and error.value.code == "SM206"
    assert phrase in error.value.message and error.value.fixes
    assert "test_jax_integration.py" in error.value.location
    assert "float32[64,128]" in str(error.value)
    rules = pallas_lowering.mosaic_lowering_rules[gpu_core.WGxWG_SEMANTICS]
    assert type(rules) is dict and lax.zeta_p not in rules


def test_a_resource_estimator_needs_a_primitive():
    class Plugin:
        @smalti.hookimpl
        def smalti_register_pallas_lowerings(self, registry: PallasRegistry) -> None:
            registry.resource_estimator(42)(lambda ctx: None)

    pipeline = smalti.build_pipeline(plugins={"bad": Plugin()}, autoload=False)
    [problem] = pipeline.problems
    assert problem.error.code == "SM006" and "not a jax primitive" in problem.error.message


def test_errors_inside_jax_are_smalti_errors():
    shape = jax.ShapeDtypeStruct((128, 128), jnp.float32)

    def kernel(x_ref, o_ref):
        x = x_ref[...]
        # Mosaic GPU converts UPCAST_2X registers to WGMMA, not the other way.
        wgmma = plgpu.layout_cast(x, plgpu.Layout.WGMMA)
        o_ref[...] = plgpu.layout_cast(wgmma, plgpu.Layout.WGMMA_UPCAST_2X)

    call = plgpu.kernel(kernel, out_type=shape, compiler_params=WARPGROUP)
    with smalti.jax.installed(), pytest.raises(smalti.SmaltiError) as error:
        lower_capturing_modules(call, shape)
    assert isinstance(error.value, ValueError)
    assert error.value.code == "SM101"
    message = str(error.value)
    assert "WGMMA_UPCAST_2X" in message and "mosaic_gpu.layout_cast" in message
    assert "test_jax_integration.py" in message  # the user's line
