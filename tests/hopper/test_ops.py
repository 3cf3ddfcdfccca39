"""Each Hopper op, through Pallas kernels: smalti's module equals jax's."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

import smalti
import smalti.jax
from tests.official import assert_same_modules, capture_modules, gpu_facts
from tests.pallas_kit import kernel, swizzled

F16 = jnp.float16


def sds(shape, dtype=F16):
    return jax.ShapeDtypeStruct(shape, dtype)


@pytest.mark.parametrize("transforms", [False, True], ids=["inferred", "explicit"])
@pytest.mark.parametrize("shape", [(64, 64), (128, 128)])
def test_tma_load_and_store(monkeypatch, transforms, shape):
    smem = swizzled(shape) if transforms else plgpu.SMEM(shape, F16)

    def body(x_gmem, o_gmem, x_smem, o_smem, barrier):
        plgpu.copy_gmem_to_smem(x_gmem, x_smem, barrier)
        plgpu.barrier_wait(barrier)
        o_smem[...] = x_smem[...] * 2
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(o_smem, o_gmem)
        plgpu.wait_smem_to_gmem(0)

    call = kernel(body, sds(shape), [smem, smem, plgpu.Barrier()])
    with gpu_facts(monkeypatch):
        assert_same_modules(call, sds(shape))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.int32])
def test_tma_store_with_reduction_and_sliced_gmem(monkeypatch, dtype):
    def body(x_gmem, o_gmem, smem, barrier):
        i = jax.lax.axis_index("x")
        plgpu.copy_gmem_to_smem(x_gmem.at[pl.ds(i * 64, 64)], smem, barrier)
        plgpu.barrier_wait(barrier)
        plgpu.copy_smem_to_gmem(smem, o_gmem.at[pl.ds(0, 64)], reduction_op="add")
        plgpu.wait_smem_to_gmem(0)

    call = kernel(body, sds((128, 64), dtype),
                  [plgpu.SMEM((64, 64), dtype), plgpu.Barrier()],
                  grid=(2,), grid_names=("x",))
    with gpu_facts(monkeypatch):
        assert_same_modules(call, sds((128, 64), dtype))


def test_tma_multicast_in_a_cluster_and_prefetch(monkeypatch):
    def body(x_gmem, o_gmem, smem, barrier):
        plgpu.async_prefetch(x_gmem)
        plgpu.copy_gmem_to_smem(x_gmem, smem, barrier, collective_axes="cluster")
        plgpu.barrier_wait(barrier)
        plgpu.copy_smem_to_gmem(smem, o_gmem)
        plgpu.wait_smem_to_gmem(0)

    call = kernel(body, sds((128, 64)), [swizzled((128, 64)), plgpu.Barrier()],
                  cluster=(2,), cluster_names=("cluster",))
    with gpu_facts(monkeypatch):
        assert_same_modules(call, sds((128, 64)))


@pytest.mark.parametrize("a_from", ["smem", "registers"])
@pytest.mark.parametrize("transpose_b", [False, True])
def test_wgmma_operand_forms(monkeypatch, a_from, transpose_b):
    m, k, n = 64, 64, 128

    def body(a_gmem, b_gmem, o_gmem, a_smem, b_smem, o_smem, barrier):
        plgpu.copy_gmem_to_smem(a_gmem, a_smem, barrier)
        plgpu.barrier_wait(barrier)
        plgpu.copy_gmem_to_smem(b_gmem, b_smem, barrier)
        plgpu.barrier_wait(barrier)
        b = b_smem.transpose((1, 0)) if transpose_b else b_smem

        def scope(acc_ref):
            a = a_smem[...] if a_from == "registers" else a_smem
            plgpu.wgmma(acc_ref, a, b)
            plgpu.wgmma_wait(0)
            return acc_ref[...]

        o_smem[...] = pl.run_scoped(scope, plgpu.ACC((m, n), jnp.float32)).astype(F16)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(o_smem, o_gmem)
        plgpu.wait_smem_to_gmem(0)

    b_shape = (n, k) if transpose_b else (k, n)
    call = kernel(body, sds((m, n)), [plgpu.SMEM((m, k), F16), plgpu.SMEM(b_shape, F16),
                                      plgpu.SMEM((m, n), F16), plgpu.Barrier()])
    with gpu_facts(monkeypatch):
        assert_same_modules(call, sds((m, k)), sds(b_shape))


def test_async_store_smem_to_a_peer(monkeypatch):
    def body(x_gmem, o_gmem, x_smem, smem, loaded, stored):
        plgpu.copy_gmem_to_smem(x_gmem, x_smem, loaded)
        plgpu.barrier_wait(loaded)
        peer = 1 - jax.lax.axis_index("cluster")
        plgpu.async_store_smem(x_smem[...], smem, stored, cluster_idx=peer,
                               cluster_dim="cluster")
        plgpu.barrier_wait(stored)
        plgpu.copy_smem_to_gmem(smem, o_gmem)
        plgpu.wait_smem_to_gmem(0)

    call = kernel(body, sds((128, 64)), [swizzled((128, 64)), swizzled((128, 64)),
                                         plgpu.Barrier(), plgpu.Barrier()],
                  cluster=(2,), cluster_names=("cluster",))
    with gpu_facts(monkeypatch):
        assert_same_modules(call, sds((128, 64)))


def test_wgmma_before_hopper_is_refused_naming_the_architecture_when_strict(monkeypatch):
    monkeypatch.setenv("SMALTI_STRICT_ARCH", "1")
    def body(a_gmem, o_gmem, a_smem, barrier):
        plgpu.copy_gmem_to_smem(a_gmem, a_smem, barrier)
        plgpu.barrier_wait(barrier)

        def scope(acc_ref):
            plgpu.wgmma(acc_ref, a_smem, a_smem)
            plgpu.wgmma_wait(0)
            return acc_ref[...]

        o_gmem[...] = pl.run_scoped(scope, plgpu.ACC((64, 64), jnp.float32))

    call = kernel(body, sds((64, 64), jnp.float32), [plgpu.SMEM((64, 64), F16), plgpu.Barrier()])
    # Pallas itself refuses to build this kernel for sm_80: build it for sm_90
    # and ask smalti to compile it for sm_80.
    monkeypatch.setattr(smalti.jax, "infer_layouts",
                        lambda module, **kw: smalti.infer_layouts(module, **{**kw, "arch": (8, 0)}))
    with gpu_facts(monkeypatch), smalti.jax.installed():
        with pytest.raises(smalti.SmaltiNotImplementedError) as error:
            capture_modules(call, sds((64, 64)))
    assert error.value.code == "SM002"
    message = str(error.value)
    assert "sm_80" in message and "smalti.hopper" in message


@pytest.mark.parametrize("rows, layout", [(16, plgpu.Layout.TMA_INDICES),
                                          (8, plgpu.Layout.TMA_INDICES_4)])
@pytest.mark.parametrize("direction", ["gather", "scatter"])
def test_tma_gather_and_scatter(monkeypatch, rows, layout, direction):
    def body(x_gmem, idx_gmem, o_gmem, smem, barrier):
        idx = plgpu.load(idx_gmem, layout=layout, optimized=False)
        if direction == "gather":
            plgpu.copy_gmem_to_smem(x_gmem.at[idx], smem, barrier)
            plgpu.barrier_wait(barrier)
            plgpu.copy_smem_to_gmem(smem, o_gmem.at[pl.ds(0, rows)])
        else:
            plgpu.copy_gmem_to_smem(x_gmem.at[pl.ds(0, rows)], smem, barrier)
            plgpu.barrier_wait(barrier)
            plgpu.copy_smem_to_gmem(smem, o_gmem.at[idx])
        plgpu.wait_smem_to_gmem(0)

    call = kernel(body, sds((128, 64)), [plgpu.SMEM((rows, 64), F16), plgpu.Barrier()])
    with gpu_facts(monkeypatch):
        assert_same_modules(call, sds((128, 64)), sds((rows,), jnp.int32))
