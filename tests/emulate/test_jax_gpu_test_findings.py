"""Patterns of jax's own GPU tests (tests/mosaic/gpu_test.py) that the
checker reported (issue 36): one false positive, fixed, and three real races
in the tests' kernels, each next to its twin.

**Warps storing a replicated layout with ``stmatrix``** (the false positive).
jax stores a replicated register layout (``WGMMA_COL_LAYOUT``: every warp
holds the whole vector) from every warp; for 16-bit elements in SMEM it does
so with ``stmatrix``. Warps writing equal values to the same bytes in one
step are one group write (docs/emulator.md, "Shadow memory"), as for
``llvm.store``/``vector.store``: a read is ordered after the group once it is
ordered after one member -- its own warp's. Before the fix ``stmatrix`` passed
no values to the checker, so jax's ``test_wgmma_col_load_store_with_layout``
(f16) was reported as a write-after-write between warps 0 and 3. A twin whose
warps store different values is still a race, with both lines.

**Thread 0 reading what every warp stored, with no barrier between** (real).
gpu_test.py's ``copy`` helper has thread 0 copy a buffer element by element
and puts its ``gpu.barrier`` *after* the copy, not before: the tests that
store registers to SMEM and then ``copy`` SMEM out (``test_store_tiled``,
``test_load_tiled``, ``test_load_and_store_tiled_f8``,
``test_wgmma_row_load_store_with_layout``, ...) read other warps' writes
unordered. The twin with the barrier first is clean.

**A TMA store of SMEM written by threads, after a barrier but without
``fence.proxy.async``** (real). ``MosaicGpuDialectSm90ATest::
test_wgmma_kernel_with_tma`` stores the WGMMA result (the lowering puts a
warpgroup barrier after the store) and issues ``async_store`` with no proxy
fence; ``test_tma_small_tile_store`` has neither, nor has
``MosaicGpuDialectTest::test_pointwise_kernel_with_tma``. The PTX memory
model needs the fence for the async proxy to see generic writes
(``commit_shared``).

**One thread per warpgroup arriving on a cluster barrier for writes of every
warp** (real). ``ClusterBarrier.arrive`` has one thread of each warpgroup
arrive on each block's mbarrier; ``MemRefTest::test_cluster_red_async*``
has every warp fill its SMEM tile, arrives, and then the peer block adds
into that tile with ``red.async``: the fills of warps 1-3 are ordered
before nothing the peer waits on. A warpgroup barrier before the arrive
orders them.
"""

from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import smalti.emulate as emu

S = jax.ShapeDtypeStruct
X = np.arange(128).astype(np.float16)


def _line(marker: str, fn=None) -> int:
    """The line of ``fn`` (in this file) holding ``# marker``."""
    lines, first = inspect.getsourcelines(fn or replicated_store_kernel)
    return first + next(i for i, text in enumerate(lines) if f"# {marker}" in text)


def replicated_store_kernel(per_warp_values: bool):
    """Every warp stores the column vector ``x`` (+ its warp index, when
    ``per_warp_values``) to SMEM with ``stmatrix``; every warp then reads it
    back with ``ldmatrix``, with no barrier between, and stores it out."""
    from jax._src.interpreters import mlir
    from jax._src.lib.mlir import ir
    from jax._src.lib.mlir.dialects import arith
    from jax.experimental.mosaic import gpu as mgpu
    from jax.experimental.mosaic.gpu import utils as mgpu_utils

    store_line, load_line = _line("replicated store"), _line("read back")

    def kernel(ctx, x_ref, o_ref, smem):
        t = mgpu.FragmentedArray.load_untiled(x_ref, layout=mgpu.WGMMA_COL_LAYOUT,
                                              optimized=False)
        if per_warp_values:
            i32 = ir.IntegerType.get_signless(32)
            warp = arith.divui(mgpu_utils.thread_idx(), mgpu_utils.c(32, i32))
            t = t + mgpu.FragmentedArray.splat(arith.uitofp(ir.F16Type.get(), warp), t.shape)
        with ir.Location.file(__file__, store_line, 0):
            t.store_untiled(smem, swizzle=16)  # replicated store
        with ir.Location.file(__file__, load_line, 0):
            back = mgpu.FragmentedArray.load_untiled(  # read back
                smem, layout=mgpu.WGMMA_COL_LAYOUT, optimized=False, swizzle=16)
        back.store_untiled(o_ref, optimized=False)

    vec = S((128,), jnp.float16)
    with mlir.make_ir_context(), ir.Location.unknown():
        return mgpu.as_gpu_kernel(kernel, (1, 1, 1), (128, 1, 1), (vec,), vec, vec)


