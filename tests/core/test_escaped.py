"""jax errors escaping Pallas' Warpgroup rules are smalti errors (SM207)
while smalti is installed (``smalti.escaped``), and bare jax errors without it."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.experimental.pallas import mosaic_gpu as plgpu

import smalti
import smalti.emulate
import smalti.jax
from smalti.registry import PallasRegistry

WARPGROUP = plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup)
SHAPE = jax.ShapeDtypeStruct((64, 128), jnp.float32)


def _kernel(fn):
    def body(x_ref, o_ref):
        o_ref[...] = fn(x_ref[...])

    return plgpu.kernel(body, out_type=SHAPE, compiler_params=WARPGROUP)


def _lower(call):
    x = np.ones(SHAPE.shape, np.float32)
    smalti.emulate.lower(call, x)


def test_a_malformed_result_of_jax_s_rule_names_the_primitive_and_the_line():
    """``jnp.copysign(x, -1.0)``: jax's bitcast of the scalar -1.0 makes a
    0-D vector, which Pallas refuses with a bare AssertionError and no line.
    With smalti (its vocabulary blocked, which lowers it): SM207, still an
    AssertionError, naming bitcast_convert_type, jax's rule and this file's
    line (the error inside jnp's jit gets the kernel's line)."""
    call = _kernel(lambda x: jnp.copysign(x, -1.0))
    with pytest.raises(AssertionError, match="Scalars must be represented") as bare:
        _lower(call)
    assert not isinstance(bare.value, smalti.SmaltiError)
    pipeline = smalti.build_pipeline(block=["smalti.vocabulary"])
    with smalti.jax.installed(pipeline), pytest.raises(smalti.SmaltiError) as error:
        _lower(call)
    assert isinstance(error.value, AssertionError) and error.value.code == "SM207"
    assert error.value.values["primitive"] == "bitcast_convert_type"
    assert error.value.values["operands"] == "float32[]"
    assert "_bitcast_convert_type_lowering_rule" in error.value.values["rule"]
    assert "vector<i32>" in error.value.message and error.value.fixes
    assert "test_escaped.py" in error.value.location


def _raising_plugin(error: Exception):
    class Plugin:
        @smalti.hookimpl
        def smalti_register_pallas_lowerings(self, registry: PallasRegistry) -> None:
            @registry.pallas_lowering(lax.floor_p)
            def lower_floor(ctx, x):
                raise error

    return smalti.build_pipeline(plugins={"raising": Plugin()}, autoload=False)


@pytest.mark.parametrize("error", [AssertionError("codegen assertion"),
                                   ValueError("bad layout"), TypeError("bad operand")],
                         ids=lambda e: type(e).__name__)
def test_an_exception_escaping_a_rule_keeps_its_class(error):
    """Whatever a rule raises is SM207, an instance of the class raised,
    with jax's message, the primitive, its operands, the rule and the line."""
    call = _kernel(jnp.floor)
    with smalti.jax.installed(_raising_plugin(error)), \
            pytest.raises(smalti.SmaltiError) as caught:
        _lower(call)
    assert isinstance(caught.value, type(error)) and caught.value.code == "SM207"
    assert str(error) in caught.value.message and "floor" in caught.value.message
    assert caught.value.values["operands"] == "float32[64,128]"
    assert caught.value.values["rule"].endswith("lower_floor")
    assert "test_escaped.py" in caught.value.location


def test_smalti_errors_of_rules_pass_unchanged():
    """A rule's own smalti error is not rewrapped."""
    refusal = smalti.SmaltiNotImplementedError("SM206", "refused", fix="do something else")
    with smalti.jax.installed(_raising_plugin(refusal)), \
            pytest.raises(smalti.SmaltiError) as caught:
        _lower(_kernel(jnp.floor))
    assert caught.value is refusal and caught.value.code == "SM206"


def test_a_rule_looked_up_twice_is_one_object_and_uninstall_restores_jax():
    from jax._src.pallas.mosaic_gpu import core as gpu_core
    from jax._src.pallas.mosaic_gpu import lowering as pallas_lowering

    def table():
        return pallas_lowering.mosaic_lowering_rules[gpu_core.WGxWG_SEMANTICS]

    raw = table()[lax.exp_p]
    with smalti.jax.installed():
        assert table()[lax.exp_p] is table()[lax.exp_p] is not raw
        assert table()[lax.exp_p].__wrapped__ is raw
    assert table()[lax.exp_p] is raw
