"""Sorts on a 32-bit key through one word per element: the key quantized
beside its index (``vocabulary/sorting.py``, ``_sort_quantized`` and the
paths into it; ``vocabulary/fixed_point.py``).

Every kernel is bit for bit jax's answer on the CPU, on each kind of block
the paths tell apart: ordinary blocks (no two neighbours share a
quantized key), genuine duplicates (neighbours share it and are in order),
runs the sweeps sort, runs they cannot (the two-word network then), blocks
of a wide dynamic range (the float32 keys' span, not fixed point),
infinities, NaNs, zeros and tiny numbers. The costs (extra
thread-instructions per element over the identity kernel, as
``benchmarks/vocabulary.py`` counts them) show which path ran.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import smalti
import smalti.emulate
import smalti.jax
import smalti.vocabulary
from benchmarks.vocabulary import kernel as tma_kernel
from smalti.emulate.profiling import INST
from smalti.vocabulary import fixed_point, lanes, sorting
from tests.vocabulary.test_scans_sort import assert_bits

SHAPE = (64, 128)
#: Issue 37's bound for a sort of rows of 128: twice a bitonic network's
#: min and max per compare-exchange, plus the pass (docs/vocabulary.md).
BOUND = 57


def _argsorts(v):
    """argsort along both axes in one output (both below 128: recoverable)."""
    return jnp.argsort(v, 1).astype(jnp.int32) + 128 * jnp.argsort(v, 0).astype(jnp.int32)


def _argsort(v):
    return jnp.argsort(v, 1).astype(jnp.int32)


def _payload(v):
    """lax.sort of the key and a payload along the columns, both read."""
    key, payload = lax.sort((v, v * 3), dimension=1, num_keys=1)
    return key + payload


_IDENTITY: dict[tuple[int, str], int] = {}


def _run(pipeline, fn, x):
    """``fn`` of ``x`` on the emulator, checked bit for bit against jax; its
    extra thread-instructions per element over the identity kernel."""
    with smalti.jax.installed(pipeline):
        profile = smalti.emulate.profile(tma_kernel(fn, [x]), x)
        key = (id(pipeline), x.dtype.str)
        if key not in _IDENTITY:
            identity = smalti.emulate.profile(tma_kernel(lambda v: v, [x]), x)
            _IDENTITY[key] = identity.counters[INST]
    assert_bits(profile.outputs[0], np.asarray(jax.jit(fn)(x)))
    return (profile.counters[INST] - _IDENTITY[key]) * 32 / x.size


def _normal(seed=0):
    return np.random.default_rng(seed).standard_normal(SHAPE).astype(np.float32)


def _softmax(scale, seed=1):
    z = scale * np.random.default_rng(seed).standard_normal(SHAPE)
    e = np.exp(z - z.max(1, keepdims=True))
    return (e / e.sum(1, keepdims=True)).astype(np.float32)


def _reversed_run(length):
    """A normal block whose row 5 holds ``length`` (at most 16) keys that
    share their fixed-point key (0.125 + k 2**-26, one ulp apart: the
    largest magnitude is in [2, 4), so fixed point keeps 2**-22) in
    descending order."""
    x = _normal() / 4
    x[0, 0] = 3.0
    x[5, 10:10 + length] = 0.125 + np.arange(length)[::-1] * 2.0 ** -26
    return x


F32_BLOCKS = {
    "ordinary": _normal,
    # equal neighbours already in index order: read, found sorted
    "duplicates": lambda: (np.round(_normal() * 4) / 4).astype(np.float32),
    "run of 2": lambda: _reversed_run(2),
    "run of 4": lambda: _reversed_run(4),
    "run of 8": lambda: _reversed_run(8),
    "run of 12": lambda: _reversed_run(12),  # beyond four sweeps: the two-word network
    "softmax": lambda: _softmax(4.0),  # a wide dynamic range: the keys' span
    "infinities": lambda: np.where(np.random.default_rng(3).random(SHAPE) < 0.05, -np.inf,
                                   _normal()).astype(np.float32),
    "nan": lambda: np.where(np.random.default_rng(4).random(SHAPE) < 0.01, np.nan,
                            _normal()).astype(np.float32),
    "signed zeros": lambda: np.where(np.random.default_rng(5).random(SHAPE) < 0.1,
                                     np.where(np.random.default_rng(6).random(SHAPE) < 0.5,
                                              -0.0, 0.0), _normal()).astype(np.float32),
    "zeros": lambda: np.zeros(SHAPE, np.float32),
    # no fixed-point scale (the largest magnitude below 2**-104); normal
    # numbers (XLA:CPU's reference flushes subnormals, the GPU orders them)
    "tiny": lambda: (np.sign(_normal()) * np.maximum(np.abs(_normal()), 0.01) * 2.0 ** -110)
    .astype(np.float32),
}


#: Blocks whose argsort along the columns test_costs_show_the_path_taken runs.
COSTED = ("ordinary", "duplicates", "run of 2", "run of 8", "softmax", "run of 12")


@pytest.mark.parametrize("kind", F32_BLOCKS)
def test_f32_argsort_along_either_axis(pipeline, kind):
    """Along the rows (and the columns, where the cost test does not)."""
    _run(pipeline, (lambda v: jnp.argsort(v, 0).astype(jnp.int32)) if kind in COSTED
         else _argsorts, F32_BLOCKS[kind]())


@pytest.mark.parametrize("kind", ["ordinary", "run of 2", "softmax"])
def test_f32_key_with_a_payload(pipeline, kind):
    _run(pipeline, _payload, F32_BLOCKS[kind]())


def _wide_ints(seed=7):
    return np.random.default_rng(seed).integers(-2 ** 31, 2 ** 31, SHAPE, dtype=np.int64) \
        .astype(np.int32)


INT_BLOCKS = {
    "full range": _wide_ints,  # offsets shifted right by 7
    # a span in [2**24, 2**25): quantized without loss
    "span 2**24": lambda: _with_row(np.random.default_rng(8).integers(0, 2 ** 24, SHAPE)
                                    .astype(np.int32), 0, [0, 2 ** 24 + 4]),
    # keys 1 apart in one row, full range elsewhere: one quantized key, out of order
    "close keys": lambda: _with_row(_wide_ints(), 9, np.arange(40, 0, -1) + 123_456),
    "duplicates": lambda: _with_row(_wide_ints(), 9, np.full(40, -77)),
}


def _with_row(x, row, values):
    x[row, 20:20 + len(values)] = values
    return x


@pytest.mark.parametrize("kind", INT_BLOCKS)
def test_int32_argsort_along_either_axis(pipeline, kind):
    _run(pipeline, _argsorts, INT_BLOCKS[kind]())


def test_uint32_keys_of_a_wide_span(pipeline):
    _run(pipeline, _payload, _wide_ints().view(np.uint32))


def test_costs_show_the_path_taken(pipeline):
    """An ordinary f32 block and a full-range int32 block stay within issue
    37's bound; duplicates add the read of the exact keys and the test of
    the neighbours, not a sweep or a second network; a run of two adds one
    sweep, a run of 8 four; a wide dynamic range skips fixed point and
    pays one network (not two); a run of 12 falls back to the two-word
    network after the four sweeps."""
    cost = {kind: _run(pipeline, _argsort, F32_BLOCKS[kind]()) for kind in COSTED}
    wide = _run(pipeline, _argsort, _wide_ints())
    assert cost["ordinary"] <= BOUND and wide <= BOUND, (cost, wide)
    assert cost["ordinary"] + 10 < cost["duplicates"] < cost["ordinary"] + 30, cost
    sweep = cost["run of 2"] - cost["duplicates"]
    assert 15 < sweep < 40, cost
    assert cost["run of 8"] == pytest.approx(cost["duplicates"] + 4 * sweep, rel=0.1), cost
    assert cost["softmax"] < cost["ordinary"] + 20, cost
    assert cost["run of 12"] > cost["run of 8"] + 100, cost


# --- the parts, on the CPU -------------------------------------------------------------------

TOP = sorting._quantized_top(128)


@pytest.mark.parametrize("magnitude", [2.0 ** -104, 1.0, 1.5, np.nextafter(2.0, 0.0), 2.0,
                                       3.0e38, float(np.finfo(np.float32).max)])
def test_scale_maps_the_largest_magnitude_into_the_upper_half(magnitude):
    m = np.float32(magnitude)
    assert bool(sorting._scales(jnp.float32(m), TOP))
    scaled = float(m) * float(sorting._scale(jnp.float32(m), TOP))
    assert TOP / 2 <= scaled < TOP


@pytest.mark.parametrize("magnitude", [0.0, 2.0 ** -105, 1e-45, np.inf, np.nan])
def test_no_scale_for_zeros_tiny_numbers_and_specials(magnitude):
    assert not bool(sorting._scales(jnp.float32(magnitude), TOP))


def _labelled(rows):
    """Positions' values at their relabelled columns."""
    place, _ = sorting.relabelled_stages(rows.shape[1])
    out = np.empty_like(rows)
    out[:, list(place)] = rows
    return out, place


