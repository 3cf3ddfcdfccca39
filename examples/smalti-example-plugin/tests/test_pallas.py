"""fma for Pallas users: a Pallas Mosaic GPU kernel (Warpgroup semantics) that
calls smalti_example_plugin.fma lowers through smalti, end to end, on the CPU."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.mosaic.gpu import core as mgpu_core
from jax.experimental.pallas import mosaic_gpu as plgpu
from smalti_example_plugin import fma

import smalti.jax

F32 = jax.ShapeDtypeStruct((128, 128), jnp.float32)


def fma_kernel():
    def body(a_ref, b_ref, c_ref, out_ref):
        out_ref[...] = fma(a_ref[...], b_ref[...], c_ref[...])

    return plgpu.kernel(body, out_type=F32, compiler_params=plgpu.CompilerParams(
        lowering_semantics=plgpu.LoweringSemantics.Warpgroup))


def lower_for_cuda(fn, *args) -> list[str]:
    """Lowers ``fn`` for CUDA on the CPU; returns the lowered Mosaic GPU modules."""
    modules, current = [], mgpu_core.lower_mgpu_module

    def spy(module, *a, **k):
        current(module, *a, **k)
        modules.append((str(module), module.context.allow_unregistered_dialects))

    mgpu_core.lower_mgpu_module = spy
    jax.clear_caches()
    try:
        jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",))
    finally:
        mgpu_core.lower_mgpu_module = current
    return modules


def test_a_pallas_kernel_calling_fma_lowers_through_smalti():
    with smalti.jax.installed():
        [(text, unregistered_allowed)] = lower_for_cuda(fma_kernel(), F32, F32, F32)
    assert "math.fma" in text
    assert "smalti_example.fma" not in text
    # The context (jax's, reused) accepts unknown dialects again only if it did before.
    assert not unregistered_allowed


def test_without_smalti_pallas_does_not_know_fma():
    with pytest.raises(NotImplementedError, match="smalti_example_fma"):
        lower_for_cuda(fma_kernel(), F32, F32, F32)


def test_fma_computes_a_fused_multiply_add_on_the_emulator(smalti_emulate, smalti_pipeline):
    """Not the text of the lowering: what it computes, run on the CPU."""
    rng = np.random.default_rng(0)
    a, b, c = (rng.standard_normal((128, 128)).astype(np.float32) for _ in range(3))
    pipeline = smalti_pipeline("smalti.plugins", "smalti.hopper", "smalti_example_plugin")
    (out,) = smalti_emulate(fma_kernel(), a, b, c, pipeline=pipeline)
    fused = (a.astype(np.float64) * b + c).astype(np.float32)  # one rounding, as fma.rn
    np.testing.assert_array_equal(out, fused)
    assert not np.array_equal(out, a * b + c)  # two roundings differ somewhere
