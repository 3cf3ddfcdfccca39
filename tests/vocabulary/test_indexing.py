"""Gathers and scatters in Pallas Mosaic GPU kernels (Warpgroup semantics),
on the emulator against jnp on the CPU, bit for bit (values only move, or
are combined in index order as the CPU combines them): ``take_along_axis``
along either axis, ``x[idx]``, ``x[:, idx]``, ``.at[idx].set/add/min/max``,
with negative and out-of-bounds indices, in f32, bf16 and int32, from plain
loads and from swizzled SMEM; refused with several warpgroups. Every run is
checked for races by the emulator's synchronization checker (``run``'s
default ``on_race="raise"``)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax.experimental.pallas import mosaic_gpu as plgpu

import smalti
import smalti.emulate
import smalti.jax
import smalti.vocabulary
from benchmarks.vocabulary import kernel as tma_kernel
from tests.vocabulary.test_movement import WG, data
from tests.vocabulary.test_movement import check as check_built
from tests.vocabulary.warpgroups import per_warpgroup_kernel

F32, I32 = np.dtype(np.float32), np.dtype(np.int32)
BF16 = np.dtype(ml_dtypes.bfloat16)


def check(pipeline, fn, *args):
    """Bit for bit jnp's answer, the blocks brought into swizzled SMEM by TMA
    (the index vectors are reductions of them: plainly loaded blocks have
    the strided layout, which reductions do not take)."""
    check_built(pipeline, fn, *args, build=tma_kernel)


def indices(n, high, seed, *, extremes=True):
    """n int32 indices in [0, high), with -1, -high (wrapped by jnp) and, if
    ``extremes``, high and 1000 (out of bounds) among them."""
    idx = np.random.default_rng(seed).integers(0, high, n).astype(np.int32)
    idx[:2] = [-1, -high]
    if extremes:
        idx[2:4] = [high, 1000]
    return idx


def per_row(idx):
    """An int32 (len(idx), 128) block whose row maxima are ``idx``: index
    vectors of 64 elements have a layout only as a reduction's result, so
    the kernels take ``jnp.max(block, 1)`` (``per_col``: ``jnp.max(block, 0)``)."""
    block = np.full((len(idx), 128), -10 ** 6, np.int32)
    block[:, 0] = idx
    return block


def per_col(idx):
    block = np.full((64, len(idx)), -10 ** 6, np.int32)
    block[0] = idx
    return block


def rows(b):
    return jnp.max(b, 1)


def cols(b):
    return jnp.max(b, 0)


# --- gathers ----------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", (F32, BF16, I32), ids=lambda d: d.name)
def test_take_along_axis_1_picks_one_per_row(pipeline, dtype):
    """Cross-entropy's pick: an (n, 1) result, broadcast against the block
    (out-of-bounds picks are jnp's fill: NaN, or the most negative int32)."""
    x = data((64, 128), dtype)
    idx = per_row(indices(64, 128, 1))
    check(pipeline, lambda x, i: x[:, :8] - jnp.take_along_axis(x, rows(i)[:, None], axis=1),
          x, idx)


def test_take_along_axis_1_with_labels_from_an_argmax(pipeline):
    """As the benchmark writes it: the label is the argmax of another block."""
    x, y = data((64, 128), F32, 1), data((64, 128), F32, 2)
    x.flat[:6] = 0.0  # no NaN in the argmax's operand
    fn = lambda x, y: y[:, :8] - jnp.take_along_axis(y, jnp.argmax(x, 1)[:, None], 1)  # noqa: E731
    check(pipeline, fn, x, y)


def test_take_along_axis_with_a_full_index_block(pipeline):
    """A permutation of every row (what argsort gives) and repeats."""
    x = data((64, 128), F32)
    rng = np.random.default_rng(3)
    perm = np.stack([rng.permutation(128) for _ in range(64)]).astype(np.int32)
    perm[:, :4] = 7
    check(pipeline, lambda x, p: jnp.take_along_axis(x, p, axis=1), x, perm)


@pytest.mark.parametrize("dtype", (F32, I32), ids=lambda d: d.name)
def test_take_along_axis_0(pipeline, dtype):
    x = data((64, 128), dtype)
    idx = per_col(indices(128, 64, 4))
    check(pipeline, lambda x, i: jnp.take_along_axis(x, cols(i)[None, :], axis=0), x, idx)


@pytest.mark.parametrize("dtype", (F32, BF16, I32), ids=lambda d: d.name)
def test_rows_and_columns_by_index(pipeline, dtype):
    """``x[idx]`` (rows) and ``x[:, idx]`` (columns), jnp's clamping of
    out-of-bounds indices included."""
    x = data((64, 128), dtype)
    check(pipeline, lambda x, i: x[rows(i)], x, per_row(indices(64, 64, 5)))
    check(pipeline, lambda x, i: x[:, cols(i)], x, per_col(indices(128, 128, 6)))


# --- scatters ---------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", (F32, BF16, I32), ids=lambda d: d.name)
def test_scatter_set_rows(pipeline, dtype):
    """``.at[idx].set(u)`` with distinct rows (out-of-bounds ones dropped)."""
    x, u = data((64, 128), dtype, 1), data((64, 128), dtype, 2)
    idx = np.random.default_rng(8).permutation(64).astype(np.int32)
    idx[:2] = [-3, 70]
    check(pipeline, lambda x, i, u: x.at[rows(i)].set(u), x, per_row(idx), u)


def test_scatter_set_duplicates_take_the_last(pipeline):
    """Duplicate indices: the last update wins, as on the CPU."""
    x, u = data((64, 128), F32, 3), data((64, 128), F32, 4)
    idx = np.random.default_rng(16).integers(0, 8, 64).astype(np.int32)
    check(pipeline, lambda x, i, u: x.at[rows(i)].set(u), x, per_row(idx), u)


@pytest.mark.parametrize("dtype", (F32, I32), ids=lambda d: d.name)
def test_scatter_add_rows_with_duplicates(pipeline, dtype):
    """``.at[idx].add`` combines every update (integer-valued floats: the
    order does not matter), out-of-bounds ones dropped."""
    x = np.random.default_rng(9).integers(-50, 50, (64, 128)).astype(dtype)
    u = np.random.default_rng(10).integers(-50, 50, (64, 128)).astype(dtype)
    idx = np.random.default_rng(11).integers(0, 8, 64).astype(np.int32)
    idx[:2] = [-1, 64]
    check(pipeline, lambda x, i, u: x.at[rows(i)].add(u), x, per_row(idx), u)


def test_scatter_add_a_constant_to_columns_and_min_max(pipeline):
    x = data((64, 128), F32, 5)
    idx = per_col(indices(128, 128, 12, extremes=False))
    check(pipeline, lambda x, i: x.at[:, cols(i)].add(1.0), x, idx)
    u = data((64, 128), F32, 6)
    u[np.isnan(u)] = 0.0  # a NaN's sign after min/max is not jnp's to fix
    which = per_row(indices(64, 64, 13, extremes=False))
    check(pipeline, lambda x, i, u: x.at[rows(i)].max(u), x, which, u)
    check(pipeline, lambda x, i, u: x.at[rows(i)].min(u), x, which, u)


def test_scatter_at_an_argmax(pipeline):
    """As the benchmark writes it: indices from an argmax, a TMA-loaded block."""
    x, y = data((64, 128), F32, 7), data((64, 128), F32, 8)
    x.flat[:6] = 0.0
    check(pipeline, lambda x, y: y.at[jnp.argmax(x, 0)[:16] // 2].add(1.0), x, y)


# --- refusals ---------------------------------------------------------------------------------


@pytest.mark.parametrize("fn", [lambda x, b: x[rows(b)],
                                lambda x, b: x.at[rows(b) // 2].add(1.0)],
                         ids=["gather", "scatter-add"])
def test_several_warpgroups_gather_and_scatter(pipeline, fn):
    """Two Pallas warpgroups, each through its own slice of the takes'
    scratch: jnp's answer for each block, clean under the checker."""
    x = data((2, 64, 128), F32)
    idx = np.stack([per_row(indices(64, 64, 14)), per_row(indices(64, 64, 15))])
    with smalti.jax.installed(pipeline):
        (got,) = smalti.emulate.run(per_warpgroup_kernel(fn, [x, idx]), x, idx)
    want = np.stack([np.asarray(jax.jit(fn)(a, b)) for a, b in zip(x, idx)])
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def test_jax_alone_refuses_a_gather(pipeline):
    """The reason for the rules: Pallas has none for gather."""
    def body(x_ref, i_ref, o_ref):
        o_ref[...] = x_ref[...][rows(i_ref[...])]

    call = plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((64, 128), jnp.float32),
                        compiler_params=WG)
    with pytest.raises(NotImplementedError, match="gather"):
        smalti.emulate.run(call, data((64, 128), F32), per_row(indices(64, 64, 15)))
