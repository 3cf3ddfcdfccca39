"""``take_along_axis`` of a block through SMEM, a scalar load per element
(:mod:`smalti.vocabulary.block_gather`), on the emulator against jnp on the
CPU, bit for bit: both axes, every mode (jnp's wrap of negative indices,
the fill for out-of-bounds ones, ``clip``), 16- and 32-bit types, index
blocks of another width or height than the operand; fewer instructions and
wavefronts than the ``take`` path it replaces; race-free with one and two
Pallas warpgroups; accepted by jax's own middle-end.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src.lax import slicing

import smalti.emulate
import smalti.jax
from smalti.emulate.profiling import INST, WAVEFRONTS
from smalti.vocabulary import block_gather
from smalti.vocabulary.block_gather import Checks
from tests.vocabulary.test_indexing import BF16, F32, I32, check, tma_kernel
from tests.vocabulary.test_lanes import _blocks_kernel, blocks_on_emulator, lowered_by_both
from tests.vocabulary.test_movement import data

RNG = np.random.default_rng(17)


def index_block(shape, high, *, extremes=True):
    """int32 indices in [0, high) of ``shape``; with ``extremes``, jnp's
    wrapped negatives (-1, -high) and out-of-bounds ones (high, -high - 1,
    2**31 - 1, -2**31) in the first row."""
    idx = RNG.integers(0, high, shape).astype(np.int32)
    if extremes:
        idx[0, :6] = [-1, -high, high, -high - 1, 2 ** 31 - 1, -2 ** 31]
    return idx


def test_along_axis_recognizes_take_along_axis_only():
    f32 = jax.core.ShapedArray((64, 128), np.float32)
    i3 = jax.core.ShapedArray((64, 32, 1), np.int32)
    for axis in (0, 1):
        other = 1 - axis
        dn = slicing.GatherDimensionNumbers(
            offset_dims=(), collapsed_slice_dims=(axis,), start_index_map=(axis,),
            operand_batching_dims=(other,), start_indices_batching_dims=(other,))
        idx = jax.core.ShapedArray((64, 32, 1) if axis == 1 else (16, 128, 1), np.int32)
        assert block_gather.along_axis(f32, idx, dn, (1, 1)) == axis
        assert block_gather.along_axis(f32, idx, dn, (1, 2)) is None
    rows = slicing.GatherDimensionNumbers(offset_dims=(1,), collapsed_slice_dims=(0,),
                                          start_index_map=(0,))
    assert block_gather.along_axis(f32, i3, rows, (1, 128)) is None  # x[idx]: whole rows
    dn1 = slicing.GatherDimensionNumbers(
        offset_dims=(), collapsed_slice_dims=(1,), start_index_map=(1,),
        operand_batching_dims=(0,), start_indices_batching_dims=(0,))
    wrong_batch = jax.core.ShapedArray((128, 32, 1), np.int32)
    assert block_gather.along_axis(f32, wrong_batch, dn1, (1, 1)) is None


@pytest.mark.parametrize("dtype", (F32, BF16, I32), ids=lambda d: d.name)
@pytest.mark.parametrize("width", [128, 64])
def test_along_the_columns(pipeline, dtype, width):
    x = data((64, 128), dtype)
    check(pipeline, lambda x, i: jnp.take_along_axis(x, i, axis=1), x,
          index_block((64, width), 128))


@pytest.mark.parametrize("dtype", (F32, BF16, I32), ids=lambda d: d.name)
@pytest.mark.parametrize("height", [64, 128])
def test_along_the_rows(pipeline, dtype, height):
    x = data((64, 128), dtype)
    check(pipeline, lambda x, i: jnp.take_along_axis(x, i, axis=0), x,
          index_block((height, 128), 64))


@pytest.mark.parametrize("axis", [0, 1])
def test_clip_mode(pipeline, axis):
    x = data((64, 128), F32)
    idx = index_block((64, 128), x.shape[axis])
    check(pipeline, lambda x, i: jnp.take_along_axis(x, i, axis=axis, mode="clip"), x, idx)


@pytest.mark.parametrize("axis", [0, 1])
def test_promise_in_bounds(pipeline, axis):
    x = data((64, 128), I32)
    idx = index_block((64, 128), x.shape[axis], extremes=False)
    check(pipeline,
          lambda x, i: jnp.take_along_axis(x, i, axis=axis, mode="promise_in_bounds"), x, idx)


@pytest.mark.parametrize("axis", [0, 1])
def test_cheaper_than_take(pipeline, monkeypatch, axis):
    """The same bits as the ``take`` path; beyond a kernel that moves the
    same blocks unchanged, at most a third of its instructions (both count
    the index block's load into registers and the test of jnp's wrapped
    indices) and
    fewer shared wavefronts (random indices: the loads' banks depend on
    the data)."""
    x = data((64, 128), F32)
    idx = index_block((64, 128), x.shape[axis])
    k = tma_kernel(lambda x, i: jnp.take_along_axis(x, i, axis=axis), [x, idx])
    with smalti.jax.installed(pipeline):
        base = smalti.emulate.profile(tma_kernel(lambda x, i: x, [x, idx]), x, idx)
        fast = smalti.emulate.profile(k, x, idx)
        monkeypatch.setattr(block_gather, "fits", lambda *a: None)
        slow = smalti.emulate.profile(k, x, idx)
    np.testing.assert_array_equal(fast.outputs[0].view(np.uint32),
                                  slow.outputs[0].view(np.uint32))
    assert (fast[INST] - base[INST]) * 3 < slow[INST] - base[INST]
    assert fast[WAVEFRONTS] < slow[WAVEFRONTS]


@pytest.mark.parametrize("name", ["gather", "gather rows 1", "gather bf16", "gather rows bf16"])
def test_within_issue_37s_bounds(pipeline, name):
    """The benchmark's gathers (f32 and bf16, either axis, the index block
    the data's own bits): jnp's bits; beyond the identity kernel, the
    indices' own computation left out, at most 4 thread-instructions per
    element, and at most twice the ideal wavefronts: one conflict-free
    write pass and the reads at the indices' own bank conflicts
    (``benchmarks.vocabulary.gather_reads``)."""
    from benchmarks import vocabulary as bench

    [entry] = [e for e in bench.entries() if e.name == name]
    _, _, lowers, equal, why, spent = bench.row(entry, pipeline)
    assert lowers and equal, why
    wavefronts, ideal_wavefronts, inst, _ = spent
    assert inst <= 4 and wavefronts <= 2 * ideal_wavefronts, spent


def test_gather_reads_counts_the_indices_own_conflicts():
    """The benchmark's ideal read pass of a (64, 128) f32 gather: one
    wavefront per warp-wide load where every lane of a row reads the same
    element (the 8 rows of a load on distinct banks at the best padding),
    about 3.5 for random indices, and never below one per load."""
    from benchmarks.vocabulary import gather_reads

    loads = 64 * 128 // 32
    assert gather_reads(np.zeros((64, 128), np.int32), 1, 4) == loads
    assert gather_reads(np.zeros((64, 128), np.int32), 0, 4) == loads
    random = gather_reads(RNG.integers(0, 128, (64, 128)), 1, 4)
    assert 3.2 * loads < random < 3.8 * loads
    assert gather_reads(np.tile(np.arange(128), (64, 1)), 1, 4) >= loads


def test_plain_loads_take_the_take_path(pipeline):
    """An operand loaded plainly from GMEM (strided layout) has no WGMMA
    registers: the gather is indexing's, with the same answer."""
    from tests.vocabulary.test_movement import plain_kernel

    x = data((64, 128), F32)
    idx = index_block((64, 128), 128)
    fn = lambda x, i: jnp.take_along_axis(x, i, axis=1)  # noqa: E731
    with smalti.jax.installed(pipeline):
        (got,) = smalti.emulate.run(plain_kernel(fn, [x, idx]), x, idx)
    want = np.asarray(jax.jit(fn)(x, idx))
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("warpgroups", [1, 2])
@pytest.mark.parametrize("axis", [0, 1])
def test_warpgroups_are_race_free(pipeline, warpgroups, axis):
    """Each Pallas warpgroup gathers from its own block in its own scratch
    slice (the index block is the data's own bits, masked)."""
    def fn(v):
        i = jax.lax.bitcast_convert_type(v, jnp.int32) & (v.shape[axis] - 1)
        return jnp.take_along_axis(v, i, axis=axis)

    got, want = blocks_on_emulator(pipeline, fn, data((warpgroups, 64, 128), F32))
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def test_lowers_under_jax_middle_end_too(pipeline):
    x = data((64, 128), F32)

    def fn(v):
        return jnp.take_along_axis(v, jax.lax.bitcast_convert_type(v, jnp.int32) & 127, axis=1)

    ours, theirs = lowered_by_both(pipeline, fn, x)
    # a scalar load per element of a thread's 64 (and one the kernel has anyway)
    assert ours.count("memref.load") == theirs.count("memref.load") >= 64 * 128 // 128


