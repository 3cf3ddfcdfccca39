"""Each Blackwell op, through small Pallas kernels: smalti's module equals jax's."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from tests.official import assert_same_modules, gpu_facts
from tests.pallas_kit import kernel, swizzled
from tests.pallas_kit import tma_in as through_smem
from tests.pallas_kit import tma_out as out_through_smem

BLACKWELL = (10, 0)
F16, F32 = jnp.float16, jnp.float32


def sds(shape, dtype=F16):
    return jax.ShapeDtypeStruct(shape, dtype)


def same_modules(monkeypatch, call, *args) -> str:
    with gpu_facts(monkeypatch, arch=BLACKWELL):
        return assert_same_modules(call, *args)


@pytest.mark.parametrize("dtype, packed", [(F32, False), (F16, True), (F16, False)],
                         ids=["f32", "f16-packed", "f16-unpacked"])
@pytest.mark.parametrize("columns", [64, 128])
def test_tmem_store_then_load(monkeypatch, dtype, packed, columns):
    shape = (128, columns)

    def body(x_gmem, o_gmem, x_smem, o_smem, barrier, tmem):
        through_smem(x_gmem, x_smem, barrier)
        plgpu.async_store_tmem(tmem, x_smem[...])
        plgpu.commit_tmem()
        value = plgpu.async_load_tmem(tmem)
        plgpu.wait_load_tmem()
        out_through_smem(value, o_smem, o_gmem)

    call = kernel(body, sds(shape, dtype),
                  [plgpu.SMEM(shape, dtype), plgpu.SMEM(shape, dtype), plgpu.Barrier(),
                   plgpu.TMEM(shape, dtype, packed=packed)])
    text = same_modules(monkeypatch, call, sds(shape, dtype))
    assert "tcgen05.st" in text and "tcgen05.ld" in text


@pytest.mark.parametrize("reduce", ["max", "min"])
def test_tmem_load_with_row_reduction(monkeypatch, reduce):
    def body(x_gmem, o_gmem, r_gmem, x_smem, o_smem, barrier, tmem):
        through_smem(x_gmem, x_smem, barrier)
        plgpu.async_store_tmem(tmem, x_smem[...])
        plgpu.commit_tmem()
        loaded, reduced = plgpu.async_load_tmem(
            tmem, layout=plgpu.Layout.TCGEN05_TMEM_NATIVE, reduce=reduce)
        plgpu.wait_load_tmem()
        r_gmem[...] = reduced
        out_through_smem(loaded, o_smem, o_gmem)

    call = kernel(body, (sds((128, 64), F32), sds((128,), F32)),
                  [plgpu.SMEM((128, 64), F32), plgpu.SMEM((128, 64), F32), plgpu.Barrier(),
                   plgpu.TMEM((128, 64), F32)])
    same_modules(monkeypatch, call, sds((128, 64), F32))


def _mma_kernel(m, k, n, dtype, *, transpose_b=False, a_in_tmem=False, swizzle=128,
                arrive_on_mma=False):
    b_shape = (n, k) if transpose_b else (k, n)

    def body(a_gmem, b_gmem, o_gmem, a_smem, b_smem, o_smem, loaded, mma_done, acc, *a_tmem):
        through_smem(a_gmem, a_smem, loaded.at[0])
        through_smem(b_gmem, b_smem, loaded.at[1])
        rhs = b_smem.transpose((1, 0)) if transpose_b else b_smem
        if a_in_tmem:
            [lhs] = a_tmem
            plgpu.async_store_tmem(lhs, a_smem[...])
            plgpu.commit_tmem()
        else:
            lhs = a_smem
        if arrive_on_mma:
            plgpu.tcgen05_mma(acc, lhs, rhs, mma_done, accumulate=False)
        else:
            plgpu.tcgen05_mma(acc, lhs, rhs, accumulate=False)
            plgpu.tcgen05_commit_arrive(mma_done)
        plgpu.barrier_wait(mma_done)
        out_through_smem(plgpu.async_load_tmem(acc).astype(dtype), o_smem, o_gmem)

    scratch = [swizzled((m, k), dtype, swizzle), swizzled(b_shape, dtype, swizzle),
               plgpu.SMEM((m, n), dtype), plgpu.Barrier(num_barriers=2),
               plgpu.Barrier(orders_tensor_core=True), plgpu.TMEM((m, n), F32)]
    if a_in_tmem:
        scratch.append(plgpu.TMEM((m, k), dtype, packed=True))
    return kernel(body, sds((m, n), dtype), scratch), (sds((m, k), dtype), sds(b_shape, dtype))


@pytest.mark.parametrize("dtype", [F16, jnp.bfloat16])
@pytest.mark.parametrize("transpose_b", [False, True])
@pytest.mark.parametrize("swizzle", [128, 64, 32])
def test_tcgen05_mma_from_smem(monkeypatch, dtype, transpose_b, swizzle):
    call, args = _mma_kernel(128, 64, 128, dtype, transpose_b=transpose_b, swizzle=swizzle)
    text = same_modules(monkeypatch, call, *args)
    assert "tcgen05.mma" in text and "tcgen05.commit" in text


@pytest.mark.parametrize("n", [64, 256])
def test_tcgen05_mma_arriving_on_a_barrier(monkeypatch, n):
    call, args = _mma_kernel(128, 64, n, F16, arrive_on_mma=True)
    same_modules(monkeypatch, call, *args)


def test_tcgen05_mma_with_a_in_tmem(monkeypatch):
    call, args = _mma_kernel(128, 64, 128, F16, a_in_tmem=True)
    text = same_modules(monkeypatch, call, *args)
    assert "tcgen05.st" in text and "tcgen05.mma" in text


def test_collective_tcgen05_mma(monkeypatch):
    """Two CTAs, one MMA: the lead block issues it for both."""
    m, k, n = 128, 64, 128  # per block: a (m, k), b (k, n / 2), acc (m, n)

    def body(a_gmem, b_gmem, o_gmem, a_smem, b_smem, o_smem, loaded, mma_done, acc):
        through_smem(a_gmem, a_smem, loaded.at[0])
        through_smem(b_gmem, b_smem, loaded.at[1])

        @pl.when(lax.axis_index("x") == 0)
        def _():
            plgpu.tcgen05_mma(acc, a_smem, b_smem, accumulate=False, collective_axis="x")
            plgpu.tcgen05_commit_arrive(mma_done, collective_axis="x")

        plgpu.barrier_wait(mma_done)
        out_through_smem(plgpu.async_load_tmem(acc).astype(F16), o_smem, o_gmem)

    call = kernel(body, sds((m, n)),
                  [swizzled((m, k)), swizzled((k, n // 2)), plgpu.SMEM((m, n), F16),
                   plgpu.Barrier(num_barriers=2), plgpu.Barrier(orders_tensor_core=True),
                   plgpu.TMEM((m, n), F32, collective=True)],
                  cluster=(2,), cluster_names=("x",))
    text = same_modules(monkeypatch, call, sds((m, k)), sds((k, n // 2)))
    assert "cta_group::2" in text


F8, E8M0, I2 = jnp.float8_e4m3fn, jnp.float8_e8m0fnu, jnp.int2


def test_block_scaled_tcgen05_mma(monkeypatch):
    """Scales are copied from SMEM into TMEM, then feed a block-scaled MMA."""
    m, k, n = 128, 128, 128
    scales_smem = (m // 128, k // 128, 32, 16)

    def body(a_gmem, b_gmem, sa_gmem, sb_gmem, o_gmem, a_smem, b_smem, sa_smem, sb_smem,
             o_smem, loaded, mma_done, acc, a_scale, b_scale):
        through_smem(a_gmem, a_smem, loaded.at[0])
        through_smem(b_gmem, b_smem, loaded.at[1])
        through_smem(sa_gmem, sa_smem, loaded.at[2])
        through_smem(sb_gmem, sb_smem, loaded.at[3])
        plgpu.async_copy_scales_to_tmem(sa_smem, a_scale)
        plgpu.async_copy_scales_to_tmem(sb_smem, b_scale)
        plgpu.tcgen05_mma(acc, a_smem, b_smem, mma_done, a_scale=a_scale, b_scale=b_scale,
                          accumulate=False)
        plgpu.barrier_wait(mma_done)
        out_through_smem(plgpu.async_load_tmem(acc).astype(F16), o_smem, o_gmem)

    scales = plgpu.TMEMLayout.SCALES_LAYOUT
    call = kernel(body, sds((m, n)),
                  [swizzled((m, k), F8), swizzled((k, n), F8), plgpu.SMEM(scales_smem, E8M0),
                   plgpu.SMEM(scales_smem, E8M0), plgpu.SMEM((m, n), F16),
                   plgpu.Barrier(num_barriers=4), plgpu.Barrier(orders_tensor_core=True),
                   plgpu.TMEM((m, n), F32), plgpu.TMEM((m, k // 32), E8M0, layout=scales),
                   plgpu.TMEM((n, k // 32), E8M0, layout=scales)])
    text = same_modules(monkeypatch, call, sds((m, k), F8), sds((k, n), F8),
                        sds(scales_smem, E8M0), sds(scales_smem, E8M0))
    assert "block_scale" in text and "tcgen05.cp" in text


def test_sparse_tcgen05_mma(monkeypatch):
    """2:4 sparse ``a`` (half of K stored), metadata copied from SMEM into TMEM."""
    m, k, n = 128, 128, 128
    meta_smem = (1, 1, 128, 64)

    def body(a_gmem, b_gmem, meta_gmem, o_gmem, a_smem, b_smem, meta, o_smem, loaded,
             mma_done, acc, meta_tmem):
        through_smem(a_gmem, a_smem, loaded.at[0])
        through_smem(b_gmem, b_smem, loaded.at[1])
        plgpu.async_copy_sparse_metadata_to_tmem(meta, meta_tmem)
        plgpu.tcgen05_mma(acc, a_smem, b_smem, mma_done, a_sparse_metadata=meta_tmem,
                          accumulate=False)
        plgpu.barrier_wait(mma_done)
        out_through_smem(plgpu.async_load_tmem(acc).astype(F16), o_smem, o_gmem)

    call = kernel(body, sds((m, n)),
                  [swizzled((m, k // 2)), swizzled((k, n)), plgpu.SMEM(meta_smem, I2),
                   plgpu.SMEM((m, n), F16), plgpu.Barrier(num_barriers=2),
                   plgpu.Barrier(orders_tensor_core=True), plgpu.TMEM((m, n), F32),
                   plgpu.TMEM((m, k // 2), I2,
                              layout=plgpu.TMEMLayout.SPARSE_METADATA_LAYOUT)])
    text = same_modules(monkeypatch, call, sds((m, k // 2)), sds((k, n)), sds(meta_smem, I2))
    assert ".sp." in text


@pytest.mark.parametrize("swizzle", [128, None])
def test_copy_smem_to_tmem(monkeypatch, swizzle):
    shape = (128, 128)
    smem = swizzled(shape, F32, swizzle) if swizzle else plgpu.SMEM(shape, F32)

    def body(x_gmem, o_gmem, x_smem, o_smem, loaded, copied, tmem):
        through_smem(x_gmem, x_smem, loaded)
        plgpu.async_copy_smem_to_tmem(x_smem, tmem)
        plgpu.tcgen05_commit_arrive(copied)
        plgpu.barrier_wait(copied)
        out_through_smem(plgpu.async_load_tmem(tmem), o_smem, o_gmem)

    call = kernel(body, sds(shape, F32),
                  [smem, plgpu.SMEM(shape, F32), plgpu.Barrier(),
                   plgpu.Barrier(orders_tensor_core=True), plgpu.TMEM(shape, F32)])
    text = same_modules(monkeypatch, call, sds(shape, F32))
    assert "tcgen05.cp" in text


def test_try_and_query_cluster_cancel(monkeypatch):
    def body(o_gmem, result, barrier):
        plgpu.try_cluster_cancel(result, barrier)
        plgpu.barrier_wait(barrier)
        (x,), cancelled = plgpu.query_cluster_cancel(result, grid_names=("x",))
        o_gmem[...] = jnp.where(cancelled, x, -1) + jnp.zeros((128,), jnp.int32)

    call = kernel(body, sds((128,), jnp.int32), [plgpu.TryClusterCancelResult(),
                                                  plgpu.Barrier()],
                  grid=(4,), grid_names=("x",))
    text = same_modules(monkeypatch, call)
    assert "clusterlaunchcontrol.try_cancel" in text and "query_cancel" in text