def test_warps_storing_a_replicated_layout_with_stmatrix_are_one_write():
    (got,) = emu.run(replicated_store_kernel(False), X, on_race="raise")
    np.testing.assert_array_equal(got, X)


def test_warps_storing_different_values_with_stmatrix_still_race():
    with pytest.raises(emu.RaceError) as err:
        emu.run(replicated_store_kernel(True), X)
    races = {r.kind: r for r in err.value.races}
    store = f"test_jax_gpu_test_findings.py:{_line('replicated store')}"
    load = f"test_jax_gpu_test_findings.py:{_line('read back')}"
    waw = races["write-after-write"]
    assert waw.space == "smem" and waw.first.op == waw.second.op == "nvvm.stmatrix"
    assert waw.first.location.endswith(store) and waw.second.location.endswith(store)
    assert waw.first.agent != waw.second.agent
    raw = races["read-after-write"]
    assert raw.first.op == "nvvm.stmatrix" and raw.first.location.endswith(store)
    assert raw.second.op == "nvvm.ldmatrix" and raw.second.location.endswith(load)


def copy_out_kernel(barrier_first: bool):
    """Every warp stores its part of ``x`` to SMEM; thread 0 then reads
    elements 0 (warp 0's) and 64 (warp 2's) into the output -- after a block
    barrier, or (gpu_test.py's ``copy``) without one."""
    from jax._src.interpreters import mlir
    from jax._src.lib.mlir import ir
    from jax._src.lib.mlir.dialects import arith, gpu, memref, scf
    from jax.experimental.mosaic import gpu as mgpu
    from jax.experimental.mosaic.gpu import utils as mgpu_utils

    store_line, read_line = _line("warps store", copy_out_kernel), _line("thread 0 reads",
                                                                        copy_out_kernel)

    def kernel(ctx, x_ref, o_ref, smem):
        with ir.Location.file(__file__, store_line, 0):
            mgpu.FragmentedArray.load_strided(x_ref).store_untiled(smem)  # warps store
        if barrier_first:
            gpu.barrier()
        index, i32 = ir.IndexType.get(), ir.IntegerType.get_signless(32)
        first = arith.cmpi(arith.CmpIPredicate.eq, mgpu_utils.thread_idx(),
                           mgpu_utils.c(0, i32))
        with ir.InsertionPoint(scf.IfOp(first).then_block):
            for k, element in enumerate((0, 64)):
                with ir.Location.file(__file__, read_line, 0):
                    v = memref.load(smem, [mgpu_utils.c(element, index)])  # thread 0 reads
                memref.store(v, o_ref, [mgpu_utils.c(k, index)])
            scf.yield_([])

    vec = S((128,), jnp.float32)
    with mlir.make_ir_context(), ir.Location.unknown():
        return mgpu.as_gpu_kernel(kernel, (1, 1, 1), (128, 1, 1), (vec,),
                                  S((2,), jnp.float32), vec)


def test_thread_0_reading_after_a_block_barrier_is_clean():
    x = np.arange(128).astype(np.float32)
    (got,) = emu.run(copy_out_kernel(True), x, on_race="raise")
    np.testing.assert_array_equal(got, x[[0, 64]])


def test_thread_0_reading_other_warps_stores_without_a_barrier_races():
    with pytest.raises(emu.RaceError) as err:
        emu.run(copy_out_kernel(False), np.arange(128).astype(np.float32))
    (race,) = err.value.races
    assert race.kind == "read-after-write" and race.space == "smem"
    assert race.first.location.endswith(f":{_line('warps store', copy_out_kernel)}")
    assert race.second.location.endswith(f":{_line('thread 0 reads', copy_out_kernel)}")
    assert race.first.agent.endswith("warp 2") and race.second.agent.endswith("warp 0")


