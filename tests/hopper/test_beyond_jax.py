"""Hopper kernels jax refuses and smalti lowers: gathers/scatters on N-D GMEM
refs (collapsed to jax's 2-D gather) and ``async_store_smem`` of a scalar."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

import smalti
import smalti.jax
from tests.official import assert_same_modules, capture_modules, gpu_facts

WARPGROUP = plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup)
F16 = jnp.float16
GATHER4 = "tile::gather4.mbarrier::complete_tx::bytes"
SCATTER4 = "tile::scatter4.bulk_group"


def sds(shape, dtype=F16):
    return jax.ShapeDtypeStruct(shape, dtype)


def kernel(body, out, scratch, **kw):
    return plgpu.kernel(body, out_type=out, scratch_types=scratch, compiler_params=WARPGROUP,
                        **kw)


def lower_with_smalti(call, *args) -> str:
    with smalti.jax.installed():
        [module] = capture_modules(call, *args)
    return module


def gather_kernel(gmem_shape, at, smem, direction="gather", rows=16):
    """A kernel moving ``rows`` gathered rows between ``x_gmem.at[idx, *at]``
    (or ``o_gmem``, scattering) and an SMEM scratch ``smem``."""

    def body(x_gmem, idx_gmem, o_gmem, smem_ref, barrier):
        idx = plgpu.load(idx_gmem, layout=plgpu.Layout.TMA_INDICES, optimized=False)
        if direction == "gather":
            plgpu.copy_gmem_to_smem(x_gmem.at[(idx, *at)], smem_ref, barrier)
            plgpu.barrier_wait(barrier)
            plgpu.copy_smem_to_gmem(smem_ref, o_gmem)
        else:
            plgpu.copy_gmem_to_smem(x_gmem, smem_ref, barrier)
            plgpu.barrier_wait(barrier)
            plgpu.copy_smem_to_gmem(smem_ref, o_gmem.at[(idx, *at)])
        plgpu.wait_smem_to_gmem(0)

    if direction == "gather":
        call = kernel(body, sds(smem.shape), [smem, plgpu.Barrier()])
        return call, (sds(gmem_shape), sds((rows,), jnp.int32))
    call = kernel(body, sds(gmem_shape), [smem, plgpu.Barrier()])
    return call, (sds(smem.shape), sds((rows,), jnp.int32))


def tma_descriptor_ranks(module: str) -> list[int]:
    return [int(r) for r in re.findall(
        r"call @mosaic_gpu_init_tma_desc\(%\w+, %\w+, %\w+, %c(\d+)_i64", module)]


@pytest.mark.parametrize("direction", ["gather", "scatter"])
def test_3d_gather_collapses_to_a_2d_gather(monkeypatch, direction):
    call, args = gather_kernel((128, 4, 64), (), plgpu.SMEM((16, 4, 64), F16), direction)
    with gpu_facts(monkeypatch):
        with pytest.raises(NotImplementedError, match="Only 2D gathers/scatters"):
            capture_modules(call, *args)  # jax
        module = lower_with_smalti(call, *args)
    # The TMA descriptor describes a 2-D view (128, 4 * 64) of the kernel argument.
    assert re.search(r"memref\.collapse_shape %\w+ \[\[0\], \[1, 2\]\] .*"
                     r": memref<128x4x64xf16> into memref<128x256xf16>", module)
    assert 2 in tma_descriptor_ranks(module)
    # ... and the SMEM rows are folded the same way.
    assert re.search(r"memref<16x4x64xf16, #gpu.address_space<workgroup>> into "
                     r"memref<16x256xf16, #gpu.address_space<workgroup>>", module)
    instruction = GATHER4 if direction == "gather" else SCATTER4
    # 16 rows, 4 at a time, over 4 warps: each warp issues one instruction.
    assert module.count(instruction) == 1
    assert "cp.async.bulk.tensor.2d" in module


def test_wide_rows_get_a_tiling_that_survives_the_collapse(monkeypatch):
    # 8 * 64 halves per row: too wide untiled, so the SMEM ref is tiled
    # (8, 1, 64) and swizzled -- the 2-D tiling (8, 64) of the folded ref.
    call, args = gather_kernel((64, 8, 64), (), plgpu.SMEM((16, 8, 64), F16))
    with gpu_facts(monkeypatch):
        module = lower_with_smalti(call, *args)
    assert "memref<64x8x64xf16> into memref<64x512xf16>" in module
    # physical (2, 8, 1, 8, 1, 64) -> (2, 8, 8, 64): tile grid and tile folded
    assert re.search(r"into memref<2x8x8x64xf16, #gpu.address_space<workgroup>>", module)
    # 4 row groups of 8 column tiles / 4 warps: 8 gathers per warp, 64 columns each.
    assert module.count(GATHER4) == 8


def test_explicit_collapsible_tiling_is_kept(monkeypatch):
    smem = plgpu.SMEM((16, 8, 64), F16, transforms=(
        plgpu.TilingTransform((8, 1, 64)), plgpu.SwizzleTransform(128)))
    call, args = gather_kernel((64, 8, 64), (), smem)
    with gpu_facts(monkeypatch):
        module = lower_with_smalti(call, *args)
    assert module.count(GATHER4) == 8


def test_a_partly_copied_leading_dim(monkeypatch):
    # x.at[idx, 1:3] on (128, 4, 64): rows of 2 * 64 starting 64 elements in.
    call, args = gather_kernel((128, 4, 64), (pl.ds(1, 2),), plgpu.SMEM((16, 2, 64), F16))
    with gpu_facts(monkeypatch):
        module = lower_with_smalti(call, *args)
    assert "memref<128x4x64xf16> into memref<128x256xf16>" in module
    assert module.count(GATHER4) == 1


def test_rows_that_are_not_contiguous_are_refused(monkeypatch):
    # x.at[idx, :, 0:32] on (128, 4, 64): each row is 4 runs of 32 elements.
    call, args = gather_kernel((128, 4, 64), (slice(None), pl.ds(0, 32)),
                               plgpu.SMEM((16, 4, 32), F16))
    with gpu_facts(monkeypatch), smalti.jax.installed():
        with pytest.raises(smalti.SmaltiNotImplementedError) as error:
            capture_modules(call, *args)
    assert error.value.code == "SM120"
    message = str(error.value)
    assert "Only 2D gathers/scatters" in message and "not contiguous" in message
    assert "mosaic_gpu.async_load" in message and "fix:" in message


def test_2d_gathers_still_match_jax(monkeypatch):
    call, args = gather_kernel((128, 64), (), plgpu.SMEM((16, 64), F16))
    with gpu_facts(monkeypatch):
        assert_same_modules(call, *args)


# --- async_store_smem of a scalar ---------------------------------------------------

ST_ASYNC = "st.async.cluster.shared::cluster.mbarrier::complete_tx::bytes"


def scalar_store_kernel(dtype=jnp.float32, atomic=None):
    def body(x_gmem, o_gmem, smem, stored):
        peer = 1 - jax.lax.axis_index("cluster")
        plgpu.async_store_smem(x_gmem[3], smem.at[5], stored, cluster_idx=peer,
                               cluster_dim="cluster", atomic=atomic)
        plgpu.barrier_wait(stored)
        o_gmem[...] = smem[...]

    call = kernel(body, sds((128,), dtype), [plgpu.SMEM((128,), dtype), plgpu.Barrier()],
                  cluster=(2,), cluster_names=("cluster",))
    return call, (sds((128,), dtype),)


@pytest.mark.parametrize("dtype, ptx_type", [(jnp.float32, "b32"), (jnp.int32, "b32")])
def test_scalar_async_store_smem_to_a_peer(monkeypatch, dtype, ptx_type):
    call, args = scalar_store_kernel(dtype)
    with gpu_facts(monkeypatch):
        with pytest.raises(NotImplementedError, match="Scalars are not supported"):
            capture_modules(call, *args)  # jax
        module = lower_with_smalti(call, *args)
    # One thread stores the element to the peer's SMEM (mapa), completing 4
    # bytes on the peer's barrier, on which every thread arrives.
    [store] = [line for line in module.splitlines() if ST_ASYNC in line]
    assert f"{ST_ASYNC}.{ptx_type} [$1], $2, [$3]" in store and "!llvm.ptr<7>" in store
    # The peer's element and barrier: jax's code generators emit mapa and the
    # cluster-scoped expect-tx as NVVM ops (0.11) or as inline PTX (0.12).
    assert module.count("nvvm.mapa") + module.count('"mapa.shared::cluster.u32') == 2
    assert re.search(r"nvvm\.mbarrier\.arrive\.expect_tx %\w+, %\w+ scope = cluster", module) \
        or "mbarrier.arrive.expect_tx.release.cluster.shared::cluster.b64" in module
    assert "mosaic_gpu.custom_primitive" not in module


def test_64_bit_scalars_use_the_b64_form(monkeypatch):
    jax.config.update("jax_enable_x64", True)
    try:
        call, args = scalar_store_kernel(jnp.float64)
        with gpu_facts(monkeypatch):
            module = lower_with_smalti(call, *args)
    finally:
        jax.config.update("jax_enable_x64", False)
    assert f"{ST_ASYNC}.b64" in module


@pytest.mark.parametrize("dtype, atomic", [(jnp.float16, None), (jnp.int32, "add")])
def test_scalars_st_async_cannot_store_are_refused(monkeypatch, dtype, atomic):
    call, args = scalar_store_kernel(dtype, atomic)
    with gpu_facts(monkeypatch), smalti.jax.installed():
        with pytest.raises(smalti.SmaltiNotImplementedError) as error:
            capture_modules(call, *args)
    assert error.value.code == "SM122"
    message = str(error.value)
    assert "Scalars are not supported in async_store_smem" in message
    assert "plain SMEM store" in message and "1-D value" in message
    assert "test_beyond_jax.py" in message  # the user's line


def test_non_scalar_async_store_smem_is_still_jax(monkeypatch):
    def body(x_gmem, o_gmem, x_smem, smem, loaded, stored):
        plgpu.copy_gmem_to_smem(x_gmem, x_smem, loaded)
        plgpu.barrier_wait(loaded)
        peer = 1 - jax.lax.axis_index("cluster")
        plgpu.async_store_smem(x_smem[...], smem, stored, cluster_idx=peer,
                               cluster_dim="cluster")
        plgpu.barrier_wait(stored)
        plgpu.copy_smem_to_gmem(smem, o_gmem)
        plgpu.wait_smem_to_gmem(0)

    swizzled = plgpu.SMEM((128, 64), F16, transforms=(
        plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128)))
    call = kernel(body, sds((128, 64)), [swizzled, swizzled, plgpu.Barrier(), plgpu.Barrier()],
                  cluster=(2,), cluster_names=("cluster",))
    with gpu_facts(monkeypatch):
        module = assert_same_modules(call, sds((128, 64)))
    assert ST_ASYNC in module