@pytest.mark.parametrize("fn", [lambda x: jnp.sort(x, 1), lambda x: jnp.sort(x, 0),
                                lambda x: jax.lax.sort((x, -x), dimension=1, num_keys=1)[1]],
                         ids=["sort", "sort cols", "payload"])
def test_sorts_read_at_the_sorted_indices_through_it(pipeline, monkeypatch, fn):
    """A float32 sort reads its zeros and NaNs (whose bits its keys do not
    keep), a sort of several operands its payload, at the sorted indices:
    through this gather, the same bits in fewer instructions than through
    ``take``. (argsort reads nothing: its index is the network's.)"""
    x = data((64, 128), F32)
    x.flat[::37] = 0.0
    x.flat[5::53] = -0.0
    k = tma_kernel(fn, [x])
    with smalti.jax.installed(pipeline):
        fast = smalti.emulate.profile(k, x)
        monkeypatch.setattr(block_gather, "fits", lambda *a: None)
        slow = smalti.emulate.profile(k, x)
    want = np.asarray(jax.jit(fn)(x))
    for prof in (fast, slow):
        np.testing.assert_array_equal(prof.outputs[0].view(np.uint32), want.view(np.uint32))
    assert fast[INST] < slow[INST]


@pytest.mark.parametrize("dtype", (F32, BF16, I32), ids=lambda d: d.name)
@pytest.mark.parametrize("axis", [1, 0])
def test_one_pick_per_line_through_it(pipeline, monkeypatch, dtype, axis):
    """Cross-entropy's pick, ``take_along_axis(y, label[:, None], 1)``, and
    one per column, ``take_along_axis(y, label[None, :], 0)``: the labels
    broadcast to a whole tile, gathered there and taken back to (n, 1) or
    (1, n): jnp's bits (out-of-bounds and negative labels included) in
    fewer instructions than through ``take``."""
    y = data((64, 128), dtype)
    labels = np.full((64, 128), -10 ** 6, np.int32)
    if axis == 1:
        labels[:, 0] = index_block((1, 64), 128)[0]
        fn = lambda y, i: y[:, :8] - jnp.take_along_axis(  # noqa: E731
            y, jnp.max(i, 1)[:, None], axis=1)
    else:
        labels[0, :] = index_block((1, 128), 64)[0]
        fn = lambda y, i: y - jnp.take_along_axis(y, jnp.max(i, 0)[None, :], axis=0)  # noqa: E731
    k = tma_kernel(fn, [y, labels])
    with smalti.jax.installed(pipeline):
        fast = smalti.emulate.profile(k, y, labels)
        monkeypatch.setattr(block_gather, "fits", lambda *a, **kw: None)
        slow = smalti.emulate.profile(k, y, labels)
    want = np.asarray(jax.jit(fn)(y, labels))
    for prof in (fast, slow):
        np.testing.assert_array_equal(prof.outputs[0].view(want.dtype), want)
    assert fast[INST] < slow[INST]


