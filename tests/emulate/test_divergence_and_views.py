"""Divergent ``scf.index_switch`` (a selector that differs between threads)
and Warpgroup-level memref views cast back (``inline_mgpu`` kernels)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

import smalti.emulate as emu
from tests.emulate.test_wrong_answers import lane_kernel

WARPGROUP = plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup)


def test_a_switch_on_the_warp_runs_each_case_for_its_threads():
    """``scf.index_switch`` on tid // 32 with cases 0, 1, 3 and a default, each
    yielding a different function of tid: every thread gets its own case's."""
    from jax._src.lib.mlir import ir
    from jax._src.lib.mlir.dialects import arith, memref, scf
    from jax.experimental.mosaic.gpu import utils as mgpu_utils

    def kernel(ctx, o_ref, _):
        i32, index = ir.IntegerType.get_signless(32), ir.IndexType.get()
        c = lambda v: mgpu_utils.c(v, i32)  # noqa: E731
        tid = mgpu_utils.thread_idx()
        warp = arith.index_cast(index, arith.divui(tid, c(32)))
        bodies = [lambda: arith.muli(tid, c(2)), lambda: arith.addi(tid, c(100)),
                  lambda: arith.subi(c(0), tid)]
        sw = scf.IndexSwitchOp([i32], warp, [0, 1, 3],
                               case_body_builder=lambda _, i, __: scf.yield_([bodies[i]()]),
                               default_body_builder=lambda _: scf.yield_([c(7)]))
        memref.store(sw.results[0], o_ref, [arith.index_cast(index, tid)])

    f = lane_kernel(kernel, [], [jax.ShapeDtypeStruct((128,), np.int32)])
    (out,) = emu.run(f)
    tid = np.arange(128)
    want = np.select([tid // 32 == 0, tid // 32 == 1, tid // 32 == 3],
                     [2 * tid, tid + 100, -tid], 7)
    np.testing.assert_array_equal(out, want)


def test_inline_mgpu_in_one_warp_of_a_warp_map():
    """Pallas' ``warp_map`` with ``pl.when(warp == 1)`` lowers to a switch on the
    warp index: only warp 1 writes its index (and returns it doubled)."""
    from jax._src.lib.mlir.dialects import memref as memref_dialect

    def body(y_gmem, z_gmem):
        @plgpu.warp_map
        def _(warp):
            @plgpu.inline_mgpu(arg_types=(plgpu.RefType(), plgpu.Layout.WG_SPLAT),
                               return_type=plgpu.ShapeDtypeStruct(
                                   (), jnp.int32, layout=plgpu.Layout.WG_SPLAT))
            def write(_, ref, w):
                memref_dialect.store(w.registers.item(), ref, [])
                return w + w

            @pl.when(warp == 1)
            def _():
                z_gmem[...] = write(y_gmem, warp)

    sds = jax.ShapeDtypeStruct((), jnp.int32)
    y, z = emu.run(plgpu.kernel(body, out_type=(sds, sds), compiler_params=WARPGROUP))
    assert (int(y), int(z)) == (1, 2)


def test_inline_mgpu_with_transformed_smem_refs():
    """An ``inline_mgpu`` body given tiled, swizzled SMEM refs (Warpgroup
    semantics): each ref is cast to its logical view and back, which is the
    same memref."""
    from jax.experimental.mosaic import gpu as mgpu

    t = (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))

    def body(x_gmem, o_gmem, x_smem, o_smem, barrier):
        plgpu.copy_gmem_to_smem(x_gmem, x_smem, barrier)
        plgpu.barrier_wait(barrier)

        @plgpu.inline_mgpu(arg_types=(plgpu.RefType(t), plgpu.RefType(t)))
        def double(ctx, x, o):
            v = mgpu.FragmentedArray.load_tiled(x, swizzle=128)
            (v + v).store_tiled(o, swizzle=128)

        double(x_smem, o_smem)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(o_smem, o_gmem)
        plgpu.wait_smem_to_gmem(0)

    f16 = jnp.float16
    call = plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((128, 64), f16),
                        scratch_types=[plgpu.SMEM((128, 64), f16, transforms=t),
                                       plgpu.SMEM((128, 64), f16, transforms=t),
                                       plgpu.Barrier()], compiler_params=WARPGROUP)
    x = np.random.default_rng(0).standard_normal((128, 64)).astype(f16)
    (y,) = emu.run(call, x)
    np.testing.assert_array_equal(y, x + x)


def test_a_while_loop_whose_condition_differs_between_threads():
    """Each thread counts to tid % 7, summing i * i on the way (``scf.while``
    with a per-thread condition): every thread leaves when its own count is
    reached, with its own results."""
    from jax._src.lib.mlir import ir
    from jax._src.lib.mlir.dialects import arith, memref, scf
    from jax.experimental.mosaic.gpu import utils as mgpu_utils

    def kernel(ctx, n_ref, s_ref, _):
        i32, index = ir.IntegerType.get_signless(32), ir.IndexType.get()
        c = lambda v: mgpu_utils.c(v, i32)  # noqa: E731
        tid = mgpu_utils.thread_idx()
        limit = arith.remui(tid, c(7))
        loop = scf.WhileOp([i32, i32], [c(0), c(0)])
        before = loop.before.blocks.append(i32, i32)
        with ir.InsertionPoint(before):
            i, acc = before.arguments
            scf.condition(arith.cmpi(arith.CmpIPredicate.ult, i, limit), [i, acc])
        after = loop.after.blocks.append(i32, i32)
        with ir.InsertionPoint(after):
            i, acc = after.arguments
            scf.yield_([arith.addi(i, c(1)), arith.addi(acc, arith.muli(i, i))])
        at = [arith.index_cast(index, tid)]
        memref.store(loop.results[0], n_ref, at)
        memref.store(loop.results[1], s_ref, at)

    sds = jax.ShapeDtypeStruct((128,), np.int32)
    n, s = emu.run(lane_kernel(kernel, [], [sds, sds]))
    limit = np.arange(128) % 7
    np.testing.assert_array_equal(n, limit)
    np.testing.assert_array_equal(s, [sum(i * i for i in range(m)) for m in limit])


def test_a_for_loop_whose_bounds_differ_between_threads():
    """``scf.for i in [tid % 5, tid % 11) step 2`` summing i: each thread runs
    its own iterations with its own induction variable."""
    from jax._src.lib.mlir import ir
    from jax._src.lib.mlir.dialects import arith, memref, scf
    from jax.experimental.mosaic.gpu import utils as mgpu_utils

    def kernel(ctx, o_ref, _):
        i32, index = ir.IntegerType.get_signless(32), ir.IndexType.get()
        c = lambda v: mgpu_utils.c(v, i32)  # noqa: E731
        tid = mgpu_utils.thread_idx()
        loop = scf.ForOp(arith.remui(tid, c(5)), arith.remui(tid, c(11)), c(2), [c(0)])
        with ir.InsertionPoint(loop.body):
            scf.yield_([arith.addi(loop.inner_iter_args[0], loop.induction_variable)])
        memref.store(loop.results[0], o_ref, [arith.index_cast(index, tid)])

    (out,) = emu.run(lane_kernel(kernel, [], [jax.ShapeDtypeStruct((128,), np.int32)]))
    t = np.arange(128)
    np.testing.assert_array_equal(out, [sum(range(a % 5, a % 11, 2)) for a in t])
