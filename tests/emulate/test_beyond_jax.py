"""What smalti's lowerings compute where they emit code jax does not.

Text equality with jax proves nothing for a kernel jax refuses: each kernel
here is one that jax 0.11.2 rejects and smalti lowers (the text tests are in
tests/plugins/test_vector_ops.py, tests/plugins/test_control_flow.py,
tests/core/test_differential_elementwise.py and tests/hopper/test_beyond_jax.py,
whose kernel builders are reused so the same kernels are judged). Each is run
on the emulator -- itself validated against numpy on code jax lowers
(test_validation.py) -- and compared with numpy: bit for bit where the
kernel's arithmetic is fixed, within a stated bound where a reduction's
summation order is the lowering's choice.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src.lib import mosaic_gpu_dialect as mgpu
from jax._src.lib.mlir import ir
from jax._src.lib.mlir.dialects import arith, vector
from jax._src.lib.mlir.dialects import math as mlir_math
from jax.experimental.mosaic.gpu import fragmented_array as fa
from jax.experimental.pallas import mosaic_gpu as plgpu

import smalti.emulate as emu
from smalti.emulate.testing import assert_close_ulp, emulate_kernel, emulate_pipeline
from tests.plugins import test_vector_ops as tv

F32 = jnp.float32
EPS = float(np.finfo(np.float32).eps)
RNG = np.random.default_rng(260)
LAYOUTS = pytest.mark.parametrize("layout", tv.TILED, ids=["WGMMA", "TCGEN05"])


def sds(shape, dtype=F32):
    return jax.ShapeDtypeStruct(shape, dtype)


def normal(shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def f64(x):
    return np.asarray(x, np.float64)


def run(body, ins, outs, *args, scratch=()):
    return emulate_kernel(body, ins, outs, *args, smem_scratch=scratch)


def assert_within(got, want, bound):
    """|got - want| <= bound, elementwise (want and bound in float64)."""
    err = np.abs(f64(got) - want)
    worst = np.unravel_index(np.argmax(err - bound), err.shape)
    assert np.all(err <= bound), (f"{int((err > bound).sum())} elements beyond the bound; worst "
                                  f"at {worst}: got {got[worst]}, want {want[worst]}, "
                                  f"bound {bound[worst]}")


def sum_bound(x, axis, keepdims=True):
    """What any summation order of f32 values can be off by: (n - 1) eps sum|x|
    (Higham, Accuracy and Stability, eq. 4.4) -- plus the rounding of the inputs."""
    n = x.shape[axis]
    return (n + 1) * EPS * np.abs(f64(x)).sum(axis, keepdims=keepdims)


# --- rank-3 vectors with an untiled leading dim ---------------------------------------------


@LAYOUTS
def test_rank3_softmax(layout):
    """softmax over the last axis of (2, 128, 128): jax's lowering rejects the
    reduction (``Invalid dimension``)."""
    x = normal((256, 128)) * 4
    (got,) = run(tv.softmax_rows(layout, rank3=True), [sds((256, 128))], [sds((256, 128))], x)
    e = np.exp(f64(x) - f64(x).max(1, keepdims=True))
    want = e / e.sum(1, keepdims=True)
    # max is exact; exp, the subtraction and the division each round once
    # (<= 3 eps relative), the sum of 128 positive terms <= 129 eps relative.
    assert_within(got, want, (128 + 4) * EPS * want + 1e-45)


@pytest.mark.parametrize("source,dims", [((128,), (1,)), ((2, 128), (0, 1))])
def test_rank3_broadcast(source, dims):
    """broadcast_in_dim into (2, 128, 128) WGMMA: jax rejects a tiling of lower
    rank than the result (``Tiling rank different``); smalti repeats registers."""
    shape = (2, 128, 128)

    def body(ctx, v_ref, out_ref, smem):
        v = tv.load(v_ref, fa.WGMMA_ROW_LAYOUT)
        mgpu.vector_store(tv.bcast(v, shape, dims), out_ref)

    v = normal(source)
    (got,) = run(body, [sds(source)], [sds(shape)], v)
    want = np.broadcast_to(np.expand_dims(v, [d for d in range(3) if d not in dims]), shape)
    assert_close_ulp(got, want, 0)


# --- keep_dims reductions and reshapes by size-1 dims ----------------------------------------


@LAYOUTS
@pytest.mark.parametrize("axis", [0, 1])
def test_keep_dims_mean(layout, axis):
    """x - mean(x, axis, keepdims=True): jax leaves the keep-dims reduction of a
    tiled layout unsolved."""
    x = normal((128, 128)) + 3
    (got,) = run(tv.mean_centered(layout, (128, 128), axis, keep_dims=True),
                 [sds((128, 128))], [sds((128, 128))], x, scratch=tv.SCRATCH)
    want = f64(x) - f64(x).mean(axis, keepdims=True)
    # the mean: the sum's bound / n plus one rounding each for / and -
    bound = sum_bound(x, axis) / 128 + 2 * EPS * (np.abs(f64(x)).mean(axis, keepdims=True)
                                                  + np.abs(want))
    assert_within(got, want, bound)


@pytest.mark.parametrize("keep_dims", [True, False], ids=["keep_dims", "plain"])
@pytest.mark.parametrize("axis", [0, 1, 2])
def test_rank3_mean(axis, keep_dims):
    """Both kinds of mean over each axis of (2, 128, 128): jax refuses both."""
    shape = (2, 128, 128)
    x = normal(shape) + 3
    (got,) = run(tv.mean_centered(fa.WGMMA_LAYOUT, shape, axis, keep_dims=keep_dims),
                 [sds(shape)], [sds(shape)], x, scratch=tv.SCRATCH)
    want = f64(x) - f64(x).mean(axis, keepdims=True)
    n = shape[axis]
    bound = sum_bound(x, axis) / n + 2 * EPS * (np.abs(f64(x)).mean(axis, keepdims=True)
                                                + np.abs(want))
    assert_within(got, want, bound)


def test_shape_casts_adding_and_dropping_size_one_dims():
    """(128,) -> (128, 1) -> (1, 128, 1) -> (128,) around a row sum, an op
    between each cast: jax cannot infer them."""
    def body(ctx, x_ref, out_ref, smem):
        x = tv.load(x_ref, fa.WGMMA_LAYOUT)
        rows = tv.reduce(tv.KIND.ADD, x, 1, 0.0)
        for unary, shape in ((mlir_math.exp, (128, 1)), (mlir_math.tanh, (1, 128, 1)),
                             (arith.negf, (128,))):
            rows = unary(tv.shape_cast(rows, shape))
        mgpu.vector_store(arith.mulf(x, tv.bcast(rows, (128, 128), (0,))), out_ref)

    x = normal((128, 128)) / 16
    (got,) = run(body, [sds((128, 128))], [sds((128, 128))], x, scratch=tv.SCRATCH)
    s = f64(x).sum(1)
    rows = -np.tanh(np.exp(s))
    want = f64(x) * rows[:, None]
    # sum error through exp (x e^s) and tanh (x (1 - tanh^2)), then 3 roundings
    ds = sum_bound(x, 1, keepdims=False)
    drow = ds * np.exp(s) * (1 - np.tanh(np.exp(s)) ** 2) + 3 * EPS * np.abs(rows)
    assert_within(got, want, np.abs(f64(x)) * drow[:, None] + EPS * np.abs(want))


def test_reduction_of_a_splat():
    """jax infers a splat source but cannot lower the reduction; smalti
    multiplies by the element count."""
    def body(ctx, out_ref, smem):
        ones = tv.splat((128, 64), ir.F32Type.get(), 1.0)
        mgpu.vector_store(tv.reduce(tv.KIND.ADD, ones, 1, 0.0), out_ref)

    (got,) = run(body, [], [sds((128,))])
    assert_close_ulp(got, np.full(128, 64, np.float32), 0)


def test_multiplicative_reduction():
    """``vector.multi_reduction <mul>``: jax has no product reduction."""
    def body(ctx, x_ref, out_ref, smem):
        mgpu.vector_store(tv.reduce(tv.KIND.MUL, tv.load(x_ref, fa.WGMMA_LAYOUT), 1, 1.0),
                          out_ref)

    x = (1 + normal((128, 128)) / 64).astype(np.float32)
    (got,) = run(body, [sds((128, 128))], [sds((128,))], x, scratch=tv.SCRATCH)
    want = np.prod(f64(x), 1)
    # a product of n terms in any order: (n - 1) roundings, relative
    assert_within(got, want, 128 * EPS * np.abs(want))


def test_integer_multiplicative_reduction_is_exact():
    def body(ctx, x_ref, out_ref, smem):
        mgpu.vector_store(tv.reduce(tv.KIND.MUL, tv.load(x_ref, fa.WGMMA_LAYOUT), 0, 1),
                          out_ref)

    x = RNG.integers(-3, 4, (128, 128)).astype(np.int32)
    (got,) = run(body, [sds((128, 128), jnp.int32)], [sds((128,), jnp.int32)], x,
                 scratch=tv.SCRATCH)
    want = np.prod(x.astype(np.int64), 0).astype(np.uint64).astype(np.uint32).view(np.int32)
    assert_close_ulp(got, want, 0)  # wraps modulo 2^32 as the hardware does


def test_vector_broadcast_of_a_vector():
    """``vector.broadcast`` of a (128,) vector to (128, 128): jax only
    broadcasts scalars."""
    def body(ctx, v_ref, x_ref, out_ref, smem):
        v = tv.load(v_ref, fa.WGMMA_COL_LAYOUT)
        x = tv.load(x_ref, fa.WGMMA_LAYOUT)
        mgpu.vector_store(arith.addf(x, vector.broadcast(x.type, v)), out_ref)

    v, x = normal((128,)), normal((128, 128))
    (got,) = run(body, [sds((128,)), sds((128, 128))], [sds((128, 128))], v, x)
    assert_close_ulp(got, x + v[None, :], 0)


# --- elementwise ops jax cannot infer or lower ------------------------------------------


def _erf(x):
    return np.vectorize(math.erf)(f64(x))


def test_erf_and_atan2():
    """``math.erf`` and ``math.atan2``: jax has no inference rule. The
    emulator evaluates both correctly rounded (libdevice: erf 2 ulp, atan2
    3 ulp); the comparison is exact, checking that smalti applies each to the
    right elements."""
    def body(ctx, x_ref, y_ref, out_ref, smem):
        x, y = mgpu.vector_load(x_ref), mgpu.vector_load(y_ref)
        mgpu.vector_store(mlir_math.atan2(mlir_math.erf(x), y), out_ref)

    x, y = normal((128, 64)), normal((128, 64))
    (got,) = run(body, [sds((128, 64))] * 2, [sds((128, 64))], x, y)
    e = _erf(x).astype(np.float32)
    assert_close_ulp(got, np.arctan2(f64(e), f64(y)).astype(np.float32), 0)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float16])
def test_remf(dtype):
    """``arith.remf`` (C's fmod: the sign of the dividend, exact): jax's
    lowering fails on it; smalti applies it register by register."""
    def body(ctx, x_ref, y_ref, out_ref, smem):
        x, y = mgpu.vector_load(x_ref), mgpu.vector_load(y_ref)
        mgpu.vector_store(arith.remf(x, y), out_ref)

    x = (normal((128, 128)) * 10).astype(dtype)
    y = (normal((128, 128)) + 0.1).astype(dtype)
    (got,) = run(body, [sds((128, 128), dtype)] * 2, [sds((128, 128), dtype)], x, y)
    assert_close_ulp(got, np.fmod(f64(x), f64(y)).astype(dtype), 0)


# --- scf.if with vector results --------------------------------------------------------------


def _if_kernel(layout, then_loads: bool):
    """``out = (flag ? A : B) + x``: with ``then_loads``, A = y loaded from GMEM
    and B a splat 5 (relaid out by the yield); otherwise A = exp(x) and B a
    splat 1. jax 0.11.2 has no rule for scf.if with vector results."""
    from jax._src.lib.mlir.dialects import memref

    from tests.plugins import test_control_flow as tc

    def body(ctx, flag_ref, x_ref, y_ref, out_ref, smem):
        x = tc.cast(mgpu.vector_load(x_ref), layout)
        flag = memref.load(flag_ref, [tc.index(0)])
        cond = arith.cmpi(arith.CmpIPredicate.ne, flag, arith.constant(flag.type, 0))
        if then_loads:
            [chosen] = tc.if_else(cond, [x.type], lambda: [mgpu.vector_load(y_ref)],
                                  lambda: [tc.splat(x, 5.0)])
        else:
            [chosen] = tc.if_else(cond, [x.type], lambda: [mlir_math.exp(x)],
                                  lambda: [tc.splat(x, 1.0)])
        mgpu.vector_store(arith.addf(chosen, x), out_ref)
    return body


@pytest.mark.parametrize("flag", [1, 0], ids=["then", "else"])
@pytest.mark.parametrize("layout,then_loads", [
    ("strided", True), ("strided", False), (fa.WGMMA_LAYOUT, False)],
    ids=["strided-load-or-splat", "strided-exp-or-splat", "WGMMA-exp-or-splat"])
def test_if_with_vector_results(layout, then_loads, flag):
    x, y = normal((128, 128)), normal((128, 128))
    shape = sds((128, 128))
    (got,) = run(_if_kernel(layout, then_loads), [sds((1,), jnp.int32), shape, shape], [shape],
                 np.array([flag], np.int32), x, y)
    if then_loads:
        chosen = y if flag else np.float32(5)
    else:
        chosen = np.exp(f64(x)).astype(np.float32) if flag else np.float32(1)
    assert_close_ulp(got, (chosen + x).astype(np.float32), 0)


# --- N-D TMA gathers and scatters, collapsed to jax's 2-D tile::gather4 --------------------


def _gather_case(gmem_shape, at, smem, direction):
    from tests.hopper.test_beyond_jax import gather_kernel

    call, structs = gather_kernel(gmem_shape, at, smem, direction)
    rows = gmem_shape[0]
    idx = RNG.permutation(rows)[:16].astype(np.int32)
    data = normal(structs[0].shape, np.float16)
    return call, data, idx


GATHERS = [
    ((128, 4, 64), (), (16, 4, 64), None),
    ((64, 8, 64), (), (16, 8, 64), None),  # too wide untiled: tiled (8, 1, 64), swizzled
    ((64, 8, 64), (), (16, 8, 64), "explicit"),  # the user's collapsible tiling
    ((128, 4, 64), (slice(1, 3),), (16, 2, 64), None),  # x.at[idx, 1:3]
]
GATHER_IDS = ["3d", "3d-wide-rows", "3d-explicit-tiling", "3d-part-of-a-row"]


def _smem(shape, tiling):
    if tiling is None:
        return plgpu.SMEM(shape, jnp.float16)
    return plgpu.SMEM(shape, jnp.float16, transforms=(
        plgpu.TilingTransform((8, 1, 64)), plgpu.SwizzleTransform(128)))


@pytest.mark.parametrize("gmem_shape,at,smem_shape,tiling", GATHERS, ids=GATHER_IDS)
def test_nd_gather(gmem_shape, at, smem_shape, tiling):
    """``x.at[idx, ...]`` on an N-D GMEM ref: jax only gathers 2-D refs ("Only 2D
    gathers/scatters"); smalti folds the trailing dims into the row."""
    from jax.experimental import pallas as pl

    at = tuple(pl.ds(s.start, s.stop - s.start) for s in at)
    call, x, idx = _gather_case(gmem_shape, at, _smem(smem_shape, tiling), "gather")
    (got,) = emulate_pipeline(call, x, idx)
    want = x[idx][:, 1:3] if at else x[idx]
    assert_close_ulp(got, want, 0)


@pytest.mark.parametrize("gmem_shape,smem_shape,tiling", [
    ((128, 4, 64), (16, 4, 64), None), ((64, 8, 64), (16, 8, 64), None)],
    ids=["3d", "3d-wide-rows"])
def test_nd_scatter(gmem_shape, smem_shape, tiling):
    call, x, idx = _gather_case(gmem_shape, (), _smem(smem_shape, tiling), "scatter")
    (got,) = emulate_pipeline(call, x, idx)
    want = np.zeros(gmem_shape, np.float16)
    want[idx] = x
    assert_close_ulp(got, want, 0)


def test_scalar_async_store_smem_to_a_peer():
    """``async_store_smem`` of a scalar: smalti's ``st.async`` of one element
    into the peer block's SMEM over a cluster of 2 (the hopper text test's
    kernel). Each block's SMEM then holds x[3] at element 5; the rest of it
    was never written (zeros on the emulator, undefined on the GPU: the
    checker says so), and both blocks store all of it to the one output. On
    the emulator the two stores write equal bytes, which is no race (either
    order leaves the same output): the uninitialized read is what tells the
    author the GPU's bytes would differ."""
    from tests.hopper.test_beyond_jax import scalar_store_kernel

    call, _ = scalar_store_kernel()
    x = normal((128,))
    with pytest.warns(UserWarning) as record:
        (got,) = emulate_pipeline(call, x, on_race="warn")
    reports = [w.message.report for w in record
               if isinstance(w.message, emu.UninitializedReadWarning)]
    assert reports and {r.space for r in reports} == {"smem"}
    assert not [w for w in record if isinstance(w.message, emu.RaceWarning)]
    assert_close_ulp(got[5], x[3], 0)


@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_scalar_async_store_smem_exchange(dtype):
    """Each block of a cluster of 2 fills its SMEM with its own row, then
    (after a cluster barrier) stores one element of its row into element 5 of
    the peer's SMEM with a scalar ``async_store_smem``: every element of both
    outputs is checked."""
    from tests.emulate.test_cluster import scalar_exchange_kernel

    call = scalar_exchange_kernel(dtype)
    x = (RNG.standard_normal((2, 128)) * 100).astype(dtype)
    want = x.copy()
    want[:, 5] = x[::-1, 3]
    (got,) = emulate_pipeline(call, x)
    assert_close_ulp(got, want, 0)


def test_scalar_async_store_smem_of_64_bits():
    """The ``.b64`` form (f64 under jax_enable_x64)."""
    from tests.emulate.test_cluster import scalar_exchange_kernel

    jax.config.update("jax_enable_x64", True)
    try:
        call = scalar_exchange_kernel(np.float64)
        x = RNG.standard_normal((2, 128))
        want = x.copy()
        want[:, 5] = x[::-1, 3]
        (got,) = emulate_pipeline(call, x)
    finally:
        jax.config.update("jax_enable_x64", False)
    assert_close_ulp(got, want, 0)
