"""jax's official Pallas Hopper kernels lower through smalti to jax's module."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax.experimental.pallas.ops.gpu import hopper_matmul_mgpu as matmul
from jax.experimental.pallas.ops.gpu import hopper_mixed_type_matmul_mgpu as mixed

from tests.official import assert_same_modules, gpu_facts

M = matmul.MatmulDimension


def sds(shape, dtype):
    return jax.ShapeDtypeStruct(shape, dtype)


MATMUL_CONFIGS = {
    "128x128x64": matmul.TuningConfig(tile_m=128, tile_n=128, tile_k=64, max_concurrent_steps=2),
    "64x64x64-n-minor": matmul.TuningConfig(tile_m=64, tile_n=64, tile_k=64,
                                            max_concurrent_steps=4, grid_minor_dim=M.N,
                                            grid_tile_width=4),
    "256x128-wg-m": matmul.TuningConfig(tile_m=256, tile_n=128, tile_k=64,
                                        max_concurrent_steps=2, wg_dimension=M.M),
    "cluster-m": matmul.TuningConfig(tile_m=128, tile_n=128, tile_k=64, max_concurrent_steps=2,
                                     cluster_dimension=M.M),
    "cluster-n": matmul.TuningConfig(tile_m=128, tile_n=64, tile_k=64, max_concurrent_steps=3,
                                     cluster_dimension=M.N),
    "untiled-epilogue": matmul.TuningConfig(tile_m=128, tile_n=128, tile_k=32,
                                            max_concurrent_steps=2, epi_tile_m=None,
                                            epi_tile_n=None),
}


@pytest.mark.parametrize("name", list(MATMUL_CONFIGS))
@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
def test_hopper_matmul(monkeypatch, name, dtype):
    config = MATMUL_CONFIGS[name]
    with gpu_facts(monkeypatch):
        a, b = sds((512, 256), dtype), sds((256, 512), dtype)
        assert_same_modules(lambda a, b: matmul.matmul(a, b, None, config), a, b)


@pytest.mark.parametrize("c_dtype", [jnp.float16, jnp.float32])
def test_hopper_matmul_with_added_c(monkeypatch, c_dtype):
    config = MATMUL_CONFIGS["128x128x64"]
    with gpu_facts(monkeypatch):
        a, b = sds((256, 256), jnp.float16), sds((256, 512), jnp.float16)
        c = sds((256, 512), c_dtype)
        assert_same_modules(lambda a, b, c: matmul.matmul(a, b, c, config), a, b, c)


MIXED_CONFIGS = {
    "128x128x64": mixed.TuningConfig(tile_m=128, tile_n=128, tile_k=64, max_concurrent_steps=2),
    "64x128x128-wg-m": mixed.TuningConfig(tile_m=64, tile_n=128, tile_k=128,
                                          max_concurrent_steps=2,
                                          wg_dimension=mixed.MatmulDimension.M),
    "cluster-n": mixed.TuningConfig(tile_m=128, tile_n=64, tile_k=64, max_concurrent_steps=2,
                                    cluster_dimension=mixed.MatmulDimension.N),
}


@pytest.mark.parametrize("name", list(MIXED_CONFIGS))
@pytest.mark.parametrize("dtypes", [(jnp.int8, jnp.bfloat16), (jnp.int8, jnp.float16)],
                         ids=["s8xbf16", "s8xf16"])
def test_hopper_mixed_type_matmul(monkeypatch, name, dtypes):
    config = MIXED_CONFIGS[name]
    a_dtype, b_dtype = dtypes
    with gpu_facts(monkeypatch):
        a, b = sds((256, 256), a_dtype), sds((256, 512), b_dtype)
        assert_same_modules(
            lambda a, b: mixed.mixed_matmul_kernel(a, b, out_dtype=b_dtype, config=config), a, b)


@pytest.mark.parametrize("block_kv", [64, 128])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_attention_with_pipeline_emitter(monkeypatch, block_kv, head_dim):
    from jax.experimental.pallas.ops.gpu import attention_mgpu as attention

    config = attention.TuningConfig(block_q=64, block_kv=block_kv, max_concurrent_steps=2)
    q = sds((1, 256, 2, head_dim), jnp.float16)
    with gpu_facts(monkeypatch):
        assert_same_modules(
            lambda q, k, v: attention.attention_with_pipeline_emitter(q, k, v, config), q, q, q)
