"""Reductions in Pallas Warpgroup kernels with smalti.vocabulary, on the emulator.

Each kernel brings a block one 128-byte swizzle wide ((64, 32) of 32-bit
values, (64, 64) of 16-bit ones) into 128-byte-swizzled SMEM by TMA (so
its registers have a tiled layout; a plain GMEM load gives a strided one,
which no one-axis reduction accepts, as in jax) and stores every result
from registers. Answers are compared with numpy (float64 for the float
truths) and jnp on the CPU:

=========================================  =====================================
function                                   bound
=========================================  =====================================
max, min, argmax, argmin, any, all,        exact (bit for bit; argmax/argmin:
bitwise reduce_or/and/xor, integer sum     first index on ties, the first NaN's
and prod (mod 2**32)                       index where there is one)
float sum, mean (n terms)                  ``|err| <= n * eps * sum|x|``
float prod (n factors near 1)              ``|err| <= n * eps * |prod|``
var (f32 and bf16; computed in f32)        ``|err| <= (n + 4) * eps32 * var``
std                                        ``|err| <= (n / 2 + 4) * eps32 * std``
layer norm ``(x - m) * rsqrt(v + 1e-5)``   ``|err| <= (n / 2 + 8) * eps * |y|``
                                           ``+ (n + 2) * eps * mean|x| * r``
copysign (both pipelines)                  exact, signed zeros and NaN included
=========================================  =====================================

``eps`` is the result dtype's machine epsilon (16-bit floats accumulate in
their own type, jnp's mean and var in f32), ``n`` the number of elements
reduced, ``r = rsqrt(v + 1e-5)``. They are the textbook bounds of recursive
summation / products (any order, which covers the per-thread then tree
order of the lowering) plus one rounding per elementwise op.
"""

from __future__ import annotations

import functools
import re

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax import lax
from jax.experimental.mosaic.gpu import fragmented_array as fa
from jax.experimental.pallas import mosaic_gpu as plgpu

import smalti
import smalti.emulate
import smalti.jax
import smalti.vocabulary
from smalti.diagnostics import SmaltiError
from smalti.plugins.flatten import flatten_registers, flatten_tiled

WG = plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup)
SHAPE = (64, 128)  # where the dtype does not matter