@pytest.mark.parametrize("dtype", [np.uint32, np.uint16, np.int16], ids=lambda d: d.__name__)
def test_fill_of_unsigned_and_16_bit_types(pipeline, dtype):
    """jnp's fill for out-of-bounds indices is the type's largest unsigned
    or most negative signed value: as a constant of the element type."""
    x = RNG.integers(0, 1000, (64, 128)).astype(dtype)
    check(pipeline, lambda x, i: jnp.take_along_axis(x, i, axis=1), x,
          index_block((64, 128), 128))


def spy_checks(monkeypatch, force: Checks | None = None) -> list[Checks]:
    """The checks each block gather lowered takes (``force``: made those)."""
    taken: list[Checks] = []
    real = block_gather.checks_for

    def recording(indices, limit, mode):
        read, checks = real(indices, limit, mode)
        if force is not None:
            read, checks = indices, force
        taken.append(checks)
        return read, checks
    monkeypatch.setattr(block_gather, "checks_for", recording)
    return taken


def profiles(pipeline, monkeypatch, fn, *args):
    """(taken checks, profile, profile with the mode's checks forced) of a
    TMA kernel of ``fn``, both outputs jnp's bits."""
    k = tma_kernel(fn, list(args))
    want = np.asarray(jax.jit(fn)(*args))
    with smalti.jax.installed(pipeline), pytest.MonkeyPatch.context() as mp:
        taken = spy_checks(mp)
        found = smalti.emulate.profile(k, *args)
        mp.undo()
        spy_checks(mp, force=Checks.BY_MODE)
        forced = smalti.emulate.profile(k, *args)
    for prof in (found, forced):
        np.testing.assert_array_equal(prof.outputs[0].view(np.uint32), want.view(np.uint32))
    return taken, found, forced


