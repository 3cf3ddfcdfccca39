"""Repeats and interleaves along the minor axis fused into one permute
(:mod:`smalti.vocabulary.repeats`, a jaxpr rewrite).

The rewrite is checked on jaxprs (what it fuses and what it leaves), and
its kernels on the emulator: bit for bit against numpy, within issue 37's
movement target where the block is in registers, the same bits where a
plain load sends the permute down its take path, race-free with one and two
Pallas warpgroups, and accepted by jax's own middle-end.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import smalti.emulate
import smalti.jax
from smalti.emulate.profiling import INST, WAVEFRONTS
from smalti.vocabulary import lanes, repeats
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
from tests.vocabulary.test_movement import plain_kernel

RNG = np.random.default_rng(3)


def _jaxpr(fn, *shapes):
    return jax.make_jaxpr(fn)(*(jnp.zeros(s, jnp.float32) for s in shapes)).jaxpr


def _primitives(jaxpr) -> list[str]:
    return [eqn.primitive.name for eqn in jaxpr.eqns]


def test_columns():
    assert repeats.repeat_columns(3, 2) == (0, 0, 1, 1, 2, 2)
    assert repeats.interleave_columns(3, 2) == (0, 3, 1, 4, 2, 5)
    assert repeats.interleave_columns(2, 3) == (0, 2, 4, 1, 3, 5)
    assert repeats.interleave_columns(2, 2, 2) == (0, 0, 2, 2, 1, 1, 3, 3)


@pytest.mark.parametrize("k, r", [(1, 3), (2, 1), (3, 2)])
@pytest.mark.parametrize("axis", [0, 1])
def test_primitive_off_the_gpu(k, r, axis):
    """What the primitive means (its impl, the CPU's): the operands
    interleaved along ``axis``, each element then repeated."""
    xs = [RNG.standard_normal((4, 5)).astype(F32) for _ in range(k)]
    want = np.repeat(np.stack(xs, axis + 1).reshape(
        (4 * k, 5) if axis == 0 else (4, 5 * k)), r, axis=axis)
    bind = lambda *v: repeats.interleave_p.bind(*v, repeats=r, axis=axis)  # noqa: E731
    np.testing.assert_array_equal(bind(*xs), want)
    np.testing.assert_array_equal(jax.jit(bind)(*xs), want)


@pytest.mark.parametrize("axis", [1, 0])
def test_primitive_bound_directly(pipeline, axis):
    """The primitive bound in a kernel (not made by the rewrite) is
    estimated and lowered as well: the row path's scratch comes from its
    own estimator."""
    x = _inputs((64, 64), F32)
    bind = lambda v: repeats.interleave_p.bind(v, repeats=2, axis=axis)  # noqa: E731
    (got,) = _profile(pipeline, bind, x).outputs
    np.testing.assert_array_equal(_bits(got), _bits(np.repeat(x, 2, axis=axis)))


def test_fuses_a_repeat_of_the_minor_axis():
    jaxpr = _jaxpr(lambda x: jnp.repeat(x, 4, axis=1), (64, 32))
    assert _primitives(jaxpr) == ["broadcast_in_dim", "reshape"]
    fused = repeats.fuse(jaxpr)
    assert fused is not None and _primitives(fused) == ["smalti_interleave"]
    [eqn] = fused.eqns
    assert eqn.invars == jaxpr.invars and eqn.outvars == jaxpr.outvars
    assert eqn.params == {"repeats": 4, "axis": 1}
    assert eqn.source_info is jaxpr.eqns[1].source_info  # the reshape's line


def test_fuses_an_interleave():
    jaxpr = _jaxpr(lambda x, y, z: jnp.stack([x, y, z], -1).reshape(64, 96),
                   (64, 32), (64, 32), (64, 32))
    fused = repeats.fuse(jaxpr)
    assert fused is not None and _primitives(fused) == ["smalti_interleave"]
    assert fused.eqns[0].invars == jaxpr.invars
    assert fused.eqns[0].params == {"repeats": 1, "axis": 1}


@pytest.mark.parametrize("fn, params", [
    (lambda x, y: jnp.repeat(x, 2, axis=0), {"repeats": 2, "axis": 0}),
    (lambda x, y: jnp.stack([x, y], 1).reshape(128, 64), {"repeats": 1, "axis": 0}),
])
def test_fuses_along_the_rows(fn, params):
    jaxpr = _jaxpr(fn, (64, 64), (64, 64))
    fused = repeats.fuse(jaxpr)
    assert fused is not None and _primitives(fused) == ["smalti_interleave"]
    assert fused.eqns[0].params == params


@pytest.mark.parametrize("fn, shape", [
    (lambda x: jnp.repeat(x[0], 2), (64, 64)),  # 1-D: no 3-D value
    (lambda x: x.reshape(64, 4, 32).reshape(64, 128), (64, 128)),  # not a repeat
    # a new middle axis merged with the last: a transpose of a repeat
    (lambda x: lax.broadcast_in_dim(x, (64, 2, 64), (0, 2)).reshape(64, 128), (64, 64)),
    (lambda x: jnp.stack([x, x], 0).reshape(128, 64), (64, 64)),  # concatenation order
])
def test_leaves_other_pairs(fn, shape):
    assert repeats.fuse(_jaxpr(fn, shape)) is None


def test_leaves_a_view_used_again():
    """The 3-D value reduced as well: it must exist, so nothing is fused."""
    def fn(x):
        view = lax.broadcast_in_dim(x, (64, 64, 2), (0, 1))
        return view.reshape(64, 128), view.sum(-1)

    assert repeats.fuse(_jaxpr(fn, (64, 64))) is None


def test_fuses_inside_nested_jaxprs(pipeline):
    """Pallas lowers a loop's body through the same function: the repeat
    inside a fori_loop is fused too (the block then has no SMEM traffic
    beyond the identity's)."""
    x = _inputs((64, 128), F32)

    def fn(v):
        return lax.fori_loop(0, 2, lambda i, a: jnp.repeat(a[:, :64], 2, axis=1), v)

    prof = _profile(pipeline, fn, x)
    base = _profile(pipeline, lambda v: v, x)
    np.testing.assert_array_equal(prof.outputs[0], np.repeat(np.repeat(x[:, :64], 2, 1)[:, :64],
                                                             2, 1))
    assert prof[WAVEFRONTS] == base[WAVEFRONTS]


@pytest.mark.parametrize("r", [2, 4, 8])
@pytest.mark.parametrize("dtype", [F32, BF16, I32], ids=lambda d: d.name)
def test_repeat(pipeline, r, dtype):
    x = _inputs((64, 128), dtype)
    n = 128 // r
    (got,) = _profile(pipeline, lambda v: jnp.repeat(v[:, :n], r, axis=1), x).outputs
    np.testing.assert_array_equal(_bits(got), _bits(np.repeat(x[:, :n], r, axis=1)))


@pytest.mark.parametrize("dtype", [F32, BF16], ids=lambda d: d.name)
def test_interleave(pipeline, dtype):
    x = _inputs((64, 128), dtype)
    fn = lambda v: jnp.stack([v[:, 64:], v[:, :64]], -1).reshape(64, 128)  # noqa: E731
    (got,) = _profile(pipeline, fn, x).outputs
    want = np.stack([x[:, 64:], x[:, :64]], -1).reshape(64, 128)
    np.testing.assert_array_equal(_bits(got), _bits(want))


@pytest.mark.parametrize("r", [2, 4, 3])
@pytest.mark.parametrize("dtype", [F32, BF16, I32], ids=lambda d: d.name)
def test_repeat_rows(pipeline, r, dtype):
    """Along the rows: an SMEM round trip of vectors for a power of two,
    the 3-D view's path for 3 (the same answer)."""
    x = _inputs((64, 64), dtype)
    (got,) = _profile(pipeline, lambda v: jnp.repeat(v, r, axis=0), x).outputs
    np.testing.assert_array_equal(_bits(got), _bits(np.repeat(x, r, axis=0)))


@pytest.mark.parametrize("dtype", [F32, BF16], ids=lambda d: d.name)
def test_interleave_rows(pipeline, dtype):
    x = _inputs((128, 128), dtype)
    fn = lambda v: jnp.stack([v[64:], v[:64]], 1).reshape(128, 128)  # noqa: E731
    (got,) = _profile(pipeline, fn, x).outputs
    want = np.stack([x[64:], x[:64]], 1).reshape(128, 128)
    np.testing.assert_array_equal(_bits(got), _bits(want))


@pytest.mark.parametrize("dtype", [F32, BF16], ids=lambda d: d.name)
def test_repeat_rows_cost(pipeline, monkeypatch, dtype):
    """Along the rows, against a kernel that moves the (128, 128) result's
    block unchanged: at most 4 extra thread-instructions per element and
    one conflict-free pass of the operand through SMEM, at most the ideal
    wavefronts of the result (the view's two takes cost more than 20
    times as many instructions)."""
    x = _inputs((128, 128), dtype)
    fn = lambda v: jnp.repeat(v[:64], 2, axis=0)  # noqa: E731
    prof = _profile(pipeline, fn, x)
    base = _profile(pipeline, lambda v: v, x)
    np.testing.assert_array_equal(_bits(prof.outputs[0]), _bits(np.repeat(x[:64], 2, 0)))
    extra = (prof[INST] - base[INST]) * 32 / x.size
    assert extra <= 4
    assert prof[WAVEFRONTS] - base[WAVEFRONTS] <= 2 * x.nbytes // 128
    monkeypatch.setattr(repeats, "fuse", lambda jaxpr: None)
    viewed = _profile(pipeline, fn, x)
    assert (viewed[INST] - base[INST]) * 32 / x.size > 20 * extra


@pytest.mark.parametrize("dtype", [F32, BF16], ids=lambda d: d.name)
def test_repeat_cost(pipeline, dtype):
    """Issue 37's movement target: at most 4 extra thread-instructions per
    element of the block and no more than 2x the ideal extra wavefronts
    (none: the permute stays in registers); through the 3-D view it was
    53 instructions per element."""
    x = _inputs((64, 128), dtype)
    prof = _profile(pipeline, lambda v: jnp.repeat(v[:, :64], 2, axis=1), x)
    base = _profile(pipeline, lambda v: v, x)
    assert prof[WAVEFRONTS] == base[WAVEFRONTS]
    assert (prof[INST] - base[INST]) * 32 / x.size <= 4


def test_view_used_again_still_right(pipeline):
    """Unfused (the 3-D value is reduced too), through the view's takes."""
    x = _inputs((64, 128), F32)

    def fn(v):
        view = lax.broadcast_in_dim(v[:, :16], (64, 16, 8), (0, 1))
        return view.reshape(64, 128) + jnp.repeat(view.max(-1), 8, axis=1)

    (got,) = _profile(pipeline, fn, x).outputs
    want = 2 * np.repeat(x[:, :16], 8, 1)
    np.testing.assert_array_equal(got, want)


def test_plain_load_keeps_the_view(pipeline, monkeypatch):
    """A block loaded plainly from GMEM (strided layout) is repeated through
    the 3-D view as before, not by a take (the permute's fallback, which
    moves a strided block element by element): the same instructions as
    with the rewrite turned off."""
    x = _inputs((64, 64), F32)
    kernel = plain_kernel(lambda v: jnp.repeat(v, 2, axis=1), [x])
    with smalti.jax.installed(pipeline):
        fused = smalti.emulate.profile(kernel, x)
        monkeypatch.setattr(repeats, "fuse", lambda jaxpr: None)
        unfused = smalti.emulate.profile(kernel, x)
    for prof in (fused, unfused):
        np.testing.assert_array_equal(prof.outputs[0], np.repeat(x, 2, axis=1))
    assert fused[INST] == unfused[INST] and fused[WAVEFRONTS] == unfused[WAVEFRONTS]


@pytest.mark.parametrize("warpgroups", [1, 2])
@pytest.mark.parametrize("axis", [0, 1])
def test_warpgroups_are_race_free(pipeline, warpgroups, axis):
    """Columns in registers; rows through each warpgroup's scratch slice."""
    fn = lambda v: jnp.repeat(v[:, 16:32], 4, axis=1) if axis else \
        jnp.repeat(v[64:], 2, axis=0)  # noqa: E731
    x = _inputs((warpgroups, 128, 64), F32)
    with smalti.jax.installed(pipeline):
        (got,) = smalti.emulate.run(_blocks_kernel(fn, (128, 64), F32, warpgroups), x)
    want = [np.repeat(b[:, 16:32], 4, 1) if axis else np.repeat(b[64:], 2, 0) for b in x]
    np.testing.assert_array_equal(got, np.stack(want))


def test_lowers_under_jax_middle_end_too(pipeline):
    x = _inputs((64, 128), F32)
    ours, theirs = lowered_by_both(pipeline, lambda v: jnp.repeat(v[:, :64], 2, axis=1), x)
    assert ours.count("nvvm.shfl.sync") == theirs.count("nvvm.shfl.sync") > 0


def test_without_the_vocabulary_nothing_is_rewritten():
    """Blocked, the plugin's rewrite is not installed: Pallas' own
    ``lower_jaxpr_to_mosaic_gpu`` stays in place."""
    from jax._src.pallas.mosaic_gpu import lowering as pallas_lowering

    original = pallas_lowering.lower_jaxpr_to_mosaic_gpu
    with smalti.jax.installed(smalti.build_pipeline(block=["smalti.vocabulary"])):
        assert pallas_lowering.lower_jaxpr_to_mosaic_gpu is original
    with smalti.jax.installed():
        assert pallas_lowering.lower_jaxpr_to_mosaic_gpu is not original
    assert pallas_lowering.lower_jaxpr_to_mosaic_gpu is original
    assert lanes.permute_p is not None