def shape_of(dtype) -> tuple[int, int]:
    """One 128-byte swizzle tile wide: small blocks keep the emulator quick."""
    return (64, 128 // np.dtype(dtype).itemsize)
BF16 = np.dtype(ml_dtypes.bfloat16)
FLOATS = (np.dtype(np.float32), np.dtype(np.float16), BF16)
AXES = [0, 1, None]


@pytest.fixture(scope="module")
def pipeline():
    return smalti.build_pipeline(plugins={"smalti.vocabulary": smalti.vocabulary})


def _transforms(dtype):
    cols = 128 // np.dtype(dtype).itemsize
    return (plgpu.TilingTransform((8, cols)), plgpu.SwizzleTransform(128))


def tma_kernel(fns, in_dtypes, shape=None):
    """Every input by TMA into swizzled SMEM; ``fns`` (each of all inputs)
    stored from registers, one output each."""
    n = len(in_dtypes)
    shape = shape or SHAPE
    specs = [jax.ShapeDtypeStruct(shape, d) for d in in_dtypes]
    outs = [jax.eval_shape(f, *specs) for f in fns]

    def body(*refs):
        gins, gouts = refs[:n], refs[n:n + len(fns)]
        smem, bar = refs[n + len(fns):-1], refs[-1]
        for g, s in zip(gins, smem):
            plgpu.copy_gmem_to_smem(g, s, bar)
        plgpu.barrier_wait(bar)
        xs = [s[...] for s in smem]
        for f, o in zip(fns, gouts):
            o[...] = f(*xs)

    scratch = [plgpu.SMEM(shape, d, transforms=_transforms(d)) for d in in_dtypes]
    return plgpu.kernel(body, out_type=tuple(jax.ShapeDtypeStruct(o.shape, o.dtype) for o in outs),
                        scratch_types=[*scratch, plgpu.Barrier(num_arrivals=n)],
                        compiler_params=WG)


def emulate(pipeline, fns, *args):
    with smalti.jax.installed(pipeline):
        return smalti.emulate.run(tma_kernel(fns, [a.dtype for a in args], args[0].shape), *args)


def eps(dtype) -> float:
    return float(np.finfo(dtype).eps)


def assert_exact(got, want):
    want = np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype
    assert np.array_equal(got, want, equal_nan=bool(jnp.issubdtype(want.dtype, jnp.floating)))


# --- inputs -------------------------------------------------------------------------------


def finite(dtype, seed=0):
    """Values near 1 (so that products of all of them stay normal in f16),
    odd integers for int32 (products nonzero mod 2**32)."""
    rng = np.random.default_rng(seed)
    shape = shape_of(dtype)
    if np.dtype(dtype) == np.int32:
        return rng.choice(np.array([-5, -3, -1, 1, 3, 5, 7], np.int32), shape)
    scale = 0.05 if np.dtype(dtype) == np.float32 else 0.01
    return (1 + scale * rng.standard_normal(shape)).astype(dtype)


def specials(dtype, seed=1):
    """Ties, signed zeros, infinities and NaN in chosen rows and columns."""
    rng = np.random.default_rng(seed)
    shape = shape_of(dtype)
    if np.dtype(dtype) == np.int32:
        x = rng.integers(-50, 50, shape).astype(np.int32)
        info = np.iinfo(np.int32)
        x[0, [3, 17]] = info.max       # tie for the max
        x[1, [5, 6]] = info.min        # tie for the min
        x[2] = 7                       # all equal
        x[[10, 40], 9] = 99            # tie down a column
        return x
    x = rng.standard_normal(shape).astype(np.float64)
    x[0, [3, 17]] = 5.0                # tie for the max
    x[1, [5, 9]] = np.nan              # two NaN: the first wins
    x[2] = 0.5                         # all equal
    x[3] = -1.0
    x[3, [4, 8]] = [-0.0, 0.0]         # -0 == +0: the first
    x[4, [0, 31]] = [np.inf, np.inf]
    x[5] = -np.inf
    x[6, 31] = np.nan
    x[7, [10, 20]] = [-np.inf, -np.inf]
    x[[12, 50], 23] = 9.0              # tie down a column
    x[[20, 30], 24] = np.nan
    return x.astype(dtype)


# --- sum, prod, mean, and argmax/argmin of finite values ----------------------------------


SUMS = [(op, a, k) for op in ("sum", "prod") for a in AXES for k in (False, True)]
SUM_FNS = [functools.partial(lambda x, op, a, k: getattr(jnp, op)(x, axis=a, keepdims=k),
                             op=op, a=a, k=k) for op, a, k in SUMS]
MEANS = [(0, False), (1, True), (None, False), (None, True)]
MEAN_FNS = [functools.partial(lambda x, a, k: jnp.mean(x, axis=a, keepdims=k), a=a, k=k)
            for a, k in MEANS]
FLAT_ARG_FNS = [lambda x: jnp.argmax(x), lambda x: jnp.argmin(x, keepdims=True)]


@pytest.mark.parametrize("dtype", [*FLOATS, np.dtype(np.int32)], ids=lambda d: np.dtype(d).name)
def test_sum_prod_mean(pipeline, dtype):
    x = finite(dtype)
    fns = SUM_FNS + MEAN_FNS + FLAT_ARG_FNS
    got = emulate(pipeline, fns, x)
    x64 = x.astype(np.float64)
    for i, (op, axis, keepdims) in enumerate(SUMS):
        n = x.size if axis is None else x.shape[axis]
        want = np.asarray(jax.jit(fns[i])(x))
        assert got[i].shape == want.shape and got[i].dtype == want.dtype, (op, axis)
        if x.dtype.kind == "i":
            assert_exact(got[i], want)
            continue
        exact = getattr(np, op)(x64, axis=axis, keepdims=keepdims)
        scale = np.abs(x64).sum(axis=axis, keepdims=keepdims) if op == "sum" else np.abs(exact)
        err = np.abs(got[i].astype(np.float64) - exact)
        assert np.all(err <= n * eps(x.dtype) * scale), (op, axis, keepdims, err.max())
    for fn, (axis, keepdims), g in zip(MEAN_FNS, MEANS, got[12:16]):
        want = np.asarray(jax.jit(fn)(x))
        assert g.shape == want.shape and g.dtype == want.dtype
        n = x.size if axis is None else x.shape[axis]
        exact = x64.mean(axis=axis, keepdims=keepdims)
        scale = np.abs(x64).mean(axis=axis, keepdims=keepdims)
        # jnp's mean sums in f32 (16-bit floats too), divides, rounds to the dtype
        bound = (n + 2) * eps(np.float32) * scale + eps(want.dtype) * np.abs(exact)
        assert np.all(np.abs(g.astype(np.float64) - exact) <= bound)
    for fn, g in zip(FLAT_ARG_FNS, got[16:]):
        assert_exact(g, jax.jit(fn)(x))


# --- max, min, argmax, argmin with ties, signed zeros, infinities and NaN -------------------


# keepdims only reshapes the result: tested for max and argmax
EXTREMES = [(op, a, k) for op in ("max", "min", "argmax", "argmin") for a in AXES
            for k in ((False, True) if op in ("max", "argmax") else (False,))]
EXTREME_FNS = [functools.partial(lambda x, op, a, k: getattr(jnp, op)(x, axis=a, keepdims=k),
                                 op=op, a=a, k=k) for op, a, k in EXTREMES]


@pytest.mark.parametrize("dtype", [*FLOATS, np.dtype(np.int32)], ids=lambda d: np.dtype(d).name)
def test_max_min_argmax_argmin(pipeline, dtype):
    x = specials(dtype)
    got = emulate(pipeline, EXTREME_FNS, x)
    for i, (op, axis, keepdims) in enumerate(EXTREMES):
        # numpy's answer (NaN propagates through max/min and wins argmax/argmin,
        # first index on ties); jnp on the CPU may drop NaN in max/min
        # (XLA:CPU's fast min/max), so it only gives the dtype -- and argmax.
        want = jax.eval_shape(EXTREME_FNS[i], x)
        ref = getattr(np, op)(x.astype(np.float64) if x.dtype == BF16 else x, axis=axis,
                              keepdims=keepdims)
        assert_exact(got[i], np.asarray(ref).astype(want.dtype))
        if op.startswith("arg"):
            assert_exact(got[i], jax.jit(EXTREME_FNS[i])(x))


def test_argmax_of_bool_and_index_dtype(pipeline):
    x = specials(np.float32)
    fns = [lambda v: jnp.argmax(v > 1, axis=1), lambda v: jnp.argmin(v > 1, axis=0),
           lambda v: lax.argmax(v, 1, jnp.int16), lambda v: lax.argmin(v, 0, jnp.uint8)]
    for fn, g in zip(fns, emulate(pipeline, fns, x)):
        assert_exact(g, jax.jit(fn)(x))


# --- any, all and bitwise reductions ---------------------------------------------------------


LOGICAL_FNS = [
    *(functools.partial(lambda x, op, a, k: op(x > 1.0, axis=a, keepdims=k).astype(jnp.int32),
                        op=op, a=a, k=k)
      for op in (jnp.any, jnp.all) for a in AXES for k in (False, True)),
    lambda x: jnp.all(x > -10.0, axis=0).astype(jnp.int32),
    lambda x: jnp.any(x > 10.0).astype(jnp.int32),
    lambda x: lax.reduce_xor(x > 1.0, (1,)).astype(jnp.int32),
]


def test_any_all_of_bool(pipeline):
    x = specials(np.float32)
    x[8] = 5.0   # a row all true
    x[9] = -5.0  # a row all false
    got = emulate(pipeline, LOGICAL_FNS, x)
    for fn, g in zip(LOGICAL_FNS, got):
        assert_exact(g, jax.jit(fn)(x))


BITWISE = {  # each kind along one axis, both axes; per dtype, to keep the kernels small
    "int32": [(lax.reduce_or, (0,)), (lax.reduce_and, (1,)), (lax.reduce_xor, (0, 1)),
              (lax.reduce_or, (0, 1))],
    "int16": [(lax.reduce_or, (1,)), (lax.reduce_and, (0, 1)), (lax.reduce_xor, (0,))],
}
NUMPY_BITWISE = {lax.reduce_or: np.bitwise_or, lax.reduce_and: np.bitwise_and,
                 lax.reduce_xor: np.bitwise_xor}
ANY_ALL_FNS = [lambda x: jnp.any(x, axis=1).astype(jnp.int32),
               lambda x: jnp.all(x, axis=0).astype(jnp.int32),
               lambda x: jnp.any(x).astype(jnp.int32)]


@pytest.mark.parametrize("dtype", ["int32", "int16"])
def test_bitwise_reductions(pipeline, dtype):
    """Bit patterns with every bit set somewhere and nowhere: jnp.any/all of
    integers (``x != 0``, where a lowest-bit truncation would be wrong for
    even numbers) and lax.reduce_or/and/xor, against numpy."""
    rng = np.random.default_rng(3)
    info = np.iinfo(dtype)
    x = rng.integers(info.min, info.max, shape_of(dtype), dtype=np.int64,
                     endpoint=True).astype(dtype)
    x[0] = 2                                  # nonzero, lowest bit clear
    x[1] = 0
    x[:, 0] = -1                              # every bit set down a column
    x[:, 1] = 0
    x[5:9, 2] = [1, 2, 4, 8]
    x[:, 3] = x[0, 3]                         # and == or == the value; xor of 64 == 0
    bitwise = [functools.partial(lambda v, r, a: r(v, a), r=r, a=a) for r, a in BITWISE[dtype]]
    got = emulate(pipeline, ANY_ALL_FNS + bitwise, x)
    for fn, g in zip(ANY_ALL_FNS + bitwise, got):
        assert_exact(g, jax.jit(fn)(x))
    for (reduce, axes), g in zip(BITWISE[dtype], got[len(ANY_ALL_FNS):]):
        want = NUMPY_BITWISE[reduce].reduce(x.ravel() if len(axes) == 2 else x,
                                            axis=0 if len(axes) == 2 else axes[0])
        assert np.array_equal(g, want)


# --- var, std, layer norm, a scalar broadcast back --------------------------------------------


def layer_norm(x):
    m = jnp.mean(x, axis=1, keepdims=True)
    v = jnp.var(x, axis=1, keepdims=True)
    return (x - m) * lax.rsqrt(v + 1e-5)


MOMENT_FNS = [lambda x: jnp.var(x, 1), lambda x: jnp.var(x, 0, keepdims=True), jnp.var,
              lambda x: jnp.std(x, 1), lambda x: jnp.std(x, 0), jnp.std,
              lambda x: jnp.var(x, 1, ddof=1)]


@pytest.mark.parametrize("dtype", [np.dtype(np.float32), BF16], ids=["float32", "bfloat16"])
def test_var_std(pipeline, dtype):
    x = (3 + 2 * np.random.default_rng(4).standard_normal(shape_of(dtype))).astype(dtype)
    got = emulate(pipeline, MOMENT_FNS, x)
    x64 = x.astype(np.float64)
    axes = [1, 0, None, 1, 0, None, 1]
    for i, (g, axis) in enumerate(zip(got, axes)):
        want = np.asarray(jax.jit(MOMENT_FNS[i])(x))
        assert g.shape == want.shape and g.dtype == want.dtype
        n = x.size if axis is None else x.shape[axis]
        ddof = 1 if i == 6 else 0
        var = x64.var(axis=axis, keepdims=g.ndim == 2, ddof=ddof)
        exact, k = (var, n + 4) if i in (0, 1, 2, 6) else (np.sqrt(var), n / 2 + 4)
        bound = k * eps(np.float32) * exact + eps(dtype) * exact  # computed in f32, rounded once
        assert np.all(np.abs(g.astype(np.float64) - exact) <= bound), (i, axis)


def test_layer_norm_and_centering(pipeline):
    x = (3 + 2 * np.random.default_rng(5).standard_normal(SHAPE)).astype(np.float32)
    fns = [layer_norm, lambda v: v - jnp.mean(v), lambda v: jnp.sum(v)[None]]
    got = emulate(pipeline, fns, x)
    x64 = x.astype(np.float64)
    n, e = SHAPE[1], eps(np.float32)
    m, v = x64.mean(1, keepdims=True), x64.var(1, keepdims=True)
    r = 1 / np.sqrt(v + 1e-5)
    want = (x64 - m) * r
    bound = (n / 2 + 8) * e * np.abs(want) + (n + 2) * e * np.abs(x64).mean(1, keepdims=True) * r
    assert np.all(np.abs(got[0] - want) <= bound)
    centered = x64 - x64.mean()
    bound = (x.size + 2) * e * np.abs(x64).mean() + e * np.abs(centered)
    assert np.all(np.abs(got[1] - centered) <= bound)
    assert got[2].shape == (1,)
    assert abs(got[2][0] - x64.sum()) <= x.size * e * np.abs(x64).sum()


def test_scalar_through_smem(pipeline):
    """A full reduction stored to an SMEM ref of shape () and read back."""
    x = finite(np.float32)

    def body(g, o, s, scalar, bar):
        plgpu.copy_gmem_to_smem(g, s, bar)
        plgpu.barrier_wait(bar)
        scalar[...] = jnp.max(s[...])
        o[...] = s[...] - scalar[...]

    kernel = plgpu.kernel(body, out_type=jax.ShapeDtypeStruct(x.shape, np.float32),
                          scratch_types=[plgpu.SMEM(x.shape, np.float32,
                                                    transforms=_transforms(np.float32)),
                                         plgpu.SMEM((), np.float32),
                                         plgpu.Barrier(num_arrivals=1)],
                          compiler_params=WG)
    with smalti.jax.installed(pipeline):
        (got,) = smalti.emulate.run(kernel, x)
    assert_exact(got, x - x.max())


def test_full_reduction_jax_lowers_is_unchanged(pipeline):
    """jnp.sum of a plain GMEM load (strided layout) is one jax lowers: the
    same answer, bit for bit, with and without smalti."""
    x = finite(np.float32)

    def body(x_ref, o_ref):
        o_ref[...] = jnp.sum(x_ref[...])

    kernel = plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((), np.float32), compiler_params=WG)
    (theirs,) = smalti.emulate.run(kernel, x)
    with smalti.jax.installed(pipeline):
        (ours,) = smalti.emulate.run(kernel, x)
    assert_exact(ours, theirs)


