"""Rank-3 views of blocks (``smalti.vocabulary.views``), ``top_k`` of one
and what sorts return combined with other values, on the emulator against
jnp on the CPU (bit for bit where values only move; sums within their
order's bound), blocks brought into swizzled SMEM by TMA, every run checked
for races by the emulator (``run``'s default ``on_race="raise"``)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax import lax

import smalti
import smalti.emulate
import smalti.jax
from benchmarks.vocabulary import kernel as tma_kernel
from tests.vocabulary.test_indexing import check
from tests.vocabulary.test_movement import data, emulate
from tests.vocabulary.warpgroups import per_warpgroup_kernel

F32, I32 = np.dtype(np.float32), np.dtype(np.int32)
BF16 = np.dtype(ml_dtypes.bfloat16)


def finite(shape, dtype, seed=0):
    x = np.random.default_rng(seed).standard_normal(shape) * 10
    x.flat[:2] = [0.0, -0.0]
    return x.astype(dtype)


# --- group-wise reductions and broadcasts back ------------------------------------------------


@pytest.mark.parametrize("dtype", (F32, BF16, I32), ids=lambda d: d.name)
@pytest.mark.parametrize("groups", [4, 8, 2])
def test_group_max(pipeline, dtype, groups):
    """Per-group scales: max |x| over groups of 128 / groups columns."""
    x = data((64, 128), dtype)
    got = emulate(pipeline, lambda x: jnp.max(jnp.abs(x.reshape(64, groups, 128 // groups)), -1),
                  x, build=tma_kernel)
    # numpy's max propagates NaN, as the kernel does (jnp's on the CPU may drop it)
    want = np.abs(x.reshape(64, groups, 128 // groups)).max(-1)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", (F32, BF16), ids=lambda d: d.name)
def test_group_scale_and_back(pipeline, dtype):
    """Divided by its group's max, broadcast back (``s[..., None]``)."""
    x = finite((64, 128), dtype)

    def fn(x):
        g = x.reshape(64, 4, 32)
        return (g / jnp.max(jnp.abs(g), -1)[..., None]).reshape(64, 128)

    got = emulate(pipeline, fn, x, build=tma_kernel)
    # correctly rounded division (jnp on the CPU multiplies by a reciprocal)
    g = x.reshape(64, 4, 32)
    want = (g / np.abs(g).max(-1)[..., None]).reshape(64, 128)
    np.testing.assert_array_equal(got, want)


def test_group_min_and_sum_of_each_axis(pipeline):
    """Reductions along the axes of a view a tile fits; sums within n eps sum |x|."""
    x = finite((64, 128), F32, 1)
    for fn, want in [(lambda x: jnp.min(x.reshape(64, 4, 32), 2), x.reshape(64, 4, 32).min(2)),
                     (lambda x: jnp.max(x.reshape(64, 4, 32), 0), x.reshape(64, 4, 32).max(0))]:
        np.testing.assert_array_equal(emulate(pipeline, fn, x, build=tma_kernel), want)
    # along the 4 groups: (2048, 4) is no tile multiple: refused with the way out
    with pytest.raises(smalti.SmaltiError) as err:
        emulate(pipeline, lambda x: jnp.min(x.reshape(64, 4, 32), 1), x, build=tma_kernel)
    assert err.value.code == "SM206" and "multiples of (64, 8)" in err.value.message
    got = emulate(pipeline, lambda x: jnp.sum(x.reshape(64, 4, 32), -1), x, build=tma_kernel)
    exact = x.astype(np.float64).reshape(64, 4, 32).sum(-1)
    bound = 32 * np.finfo(np.float32).eps * np.abs(x).astype(np.float64).reshape(64, 4, 32).sum(-1)
    assert np.all(np.abs(got - exact) <= bound)


# --- repeat, tile, interleave -----------------------------------------------------------------