def tma_store_kernel(fence: bool):
    """Every warp stores ``x`` to SMEM, a warpgroup barrier follows (as the
    dialect lowering of ``vector_store`` emits), then a TMA store copies it
    out -- with ``commit_shared`` (proxy fence + barrier) before, or not."""
    from jax._src.interpreters import mlir
    from jax._src.lib.mlir import ir
    from jax.experimental.mosaic import gpu as mgpu
    from jax.experimental.mosaic.gpu import utils as mgpu_utils

    store_line, copy_line = _line("smem store", tma_store_kernel), _line("tma store",
                                                                        tma_store_kernel)

    def kernel(ctx, x_ref, o_ref, smem):
        with ir.Location.file(__file__, store_line, 0):
            mgpu.FragmentedArray.load_strided(x_ref).store_untiled(smem)  # smem store
        mgpu_utils.warpgroup_barrier()
        if fence:
            mgpu_utils.commit_shared()
        with ir.Location.file(__file__, copy_line, 0):
            ctx.async_copy(src_ref=smem, dst_ref=o_ref)  # tma store
        ctx.await_async_copy(0)

    tile = S((64, 64), jnp.float32)
    with mlir.make_ir_context(), ir.Location.unknown():
        return mgpu.as_gpu_kernel(kernel, (1, 1, 1), (128, 1, 1), (tile,), tile, tile)


def test_a_tma_store_after_commit_shared_is_clean():
    x = np.random.default_rng(36).standard_normal((64, 64)).astype(np.float32)
    (got,) = emu.run(tma_store_kernel(True), x, on_race="raise")
    np.testing.assert_array_equal(got, x)


def test_a_tma_store_after_a_barrier_without_proxy_fence_races():
    x = np.random.default_rng(36).standard_normal((64, 64)).astype(np.float32)
    with pytest.raises(emu.RaceError) as err:
        emu.run(tma_store_kernel(False), x)
    race = err.value.races[0]
    assert race.kind == "read-after-write" and race.space == "smem"
    assert race.first.location.endswith(f":{_line('smem store', tma_store_kernel)}")
    assert race.second.location.endswith(f":{_line('tma store', tma_store_kernel)}")
    assert "TMA" in race.second.agent and "commit_smem" in race.fix