def test_on_blackwell(pipeline):
    """sm_100: f32 max across lanes is ``redux.sync`` there (NaN propagating)."""
    x = specials(np.float32)
    fns = [lambda v: jnp.max(v, 1), jnp.max, lambda v: jnp.argmin(v, 0), jnp.argmax]
    with smalti.jax.installed(pipeline):
        got = smalti.emulate.run(tma_kernel(fns, [np.float32], x.shape), x, arch=(10, 0))
    for g, want in zip(got, [x.max(1), x.max(), x.argmin(0), x.argmax()]):
        assert_exact(g, np.asarray(want).astype(g.dtype))


# --- flattening a tiled layout (smalti.plugins.flatten) ---------------------------------------


def _placement(layout: fa.TiledLayout, shape, index):
    """(warp, lane, vector position, register index) of the element at ``index``."""
    t = list(layout.tiling.tile_indices(index))
    warp = tuple(t[d] for d in layout.partitioned_warp_dims)
    lane = tuple(t[d] for d in layout.partitioned_lane_dims)
    vec = t[layout.vector_dim]
    for d in (*layout.partitioned_warp_dims, *layout.partitioned_lane_dims, layout.vector_dim):
        t[d] = 0
    return warp, lane, vec, tuple(t)


@pytest.mark.parametrize("layout,shape", [
    (fa.WGMMA_LAYOUT, (64, 128)), (fa.WGMMA_LAYOUT, (128, 32)), (fa.WGMMA_LAYOUT, (2, 64, 16)),
    (fa.WGMMA_LAYOUT_8BIT, (64, 64)), (fa.WGMMA_TRANSPOSED_LAYOUT, (64, 64)),
    (fa.TCGEN05_LAYOUT, (128, 32)),
], ids=["wgmma", "wgmma-tall", "wgmma-3d", "wgmma-8bit", "wgmma-transposed", "tcgen05"])
def test_flattened_layout_places_every_element_alike(layout, shape):
    found = flatten_tiled(layout, shape)
    assert found is not None
    flat, permutation = found
    size = int(np.prod(shape))
    registers = np.empty(layout.registers_shape(shape), dtype=object)
    for index in np.ndindex(registers.shape):
        registers[index] = index
    flat_registers = flatten_registers(registers, permutation, flat, size)
    for f in range(0, size, 7):
        index = np.unravel_index(f, shape)
        warp, lane, vec, reg = _placement(layout, shape, tuple(int(i) for i in index))
        fwarp, flane, fvec, freg = _placement(flat, (size,), (f,))
        assert (warp, lane, vec) == (fwarp, flane, fvec)
        assert flat_registers[freg] == reg