@pytest.mark.parametrize("dtype", (F32, BF16, I32), ids=lambda d: d.name)
def test_repeat_tile_interleave(pipeline, dtype):
    x = data((64, 128), dtype)
    check(pipeline, lambda x: jnp.repeat(x[:, :64], 2, axis=1), x)
    check(pipeline, lambda x: jnp.tile(x[:, :64], (1, 2)), x)
    check(pipeline, lambda x: jnp.stack([x[:, :64], x[:, 64:]], -1).reshape(64, 128), x)


def test_repeat_by_four(pipeline):
    check(pipeline, lambda x: jnp.repeat(x[:, :32], 4, axis=1), data((64, 128), F32))


def test_views_in_several_warpgroups(pipeline):
    """A repeat (a broadcast into a rank-3 view) and a group-wise reduction
    in each of two Pallas warpgroups, each through its own slice of the
    takes' scratch: jnp's answer for each block, clean under the checker."""
    def fn(x):
        scales = jnp.max(jnp.abs(x.reshape(64, 4, 32)), axis=-1)
        return jnp.repeat(x[:, :64], 2, axis=1) + jnp.repeat(scales, 32, axis=1)

    x = data((2, 64, 128), F32)
    with smalti.jax.installed(pipeline):
        (got,) = smalti.emulate.run(per_warpgroup_kernel(fn, [x]), x)
    # numpy's answer: NaN-propagating maxima, as jnp.max documents (XLA:CPU's
    # reduction drops NaNs, so jax.jit on the CPU is not the reference here)
    scales = np.max(np.abs(x.reshape(2, 64, 4, 32)), axis=-1)
    want = np.repeat(x[:, :, :64], 2, axis=2) + np.repeat(scales, 32, axis=2)
    np.testing.assert_array_equal(got, want)


# --- top_k and sorts combined -------------------------------------------------------------------


@pytest.mark.parametrize("dtype", (F32, BF16, I32), ids=lambda d: d.name)
def test_top_1(pipeline, dtype):
    """``lax.top_k(x, 1)``: the largest in total order, the first index of it."""
    x = data((64, 128), dtype)
    x[3, 10] = x[3, 90] = x[3].max() if dtype == I32 else np.inf  # ties: the lower index
    check(pipeline, lambda x: lax.top_k(x, 1)[0][:, 0], x)
    check(pipeline, lambda x: lax.top_k(x, 1)[1][:, 0], x)


def test_top_k_and_sorts_combined(pipeline):
    x = finite((64, 128), F32, 2)

    def top2(x):
        v, i = lax.top_k(jax.nn.softmax(x), 2)
        return jnp.concatenate([v, i.astype(jnp.float32)], 1)

    got = emulate(pipeline, top2, x, build=tma_kernel)
    # softmax's exp and division: within a few ulp of jnp's; indices exact
    np.testing.assert_allclose(got, np.asarray(jax.jit(top2)(x)), rtol=4e-7, atol=0)
    check(pipeline, lambda x: jnp.sort(x, 1) - x, x)
    check(pipeline, lambda x: jnp.take_along_axis(x, jnp.argsort(x, 1), axis=1), x)


def test_vector_matrix_products(pipeline):
    """``v @ x`` and ``x @ x[0]`` (f32 and bf16 into f32), within K eps |a| @ |b|."""
    x = finite((64, 128), F32, 3)
    eps = np.finfo(np.float32).eps
    for fn in [lambda x: x.sum(1) @ x, lambda x: x @ x[0]]:
        got = emulate(pipeline, fn, x, build=tma_kernel)
        want = np.asarray(jax.jit(fn)(x), np.float64)
        a_abs = np.abs(x).astype(np.float64)
        scale = (a_abs.sum(1) @ a_abs) if got.shape == (128,) else (a_abs @ a_abs[0])
        assert np.all(np.abs(got - want) <= 2 * 128 * eps * scale + 1e-30)
    xb = finite((64, 128), BF16, 4)
    got = emulate(pipeline, lambda x: jnp.dot(x, x[0], preferred_element_type=jnp.float32),
                  xb, build=tma_kernel)
    wide = xb.astype(np.float64)
    assert np.all(np.abs(got - wide @ wide[0]) <= 128 * eps * (np.abs(wide) @ np.abs(wide[0])))