def cluster_red_kernel(warpgroup_barrier: bool):
    """Each block of a cluster of two: every warp fills its SMEM tile with
    zeros, the cluster barrier (one arriving thread per warpgroup and
    block, as ``ClusterBarrier.arrive`` does), then an atomic add of ``x``'s
    tile into the *peer's* SMEM (``red.async``), its barrier, the cluster
    barrier again, and the tile out. gpu_test.py's ``test_cluster_red_async``
    has no warpgroup barrier before the first arrive; the twin has one."""
    from jax._src.interpreters import mlir
    from jax._src.lib.mlir import ir
    from jax._src.lib.mlir.dialects import arith, gpu
    from jax.experimental.mosaic import gpu as mgpu
    from jax.experimental.mosaic.gpu import utils as mgpu_utils

    fill_line, add_line = (_line("warps fill", cluster_red_kernel),
                           _line("peer adds", cluster_red_kernel))

    def kernel(ctx, x_ref, o_ref, scratch):
        smem, done, cluster = scratch
        rank = gpu.cluster_block_id(gpu.Dimension.x)
        peer = arith.subi(arith.constant(ir.IndexType.get(), 1), rank)
        tile = mgpu.FragmentedArray.load_tiled(mgpu_utils.memref_slice(x_ref, rank),
                                               layout=mgpu.WGMMA_LAYOUT, swizzle=128,
                                               is_signed=True, optimized=False)
        zeros = mgpu.FragmentedArray.splat(mgpu_utils.c(0, tile.mlir_dtype), tile.shape,
                                           is_signed=True, layout=tile.layout)
        with ir.Location.file(__file__, fill_line, 0):
            zeros.store_tiled(smem, swizzle=128)  # warps fill
        if warpgroup_barrier:
            mgpu_utils.warpgroup_barrier()
        cluster.arrive()
        cluster.wait()
        done.arrive_expect_tx(tile.shape[0] * tile.shape[1] * 4 // 128)
        with ir.Location.file(__file__, add_line, 0):
            tile.store_tiled_async(smem, done, cluster_dim=gpu.Dimension.x,  # peer adds
                                   cluster_idx=peer, swizzle=128, atomic="add")
        done.wait()
        cluster.arrive()
        cluster.wait()
        mgpu.FragmentedArray.load_strided(smem, is_signed=True).store_untiled(
            mgpu_utils.memref_slice(o_ref, rank))

    x = S((2, 8, 1, 8, 32), jnp.int32)
    scratch = (S((8, 1, 8, 32), jnp.int32), mgpu.Barrier(arrival_count=128),
               mgpu.ClusterBarrier(collective_dims=(gpu.Dimension.x,)))
    with mlir.make_ir_context(), ir.Location.unknown():
        return mgpu.as_gpu_kernel(kernel, (2, 1, 1), (128, 1, 1), x, x, scratch,
                                  cluster=(2, 1, 1))


CLUSTER_X = np.arange(2 * 64 * 32, dtype=np.int32).reshape(2, 8, 1, 8, 32) - 1000


def test_a_cluster_barrier_after_a_warpgroup_barrier_orders_every_warps_fill():
    (got,) = emu.run(cluster_red_kernel(True), CLUSTER_X, on_race="raise")
    np.testing.assert_array_equal(got, CLUSTER_X[::-1])  # each block holds its peer's tile


def test_one_thread_arriving_for_its_warpgroup_leaves_other_warps_fills_unordered():
    with pytest.raises(emu.RaceError) as err:
        emu.run(cluster_red_kernel(False), CLUSTER_X)
    fill = f":{_line('warps fill', cluster_red_kernel)}"
    add = f":{_line('peer adds', cluster_red_kernel)}"
    for race in err.value.races:
        assert race.kind == "write-after-write" and race.space == "smem"
        accesses = {access.op.split(".")[0]: access for access in (race.first, race.second)}
        assert accesses["red"].location.endswith(add)
        (fill_access,) = (a for name, a in accesses.items() if name != "red")
        assert fill_access.location.endswith(fill) and "warp 0" not in fill_access.agent


def test_the_reciprocal_of_every_e8m0_value_is_exact():
    """``FragmentedArrayTest::test_e8m0_reciprocal`` fails on the CPU by its
    reference, not the kernel: XLA:CPU computes ``1 / x.astype(f32)`` with
    f32 subnormals flushed, so 1 / 2^-127 is inf there and 1 / 2^127 is 0,
    where the GPU (and the emulator) give 2^127 and 2^-127 -- e8m0 holds
    both. Every one of the 256 codes: 2^(127 - e), NaN for 0xFF."""
    from jax._src.interpreters import mlir
    from jax._src.lib.mlir import ir
    from jax.experimental.mosaic import gpu as mgpu

    def kernel(ctx, x_ref, o_ref, smem):
        x = mgpu.FragmentedArray.load_untiled(x_ref, layout=mgpu.WGMMA_LAYOUT, optimized=False)
        (1 / x).store_untiled(o_ref, optimized=False)

    block = S((64, 128), jnp.float8_e8m0fnu)
    with mlir.make_ir_context(), ir.Location.unknown():
        fn = mgpu.as_gpu_kernel(kernel, (1, 1, 1), (128, 1, 1), block, block, ())
    codes = (np.arange(64 * 128) % 256).astype(np.uint8).reshape(64, 128)
    (got,) = emu.run(fn, codes.view(jnp.float8_e8m0fnu), arch=(10, 0))
    exact = np.where(codes == 255, np.nan, np.exp2(127.0 - codes))
    np.testing.assert_array_equal(got.astype(np.float64), exact)
