"""The new op, smalti_example.fma: inference, the Vectorized constraint, lowering."""

import jax
import jax.numpy as jnp
import pytest
import smalti_example_plugin
from jax._src.lib import mosaic_gpu_dialect as mgpu
from jax.experimental.mosaic.gpu import fragmented_array as fa
from jax.experimental.mosaic.gpu import layouts as mgpu_layouts
from smalti_example_plugin import OP_NAME, fma_op

import smalti

PLUGIN = "smalti_example_plugin"


def fma_body(cast_to=None):
    def body(ctx, a_ref, b_ref, c_ref, out_ref, smem):
        a = mgpu.vector_load(a_ref)
        if cast_to is not None:
            a = mgpu.layout_cast(a, mgpu_layouts.to_layout_attr(cast_to))
        out = fma_op(a, mgpu.vector_load(b_ref), mgpu.vector_load(c_ref))
        mgpu.vector_store(out, out_ref)
    return body


def shapes(shape, dtype=jnp.float32):
    s = jax.ShapeDtypeStruct(shape, dtype)
    return [s, s, s], [s]


@pytest.fixture
def pipeline(smalti_pipeline):
    # The built-in rules for vector_load / vector_store, and this plugin.
    return smalti_pipeline("smalti.plugins", smalti_example_plugin)


def test_fma_is_inferred_and_lowered_to_math_fma(smalti_build, smalti_lower, pipeline):
    kernel = smalti_build(fma_body(), *shapes((128, 128)))
    lowered = smalti_lower(kernel, pipeline)
    [entry] = [e for e in lowered.inference.trace if e.op == OP_NAME]
    assert entry.plugin == PLUGIN
    assert "WGStridedFragLayout" in entry.layouts["out_layouts"]
    assert lowered.lowering.ops_per_plugin[PLUGIN] == 1
    assert OP_NAME not in lowered.text
    assert "math.fma" in lowered.text


def test_fma_takes_the_tiled_layout_of_its_operand(smalti_build, smalti_lower, pipeline):
    kernel = smalti_build(fma_body(cast_to=fa.WGMMA_LAYOUT), *shapes((128, 128)))
    lowered = smalti_lower(kernel, pipeline)
    [entry] = [e for e in lowered.inference.trace if e.op == OP_NAME]
    wgmma = "TiledLayout<[[64, 8], [16, 8], [8, 8], [2]]"  # registers of 2 elements
    assert entry.layouts["in_layouts"].count(wgmma) == 3
    assert wgmma in entry.layouts["out_layouts"]
    assert "math.fma" in lowered.text


def test_the_installed_plugins_lower_fma(smalti_build, smalti_lower):
    # pipeline=None: every installed plugin, this one found by its entry point.
    lowered = smalti_lower(smalti_build(fma_body(), *shapes((128, 64))))
    assert lowered.lowering.ops_per_plugin[PLUGIN] == 1


def test_one_element_per_thread_violates_vectorized(smalti_build, pipeline):
    # 128 elements over 128 threads: registers of one element.
    kernel = smalti_build(fma_body(), *shapes((128,)))
    with pytest.raises(smalti.UnsatisfiableLayoutsError) as error:
        smalti.infer_layouts(kernel.module, pipeline=pipeline)
    assert error.value.code == "SM101"
    assert any("holds vectors of at least 2 elements" in c and PLUGIN in c
               for c in error.value.conflict)


def test_fma_rejects_integer_vectors(smalti_build, smalti_lower, pipeline):
    kernel = smalti_build(fma_body(), *shapes((128, 128), jnp.int32))
    with pytest.raises(smalti.SmaltiError) as error:
        smalti_lower(kernel, pipeline)
    assert error.value.code == "SM203"
    assert "floating-point" in error.value.message


def test_without_the_plugin_the_op_is_unknown(smalti_build, smalti_pipeline):
    kernel = smalti_build(fma_body(), *shapes((128, 128)))
    with pytest.raises(smalti.SmaltiNotImplementedError) as error:
        smalti.infer_layouts(kernel.module, pipeline=smalti_pipeline("smalti.plugins"))
    assert error.value.code == "SM003"
