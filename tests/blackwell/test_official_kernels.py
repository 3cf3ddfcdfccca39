"""jax's official Pallas Blackwell kernels lower through smalti to jax's module."""

from __future__ import annotations

import types

import jax
import jax.numpy as jnp
import pytest
from jax.experimental.pallas.ops.gpu import blackwell_matmul_mgpu as matmul
from jax.experimental.pallas.ops.gpu import blackwell_ragged_dot_mgpu as ragged

import smalti
import smalti.jax
from tests.official import NUM_SMS, assert_same_modules, capture_modules, gpu_facts

M = matmul.MatmulDimension
BLACKWELL = (10, 0)


def sds(shape, dtype):
    return jax.ShapeDtypeStruct(shape, dtype)


MATMUL_CONFIGS = {
    "128x128x64": matmul.TuningConfig(tile_m=128, tile_n=128, tile_k=64,
                                      max_concurrent_steps=2, collective=False),
    "128x256x64": matmul.TuningConfig(tile_m=128, tile_n=256, tile_k=64,
                                      max_concurrent_steps=2, collective=False),
    "k32-epilogue32": matmul.TuningConfig(tile_m=128, tile_n=128, tile_k=32,
                                          max_concurrent_steps=4, collective=False,
                                          epilogue_tile_n=32),
    "m-minor-snake": matmul.TuningConfig(tile_m=128, tile_n=128, tile_k=128,
                                         max_concurrent_steps=2, collective=False,
                                         grid_minor_dim=M.M, grid_tile_width=4),
    "collective": matmul.TuningConfig(tile_m=128, tile_n=128, tile_k=64,
                                      max_concurrent_steps=2, collective=True),
    "collective-n64": matmul.TuningConfig(tile_m=128, tile_n=64, tile_k=64,
                                          max_concurrent_steps=3, collective=True,
                                          epilogue_tile_n=32, grid_tile_width=2),
}


@pytest.mark.parametrize("name", list(MATMUL_CONFIGS))
@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
def test_blackwell_matmul(monkeypatch, name, dtype):
    config = MATMUL_CONFIGS[name]
    with gpu_facts(monkeypatch, arch=BLACKWELL):
        a, b = sds((512, 256), dtype), sds((256, 1024), dtype)
        text = assert_same_modules(lambda a, b: matmul.matmul_kernel(a, b, config), a, b)
    assert "mosaic_gpu.tcgen05_mma" not in text and "tcgen05.mma" in text
    assert ("cta_group::2" in text) == config.collective


RAGGED_CONFIGS = {
    "128x128x64": ragged.TuningConfig(tile_m=128, tile_n=128, tile_k=64,
                                      max_concurrent_steps=2, collective=True,
                                      grid_tile_width=1, grid_minor_dim=M.N),
    "4-steps-m-minor": ragged.TuningConfig(tile_m=128, tile_n=128, tile_k=64,
                                           max_concurrent_steps=4, collective=True,
                                           grid_tile_width=8, grid_minor_dim=M.M),
    "epilogue32": ragged.TuningConfig(tile_m=128, tile_n=64, tile_k=128,
                                      max_concurrent_steps=2, collective=True,
                                      grid_tile_width=1, grid_minor_dim=M.N,
                                      epilogue_tile_n=32),
}


@pytest.mark.parametrize("name", list(RAGGED_CONFIGS))
def test_blackwell_ragged_dot(monkeypatch, name):
    # (jax's own lowering of the non-collective ragged dot fails: it asks for
    # the index along a cluster axis the kernel does not have.)
    config = RAGGED_CONFIGS[name]
    device = types.SimpleNamespace(core_count=NUM_SMS)
    monkeypatch.setattr(jax, "local_devices", lambda *a, **k: [device])
    with gpu_facts(monkeypatch, arch=BLACKWELL):
        a, b = sds((1024, 256), jnp.float16), sds((4, 256, 512), jnp.float16)
        groups = sds((4,), jnp.int32)
        assert_same_modules(lambda a, b, g: ragged.ragged_dot_kernel(a, b, g, config),
                            a, b, groups)


def test_m64_tiles_fail_like_jax(monkeypatch):
    """M=64 tiles: Pallas pins the accumulator to the 128-row layout, which
    an M=64 MMA cannot use. jax fails to infer layouts, and so does smalti,
    naming the conflict."""
    config = matmul.TuningConfig(tile_m=64, tile_n=128, tile_k=64, max_concurrent_steps=2,
                                 collective=False)
    a, b = sds((512, 256), jnp.float16), sds((256, 512), jnp.float16)

    def fn(a, b):
        return matmul.matmul_kernel(a, b, config)

    with gpu_facts(monkeypatch, arch=BLACKWELL):
        with pytest.raises(ValueError, match="Failed to infer a possible set of layouts"):
            capture_modules(fn, a, b)
        with smalti.jax.installed(), pytest.raises(smalti.UnsatisfiableLayoutsError) as error:
            capture_modules(fn, a, b)
    assert error.value.code == "SM101"
    assert "tcgen05_mma" in str(error.value) and "tmem_layout_cast" in str(error.value)