@pytest.mark.parametrize("axis", [0, 1])
def test_indices_known_in_bounds_are_not_checked(pipeline, monkeypatch, axis):
    """``idx & (n - 1)`` lies in the axis: no clamp, compare or select (jnp's
    wrap of it is dead), the same bits in fewer instructions."""
    x = data((64, 128), F32)
    n = x.shape[axis]
    taken, found, forced = profiles(
        pipeline, monkeypatch, lambda x, i: jnp.take_along_axis(x, i & (n - 1), axis=axis), x,
        index_block((64, 128), n))
    assert taken == [Checks.NONE]
    assert found[INST] < forced[INST]


@pytest.mark.parametrize("axis", [0, 1])
def test_jnps_wrap_is_folded_into_the_fill(pipeline, monkeypatch, axis):
    """Unknown indices under jnp's default mode: valid in [-n, n), read at
    ``c & (n - 1)`` -- negative, out-of-bounds and the int32 extremes give
    jnp's bits, in fewer instructions than the wrap and the fill's checks."""
    x = data((64, 128), F32)
    taken, found, forced = profiles(
        pipeline, monkeypatch, lambda x, i: jnp.take_along_axis(x, i, axis=axis), x,
        index_block((64, 128), x.shape[axis]))
    assert taken == [Checks.WRAPPED]
    assert found[INST] < forced[INST]


def test_clip_keeps_the_wrap_and_the_clamp(pipeline, monkeypatch):
    """clip(wrap(c)) is not ``c & (n - 1)`` below -n: the mode's checks."""
    x = data((64, 128), F32)
    taken, _, _ = profiles(
        pipeline, monkeypatch, lambda x, i: jnp.take_along_axis(x, i, axis=1, mode="clip"), x,
        index_block((64, 128), 128))
    assert taken == [Checks.BY_MODE]


