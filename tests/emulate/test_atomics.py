"""Atomics: ``red``/``atom``/strong loads (``plgpu.atomic_*``, Pallas
semaphores across blocks) against numpy; atomics do not race with each
other, only with plain accesses."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

import smalti.emulate as emu

S = jax.ShapeDtypeStruct


def _atomic_kernel(atomic, dtype, blocks=4, shape=(128,)):
    """Every block atomically combines its slice of x into the one output."""
    def body(x_gmem, o_gmem):
        i = lax.axis_index("x")
        atomic(o_gmem, x_gmem[i])

    return plgpu.kernel(body, out_type=S(shape, dtype), grid=(blocks,), grid_names=("x",))


@pytest.mark.parametrize("name,np_fn", [("atomic_add", np.sum), ("atomic_max", np.max),
                                        ("atomic_min", np.min),
                                        ("atomic_and", np.bitwise_and.reduce),
                                        ("atomic_or", np.bitwise_or.reduce),
                                        ("atomic_xor", np.bitwise_xor.reduce)])
def test_integer_atomics_from_every_block_combine_without_a_race(name, np_fn):
    """Pallas emits ``red.global.relaxed.gpu.<op>.u32`` for int32 (min/max
    compare unsigned, as the PTX type says)."""
    x = np.random.default_rng(0).integers(-2**31, 2**31, (4, 128)).astype(np.int32)
    (out,) = emu.run(_atomic_kernel(getattr(plgpu, name), jnp.int32), x)
    # the output starts zeroed, and is the first operand of each combination
    u = np.concatenate([np.zeros((1, 128), np.uint32), x.view(np.uint32)])
    want = (u.astype(np.uint64).sum(0).astype(np.uint32) if name == "atomic_add"
            else np_fn(u, axis=0))
    np.testing.assert_array_equal(out.view(np.uint32), want)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float16, jnp.bfloat16])
def test_float_atomic_add_rounds_each_addition_in_block_order(dtype):
    """f32 (``red...add.f32``), f16/bf16 (``red...add.noftz.v4.f16x2`` pairs)."""
    x = np.random.default_rng(1).standard_normal((4, 1024)).astype(dtype)
    (out,) = emu.run(_atomic_kernel(plgpu.atomic_add, dtype, shape=(1024,)), x)
    want = np.zeros(1024, dtype)
    for row in x:
        want = (want.astype(np.float64) + row.astype(np.float64)).astype(dtype)  # rounded once
    np.testing.assert_array_equal(out, want)


def test_an_atomic_and_a_plain_store_of_another_block_race():
    def body(x_gmem, o_gmem):
        i = lax.axis_index("x")

        @pl.when(i == 0)
        def _():
            o_gmem[...] = x_gmem[0]

        @pl.when(i == 1)
        def _():
            plgpu.atomic_add(o_gmem, x_gmem[1])

    k = plgpu.kernel(body, out_type=S((128,), jnp.int32), grid=(2,), grid_names=("x",))
    x = np.ones((2, 128), np.int32)
    with pytest.raises(emu.RaceError) as e:
        emu.run(k, x)
    kinds = {(r.kind, r.first.is_write, r.second.is_write) for r in e.value.races}
    assert ("write-after-write", True, True) in kinds
    lines = {r.first.location.rsplit(":", 1)[1] for r in e.value.races} | \
        {r.second.location.rsplit(":", 1)[1] for r in e.value.races}
    assert len(lines) == 2  # the plain store and the atomic


def _semaphore_kernel(signaller: int, waiter: int):
    def body(o_gmem):
        sem = pl.get_global(plgpu.SemaphoreType.REGULAR)
        i = lax.axis_index("x")

        @pl.when(i == signaller)
        def _():
            pl.semaphore_signal(sem, 2)

        @pl.when(i == waiter)
        def _():
            pl.semaphore_wait(sem, 2)
            o_gmem[...] = jnp.full((128,), 7, jnp.int32)

    return plgpu.kernel(body, out_type=S((128,), jnp.int32), grid=(2,), grid_names=("x",))


def test_a_global_semaphore_signalled_by_an_earlier_block_is_waited_for():
    """Block 0 signals 2 (red.release.sys.global.add), block 1 waits for 2
    (an atom.cas loop over Pallas' zeroed GMEM scratch), then writes."""
    (out,) = emu.run(_semaphore_kernel(0, 1))
    np.testing.assert_array_equal(out, np.full(128, 7, np.int32))


def test_a_wait_for_a_block_that_runs_later_is_a_named_deadlock():
    """Blocks of different clusters run one after another: block 0 waiting for
    block 1's signal would spin forever, so the emulator stops and says why."""
    with pytest.raises(emu.Deadlock, match="atom.cas poll"):
        emu.run(_semaphore_kernel(1, 0))


def test_a_semaphore_waited_for_by_one_warpgroup_and_signalled_by_the_other():
    """Warpgroup 0 polls (atom.cas) before warpgroup 1 has signalled: the poll
    lets warpgroup 1 run only once its own read-modify-write is stored, so the
    signal made meanwhile is not overwritten by the failed cas (it was: a
    false deadlock)."""
    def body(x_gmem, o_gmem, sem):
        wg = lax.axis_index("wg")

        @pl.when(wg == 0)
        def _():
            pl.semaphore_wait(sem, 1)
            o_gmem[...] = x_gmem[...] + 1

        @pl.when(wg == 1)
        def _():
            pl.semaphore_signal(sem, 1)

    k = plgpu.kernel(body, out_type=S((128,), jnp.float32), num_threads=2, thread_name="wg",
                     scratch_types=[plgpu.SemaphoreType.REGULAR])
    x = np.arange(128, dtype=np.float32)
    (out,) = emu.run(k, x)
    np.testing.assert_array_equal(out, x + 1)


@pytest.mark.parametrize("op,dtype", [("add", jnp.int32), ("max", jnp.int32), ("add", jnp.float32)])
def test_shared_memory_atomics_from_two_warpgroups(op, dtype):
    """Two warpgroups atomically combine their halves of x into one SMEM
    buffer (``red.shared::cta...``) after a zeroing write and a block barrier;
    a second barrier, and the buffer goes out."""
    from jax._src.interpreters import mlir
    from jax._src.lib.mlir import ir
    from jax._src.lib.mlir.dialects import gpu
    from jax.experimental.mosaic import gpu as mgpu
    from jax.experimental.mosaic.gpu import utils as mgpu_utils

    def kernel(ctx, x_ref, o_ref, acc):
        wg = mgpu_utils.warpgroup_idx(sync=True)
        idx = ir.IndexType.get()
        mine = mgpu_utils.memref_slice(x_ref, mgpu_utils.ds(
            mgpu_utils.arith.index_cast(idx, wg), 1))
        mine = mgpu_utils.memref_reshape(mine, (64, 32))
        signed = True if dtype == jnp.int32 else None
        zero = mgpu.FragmentedArray.splat(mgpu_utils.c(0, mgpu_utils.dtype_to_ir_type(dtype)),
                                          (64, 32), is_signed=signed)
        with mgpu_utils.when(mgpu_utils.arith.cmpi(mgpu_utils.arith.CmpIPredicate.eq, wg,
                                                   mgpu_utils.c(0, wg.type))):
            zero.store_untiled(acc, optimized=False)
        gpu.barrier()
        v = mgpu.FragmentedArray.load_strided(mine, is_signed=signed)
        v.store_untiled(acc, atomic=op, optimized=False)
        gpu.barrier()
        with mgpu_utils.when(mgpu_utils.arith.cmpi(mgpu_utils.arith.CmpIPredicate.eq, wg,
                                                   mgpu_utils.c(1, wg.type))):
            mgpu.FragmentedArray.load_strided(acc, is_signed=signed).store_untiled(
                o_ref, optimized=False)

    sds = jax.ShapeDtypeStruct((2, 64, 32), dtype)
    out = jax.ShapeDtypeStruct((64, 32), dtype)
    with mlir.make_ir_context(), ir.Location.unknown():
        f = mgpu.as_gpu_kernel(kernel, (1, 1, 1), (256, 1, 1), sds, out, out)
    rng = np.random.default_rng(5)
    x = (rng.integers(-1000, 1000, (2, 64, 32)) if dtype == jnp.int32
         else rng.standard_normal((2, 64, 32))).astype(dtype)
    (o,) = emu.run(f, x)
    zero = np.zeros((64, 32), dtype)
    if op == "add":
        want = (zero + x[0]) + x[1]
    else:  # FragmentedArray says is_signed: .s32
        want = np.maximum(np.maximum(zero, x[0]), x[1])
    np.testing.assert_array_equal(o, want)
