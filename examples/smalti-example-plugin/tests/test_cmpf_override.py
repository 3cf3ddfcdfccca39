"""The override of smalti.plugins' arith.cmpf lowering: the same IR where the
built-in works, every predicate where it does not; blocking the plugin
restores the built-in."""

import jax
import jax.numpy as jnp
import pytest
import smalti_example_plugin
from jax._src.lib import mosaic_gpu_dialect as mgpu
from jax._src.lib.mlir.dialects import arith

import smalti
from smalti.registry import RuleKind

PLUGIN = "smalti_example_plugin"
F32 = jax.ShapeDtypeStruct((128, 128), jnp.float32)
P = arith.CmpFPredicate


def select_body(*predicates):
    """out = x, then for each predicate: out = pred(out, y) ? out : y."""
    def body(ctx, x_ref, y_ref, out_ref, smem):
        x, y = mgpu.vector_load(x_ref), mgpu.vector_load(y_ref)
        for predicate in predicates:
            x = arith.select(arith.cmpf(predicate, x, y), x, y)
        mgpu.vector_store(x, out_ref)
    return body


@pytest.fixture
def builtin(smalti_pipeline):
    return smalti_pipeline("smalti.plugins")


@pytest.fixture
def with_example(smalti_pipeline):
    return smalti_pipeline("smalti.plugins", smalti_example_plugin)


def test_the_override_is_declared(with_example):
    [(winner, loser)] = with_example.overridden
    assert (winner.plugin, loser.plugin, winner.key) == (PLUGIN, "smalti.plugins", "arith.cmpf")
    assert winner.kind is RuleKind.LOWERING
    assert with_example.table(RuleKind.LOWERING, (9, 0))["arith.cmpf"].plugin == PLUGIN
    # Only the lowering: inference keeps the built-in rule.
    assert with_example.table(RuleKind.CONSTRAINT, (9, 0))["arith.cmpf"].plugin == "smalti.plugins"


def test_builtin_predicates_lower_as_the_builtin_and_jax_do(smalti_compare, builtin,
                                                           with_example):
    body = select_body(P.OLT, P.OLE, P.OGT, P.OGE, P.OEQ, P.UNE)
    ours = smalti_compare(body, [F32, F32], [F32], pipeline=with_example, reference=builtin)
    assert smalti_compare(body, [F32, F32], [F32], pipeline=with_example, reference="jax") == ours


@pytest.mark.parametrize("predicate", [P.ULT, P.UGE, P.UEQ, P.ONE, P.ORD, P.UNO])
def test_other_predicates_need_the_plugin(smalti_build, smalti_lower, builtin, with_example,
                                          predicate):
    lowered = smalti_lower(smalti_build(select_body(predicate), [F32, F32], [F32]),
                           with_example)
    assert lowered.lowering.ops_per_plugin[PLUGIN] == 1
    assert f"arith.cmpf {str(predicate).lower()}" in lowered.text

    kernel = smalti_build(select_body(predicate), [F32, F32], [F32])
    with pytest.raises(smalti.SmaltiError) as error:
        smalti_lower(kernel, builtin)
    assert error.value.code == "SM203"


def test_blocking_the_plugin_restores_the_builtin(smalti_pipeline):
    pipeline = smalti_pipeline("smalti.plugins", smalti_example_plugin, block=[PLUGIN])
    assert pipeline.overridden == []
    assert pipeline.table(RuleKind.LOWERING, (9, 0))["arith.cmpf"].plugin == "smalti.plugins"
