"""Clusters of several blocks: the blocks of a cluster run together (their
warpgroups as tasks of one schedule), with distributed shared memory
(``mapa``, shared::cluster loads, ``st.async``, arrivals on a peer's
mbarrier), cluster barriers, multicast TMA and the cluster ids. Validated on
kernels jax 0.11.2 lowers itself (jax's own pipeline), against numpy, bit for
bit; smalti's scalar ``async_store_smem`` is in test_beyond_jax.py."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.experimental.pallas import mosaic_gpu as plgpu

import smalti.emulate as emu
from smalti.emulate import memory
from smalti.emulate.testing import assert_close_ulp
from tests.emulate.kernels import WG, S

F16 = jnp.float16
RNG = np.random.default_rng(2602)


def swizzled(shape, dtype=F16):
    return plgpu.SMEM(shape, dtype, transforms=(plgpu.TilingTransform((8, 64)),
                                                plgpu.SwizzleTransform(128)))


def exchange_kernel(grid=3):
    """Block (g, c) loads x[g, c] by TMA and ``async_store_smem``s it (st.async,
    with the expected bytes on the peer's barrier) into block (g, 1 - c)'s SMEM,
    which writes it out: o[g, c] = x[g, 1 - c]. ``grid`` clusters of 2."""
    def body(x_gmem, o_gmem, x_smem, smem, loaded, stored):
        g, c = lax.axis_index("g"), lax.axis_index("c")
        plgpu.copy_gmem_to_smem(x_gmem.at[g, c], x_smem, loaded)
        plgpu.barrier_wait(loaded)
        plgpu.async_store_smem(x_smem[...], smem, stored, cluster_idx=1 - c, cluster_dim="c")
        plgpu.barrier_wait(stored)
        plgpu.copy_smem_to_gmem(smem, o_gmem.at[g, c])
        plgpu.wait_smem_to_gmem(0)
    return plgpu.kernel(body, out_type=S((grid, 2, 64, 64), F16), compiler_params=WG,
                        scratch_types=[swizzled((64, 64)), swizzled((64, 64)), plgpu.Barrier(),
                                       plgpu.Barrier()],
                        grid=(grid,), grid_names=("g",), cluster=(2,), cluster_names=("c",))


def cluster_barrier_kernel():
    """Each block writes 2 x[c] into its SMEM, arrives on a ClusterBarrier (on
    every block's barrier: mapa + mbarrier.arrive.shared::cluster) and waits;
    then reads the peer's SMEM through ``cluster_ref`` (shared::cluster
    loads) and writes it out; a second ClusterBarrier keeps the peer's SMEM
    alive until both have read."""
    def body(x_gmem, o_gmem, smem, ready, done):
        c = lax.axis_index("c")
        smem[...] = x_gmem[c] * 2
        plgpu.barrier_arrive(ready)
        plgpu.barrier_wait(ready)
        o_gmem[c] = plgpu.cluster_ref(smem, {"c": 1 - c})[...] + 1
        plgpu.barrier_arrive(done)
        plgpu.barrier_wait(done)
    return plgpu.kernel(body, out_type=S((2, 128), jnp.float32), compiler_params=WG,
                        scratch_types=[plgpu.SMEM((128,), jnp.float32),
                                       plgpu.ClusterBarrier(collective_axes=("c",)),
                                       plgpu.ClusterBarrier(collective_axes=("c",))],
                        cluster=(2,), cluster_names=("c",))


def multicast_kernel(n=2):
    """``copy_gmem_to_smem(..., collective_axes="c")``: each block of the
    cluster loads 1/n of the box and multicasts it to every block (multicast
    TMA), so every block's barrier completes with the whole tile."""
    def body(x_gmem, o_gmem, smem, bar):
        c = lax.axis_index("c")
        plgpu.copy_gmem_to_smem(x_gmem, smem, bar, collective_axes="c")
        plgpu.barrier_wait(bar)
        o_gmem[c] = smem[...] * (c + 1).astype(F16)
    return plgpu.kernel(body, out_type=S((n, 64, 64), F16), compiler_params=WG,
                        scratch_types=[swizzled((64, 64)), plgpu.Barrier()],
                        cluster=(n,), cluster_names=("c",))


def ids_kernel():
    """Cluster and block ids in a (3, 2) grid of clusters of (2, 1), two
    warpgroups a block (four tasks in one schedule per cluster)."""
    def body(o_gmem):
        g, h = lax.axis_index("g"), lax.axis_index("h")
        c, wg = lax.axis_index("c"), lax.axis_index("wg")
        v = g * 1000 + h * 100 + c * 10 + wg
        o_gmem[g, h, c, wg] = jnp.full((128,), v, jnp.int32)
    return plgpu.kernel(body, out_type=S((3, 2, 2, 2, 128), jnp.int32), compiler_params=WG,
                        grid=(3, 2), grid_names=("g", "h"), cluster=(2,), cluster_names=("c",),
                        num_threads=2, thread_name="wg")


def scalar_exchange_kernel(dtype):
    """(For smalti: jax refuses scalars.) Each block fills its SMEM with x[c],
    waits on a ClusterBarrier, then stores x[c, 3] into element 5 of the peer's
    SMEM with a scalar ``async_store_smem``: o[c] = x[c] but o[c, 5] = x[1-c, 3]."""
    def body(x_gmem, o_gmem, smem, ready, stored):
        c = lax.axis_index("c")
        smem[...] = x_gmem[c]
        plgpu.barrier_arrive(ready)
        plgpu.barrier_wait(ready)
        plgpu.async_store_smem(x_gmem[c, 3], smem.at[5], stored, cluster_idx=1 - c,
                               cluster_dim="c")
        plgpu.barrier_wait(stored)
        o_gmem[c] = smem[...]
    return plgpu.kernel(body, out_type=S((2, 128), dtype), compiler_params=WG,
                        scratch_types=[plgpu.SMEM((128,), dtype),
                                       plgpu.ClusterBarrier(collective_axes=("c",)),
                                       plgpu.Barrier()],
                        cluster=(2,), cluster_names=("c",))


def test_async_store_smem_exchange_between_peers():
    x = RNG.standard_normal((3, 2, 64, 64)).astype(np.float16)
    (got,) = emu.run(exchange_kernel(), x)
    assert_close_ulp(got, x[:, ::-1], 0)


def test_cluster_barrier_and_reads_of_a_peers_smem():
    x = RNG.standard_normal((2, 128)).astype(np.float32)
    (got,) = emu.run(cluster_barrier_kernel(), x)
    assert_close_ulp(got, (x[::-1] * 2 + 1).astype(np.float32), 0)


@pytest.mark.parametrize("n", [2, 4])
def test_multicast_tma(n):
    x = RNG.standard_normal((64, 64)).astype(np.float16)
    (got,) = emu.run(multicast_kernel(n), x)
    want = np.stack([(x * np.float16(k + 1)).astype(np.float16) for k in range(n)])
    assert_close_ulp(got, want, 0)


def test_cluster_ids_with_two_warpgroups_a_block():
    (got,) = emu.run(ids_kernel())
    g, h, c, w = np.meshgrid(*[np.arange(k) for k in (3, 2, 2, 2)], indexing="ij")
    want = np.broadcast_to((g * 1000 + h * 100 + c * 10 + w)[..., None], got.shape)
    assert_close_ulp(got, want.astype(np.int32), 0)


def test_mapa_as_jax_0_12_emits_it(monkeypatch):
    """jax 0.12 maps an SMEM pointer to a peer block's with inline PTX
    (``mapa.shared::cluster.u32 $0, $1, $2;``) where 0.11.2 emits
    ``nvvm.mapa``: the kernel reading its peer's SMEM and arriving on its
    barriers, lowered with 0.12's form, computes the same bits."""
    from jax._src.lib.mlir.dialects import llvm
    from jax.experimental.mosaic.gpu import utils as mgpu_utils

    def get_cluster_ptr(ptr, cluster_block, generic=True):  # jax 0.12's
        mapped = llvm.inline_asm(llvm.PointerType.get(7), [ptr, cluster_block],
                                 "mapa.shared::cluster.u32 $0, $1, $2;", "=r,r,r")
        return llvm.addrspacecast(llvm.PointerType.get(), mapped) if generic else mapped

    monkeypatch.setattr(mgpu_utils, "get_cluster_ptr", get_cluster_ptr)
    x = RNG.standard_normal((2, 128)).astype(np.float32)
    module, _ = emu.lower(cluster_barrier_kernel(), x)
    text = str(module)
    assert "mapa.shared::cluster.u32 $0, $1, $2;" in text and "nvvm.mapa" not in text
    (got,) = emu.run(cluster_barrier_kernel(), x, workers=1)  # the patch is this process's
    assert_close_ulp(got, (x[::-1] * 2 + 1).astype(np.float32), 0)


def test_a_wrong_peer_would_be_noticed(monkeypatch):
    """With mapa mapping every rank to the block itself, each block stores
    into (and completes) its own SMEM: the exchange no longer matches."""
    x = RNG.standard_normal((1, 2, 64, 64)).astype(np.float16)
    real = memory.cluster_address
    from smalti.emulate.ops import nvvm

    monkeypatch.setattr(nvvm, "_mapa_address", lambda b, rank, addr: real(b.rank, addr))
    (got,) = emu.run(exchange_kernel(1), x, workers=1)  # the patch is this process's
    assert_close_ulp(got, x, 0)
    assert not np.array_equal(got, x[:, ::-1])


def test_a_cluster_barrier_one_block_skips_is_a_named_deadlock():
    def body(o_gmem, bar):
        c = lax.axis_index("c")

        def arrive():
            plgpu.barrier_arrive(bar)
        lax.cond(c == 0, arrive, lambda: None)  # block 1 never arrives
        plgpu.barrier_wait(bar)
        o_gmem[c] = jnp.zeros((128,), jnp.float32)
    call = plgpu.kernel(body, out_type=S((2, 128), jnp.float32), compiler_params=WG,
                        scratch_types=[plgpu.ClusterBarrier(collective_axes=("c",))],
                        cluster=(2,), cluster_names=("c",))
    with pytest.raises(emu.Deadlock, match=r"block \(0, 0, 0\) waits for mbarrier .* "
                       r"block \(1, 0, 0\) waits for mbarrier"):
        emu.run(call)
