"""One column or one row of a block (:mod:`smalti.vocabulary.lines`): size-1
slices that broadcast back like a ``keepdims`` reduction, on the emulator.

Results are compared with numpy bit for bit (values only move; the
arithmetic after them is exact or done in numpy in the same type); the
profiler shows the outer broadcast within issue 37's movement target; the
checker runs with one and two Pallas warpgroups; jax's own middle-end
accepts the lowered module.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

import smalti.emulate
import smalti.jax
from smalti.emulate.profiling import INST, WAVEFRONTS
from smalti.vocabulary import lines
from tests.vocabulary.test_lanes import (
    BF16,
    F32,
    I32,
    _bits,
    _blocks_kernel,
    _inputs,
    _profile,
    lowered_by_both,
)


@pytest.mark.parametrize("c", [0, 5, 127])
@pytest.mark.parametrize("dtype", [F32, BF16, I32], ids=lambda d: d.name)
def test_column(pipeline, c, dtype):
    """``x[:, c:c+1]`` alone (stored as (64, 1)) and broadcast over the block."""
    x = _inputs((64, 128), dtype)
    (alone,) = _profile(pipeline, lambda v: v[:, c:c + 1], x).outputs
    np.testing.assert_array_equal(_bits(alone), _bits(x[:, c:c + 1]))
    (spread,) = _profile(pipeline, lambda v: jnp.maximum(v, v[:, c:c + 1]), x).outputs
    np.testing.assert_array_equal(_bits(spread), _bits(np.maximum(x, x[:, c:c + 1])))


@pytest.mark.parametrize("shape, r", [((64, 128), 0), ((64, 128), 17), ((64, 128), 63),
                                      ((128, 64), 100)])
@pytest.mark.parametrize("dtype", [F32, BF16, I32], ids=lambda d: d.name)
def test_row(pipeline, shape, r, dtype):
    """``x[r:r+1, :]`` alone (stored as (1, n)) and broadcast over the block."""
    x = _inputs(shape, dtype)
    (alone,) = _profile(pipeline, lambda v: v[r:r + 1, :], x).outputs
    np.testing.assert_array_equal(_bits(alone), _bits(x[r:r + 1, :]))
    (spread,) = _profile(pipeline, lambda v: jnp.minimum(v, v[r:r + 1, :]), x).outputs
    np.testing.assert_array_equal(_bits(spread), _bits(np.minimum(x, x[r:r + 1, :])))


def test_outer_broadcast_cost(pipeline):
    """Issue 37's movement target for ``x[:, :1] + x[:1, :]``: at most 4
    extra thread-instructions per element and 2x the ideal wavefronts (was
    60.2 and 648 through take)."""
    x = _inputs((64, 128), F32)
    prof = _profile(pipeline, lambda v: v[:, :1] + v[:1, :], x)
    base = _profile(pipeline, lambda v: v, x)
    with np.errstate(invalid="ignore"):  # inf + -inf in the data
        np.testing.assert_array_equal(prof.outputs[0], x[:, :1] + x[:1, :])
    assert (prof[INST] - base[INST]) * 32 / x.size <= 4
    assert prof[WAVEFRONTS] - base[WAVEFRONTS] <= 2 * (2 * x.nbytes // 128)


@pytest.mark.parametrize("warpgroups", [1, 2])
def test_warpgroups_are_race_free(pipeline, warpgroups):
    fn = lambda v: v[:, 7:8] * v[9:10, :]  # noqa: E731
    x = _inputs((warpgroups, 64, 128), F32)
    with smalti.jax.installed(pipeline):
        (got,) = smalti.emulate.run(_blocks_kernel(fn, (64, 128), F32, warpgroups), x)
    np.testing.assert_array_equal(got, np.stack([b[:, 7:8] * b[9:10, :] for b in x]))


def test_blocks_that_do_not_fit_take_the_take_path(pipeline, monkeypatch):
    """Where the register path does not apply (here: made not to), the
    slice is one take, as before, with the same answer."""
    from smalti.vocabulary import lanes

    monkeypatch.setattr(lanes, "fits", lambda aval, x=None: False)
    x = _inputs((64, 128), F32)
    with np.errstate(invalid="ignore"):  # inf + -inf in the data
        outer = x[:, 2:3] + x[:1, :]
    # (a (64, 1) take stored alone has no layout, SM101, as before these lines)
    for fn, want in [(lambda v: v[:, 2:3] + v[:1, :], outer), (lambda v: v[4:5, :], x[4:5])]:
        (got,) = _profile(pipeline, fn, x).outputs
        np.testing.assert_array_equal(_bits(got), _bits(want))


@pytest.mark.parametrize("index", [(0, 0), (17, 5), (63, 127)])
@pytest.mark.parametrize("dtype", [F32, BF16, I32], ids=lambda d: d.name)
def test_one_element(pipeline, index, dtype):
    """``x[r, c]`` of a loaded block (a (1, 1) slice squeezed to a scalar)
    and ``x[r:r+1, c:c+1]`` broadcast back, subtracted from the block: the
    element's bits (``-0.0`` and the least int32 among them; a NaN makes
    every difference NaN). jax lowers neither: no layout holds the (1, 1)
    slice."""
    r, c = index
    x = _inputs((64, 128), dtype)
    x[np.isnan(x.astype(np.float32))] = 2  # the NaNs' payloads below are the pick's
    for special in ([-0.0, np.nan] if dtype != I32 else [np.iinfo(np.int32).min, 7]):
        x[r, c] = special
        (shifted,) = _profile(pipeline, lambda v: v - v[r, c], x).outputs
        (spread,) = _profile(pipeline, lambda v: v - v[r:r + 1, c:c + 1], x).outputs
        with np.errstate(invalid="ignore", over="ignore"):
            want = x - x[r, c]
        for got in (shifted, spread):
            if np.isnan(float(special)):
                assert np.isnan(got.astype(np.float32)).all()
            else:
                np.testing.assert_array_equal(_bits(got), _bits(want))


@pytest.mark.parametrize("dtype", [F32, BF16, I32], ids=lambda d: d.name)
def test_one_element_of_several_warpgroups(pipeline, dtype):
    """Each warpgroup picks from its own block on its own scratch slice
    (``block_reduce``): race-free, each block's element."""
    x = _inputs((2, 64, 128), dtype)
    x[np.isnan(x.astype(np.float32))] = 2
    fn = lambda v: v - v[3, 4]  # noqa: E731
    with smalti.jax.installed(pipeline):
        (got,) = smalti.emulate.run(_blocks_kernel(fn, (64, 128), dtype, 2), x)
    with np.errstate(invalid="ignore", over="ignore"):
        want = np.stack([b - b[3, 4] for b in x])
    np.testing.assert_array_equal(_bits(got), _bits(want))