def test_flatten_store_is_exact(pipeline):
    """x.reshape(-1) of a tiled block, stored: every element where it belongs."""
    x = np.arange(np.prod(SHAPE), dtype=np.float32).reshape(SHAPE)
    (got,) = emulate(pipeline, [lambda v: v.reshape(-1)], x)
    assert_exact(got, x.ravel())


# --- copysign (arith.trunci to i1) -------------------------------------------------------------


def _copysign_inputs(dtype):
    rng = np.random.default_rng(6)
    x = rng.standard_normal(shape_of(dtype))
    y = rng.standard_normal(shape_of(dtype))
    vals = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1.0, -1.0])
    x[:2, :32] = np.repeat(vals, 8).reshape(2, 32)
    y[:2, :32] = np.tile(vals, 8).reshape(2, 32)
    return x.astype(dtype), y.astype(dtype)


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: np.dtype(d).name)
def test_copysign(pipeline, dtype):
    """Exact with both pipelines: without the vocabulary jnp.signbit's
    conversion to bool is smalti.plugins' ``arith.trunci`` to i1 (the lowest
    bit of 0 / -1), with it ``x != 0``."""
    x, y = _copysign_inputs(dtype)
    want = np.asarray(jax.jit(jnp.copysign)(x, y))
    for pipe in (smalti.build_pipeline(block=["smalti.vocabulary"]), pipeline):
        with smalti.jax.installed(pipe):
            (got,) = smalti.emulate.run(tma_kernel([jnp.copysign], [dtype, dtype], x.shape), x, y)
        bits = {2: np.uint16, 4: np.uint32}[np.dtype(dtype).itemsize]
        assert np.array_equal(got.view(bits), want.view(bits))


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("sign", [-1.0, 1.0, -0.0, 0.0])
def test_copysign_with_a_scalar(pipeline, dtype, sign):
    """``jnp.copysign(x, -1.0)``: ``jnp.signbit`` of the scalar bitcasts a
    0-D value, which the vocabulary keeps a scalar (jax's rule makes a 0-D
    vector of it: SM207 without the vocabulary). Exact, NaN and zeros of
    either sign included."""
    x, _ = _copysign_inputs(dtype)
    fn = lambda v: jnp.copysign(v, sign)  # noqa: E731
    (got,) = emulate(pipeline, [fn], x)
    want = np.asarray(jax.jit(fn)(x))
    bits = {2: np.uint16, 4: np.uint32}[np.dtype(dtype).itemsize]
    assert np.array_equal(got.view(bits), want.view(bits))


