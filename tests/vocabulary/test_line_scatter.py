"""Scatters of one element per row or column
(:mod:`smalti.vocabulary.line_scatter`): cross-entropy's gradient
``p.at[jnp.arange(n), labels].add(-1)``, every combine (set, add, mul, min,
max), along both axes, ``put_along_axis``, with jnp's negative positions,
out-of-bounds ones dropped (``fill``) or clamped (``clip``) and the int32
extremes, in f32, bf16 and int32: jnp's bits on the emulator, race-free with
one and two Pallas warpgroups. The rewrite fuses exactly those scatters and
leaves the others (a row coordinate that is not an iota, a 2-D scatter of
several elements per line) as they were."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import smalti.emulate
import smalti.jax
from smalti.emulate.profiling import INST
from smalti.vocabulary import line_scatter
from tests.vocabulary.test_indexing import BF16, F32, I32, check, per_col, per_row, tma_kernel
from tests.vocabulary.test_lanes import blocks_on_emulator
from tests.vocabulary.test_movement import data

RNG = np.random.default_rng(41)
INT32_MIN, INT32_MAX = -2 ** 31, 2 ** 31 - 1


def positions(n: int, length: int) -> np.ndarray:
    """n int32 positions in [0, length), with jnp's negatives (-1, -length),
    out-of-bounds ones (length, -length - 1) and the int32 extremes first."""
    p = RNG.integers(0, length, n).astype(np.int32)
    p[:6] = [-1, -length, length, -length - 1, INT32_MAX, INT32_MIN]
    return p


KINDS = {
    "set": lambda r, u: r.set(u), "add": lambda r, u: r.add(u),
    "mul": lambda r, u: r.multiply(u), "min": lambda r, u: r.min(u),
    "max": lambda r, u: r.max(u),
}


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("dtype", (F32, BF16, I32), ids=lambda d: d.name)
def test_one_element_per_row(pipeline, kind, dtype):
    """``x.at[jnp.arange(64), cols].<kind>(u)``, ``u`` a vector of the rows
    (the block's infinities, NaN and zeros in row 0 meet it)."""
    x = data((64, 128), dtype)

    def fn(x, p):
        cols = jnp.max(p, 1)
        return KINDS[kind](x.at[jnp.arange(64), cols], (cols % 5 - 2).astype(x.dtype))

    check(pipeline, fn, x, per_row(positions(64, 128)))


@pytest.mark.parametrize("kind", ["set", "add", "max"])
def test_one_element_per_column(pipeline, kind):
    """``x.at[rows, jnp.arange(128)].<kind>(u)``: the lines are columns."""
    x = data((64, 128), F32)

    def fn(x, p):
        rows = jnp.max(p, 0)
        return KINDS[kind](x.at[rows, jnp.arange(128)], (rows % 3).astype(x.dtype))

    check(pipeline, fn, x, per_col(positions(128, 64)))


def test_cross_entropys_gradient(pipeline):
    """Cross-entropy's gradient ``p - onehot(labels)``: a scalar update,
    labels in bounds (``p`` a scaled block: the emulator's exp is not
    the CPU's to the bit)."""
    x = data((64, 128), F32)
    labels = per_row(RNG.integers(0, 128, 64).astype(np.int32))

    def fn(x, p):
        return (x * 0.5).at[jnp.arange(64), jnp.max(p, 1)].add(-1.0)

    check(pipeline, fn, x, labels)


def test_clip_mode(pipeline):
    x = data((64, 128), F32)

    def fn(x, p):
        cols = jnp.max(p, 1)
        return x.at[jnp.arange(64), cols].set(cols.astype(x.dtype), mode="clip")

    check(pipeline, fn, x, per_row(positions(64, 128)))


@pytest.mark.parametrize("axis", [1, 0])
def test_put_along_axis(pipeline, axis):
    x = data((64, 128), F32)
    if axis == 1:
        fn = lambda x, p: jnp.put_along_axis(  # noqa: E731
            x, jnp.max(p, 1)[:, None], jnp.max(p, 1)[:, None] * 0.5, axis=1, inplace=False)
        p = per_row(positions(64, 128))
    else:
        fn = lambda x, p: jnp.put_along_axis(  # noqa: E731
            x, jnp.max(p, 0)[None, :], -2.5, axis=0, inplace=False)
        p = per_col(positions(128, 64))
    check(pipeline, fn, x, p)


@pytest.mark.parametrize("warpgroups", [1, 2])
def test_warpgroups_are_race_free(pipeline, warpgroups):
    """No memory is touched: each Pallas warpgroup updates its own block."""
    def fn(v):
        cols = jnp.argmax(v, 1)
        return v.at[jnp.arange(64), cols].add(-1.0)

    got, want = blocks_on_emulator(pipeline, fn, data((warpgroups, 64, 128), F32))
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def test_a_compare_a_select_and_the_combine(pipeline):
    """Beyond the kernel computing the same positions and updates, at most
    4 instructions per element: the position's compare, the select, the
    add (and jnp's wrap of the position, once per row)."""
    x = data((64, 128), F32)
    p = per_row(positions(64, 128))

    def scattered(x, p):
        cols = jnp.max(p, 1)
        return x.at[jnp.arange(64), cols].add(cols.astype(F32))

    def inputs_only(x, p):
        return x + jnp.max(p, 1).astype(F32)[:, None] * 0

    with smalti.jax.installed(pipeline):
        base = smalti.emulate.profile(tma_kernel(inputs_only, [x, p]), x, p)
        prof = smalti.emulate.profile(tma_kernel(scattered, [x, p]), x, p)
    np.testing.assert_array_equal(prof.outputs[0], np.asarray(jax.jit(scattered)(x, p)))
    assert (prof[INST] - base[INST]) * 32 / x.size <= 4


# --- the rewrite -----------------------------------------------------------------------------


def rewritten(fn, *avals):
    """The primitives of ``fn``'s jaxpr (the inner one of its jit, if any)
    after the rewrite, or None where it left the jaxpr alone."""
    jaxpr = jax.make_jaxpr(fn)(*avals).jaxpr
    inner = [e.params["jaxpr"].jaxpr for e in jaxpr.eqns if "jaxpr" in e.params]
    out = line_scatter.fuse(inner[0] if inner else jaxpr)
    return None if out is None else [e.primitive.name for e in out.eqns]


X = jax.ShapeDtypeStruct((64, 128), np.float32)
V = jax.ShapeDtypeStruct((64,), np.int32)


def test_the_rewrite_fuses_one_element_per_line():
    names = rewritten(lambda x, c: x.at[jnp.arange(64), c].add(-1.0), X, V)
    assert "smalti_line_scatter" in names
    assert "concatenate" not in names and "scatter-add" not in names  # its index array dropped
    names = rewritten(lambda x, c: jnp.put_along_axis(x, c[:, None], 1.0, axis=1,
                                                      inplace=False), X, V)
    assert "smalti_line_scatter" in names and "scatter" not in names


@pytest.mark.parametrize("fn", [
    lambda x, c: x.at[c, c].add(-1.0),  # the rows are data, not an iota
    lambda x, c: x.at[jnp.arange(64) // 2, c].add(-1.0),  # an iota, changed
    lambda x, c: x.at[c].set(0.0),  # whole rows
    lambda x, c: x.at[jnp.arange(64) + 0 * c, c].add(1.0),  # an iota plus data
], ids=["data rows", "halved iota", "rows", "iota plus data"])
def test_the_rewrite_leaves_other_scatters(fn):
    assert rewritten(fn, X, V) is None


def test_the_rewrite_keeps_an_index_array_read_elsewhere():
    """The concatenated indices also returned: only the scatter is replaced."""
    def fn(x, c):
        idx = jnp.stack([jnp.arange(64), c], 1)
        return lax.scatter_add(x, idx, jnp.ones(64, x.dtype), lax.ScatterDimensionNumbers(
            update_window_dims=(), inserted_window_dims=(0, 1),
            scatter_dims_to_operand_dims=(0, 1))), idx
    names = rewritten(fn, X, V)
    assert names is not None and "smalti_line_scatter" in names and "stack" in names


def test_line_scatter_on_the_cpu():
    """The primitive's own implementation is the select, and jnp's answer."""
    x = data((64, 128), F32)
    p = positions(64, 128)
    u = RNG.standard_normal(64).astype(np.float32)
    got = line_scatter.line_scatter_p.bind(x, p, u, axis=0, kind="add",
                                           mode=lax.GatherScatterMode.FILL_OR_DROP, wrapped=True)
    want = jnp.asarray(x).at[jnp.arange(64), p].add(u)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
