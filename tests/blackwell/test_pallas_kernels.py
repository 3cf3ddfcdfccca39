"""Pallas Mosaic GPU kernels with Warpgroup semantics, written the way jax's own
Pallas tests write them, lowered for sm_100a: smalti's modules equal jax's.

TMEM allocation, loads, stores, slices and aliasing; tcgen05 MMA (dense,
integer, FP8, block-scaled, sparse, from TMEM, into sliced accumulators, in
loops and pipelines, issued from one warp); collective 2-CTA kernels in a
cluster; dynamic work scheduling.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from tests.official import assert_same_modules, gpu_facts
from tests.pallas_kit import kernel, swizzled, tma_in, tma_out, transforms

BLACKWELL = (10, 0)
F16, BF16, F32, I32 = jnp.float16, jnp.bfloat16, jnp.float32, jnp.int32
I8, U8 = jnp.int8, jnp.uint8
E4M3, E5M2, E8M0, U2 = jnp.float8_e4m3fn, jnp.float8_e5m2, jnp.float8_e8m0fnu, jnp.uint2


def sds(shape, dtype=F32):
    return jax.ShapeDtypeStruct(shape, dtype)


def same(monkeypatch, call, *args) -> str:
    with gpu_facts(monkeypatch, arch=BLACKWELL):
        return assert_same_modules(call, *args)


# --- Hopper-style kernels compiled for Blackwell --------------------------------------

@pytest.mark.parametrize("op", ["exp-add", "reduce-max", "convert"])
def test_registers_and_smem_on_blackwell(monkeypatch, op):
    def fn(x):
        if op == "exp-add":
            return jnp.exp(x) + x
        if op == "reduce-max":
            x = plgpu.layout_cast(x, plgpu.Layout.TCGEN05)
            return x - jnp.max(x, axis=1, keepdims=True)
        return x.astype(BF16).astype(F32) * 2

    def body(x_gmem, o_gmem, x_smem, o_smem, barrier):
        tma_in(x_gmem, x_smem, barrier)
        tma_out(fn(x_smem[...]), o_smem, o_gmem)

    call = kernel(body, sds((128, 128)), [plgpu.SMEM((128, 128), F32),
                                          plgpu.SMEM((128, 128), F32), plgpu.Barrier()])
    same(monkeypatch, call, sds((128, 128)))


def test_emit_pipeline_on_blackwell(monkeypatch):
    def body(x_gmem, o_gmem):
        def step(_, x_smem, o_smem):
            o_smem[...] = x_smem[...] * 2

        spec = plgpu.BlockSpec((128, 64), lambda i: (0, i), transforms=transforms(F16))
        plgpu.emit_pipeline(step, grid=(4,), in_specs=[spec], out_specs=[spec],
                            max_concurrent_steps=2)(x_gmem, o_gmem)

    same(monkeypatch, kernel(body, sds((128, 256), F16)), sds((128, 256), F16))


# --- TMEM ------------------------------------------------------------------------------

@pytest.mark.parametrize("collective", [False, True])
def test_tmem_roundtrip_through_registers(monkeypatch, collective):
    """SMEM -> registers (TCGEN05 layout) -> TMEM -> registers -> TMEM -> SMEM."""
    def body(x_gmem, o_gmem, tmem, tmem2, smem, barrier):
        tma_in(x_gmem, smem, barrier)
        plgpu.async_store_tmem(tmem, plgpu.load(smem, layout=plgpu.Layout.TCGEN05) + 1)
        plgpu.commit_tmem()
        plgpu.async_store_tmem(tmem2, plgpu.async_load_tmem(tmem))
        plgpu.commit_tmem()
        tma_out(plgpu.async_load_tmem(tmem2), smem, o_gmem)

    cluster = {"cluster": (2,), "cluster_names": ("x",)} if collective else {}
    call = kernel(body, sds((128, 128)),
                  [plgpu.TMEM((128, 128), F32, collective=collective),
                   plgpu.TMEM((128, 128), F32, collective=collective),
                   swizzled((128, 128), F32), plgpu.Barrier()], **cluster)
    same(monkeypatch, call, sds((128, 128)))


@pytest.mark.parametrize("layout", [plgpu.Layout.TCGEN05, plgpu.Layout.TCGEN05_TMEM_NATIVE],
                         ids=["tcgen05", "tmem-native"])
def test_tmem_load_and_store_layouts(monkeypatch, layout):
    def body(x_gmem, o_gmem, tmem, smem, barrier):
        tma_in(x_gmem, smem, barrier)
        native = layout == plgpu.Layout.TCGEN05_TMEM_NATIVE
        plgpu.async_store_tmem(tmem, plgpu.load(smem, layout=layout, optimized=not native) * 3)
        plgpu.commit_tmem()
        tma_out(plgpu.async_load_tmem(tmem, layout=layout), smem, o_gmem)

    call = kernel(body, sds((128, 128)), [plgpu.TMEM((128, 128), F32),
                                          swizzled((128, 128), F32), plgpu.Barrier()])
    same(monkeypatch, call, sds((128, 128)))


def test_packed_bf16_tmem_chain(monkeypatch):
    def body(x_gmem, o_gmem, t1, t2, t3, smem, barrier):
        tma_in(x_gmem, smem, barrier)
        x = plgpu.load(smem, layout=plgpu.Layout.TCGEN05)
        for t in (t1, t2, t3):
            plgpu.async_store_tmem(t, x + 1)
            plgpu.commit_tmem()
            x = plgpu.async_load_tmem(t)
        tma_out(x, smem, o_gmem)

    tmem = plgpu.TMEM((128, 256), BF16, packed=True)
    call = kernel(body, sds((128, 256), BF16), [tmem, tmem, tmem, swizzled((128, 256), BF16),
                                                plgpu.Barrier()])
    same(monkeypatch, call, sds((128, 256), BF16))


def test_tmem_column_slices(monkeypatch):
    def body(x_gmem, o_gmem, tmem):
        x = plgpu.load(x_gmem, layout=plgpu.Layout.TCGEN05, optimized=False)
        plgpu.async_store_tmem(tmem.at[:, 8:208].at[:, 0:128], x + 1)
        plgpu.commit_tmem()
        o_gmem[...] = plgpu.async_load_tmem(tmem.at[:, 8:136])

    same(monkeypatch, kernel(body, sds((128, 128)), [plgpu.TMEM((128, 256), F32)]),
         sds((128, 128)))


def test_tmem_dynamic_column_slice_from_a_warp(monkeypatch):
    def body(x_gmem, o_gmem, smem, tmem, barrier):
        smem[...] = plgpu.load(x_gmem, layout=plgpu.Layout.WGMMA, optimized=False)
        offset = lax.axis_index("x") * 32

        @plgpu.warp_map
        def _(warp):
            @pl.when(warp == 0)
            def _():
                plgpu.async_copy_smem_to_tmem(smem, tmem.at[:, pl.ds(offset, 32)])
                plgpu.tcgen05_commit_arrive(barrier)

        plgpu.barrier_wait(barrier)
        o_gmem[...] = plgpu.async_load_tmem(tmem.at[:, pl.ds(offset, 32)])

    call = kernel(body, sds((128, 32)), [swizzled((128, 32), F32), plgpu.TMEM((128, 64), F32),
                                         plgpu.Barrier(orders_tensor_core=True)],
                  grid=(2,), grid_names=("x",))
    same(monkeypatch, call, sds((128, 32)))


def test_tmem_ref_union(monkeypatch):
    def body(x_gmem, o_gmem, aliased, smem, barrier):
        [a, b], c = aliased
        tma_in(x_gmem, smem, barrier)
        for ref, cols in ((a, slice(0, 32)), (b, slice(32, 64)), (c, slice(64, 128))):
            plgpu.async_store_tmem(ref, plgpu.load(smem.at[:, cols],
                                                   layout=plgpu.Layout.TCGEN05) * 2)
            plgpu.commit_tmem()
            smem[:, cols] = plgpu.async_load_tmem(ref)
            plgpu.wait_load_tmem()
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(smem, o_gmem)
        plgpu.wait_smem_to_gmem(0)

    union = plgpu.RefUnion([plgpu.TMEM((128, 32), F32), plgpu.TMEM((128, 32), F32)],
                           plgpu.TMEM((128, 64), F32))
    call = kernel(body, sds((128, 128)), [union, swizzled((128, 128), F32), plgpu.Barrier()])
    same(monkeypatch, call, sds((128, 128)))


def test_tmem_union_next_to_an_allocation(monkeypatch):
    def body(x_gmem, o_gmem, t1, aliased):
        [t2] = aliased
        plgpu.async_store_tmem(t1, plgpu.load(x_gmem.at[:, 0:256], layout=plgpu.Layout.TCGEN05,
                                              optimized=False) + 1)
        plgpu.async_store_tmem(t2, plgpu.load(x_gmem.at[:, 256:512], layout=plgpu.Layout.TCGEN05,
                                              optimized=False) + 2)
        plgpu.commit_tmem()
        o_gmem[:, 0:256] = plgpu.async_load_tmem(t1)
        o_gmem[:, 256:512] = plgpu.async_load_tmem(t2)

    call = kernel(body, sds((128, 512), F16),
                  [plgpu.TMEM((128, 256), F16, packed=False),
                   plgpu.RefUnion(plgpu.TMEM((128, 256), F16, packed=False))])
    same(monkeypatch, call, sds((128, 512), F16))


@pytest.mark.parametrize("native", [False, True])
def test_tmem_m64_collective_layout(monkeypatch, native):
    layout = (plgpu.Layout.TCGEN05_M64_COLLECTIVE_NATIVE if native
              else plgpu.Layout.TCGEN05_M64_COLLECTIVE)(160)

    def body(x_gmem, o_gmem, tmem):
        plgpu.async_store_tmem(tmem, plgpu.load(x_gmem, layout=layout, optimized=False) * 2)
        plgpu.commit_tmem()
        o_gmem[...] = plgpu.async_load_tmem(tmem, layout=layout)

    tmem = plgpu.TMEM((64, 160), F32, collective=True,
                      layout=plgpu.TMEMLayout.M64_COLLECTIVE_LAYOUT(160))
    call = kernel(body, sds((64, 160)), [tmem], cluster=(2,), cluster_names=("c",))
    same(monkeypatch, call, sds((64, 160)))


def test_tmem_batch_indexing_with_scales_layout(monkeypatch):
    shape = (2, 3, 128, 4)
    layout = plgpu.Layout.TILED(plgpu.Tiling(((128, 4), (32, 1))),
                                warp_dims=(plgpu.Replicated(4),), lane_dims=(-2,),
                                vector_dim=-3)

    def body(x_gmem, i_gmem, j_gmem, o_gmem, tmem):
        plgpu.async_store_tmem(tmem, plgpu.load(x_gmem, layout=layout, optimized=False))
        plgpu.commit_tmem()
        o_gmem[...] = plgpu.async_load_tmem(tmem.at[i_gmem[...], j_gmem[...]])

    call = kernel(body, sds((128, 4), E5M2),
                  [plgpu.TMEM(shape, E5M2, layout=plgpu.TMEMLayout.SCALES_LAYOUT)])
    same(monkeypatch, call, sds(shape, E5M2), sds((), I32), sds((), I32))


@pytest.mark.parametrize("dtype", [F32, I32])
@pytest.mark.parametrize("reduce", ["max", "absmin"])
def test_tmem_load_with_reduction(monkeypatch, dtype, reduce):
    if dtype == I32 and reduce == "absmin":
        dtype, reduce = jnp.uint32, "min"

    def body(x_gmem, o_gmem, r_gmem, tmem):
        plgpu.async_store_tmem(tmem, plgpu.load(x_gmem, layout=plgpu.Layout.TCGEN05,
                                                optimized=False))
        plgpu.commit_tmem()
        o_gmem[...], r_gmem[...] = plgpu.async_load_tmem(
            tmem, layout=plgpu.Layout.TCGEN05_TMEM_NATIVE, reduce=reduce)

    call = kernel(body, (sds((128, 128), dtype), sds((128,), dtype)),
                  [plgpu.TMEM((128, 128), dtype)])
    same(monkeypatch, call, sds((128, 128), dtype))


# --- tcgen05 MMA -----------------------------------------------------------------------

def _mma(m, n, k, a_type, b_type=None, *, swizzle=128, lhs_tmem=False, transpose_a=False,
         transpose_b=False, acc_type=F32, out_type=None):
    b_type = b_type or a_type
    out_type = out_type or (acc_type if jnp.dtype(a_type).itemsize == 1 else a_type)
    a_shape = (k, m) if transpose_a else (m, k)
    b_shape = (n, k) if transpose_b else (k, n)

    def body(a_gmem, b_gmem, o_gmem, a_smem, b_smem, loaded, done, acc, a_tmem):
        tma_in(a_gmem, a_smem, loaded.at[0])
        tma_in(b_gmem, b_smem, loaded.at[1])
        a = a_smem.transpose((1, 0)) if transpose_a else a_smem
        b = b_smem.transpose((1, 0)) if transpose_b else b_smem
        if lhs_tmem:
            packing = 32 // jax.dtypes.itemsize_bits(a_type)
            plgpu.async_store_tmem(a_tmem, plgpu.load(
                a, layout=plgpu.Layout.TCGEN05_TMEM_NATIVE(packing), optimized=False))
            plgpu.commit_tmem()
            a = a_tmem
        plgpu.tcgen05_mma(acc, a, b, done, accumulate=False)
        plgpu.barrier_wait(done)
        o_gmem[...] = plgpu.async_load_tmem(acc).astype(out_type)

    scratch = [swizzled(a_shape, a_type, swizzle), swizzled(b_shape, b_type, swizzle),
               plgpu.Barrier(num_barriers=2), plgpu.Barrier(orders_tensor_core=True),
               plgpu.TMEM((m, n), acc_type, packed=False),
               plgpu.TMEM((m, k), a_type, packed=True) if lhs_tmem else None]
    return kernel(body, sds((m, n), out_type), scratch), (sds(a_shape, a_type),
                                                         sds(b_shape, b_type))


@pytest.mark.parametrize("m", [64, 128])
@pytest.mark.parametrize("n, swizzle", [(64, 32), (128, 32), (256, 32), (128, 128),
                                        (256, 128)])
def test_tcgen05_mma_shapes(monkeypatch, m, n, swizzle):
    call, args = _mma(m, n, 128, BF16, swizzle=swizzle)
    same(monkeypatch, call, *args)


@pytest.mark.parametrize("types", [(E5M2, E5M2), (E4M3, E4M3), (E5M2, E4M3), (E4M3, E5M2)],
                         ids=["e5m2", "e4m3", "e5m2xe4m3", "e4m3xe5m2"])
@pytest.mark.parametrize("lhs_tmem", [False, True])
def test_tcgen05_mma_fp8(monkeypatch, types, lhs_tmem):
    call, args = _mma(128, 128, 128, *types, lhs_tmem=lhs_tmem)
    same(monkeypatch, call, *args)


@pytest.mark.parametrize("dtype", [I8, U8])
@pytest.mark.parametrize("lhs_tmem", [False, True])
def test_tcgen05_mma_integer(monkeypatch, dtype, lhs_tmem):
    call, args = _mma(128, 128, 128, dtype, swizzle=64, lhs_tmem=lhs_tmem, acc_type=I32)
    same(monkeypatch, call, *args)


@pytest.mark.parametrize("transpose_a, transpose_b", [(True, False), (False, True),
                                                      (True, True)])
@pytest.mark.parametrize("dtype", [F16, BF16])
def test_tcgen05_mma_transposed_operands(monkeypatch, transpose_a, transpose_b, dtype):
    call, args = _mma(128, 128, 128, dtype, transpose_a=transpose_a, transpose_b=transpose_b)
    same(monkeypatch, call, *args)


@pytest.mark.parametrize("dtype", [F16, BF16])
def test_tcgen05_mma_lhs_in_tmem(monkeypatch, dtype):
    call, args = _mma(128, 256, 128, dtype, lhs_tmem=True, swizzle=64)
    same(monkeypatch, call, *args)


def test_tcgen05_mma_f16_accumulator(monkeypatch):
    call, args = _mma(128, 128, 64, F16, acc_type=F16)
    same(monkeypatch, call, *args)


def test_tcgen05_mma_into_sliced_accumulator_and_aligned_tmem(monkeypatch):
    def body(a_gmem, b_gmem, o_gmem, a_smem, b_smem, loaded, done, pad, acc):
        tma_in(a_gmem, a_smem, loaded.at[0])
        tma_in(b_gmem, b_smem, loaded.at[1])
        for half in (0, 1):
            cols = pl.ds(half * 128, 128)
            plgpu.tcgen05_mma(acc.at[:, cols], a_smem, b_smem.at[:, pl.ds((1 - half) * 128, 128)],
                              accumulate=False)
        plgpu.tcgen05_commit_arrive(done)
        plgpu.barrier_wait(done)
        o_gmem[...] = plgpu.async_load_tmem(acc).astype(BF16)

    call = kernel(body, sds((128, 256), BF16),
                  [swizzled((128, 64), BF16), swizzled((64, 256), BF16),
                   plgpu.Barrier(num_barriers=2), plgpu.Barrier(orders_tensor_core=True),
                   plgpu.TMEM((128, 1), F32), plgpu.TMEM((128, 256), F32)])
    same(monkeypatch, call, sds((128, 64), BF16), sds((64, 256), BF16))


def test_tcgen05_mma_k_loop_with_dynamic_accumulate(monkeypatch):
    steps = 4

    def body(a_gmem, b_gmem, o_gmem, a_smem, b_smem, loaded, done, acc):
        @pl.loop(0, steps)
        def _(i):
            tma_in(a_gmem.at[:, pl.ds(i * 64, 64)], a_smem, loaded.at[0])
            tma_in(b_gmem.at[pl.ds(i * 64, 64)], b_smem, loaded.at[1])
            plgpu.tcgen05_mma(acc, a_smem, b_smem, done, accumulate=i > 0)
            plgpu.barrier_wait(done)

        o_gmem[...] = plgpu.async_load_tmem(acc).astype(F16)

    call = kernel(body, sds((128, 128), F16),
                  [swizzled((128, 64)), swizzled((64, 128)), plgpu.Barrier(num_barriers=2),
                   plgpu.Barrier(orders_tensor_core=True), plgpu.TMEM((128, 128), F32)])
    same(monkeypatch, call, sds((128, 64 * steps), F16), sds((64 * steps, 128), F16))


def test_tcgen05_mma_in_emit_pipeline(monkeypatch):
    """A pipeline over K feeds one MMA per step into a TMEM accumulator."""
    tile_k = 64

    def body(a_gmem, b_gmem, o_gmem, acc, done):
        def step(idx, a_smem, b_smem):
            k, = idx
            plgpu.tcgen05_mma(acc, a_smem, b_smem, accumulate=k > 0)

        t = transforms(F16)
        plgpu.emit_pipeline(
            step, grid=(4,),
            in_specs=[plgpu.BlockSpec((128, tile_k), lambda k: (0, k), transforms=t),
                      plgpu.BlockSpec((tile_k, 128), lambda k: (k, 0), transforms=t)],
            max_concurrent_steps=2)(a_gmem, b_gmem)
        plgpu.tcgen05_commit_arrive(done)
        plgpu.barrier_wait(done)
        o_gmem[...] = plgpu.async_load_tmem(acc).astype(F16)

    call = kernel(body, sds((128, 128), F16), [plgpu.TMEM((128, 128), F32),
                                               plgpu.Barrier(orders_tensor_core=True)])
    same(monkeypatch, call, sds((128, 4 * tile_k), F16), sds((4 * tile_k, 128), F16))


def test_mma_issued_from_one_warp(monkeypatch):
    def body(a_gmem, b_gmem, o_gmem, a_smem, b_smem, acc, loaded, done):
        plgpu.copy_gmem_to_smem(a_gmem, a_smem, loaded)
        plgpu.copy_gmem_to_smem(b_gmem, b_smem, loaded)
        plgpu.barrier_wait(loaded)

        @plgpu.warp_map
        def _(warp):
            @pl.when(warp == 0)
            def _():
                plgpu.tcgen05_mma(acc, a_smem, b_smem, done, accumulate=False)

        plgpu.barrier_wait(done)
        o_gmem[...] = plgpu.async_load_tmem(acc).astype(F16)

    call = kernel(body, sds((128, 128), F16),
                  [swizzled((128, 128)), swizzled((128, 128)), plgpu.TMEM((128, 128), F32),
                   plgpu.Barrier(num_arrivals=2), plgpu.Barrier(orders_tensor_core=True)])
    same(monkeypatch, call, sds((128, 128), F16), sds((128, 128), F16))


@pytest.mark.parametrize("dtype", [I32, F16])
def test_smem_to_tmem_copy_from_one_warp(monkeypatch, dtype):
    shape = (128, 64) if dtype == I32 else (128, 128)

    def body(x_gmem, o_gmem, smem, tmem, loaded, copied):
        tma_in(x_gmem, smem, loaded)

        @plgpu.warp_map
        def _(warp):
            @pl.when(warp == 0)
            def _():
                plgpu.async_copy_smem_to_tmem(smem, tmem)
                plgpu.tcgen05_commit_arrive(copied)

        plgpu.barrier_wait(copied)
        o_gmem[...] = plgpu.async_load_tmem(tmem)

    call = kernel(body, sds(shape, dtype),
                  [swizzled(shape, dtype), plgpu.TMEM(shape, dtype, packed=dtype == F16),
                   plgpu.Barrier(), plgpu.Barrier(orders_tensor_core=True)])
    same(monkeypatch, call, sds(shape, dtype))


def test_scales_copy_from_one_warp(monkeypatch):
    def body(o_gmem, smem, tmem, copied):
        @plgpu.warp_map
        def _(warp):
            @pl.when(warp == 0)
            def _():
                plgpu.async_copy_scales_to_tmem(smem, tmem)
                plgpu.tcgen05_commit_arrive(copied)

        plgpu.barrier_wait(copied)
        plgpu.copy_smem_to_gmem(smem, o_gmem)
        plgpu.wait_smem_to_gmem(0)

    call = kernel(body, sds((1, 1, 32, 16), E8M0),
                  [plgpu.SMEM((1, 1, 32, 16), E8M0),
                   plgpu.TMEM((128, 4), E8M0, layout=plgpu.TMEMLayout.SCALES_LAYOUT),
                   plgpu.Barrier(orders_tensor_core=True)])
    same(monkeypatch, call)


def test_smem_ref_union_for_two_matmuls(monkeypatch):
    """Two MMAs read aliased SMEM: 128x128 @ 128x128, then 128x64 @ 64x128."""
    def body(a_gmem, b_gmem, o128, o64, a_alias, b_alias, loaded, done, acc):
        a128, a64 = a_alias
        b128, b64 = b_alias
        tma_in(a_gmem, a128, loaded.at[0])
        tma_in(b_gmem, b128, loaded.at[1])
        plgpu.tcgen05_mma(acc, a128, b128, done.at[0], accumulate=False)
        plgpu.barrier_wait(done.at[0])
        o128[...] = plgpu.async_load_tmem(acc).astype(F16)
        plgpu.wait_load_tmem()
        plgpu.tcgen05_mma(acc, a64, b64, done.at[1], accumulate=False)
        plgpu.barrier_wait(done.at[1])
        o64[...] = plgpu.async_load_tmem(acc).astype(F16)

    call = kernel(body, (sds((128, 128), F16), sds((128, 128), F16)),
                  [plgpu.RefUnion(swizzled((128, 128)), swizzled((128, 64))),
                   plgpu.RefUnion(swizzled((128, 128)), swizzled((64, 128))),
                   plgpu.Barrier(num_barriers=2),
                   plgpu.Barrier(num_barriers=2, orders_tensor_core=True),
                   plgpu.TMEM((128, 128), F32)])
    same(monkeypatch, call, sds((128, 128), F16), sds((128, 128), F16))


@pytest.mark.parametrize("n", [128, 256])
def test_block_scaled_fp8_mma(monkeypatch, n):
    m, k, block = 128, 128, 32

    def body(a_gmem, b_gmem, sa_gmem, sb_gmem, o_gmem, a_smem, b_smem, sa_smem, sb_smem,
             loaded, done, acc, a_scale, b_scale):
        for i, (g, s) in enumerate(((a_gmem, a_smem), (b_gmem, b_smem), (sa_gmem, sa_smem),
                                    (sb_gmem, sb_smem))):
            tma_in(g, s, loaded.at[i])
        plgpu.async_copy_scales_to_tmem(sa_smem, a_scale)
        plgpu.async_copy_scales_to_tmem(sb_smem, b_scale)
        plgpu.tcgen05_mma(acc, a_smem, b_smem.transpose((1, 0)), a_scale=a_scale,
                          b_scale=b_scale, accumulate=False)
        plgpu.tcgen05_commit_arrive(done)
        plgpu.barrier_wait(done)
        o_gmem[...] = plgpu.async_load_tmem(acc)

    scales = plgpu.TMEMLayout.SCALES_LAYOUT
    sa, sb = (m // 128, k // (block * 4), 32, 16), (n // 128, k // (block * 4), 32, 16)
    call = kernel(body, sds((m, n)),
                  [swizzled((m, k), E4M3), swizzled((n, k), E5M2), plgpu.SMEM(sa, E8M0),
                   plgpu.SMEM(sb, E8M0), plgpu.Barrier(num_barriers=4),
                   plgpu.Barrier(orders_tensor_core=True), plgpu.TMEM((m, n), F32),
                   plgpu.TMEM((m, k // block), E8M0, layout=scales),
                   plgpu.TMEM((n, k // block), E8M0, layout=scales)])
    same(monkeypatch, call, sds((m, k), E4M3), sds((n, k), E5M2), sds(sa, E8M0),
         sds(sb, E8M0))


# --- collective (2-CTA) kernels ----------------------------------------------------------

@pytest.mark.parametrize("m, n, k, lhs_tmem", [(256, 256, 128, False), (256, 128, 64, False),
                                              (128, 64, 128, False), (256, 256, 128, True),
                                              (256, 128, 64, True)])
def test_collective_matmul(monkeypatch, m, n, k, lhs_tmem):
    dtype = F16
    block_m, block_n = m // 2, n // 2

    def body(a_gmem, b_gmem, o_gmem, a_smem, b_smem, acc, loaded, done, synced, a_tmem):
        c = lax.axis_index("x")
        rows, cols = pl.ds(c * block_m, block_m), pl.ds(c * block_n, block_n)
        tma_in(a_gmem.at[rows, :], a_smem, loaded)
        tma_in(b_gmem.at[:, cols], b_smem, loaded)
        lhs = a_smem
        if lhs_tmem:
            plgpu.async_store_tmem(a_tmem, plgpu.load(
                a_smem, layout=plgpu.Layout.TCGEN05_TMEM_NATIVE(2), optimized=False))
            plgpu.commit_tmem()
            lhs = a_tmem
        plgpu.barrier_arrive(synced)
        plgpu.barrier_wait(synced)
        plgpu.tcgen05_mma(acc, lhs, b_smem, done, accumulate=False, collective_axis="x")
        plgpu.barrier_wait(done)
        layout = plgpu.Layout.TCGEN05_M64_COLLECTIVE(n) if m == 128 else plgpu.Layout.TCGEN05
        o_gmem[rows, :] = plgpu.async_load_tmem(acc, layout=layout).astype(dtype)

    call = kernel(body, sds((m, n), dtype),
                  [swizzled((block_m, k), dtype, 64), swizzled((k, block_n), dtype, 64),
                   plgpu.TMEM((block_m, n), F32, collective=True), plgpu.Barrier(),
                   plgpu.Barrier(orders_tensor_core=True),
                   plgpu.ClusterBarrier(collective_axes=("x",)),
                   plgpu.TMEM((block_m, k), dtype, collective=True, packed=True)
                   if lhs_tmem else None],
                  cluster=(2,), cluster_names=("x",))
    same(monkeypatch, call, sds((m, k), dtype), sds((k, n), dtype))


def test_collective_partitioned_copies_and_block_scaled_mma(monkeypatch):
    """The leader tracks partitioned TMA copies and issues the 2-CTA scaled MMA."""
    m, n, block, swizzle = 256, 128, 32, 128
    k = 2 * swizzle * 8 // 4  # two swizzle widths of fp4
    fp4 = jnp.float4_e2m1fn
    bm, bn = m // 2, n // 2
    sa, sb = (bm // 128, k // (block * 4), 32, 16), (n // 128, k // (block * 4), 32, 16)

    def body(a_gmem, b_gmem, sa_gmem, sb_gmem, o_gmem, a_smem, b_smem, sa_smem, sb_smem,
             loaded, done, acc, a_scale, b_scale):
        split = plgpu.CopyPartition.PARTITIONED(0)
        plgpu.copy_gmem_to_smem(a_gmem, a_smem, loaded, collective_axes="x",
                                leader_tracked=split)
        plgpu.copy_gmem_to_smem(b_gmem, b_smem, loaded, collective_axes="x",
                                leader_tracked=split)
        plgpu.copy_gmem_to_smem(sa_gmem, sa_smem, loaded, collective_axes="x",
                                leader_tracked=split)
        plgpu.copy_gmem_to_smem(sb_gmem, sb_smem, loaded, collective_axes="x")
        c = lax.axis_index("x")

        @pl.when(c == 0)
        def _():
            plgpu.barrier_wait(loaded)
            plgpu.async_copy_scales_to_tmem(sa_smem, a_scale, collective_axis="x")
            plgpu.async_copy_scales_to_tmem(sb_smem, b_scale, collective_axis="x")
            plgpu.tcgen05_mma(acc, a_smem, b_smem.transpose((1, 0)), done,
                              a_scale=a_scale, b_scale=b_scale, accumulate=False,
                              collective_axis="x")

        plgpu.barrier_wait(done)
        o_gmem[pl.ds(c * bm, bm), :] = plgpu.async_load_tmem(acc)

    scales = plgpu.TMEMLayout.SCALES_LAYOUT
    call = kernel(body, sds((m, n)),
                  [swizzled((bm, k), fp4), swizzled((bn, k), fp4), plgpu.SMEM(sa, E8M0),
                   plgpu.SMEM(sb, E8M0), plgpu.Barrier(num_arrivals=4),
                   plgpu.Barrier(orders_tensor_core=True),
                   plgpu.TMEM((bm, n), F32, collective=True),
                   plgpu.TMEM((bm, k // block), E8M0, layout=scales, collective=True),
                   plgpu.TMEM((n, k // block), E8M0, layout=scales, collective=True)],
                  cluster=(2,), cluster_names=("x",))
    same(monkeypatch, call, sds((m, k), fp4), sds((n, k), fp4), sds((2 * sa[0], *sa[1:]), E8M0),
         sds(sb, E8M0))


@pytest.mark.parametrize("dtype", [F16, I8])
def test_collective_sparse_mma(monkeypatch, dtype):
    m, n, k = 256, 128, 128
    bm, bn = m // 2, n // 2
    acc_type = I32 if dtype == I8 else F32

    def body(a_gmem, b_gmem, meta_gmem, o_gmem, a_smem, b_smem, meta_smem, loaded, done,
             synced, acc, meta_tmem):
        c = lax.axis_index("x")
        plgpu.copy_gmem_to_smem(a_gmem.at[pl.ds(c * bm, bm), :], a_smem, loaded)
        plgpu.copy_gmem_to_smem(b_gmem.at[pl.ds(c * bn, bn), :], b_smem, loaded)
        plgpu.copy_gmem_to_smem(meta_gmem.at[pl.ds(c, 1), :], meta_smem, loaded)
        plgpu.barrier_wait(loaded)
        plgpu.barrier_arrive(synced)
        plgpu.barrier_wait(synced)
        plgpu.async_copy_sparse_metadata_to_tmem(meta_smem, meta_tmem, collective_axis="x")
        plgpu.tcgen05_mma(acc, a_smem, b_smem.transpose((1, 0)), done,
                          a_sparse_metadata=meta_tmem, accumulate=False, collective_axis="x")
        plgpu.barrier_wait(done)
        o_gmem[pl.ds(c * bm, bm), :] = plgpu.async_load_tmem(acc)

    call = kernel(body, sds((m, n), acc_type),
                  [swizzled((bm, k // 2), dtype, 64), swizzled((bn, k), dtype, 64),
                   plgpu.SMEM((1, 1, 128, 64), U2), plgpu.Barrier(num_arrivals=3),
                   plgpu.Barrier(orders_tensor_core=True),
                   plgpu.ClusterBarrier(collective_axes=("x",)),
                   plgpu.TMEM((bm, n), acc_type, collective=True),
                   plgpu.TMEM((bm, k // 2), U2, collective=True,
                              layout=plgpu.TMEMLayout.SPARSE_METADATA_LAYOUT)],
                  cluster=(2,), cluster_names=("x",))
    same(monkeypatch, call, sds((m, k // 2), dtype), sds((n, k), dtype),
         sds((2, 1, 128, 64), U2))


def test_cluster_barrier_with_multicast_on_blackwell(monkeypatch):
    def body(x_gmem, o_gmem, smem, loaded, synced):
        plgpu.copy_gmem_to_smem(x_gmem, smem, loaded, collective_axes="c")
        plgpu.barrier_wait(loaded)
        plgpu.barrier_arrive(synced)
        plgpu.barrier_wait(synced)
        tma_out(smem[...] + 1, smem, o_gmem.at[lax.axis_index("c")])

    call = kernel(body, sds((2, 128, 64), F16),
                  [swizzled((128, 64)), plgpu.Barrier(),
                   plgpu.ClusterBarrier(collective_axes=("c",), num_arrivals=1)],
                  cluster=(2,), cluster_names=("c",))
    same(monkeypatch, call, sds((128, 64), F16))


# --- scheduling ------------------------------------------------------------------------

@pytest.mark.parametrize("grid, cluster", [((200,), ()), ((3, 4, 5), ()), ((50,), (2,))],
                         ids=["1d", "3d", "cluster"])
def test_dynamic_scheduling_loop(monkeypatch, grid, cluster):
    names = tuple(f"g{i}" for i in range(len(grid)))
    cluster_names = tuple(f"c{i}" for i in range(len(cluster)))

    def body(o_gmem, _):
        sm = lax.axis_index(names)
        cluster_idx = tuple(lax.axis_index(c) for c in cluster_names)

        @plgpu.dynamic_scheduling_loop(names, cluster_axes=cluster_names)
        def _(info):
            o_gmem[(*info.index, *cluster_idx)] = sm

    call = kernel(body, sds((*grid, *cluster), I32), [plgpu.SMEM((1024,), jnp.int8)],
                  grid=grid, grid_names=names, cluster=cluster, cluster_names=cluster_names)
    same(monkeypatch, call)


def test_dynamic_scheduling_loop_with_a_carry(monkeypatch):
    def body(o_gmem):
        @pl.when(lax.axis_index("x") == 0)
        def _():
            count = plgpu.dynamic_scheduling_loop(("x",), init_carry=jnp.int32(0))(
                lambda info, carry: carry + 1)
            o_gmem[0] = count

    same(monkeypatch, kernel(body, sds((1,), I32), grid=(300,), grid_names=("x",)))


# --- larger compositions ---------------------------------------------------------------

def test_attention_block_with_tmem(monkeypatch):
    """S = Q K^T into TMEM; softmax in registers (TCGEN05 layout); P goes back
    into TMEM (packed bf16) as the A operand of O = P V."""
    q_len, kv_len, d = 128, 128, 64

    def body(q_gmem, k_gmem, v_gmem, o_gmem, q_smem, k_smem, v_smem, loaded, done, s_tmem,
             p_tmem, o_tmem):
        tma_in(q_gmem, q_smem, loaded.at[0])
        tma_in(k_gmem, k_smem, loaded.at[1])
        tma_in(v_gmem, v_smem, loaded.at[2])
        plgpu.tcgen05_mma(s_tmem, q_smem, k_smem.transpose((1, 0)), done.at[0],
                          accumulate=False)
        plgpu.barrier_wait(done.at[0])
        s = plgpu.async_load_tmem(s_tmem)
        p = jnp.exp(s - lax.broadcast_in_dim(jnp.max(s, axis=1), s.shape, [0]))
        denom = jnp.sum(p, axis=1)
        plgpu.async_store_tmem(p_tmem, p.astype(BF16))
        plgpu.commit_tmem()
        plgpu.tcgen05_mma(o_tmem, p_tmem, v_smem, done.at[1], accumulate=False)
        plgpu.barrier_wait(done.at[1])
        o = plgpu.async_load_tmem(o_tmem)
        o_gmem[...] = (o / lax.broadcast_in_dim(denom, (q_len, d), [0])).astype(BF16)

    call = kernel(body, sds((q_len, d), BF16),
                  [swizzled((q_len, d), BF16), swizzled((kv_len, d), BF16),
                   swizzled((kv_len, d), BF16), plgpu.Barrier(num_barriers=3),
                   plgpu.Barrier(num_barriers=2, orders_tensor_core=True),
                   plgpu.TMEM((q_len, kv_len), F32), plgpu.TMEM((q_len, kv_len), BF16, packed=True),
                   plgpu.TMEM((q_len, d), F32)])
    same(monkeypatch, call, sds((q_len, d), BF16), sds((kv_len, d), BF16),
         sds((kv_len, d), BF16))


def test_loop_carrying_tmem_loads(monkeypatch):
    """Each step adds a TMEM load (TCGEN05 layout) into a register carry."""
    def body(x_gmem, o_gmem, tmem):
        def step(i, acc):
            plgpu.async_store_tmem(tmem, plgpu.load(x_gmem.at[i], layout=plgpu.Layout.TCGEN05,
                                                    optimized=False))
            plgpu.commit_tmem()
            v = plgpu.async_load_tmem(tmem)
            plgpu.wait_load_tmem()
            return acc + v

        o_gmem[...] = lax.fori_loop(0, 3, step, jnp.zeros((128, 64), F32))

    same(monkeypatch, kernel(body, sds((128, 64)), [plgpu.TMEM((128, 64), F32)]),
         sds((3, 128, 64)))


def test_warp_specialized_pipeline_feeding_tcgen05(monkeypatch):
    """A memory warpgroup runs the TMA pipeline; the compute warpgroup issues
    one MMA per step from one warp and waits for it before the slot is released."""
    tile_k, steps = 64, 4

    def body(a_gmem, b_gmem, o_gmem, acc, mma_done, done):
        wg = lax.axis_index("wg")

        def step(idx, a_smem, b_smem):
            k, = idx

            @plgpu.warp_map
            def _(warp):
                @pl.when(warp == 0)
                def _():
                    plgpu.tcgen05_mma(acc, a_smem, b_smem, mma_done, accumulate=k > 0)

            plgpu.barrier_wait(mma_done)

        t = transforms(F16)
        plgpu.emit_pipeline_warp_specialized(
            step, grid=(steps,), memory_registers=40, max_concurrent_steps=2,
            num_compute_wgs=1, wg_axis="wg",
            in_specs=[plgpu.BlockSpec((128, tile_k), lambda k: (0, k), transforms=t),
                      plgpu.BlockSpec((tile_k, 128), lambda k: (k, 0), transforms=t)],
        )(a_gmem, b_gmem)

        @pl.when(wg == 0)
        def _():
            plgpu.tcgen05_commit_arrive(done)
            plgpu.barrier_wait(done)
            o_gmem[...] = plgpu.async_load_tmem(acc).astype(F16)

    call = kernel(body, sds((128, 128), F16),
                  [plgpu.TMEM((128, 128), F32), plgpu.Barrier(orders_tensor_core=True),
                   plgpu.Barrier(orders_tensor_core=True)],
                  num_threads=2, thread_name="wg")
    same(monkeypatch, call, sds((128, steps * tile_k), F16), sds((steps * tile_k, 128), F16))


def test_persistent_matmul_over_a_dynamic_schedule(monkeypatch):
    """Each block takes output tiles from the dynamic scheduler and runs a
    small K loop of tcgen05 MMAs for each."""
    tiles_m, tiles_n, k = 2, 3, 128

    def body(a_gmem, b_gmem, o_gmem, a_smem, b_smem, loaded, done, acc):
        @plgpu.dynamic_scheduling_loop(("m", "n"))
        def _(info):
            m, n = info.index
            tma_in(a_gmem.at[pl.ds(m * 128, 128)], a_smem, loaded.at[0])
            tma_in(b_gmem.at[:, pl.ds(n * 128, 128)], b_smem, loaded.at[1])
            plgpu.tcgen05_mma(acc, a_smem, b_smem, done, accumulate=False)
            plgpu.barrier_wait(done)
            o_gmem[pl.ds(m * 128, 128), pl.ds(n * 128, 128)] = (
                plgpu.async_load_tmem(acc).astype(F16))
            plgpu.wait_load_tmem()

    call = kernel(body, sds((tiles_m * 128, tiles_n * 128), F16),
                  [swizzled((128, k)), swizzled((k, 128)), plgpu.Barrier(num_barriers=2),
                   plgpu.Barrier(orders_tensor_core=True), plgpu.TMEM((128, 128), F32)],
                  grid=(tiles_m, tiles_n), grid_names=("m", "n"))
    same(monkeypatch, call, sds((tiles_m * 128, k), F16), sds((k, tiles_n * 128), F16))


def test_tmem_stores_of_values_from_several_sources(monkeypatch):
    """An iota, a splat and a loaded value are stored to TMEM with no layout
    given: inference picks the register layouts."""
    def body(x_gmem, o_gmem, t1, t2, t3):
        plgpu.async_store_tmem(t1, lax.broadcasted_iota(I32, (128, 64), 1).astype(F32))
        plgpu.async_store_tmem(t2, jnp.full((128, 64), 3.0, F32))
        plgpu.async_store_tmem(t3, plgpu.load(x_gmem, layout=plgpu.Layout.TCGEN05,
                                              optimized=False) * 2)
        plgpu.commit_tmem()
        o_gmem[...] = (plgpu.async_load_tmem(t1) + plgpu.async_load_tmem(t2)
                       + plgpu.async_load_tmem(t3))

    tmem = plgpu.TMEM((128, 64), F32)
    same(monkeypatch, kernel(body, sds((128, 64)), [tmem, tmem, tmem]), sds((128, 64)))