@pytest.mark.parametrize("length,sorted_", [(2, True), (3, True), (5, True), (8, True),
                                            (9, False)])
def test_repair_sorts_reversed_runs_of_up_to_eight(length, sorted_):
    """Keys sorted but for reversed runs of ``length``, every third run
    start (indices a random permutation): four sweeps sort runs of up to
    eight, as ``np.lexsort`` does; a run of nine is reported unsorted."""
    rng = np.random.default_rng(length)
    keys = np.tile(np.arange(128, dtype=np.int32) * 10, (4, 1))
    for start in range(0, 128, 3 * length):
        keys[:, start:start + length] = keys[:, start:start + length][:, ::-1]
    index = np.stack([rng.permutation(128) for _ in range(4)]).astype(np.int32)
    key_cols, place = _labelled(keys)
    index_cols, _ = _labelled(index)
    got, unsorted = jax.jit(lambda k, i: sorting._repair(k, i, place))(key_cols, index_cols)
    assert bool(unsorted) is not sorted_
    if sorted_:
        want = np.stack([i[np.lexsort((i, k))] for k, i in zip(keys, index)])
        np.testing.assert_array_equal(np.asarray(got)[:, list(place)], want)


def test_inverted_marks_each_pair_out_of_order_with_the_next():
    keys = np.tile(np.arange(128, dtype=np.int32), (2, 1))
    index = np.tile(np.arange(128, dtype=np.int32), (2, 1))
    keys[1, 7], keys[1, 8] = 8, 7  # position 7 is above its successor
    index[0, 20], index[0, 21] = 21, 20  # equal keys: the index decides
    keys[0, 20] = keys[0, 21] = 20
    key_cols, place = _labelled(keys)
    index_cols, _ = _labelled(index)
    inverted = np.asarray(jax.jit(lambda k, i: sorting._inverted(k, i, place))(key_cols,
                                                                              index_cols))
    assert sorted(map(tuple, np.argwhere(inverted[:, list(place)]))) == [(0, 20), (1, 7)]