def test_one_element_of_several_warpgroups_is_refused_for_other_types(pipeline):
    """A type ``block_reduce`` does not take goes by Pallas' reduction to a
    scalar, which shares its scratch among warpgroups (a race the checker
    finds): the pick is refused there, with the fix."""
    x = _inputs((2, 64, 128), I32).astype(np.int16)
    with smalti.jax.installed(pipeline), pytest.raises(Exception, match="SM206") as info:
        smalti.emulate.run(_blocks_kernel(lambda v: v * v[3, 4], (64, 128), np.dtype(np.int16),
                                          2), x)
    assert "x_ref[r, c]" in str(info.value) and "int16 block" in str(info.value)


def test_bad_index():
    x = jnp.zeros((64, 128), jnp.float32)
    with pytest.raises(ValueError, match="index 64 along axis 0"):
        lines.row(x, 64)
    with pytest.raises(ValueError, match="of a 2-D block"):
        lines.column(x[0], 0)


def test_lowers_under_jax_middle_end_too(pipeline):
    x = _inputs((64, 128), F32)
    ours, theirs = lowered_by_both(pipeline, lambda v: v[:, :1] + v[:1, :], x)
    assert ours.count("nvvm.shfl.sync") == theirs.count("nvvm.shfl.sync") > 0
    assert ours.count("vector.load") == theirs.count("vector.load") > 0
