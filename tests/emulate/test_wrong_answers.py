"""Cases where the emulator used to return a wrong answer (its first promise
broken): each kernel is checked against numpy with the GPU's semantics."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import smalti.emulate as emu


def lane_kernel(kernel, in_shapes, out_shapes, smem=()):
    """``mgpu.as_gpu_kernel`` of one block of 128 threads (it lowers when
    built, so in an MLIR context)."""
    from jax._src.interpreters import mlir
    from jax._src.lib.mlir import ir
    from jax.experimental.mosaic import gpu as mgpu

    with mlir.make_ir_context(), ir.Location.unknown():
        return mgpu.as_gpu_kernel(kernel, (1, 1, 1), (128, 1, 1), tuple(in_shapes),
                                  tuple(out_shapes), smem)


def _ptx_div(a, b):
    """PTX div.s/div.u: truncating; by zero all ones."""
    a64, b64 = a.astype(np.int64), b.astype(np.int64)
    q = np.where(b64 == 0, -1, np.trunc(a64 / np.where(b64 == 0, 1, b64)))
    return q.astype(np.int64).astype(a.dtype)


def _ptx_rem(a, b):
    """PTX rem.s/rem.u: the dividend's sign; by zero the dividend."""
    a64, b64 = a.astype(np.int64), b.astype(np.int64)
    r = a64 - np.trunc(a64 / np.where(b64 == 0, 1, b64)).astype(np.int64) * b64
    return np.where(b64 == 0, a64, r).astype(a.dtype)


@pytest.mark.parametrize("dtype", [np.int32, np.uint32])
def test_integer_division_and_remainder_by_zero_follow_ptx(dtype):
    """div by zero gives all ones (-1, 0xFFFFFFFF) and rem by zero the dividend;
    the divisors include zeros, negatives and the largest magnitudes."""
    from jax.experimental.mosaic import gpu as mgpu

    signed = np.dtype(dtype).kind == "i"

    def kernel(ctx, x_ref, y_ref, q_ref, r_ref, _):
        x = mgpu.FragmentedArray.load_strided(x_ref, is_signed=signed)
        y = mgpu.FragmentedArray.load_strided(y_ref, is_signed=signed)
        x.trunc_div(y).store_untiled(q_ref, optimized=False)
        (x % y).store_untiled(r_ref, optimized=False)

    rng = np.random.default_rng(0)
    info = np.iinfo(dtype)
    x = rng.integers(info.min, info.max, (64, 32), dtype=dtype, endpoint=True)
    y = rng.integers(-9 if signed else 0, 9, (64, 32)).astype(dtype)
    y[0, :8] = 0
    x[1, :4] = info.min
    x[2, :4], y[2, :4] = info.max, info.max
    if signed:
        y[1, :4] = -1  # INT_MIN / -1 wraps
    sds = jax.ShapeDtypeStruct((64, 32), dtype)
    f = lane_kernel(kernel, [sds, sds], [sds, sds])
    q, r = emu.run(f, x, y)
    assert (y == 0).sum() >= 8
    np.testing.assert_array_equal(q, _ptx_div(x, y))
    np.testing.assert_array_equal(r, _ptx_rem(x, y))
    assert np.all(q[y == 0] == dtype(-1 if signed else info.max))