def test_an_axis_not_a_power_of_two(pipeline, monkeypatch):
    """96 columns: jnp's wrap cannot be an ``and``, so the mode's checks; a
    non-negative remainder by 96 is known in bounds."""
    x = data((64, 96), F32)
    idx = index_block((64, 96), 96)
    taken, _, _ = profiles(pipeline, monkeypatch,
                           lambda x, i: jnp.take_along_axis(x, i, axis=1), x, idx)
    assert taken == [Checks.BY_MODE]
    taken, found, forced = profiles(
        pipeline, monkeypatch,
        lambda x, i: jnp.take_along_axis(x, jax.lax.rem(i & (2 ** 31 - 1), 96), axis=1), x, idx)
    assert taken == [Checks.NONE]
    assert found[INST] < forced[INST]


@pytest.mark.parametrize("dtype", (F32, BF16), ids=lambda d: d.name)
@pytest.mark.parametrize("cols", [128, 64, 24])
@pytest.mark.parametrize("axis", [0, 1])
def test_the_stores_are_conflict_free(pipeline, dtype, cols, axis):
    """The copy of the block goes into padded rows (24 columns need none;
    the block is a slice of a TMA-loaded one): its stores take the ideal
    wavefronts, one per 128 bytes."""
    x = data((64, 128), dtype)
    idx = index_block((64, 128), 64 if axis == 0 else cols, extremes=False)

    def fn(x, i):
        return jnp.take_along_axis(x[:, :cols], i[:, :cols], axis=axis)

    stores = WAVEFRONTS + "_op_st"
    with smalti.jax.installed(pipeline):
        base = smalti.emulate.profile(tma_kernel(lambda x, i: x[:, :cols], [x, idx]), x, idx)
        prof = smalti.emulate.profile(tma_kernel(fn, [x, idx]), x, idx)
    np.testing.assert_array_equal(prof.outputs[0].view(np.uint16),
                                  np.asarray(jax.jit(fn)(x, idx)).view(np.uint16))
    assert prof[stores] - base[stores] == 64 * cols * x.itemsize // 128
    assert block_gather.padded((64, cols), x.itemsize)[1] == cols + (0 if cols == 24 else 8)


def test_transposes_beside_it_keep_their_fast_path(pipeline, monkeypatch):
    """With two Pallas warpgroups the gather's padded copy makes each
    warpgroup's share of the scratch larger than a block: a transpose in the
    same kernel still takes its register path at that stride -- race-free,
    jnp's bits, fewer instructions than its ``take`` fallback."""
    from smalti.vocabulary import smem_transpose

    def fn(v):
        i = jax.lax.bitcast_convert_type(v, jnp.int32) & 127
        return (jnp.take_along_axis(v, i, axis=1).T * 2).T

    x = data((2, 64, 128), F32)
    want = np.stack([np.asarray(jax.jit(fn)(b)) for b in x])
    k = _blocks_kernel(fn, (64, 128), F32, 2)
    with smalti.jax.installed(pipeline):
        fast = smalti.emulate.profile(k, x)
        monkeypatch.setattr(smem_transpose, "fits_slices", lambda ctx, aval: False)
        slow = smalti.emulate.profile(k, x)
    for prof in (fast, slow):
        np.testing.assert_array_equal(prof.outputs[0].view(np.uint32), want.view(np.uint32))
    assert fast[INST] * 2 < slow[INST]


def _rows_of(b):  # an index per row: a reduction along the rows (the row layout)
    return jnp.max(b, 1)


def _cols_of(b):  # an index per column: a reduction along the columns (the column layout)
    return jnp.max(b, 0)