def test_truncate_in_range_is_astype_without_the_clamp(pipeline):
    """Toward zero, bit for bit ``astype`` on values within int32 (signed
    zeros, halves, both ends of 2**24), one instruction per element where
    ``astype`` spends three."""
    rng = np.random.default_rng(10)
    x = (rng.standard_normal(SHAPE) * 2.0 ** 20).astype(np.float32)
    x[0, :8] = [-0.0, 0.5, -0.5, 1.5, -1.5, 2.0 ** 24 - 1, -(2.0 ** 24), 2.0 ** 30]
    def truncated(v):
        with lanes.for_operands():  # as inside a vocabulary rule: registers allowed
            return fixed_point.truncate_in_range(v)

    with smalti.jax.installed(pipeline):
        (got,) = smalti.emulate.run(tma_kernel(truncated, [x]), x)
    np.testing.assert_array_equal(got, x.astype(np.int32))
    cost = [_run(pipeline, fn, x) for fn in (truncated, lambda v: v.astype(jnp.int32))]
    assert cost[0] + 2 == cost[1], cost


def test_truncate_in_range_refuses_other_types():
    with pytest.raises(ValueError, match="float32 block"):
        fixed_point.truncate_in_range(jnp.zeros((8, 8), jnp.int32))


# --- several warpgroups ----------------------------------------------------------------------


@pytest.mark.parametrize("name, fn, dtype", [
    ("f32 argsort", _argsort, np.float32),
    ("f32 argsort along the rows", lambda v: jnp.argsort(v, 0).astype(jnp.int32), np.float32),
    ("f32 sort", lambda v: jnp.sort(v, 1), np.float32),
    ("int32 argsort", _argsort, np.int32),
    ("bf16 sort", lambda v: jnp.sort(v, 1), jnp.bfloat16),
], ids=lambda p: p if isinstance(p, str) else "")
def test_several_warpgroups_screen_too(pipeline, name, fn, dtype):
    """In a kernel of two Pallas warpgroups, each sorting its own block, the
    block-wide scalars that choose the path are each warpgroup's own
    (``block_reduce``: its own scratch slice), so the sorts take the same
    paths as in a kernel of one -- at the same cost per element, not the
    unscreened paths' (an f32 argsort 2.2 times as much) -- race-free, bit
    for bit jax's."""
    from tests.vocabulary.warpgroups import per_warpgroup_kernel

    rng = np.random.default_rng(21)
    x = (rng.standard_normal((2, *SHAPE)) * 1000).astype(dtype)
    costs = []
    for blocks in (x[:1], x):
        with smalti.jax.installed(pipeline):
            got = smalti.emulate.profile(per_warpgroup_kernel(fn, [blocks]), blocks)
        want = np.stack([np.asarray(jax.jit(fn)(b)) for b in blocks])
        assert_bits(got.outputs[0], want)
        costs.append(got.counters[INST] * 32 / blocks.size)
    one, two = costs
    assert two <= one * 1.05, (name, costs)