def test_trunci_to_i1_keeps_the_lowest_bit(pipeline):
    """``x.astype(bool)`` of integers: smalti.plugins lowers Pallas'
    ``arith.trunci`` to i1 as MLIR defines it (the lowest bit); the
    vocabulary lowers the conversion as jnp does (``x != 0``)."""
    x = np.arange(np.prod(SHAPE), dtype=np.int32).reshape(SHAPE) - 4000
    fn = [lambda v: v.astype(jnp.bool_).astype(jnp.int32)]
    with smalti.jax.installed(smalti.build_pipeline(block=["smalti.vocabulary"])):
        (lowest,) = smalti.emulate.run(tma_kernel(fn, [np.int32]), x)
    assert_exact(lowest, (x & 1).astype(np.int32))
    (nonzero,) = emulate(pipeline, fn, x)
    assert_exact(nonzero, (x != 0).astype(np.int32))


def test_logical_not_of_bool_and_bitwise_not_of_int(pipeline):
    """``~b`` of booleans (``jnp.logical_not``): jax's Pallas rule goes
    through ``astype(astype(b, int) ^ -1, bool)``, right only if int-to-bool
    keeps the lowest bit, so the vocabulary lowers it as ``b ^ True``; ``~i``
    of integers keeps jax's rule and module."""
    x = (np.arange(np.prod(SHAPE), dtype=np.int32).reshape(SHAPE) % 7) - 3
    fns = [lambda v: (~(v > 0)).astype(jnp.int32),
           lambda v: jnp.where(jnp.logical_not(v == 0), v, 9),
           lambda v: ~v]
    got = emulate(pipeline, fns, x)
    for g, f in zip(got, fns):
        assert_exact(g, jax.jit(f)(x))
    texts = []
    for p in (pipeline, smalti.build_pipeline(block=["smalti.vocabulary"])):
        with smalti.jax.installed(p):
            module, _ = smalti.emulate.lower(tma_kernel([lambda v: ~v], [np.int32]), x)
        texts.append(re.sub(r'dump_basename = "[^"]*"', "", str(module)))
    assert texts[0] == texts[1]


# --- refusals ----------------------------------------------------------------------------------


def test_unsupported_dtype_is_refused(pipeline):
    x = np.ones((64, 256), np.float32)
    with pytest.raises(SmaltiError) as info:  # indices up to 255 do not fit int8
        emulate(pipeline, [lambda v: lax.argmax(v, 1, jnp.int8)], x)
    assert info.value.code == "SM206" and info.value.fixes
    assert "test_reductions.py" in (info.value.location or "")