WHOLE_LINES = {
    # x[idx]: whole rows, by indices of either layout or from an iota
    "rows by rows": (lambda x, b: x[_rows_of(b)], (64, 64)),
    "rows by columns": (lambda x, b: x[_cols_of(b)[:64]], (128, 64)),
    "rows by iota": (lambda x, b: x[(jnp.arange(64) * 7 - 3) % 64], (64, 64)),
    # x[:, idx] and jnp.take (its fill mode): whole columns
    "columns by columns": (lambda x, b: x[:, _cols_of(b)], (128, 128)),
    "take columns": (lambda x, b: jnp.take(x, _cols_of(b), axis=1), (128, 128)),
    "columns by iota": (lambda x, b: x[:, (jnp.arange(128) * 5) % 128], (128, 128)),
}


@pytest.mark.parametrize("case", list(WHOLE_LINES))
def test_whole_rows_and_columns_through_it(pipeline, monkeypatch, case):
    """``x[idx]``, ``x[:, idx]`` and ``jnp.take(x, idx, 1)``: the (k,) index
    broadcast across the lines into a block and gathered element by element
    -- jnp's bits (negative and out-of-bounds indices clamped, or the fill
    for ``take``), fewer instructions than the ``take`` path (the iota
    cases did not lower at all before: no layout for their index)."""
    from smalti.vocabulary import indexing

    fn, (n, high) = WHOLE_LINES[case]
    x = data((64, 128), F32)
    b = index_block((64, 128), high)
    if n == 128:  # the column indices run along the first row
        b[:] = -10 ** 6
        b[0] = index_block((1, 128), high)[0]
    else:
        b[:, 1:] = -10 ** 6
    k = tma_kernel(fn, [x, b])
    want = np.asarray(jax.jit(fn)(x, b))
    with smalti.jax.installed(pipeline):
        fast = smalti.emulate.profile(k, x, b)
        np.testing.assert_array_equal(fast.outputs[0].view(np.uint32), want.view(np.uint32))
        if "iota" in case:
            return
        monkeypatch.setattr(indexing, "_whole_lines", lambda *a: None)
        slow = smalti.emulate.profile(k, x, b)
    np.testing.assert_array_equal(slow.outputs[0].view(np.uint32), want.view(np.uint32))
    assert fast[INST] < slow[INST]


def test_columns_by_row_indices_transpose_the_index_block(pipeline, monkeypatch):
    """``x[:, jnp.argmax(y, 1)]``: indices in the row layout, which no
    relayout makes the columns' (a broadcast across the rows fails
    inference): the index is broadcast along the columns and the block
    transposed -- jnp's bits, fewer instructions than the ``take`` path."""
    from smalti.vocabulary import indexing

    x, y = data((64, 128), F32, 1), data((64, 128), F32, 2)
    x.flat[:6] = 0.0
    fn = lambda x, y: y[:, jnp.argmax(x, 1)]  # noqa: E731
    k = tma_kernel(fn, [x, y])
    want = np.asarray(jax.jit(fn)(x, y))
    with smalti.jax.installed(pipeline):
        fast = smalti.emulate.profile(k, x, y)
        monkeypatch.setattr(indexing, "_whole_lines", lambda *a: None)
        slow = smalti.emulate.profile(k, x, y)
    for prof in (fast, slow):
        np.testing.assert_array_equal(prof.outputs[0], want)
    assert fast[INST] < slow[INST]


@pytest.mark.parametrize("warpgroups", [1, 2])
def test_whole_lines_are_race_free(pipeline, warpgroups):
    """Rows by an index per row, columns by an iota's indices and by an
    index per row (the transposed index block): each Pallas warpgroup
    gathers from its own block in its own scratch slice."""
    def fn(v):
        per_row = jnp.max(jax.lax.bitcast_convert_type(v, jnp.int32) & 127, 1)
        rows = v[per_row % 64]
        cols = v[:, (jnp.arange(128) * 5) % 128]
        across = v[:, per_row]
        return rows + cols + jnp.concatenate([across, across], 1)

    got, want = blocks_on_emulator(pipeline, fn, data((warpgroups, 64, 128), F32))
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