def test_floor_division_by_zero_is_unsupported_not_guessed():
    """arith.floordivsi's value at zero depends on MLIR's expansion: refused."""
    from jax.experimental.mosaic import gpu as mgpu

    def kernel(ctx, x_ref, y_ref, q_ref, _):
        x = mgpu.FragmentedArray.load_strided(x_ref, is_signed=True)
        y = mgpu.FragmentedArray.load_strided(y_ref, is_signed=True)
        (x // y).store_untiled(q_ref, optimized=False)

    sds = jax.ShapeDtypeStruct((64, 32), np.int32)
    f = lane_kernel(kernel, [sds, sds], [sds])
    x = np.arange(64 * 32, dtype=np.int32).reshape(64, 32) - 1000
    y = np.full((64, 32), -7, np.int32)
    (q,) = emu.run(f, x, y)
    np.testing.assert_array_equal(q, x // y)  # floor semantics where defined
    y[5, 5] = 0
    with pytest.raises(emu.Unsupported, match="floordivsi by zero"):
        emu.run(f, x, y)


def test_memref_index_type_parses():
    """A profiler buffer is ``memref<index>``-like: "index" holds an x, which
    once split the type name."""
    from smalti.emulate import irtypes

    assert irtypes.parse("memref<index>").shape == ()
    assert irtypes.parse("memref<index>").elem == "index"
    assert irtypes.parse("memref<4x?xindex, 3>").shape == (4, -1)
    assert irtypes.parse("vector<2x4xindex>").shape == (2, 4)


def _store_tid_to_one_address(pred):
    """Threads for which ``pred(tid)`` holds store their thread id + 1000 to
    element 0 of the output: a per-thread value through one pointer."""
    from jax._src.lib.mlir import ir
    from jax._src.lib.mlir.dialects import arith, memref, scf
    from jax.experimental.mosaic.gpu import utils as mgpu_utils

    def kernel(ctx, o_ref, _):
        i32 = ir.IntegerType.get_signless(32)
        tid = mgpu_utils.thread_idx()
        c = lambda v: mgpu_utils.c(v, i32)  # noqa: E731
        if_op = scf.IfOp(pred(tid, c), [], has_else=False)
        with ir.InsertionPoint(if_op.then_block):
            memref.store(arith.addi(tid, c(1000)), o_ref, [mgpu_utils.c(0, ir.IndexType.get())])
            scf.yield_([])

    return lane_kernel(kernel, [], [jax.ShapeDtypeStruct((1,), np.int32)])


def test_a_per_thread_value_through_one_pointer_is_stored():
    """One active thread (per-thread value, uniform address): its value lands.
    All of warp 1 at once: the highest lane's value stays (the checker does
    not see lanes of one warp race; the GPU keeps one of them)."""
    from jax._src.lib.mlir.dialects import arith

    eq = arith.CmpIPredicate.eq
    one = _store_tid_to_one_address(lambda tid, c: arith.cmpi(eq, tid, c(37)))
    np.testing.assert_array_equal(emu.run(one)[0], [1037])
    warp1 = _store_tid_to_one_address(
        lambda tid, c: arith.cmpi(eq, arith.divui(tid, c(32)), c(1)))
    np.testing.assert_array_equal(emu.run(warp1)[0], [1063])


def test_per_thread_values_from_several_warps_through_one_pointer_race():
    """Lane 0 of each of the four warps stores its own value to one address,
    unsynchronized: a write-after-write race the checker names."""
    from jax._src.lib.mlir.dialects import arith

    f = _store_tid_to_one_address(
        lambda tid, c: arith.cmpi(arith.CmpIPredicate.eq, arith.remui(tid, c(32)), c(0)))
    with pytest.raises(emu.RaceError) as e:
        emu.run(f)
    (race,) = e.value.races
    assert race.kind == "write-after-write" and race.space == "gmem"
    assert race.first.location == race.second.location  # the one store, by two warps
    (out,) = emu.run(f, on_race="ignore")
    assert out[0] in (1000, 1032, 1064, 1096)


def test_an_access_of_no_elements_touches_nothing():
    """Zero elements at the end of a buffer (or anywhere): nothing is read or
    written and nothing is out of bounds."""
    from smalti.emulate.memory import Space

    space = Space("global", 1 << 32)
    region = space.alloc(64, "buffer")
    at_end = np.full((0,), region.end, np.int64)
    assert space.load(at_end, np.dtype(np.float32)).shape == (0,)
    space.store(at_end, np.zeros(0, np.float32), np.dtype(np.float32))
    assert space.read_bytes(region.end, 0).size == 0
    assert not region.data.any()


def _scratch_kernel(used: bool):
    """A Pallas kernel with a GMEM semaphore scratch it uses (``used``) or
    only declares: ``o = x + 1``."""
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import mosaic_gpu as plgpu

    def body(x_gmem, o_gmem):
        sem = pl.get_global(plgpu.SemaphoreType.REGULAR)
        if used:
            pl.semaphore_signal(sem, 1)
            pl.semaphore_wait(sem, 1)
        o_gmem[...] = x_gmem[...] + 1

    return plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((128,), jnp.float32))


@pytest.mark.parametrize("used", [True, False])
def test_a_gmem_scratch_the_kernel_never_touches_does_not_shift_the_outputs(used):
    """The buffer table is the custom call's operands and results, Pallas'
    scratch among them. A scratch the kernel never touches has no type in
    the module, and the table guessed from the module's types took the
    output for an unrequested profiler buffer: ``run`` returned zeros."""
    x = np.arange(128, dtype=np.float32)
    (out,) = emu.run(_scratch_kernel(used), x)
    np.testing.assert_array_equal(out, x + 1)
    (profiled,) = emu.profile(_scratch_kernel(used), x).outputs
    np.testing.assert_array_equal(profiled, x + 1)


def test_a_function_that_is_not_only_its_kernel_call_is_refused_by_run():
    """Where the function's arguments are not the kernel call's first
    operands (here it transposes before the call), ``run`` cannot tell which
    buffer is which: Unsupported, naming on_cpu."""
    def f(x):
        return _scratch_kernel(True)(x.T.reshape(-1)[:128])

    with pytest.raises(emu.Unsupported, match="on_cpu"):
        emu.run(f, np.arange(256, dtype=np.float32).reshape(2, 128))
