"""Moves of a block's rows (:mod:`smalti.vocabulary.rows`) on the emulator.

Kernels bring blocks into 128-byte-swizzled SMEM by TMA (WGMMA's layout:
the SMEM path, or shuffles for a xor within a warp) or load them plainly
from global memory (``take``). Results are compared with numpy bit for bit
(values only move); the scans and sorts along the rows with the ``take``
path bit for bit (the same combining tree and network). The profiler shows
the SMEM path's traffic is one conflict-free write and read pass of the
block; the checker runs on every kernel, with one and two Pallas
warpgroups; jax's own middle-end accepts the lowered module.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import smalti.emulate
import smalti.jax
from benchmarks.vocabulary import kernel as tma_kernel
from smalti.emulate.profiling import INST, WAVEFRONTS
from smalti.vocabulary import lanes
from smalti.vocabulary import rows as row_moves
from smalti.vocabulary.rows import RowMap, classify
from tests.vocabulary.test_lanes import (
    BF16,
    F32,
    I32,
    U16,
    _bits,
    _blocks_kernel,
    _inputs,
    _profile,
    _without_registers,
    lowered_by_both,
)
from tests.vocabulary.test_movement import plain_kernel
from tests.vocabulary.test_scans_sort import assert_bits

DTYPES = (F32, BF16, I32, U16)
RNG = np.random.default_rng(43)


def _xor(n: int, m: int) -> tuple[int, ...]:
    return tuple(r ^ m for r in range(n))


#: row maps of 64 rows: name -> (rows, fill, whether they cross warps)
ROWS = {
    "flip": (lanes.flipped(64), None, True),
    "roll 3": (lanes.shifted(64, 3), None, True),
    "roll -21": (lanes.shifted(64, -21), None, True),
    "roll 16": (lanes.shifted(64, 16), None, True),
    "shift 1": (lanes.shifted(64, 1, wrap=False), -0.0, True),
    "shift -5": (lanes.shifted(64, -5, wrap=False), 7, True),
    "shift 32": (lanes.shifted(64, 32, wrap=False), 3, True),
    "xor 16": (_xor(64, 16), None, True),
    "xor 63": (_xor(64, 63), None, True),
    "xor 1": (_xor(64, 1), None, False),
    "xor 7": (_xor(64, 7), None, False),
    "xor 8": (_xor(64, 8), None, False),
    "xor 15": (_xor(64, 15), None, False),
}


def _want(x: np.ndarray, rows, fill=None) -> np.ndarray:
    index = np.asarray(rows)
    got = x[np.maximum(index, 0)]
    if fill is None:
        return got
    return np.where((index >= 0)[:, None], got, np.asarray(fill).astype(x.dtype))


@pytest.mark.parametrize("rows, mapping", [
    (lanes.flipped(64), RowMap(0, mask=63)),  # a power of two: a xor
    (lanes.flipped(192), RowMap(-1, 191)),
    (lanes.shifted(64, 3), RowMap(1, 61)),
    (lanes.shifted(64, -3, wrap=False), RowMap(1, 3, wrap=False)),
    (_xor(64, 5), RowMap(0, mask=5)),
    (tuple(range(64)), RowMap(0)),
    (tuple(reversed(lanes.shifted(64, 5))), RowMap(-1, 58)),
    ((1, 0, 2, 3), None),  # a swap of two rows: neither a xor nor affine
    ((0, 0, 1, 1), None),
])
def test_classify(rows, mapping):
    assert classify(rows) == mapping
    if mapping is not None:
        assert tuple(mapping.source(r, len(rows)) for r in range(len(rows))) == rows


@pytest.mark.parametrize("name", ROWS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_permute_rows(pipeline, name, dtype):
    """Bit for bit; across warps one write and one read pass of the block
    through SMEM, free of bank conflicts (2 B / 128 wavefronts beyond the
    identity kernel's); within a warp no SMEM traffic at all."""
    rows, fill, crosses = ROWS[name]
    if dtype in (I32, U16) and fill is not None:
        fill = 7
    x = _inputs((64, 128), dtype)
    moved = _profile(pipeline, lambda v: row_moves.permute(v, rows, fill), x)
    base = _profile(pipeline, lambda v: v, x)
    np.testing.assert_array_equal(_bits(moved.outputs[0]), _bits(_want(x, rows, fill)))
    extra = moved[WAVEFRONTS] - base[WAVEFRONTS]
    assert extra == (2 * x.nbytes // 128 if crosses else 0)


@pytest.mark.parametrize("shape", [(128, 64), (64, 256), (192, 64), (64, 64)])
@pytest.mark.parametrize("dtype", (F32, BF16), ids=lambda d: d.name)
def test_permute_rows_shapes(pipeline, shape, dtype):
    """Several row groups (registers ``g``), a row count that is not a
    power of two (its wrap is a remainder), narrower and wider rows."""
    x = _inputs(shape, dtype)
    n = shape[0]
    maps = [(lanes.flipped(n), None), (lanes.shifted(n, 70), None),
            (lanes.shifted(n, -9, wrap=False), 1.5)]
    if n & (n - 1) == 0:
        maps += [(_xor(n, n - 1), None), (_xor(n, 64 % n), None)]
    for rows, fill in maps:
        moved = _profile(pipeline, lambda v, r=rows, f=fill: row_moves.permute(v, r, f), x)
        np.testing.assert_array_equal(_bits(moved.outputs[0]), _bits(_want(x, rows, fill)))


def test_other_maps_and_plain_loads_take_the_take_path(pipeline):
    """A row map that is no RowMap, and a block loaded plainly from global
    memory: take, the same answer."""
    x = _inputs((64, 128), F32)
    swap = (1, 0, *range(2, 64))
    for rows, make in [(swap, tma_kernel), (lanes.flipped(64), plain_kernel)]:
        with smalti.jax.installed(pipeline):
            (got,) = smalti.emulate.run(make(lambda v, r=rows: row_moves.permute(v, r), [x]), x)
        np.testing.assert_array_equal(_bits(got), _bits(_want(x, rows)))


def test_permute_rejects_bad_rows():
    x = jnp.zeros((64, 8), jnp.float32)
    with pytest.raises(ValueError, match="rows must be 64 indices"):
        row_moves.permute(x, range(63))
    with pytest.raises(ValueError, match="or -1 with a fill"):
        row_moves.permute(x, [-1] * 64)
    np.testing.assert_array_equal(row_moves.permute(x, [-1] * 64, 2.0), np.full((64, 8), 2.0))


@pytest.mark.parametrize("dtype", (F32, BF16), ids=lambda d: d.name)
def test_rev_rows_cost(pipeline, dtype):
    """Issue 37's movement target for a flip of the rows: at most 4 extra
    thread-instructions per element and the ideal wavefronts (was 45.5 and
    512 through take in f32)."""
    x = _inputs((64, 128), dtype)
    moved = _profile(pipeline, lambda v: v[::-1], x)
    base = _profile(pipeline, lambda v: v, x)
    np.testing.assert_array_equal(_bits(moved.outputs[0]), _bits(x[::-1]))
    assert moved[WAVEFRONTS] - base[WAVEFRONTS] == 2 * x.nbytes // 128
    assert (moved[INST] - base[INST]) * 32 / x.size <= 4


def test_lowers_under_jax_middle_end_too(pipeline):
    """The SMEM path is a custom_primitive in WGMMA's layout reading
    dynamic SMEM at the reserved offset: jax's own layout inference and
    dialect lowering accept it and emit the same accesses smalti's does."""
    x = _inputs((64, 128), F32)
    ours, theirs = lowered_by_both(pipeline, lambda v: row_moves.permute(v, lanes.flipped(64)), x)
    assert ours.count("memref.view") == theirs.count("memref.view") > 0
    assert ours.count("vector.load") == theirs.count("vector.load") > 0


ALONG_ROWS = {
    "flip": (lambda v: jnp.flip(v, 0), lambda v: v[::-1]),
    "flip both": (lambda v: v[::-1, ::-1], lambda v: v[::-1, ::-1]),
    "cummin": (lambda v: lax.cummin(v, 0), None),
    "cumsum rev": (lambda v: lax.cumsum(v, 0, reverse=True), None),
    "cumlogsumexp": (lambda v: lax.cumlogsumexp(v, 0), None),
    "sort": (lambda v: jnp.sort(v, 0), None),
    "argsort": (lambda v: jnp.argsort(v, 0).astype(v.dtype), None),
}


@pytest.mark.parametrize("warpgroups", [1, 2])
@pytest.mark.parametrize("name", ALONG_ROWS)
def test_warpgroups_are_race_free(pipeline, name, warpgroups):
    """Clean under the synchronization checker (emulate.run raises on a
    race) with one and two Pallas warpgroups, each through its own slice of
    the scratch; jnp's answer for each block (bit for bit where exact)."""
    fn, _ = ALONG_ROWS[name]
    sums = name in ("cumsum rev", "cumlogsumexp")
    x = (RNG.standard_normal((warpgroups, 64, 128)) * 100).astype(F32) if sums \
        else _inputs((warpgroups, 64, 128), F32)
    with smalti.jax.installed(pipeline):
        (got,) = smalti.emulate.run(_blocks_kernel(fn, (64, 128), F32, warpgroups), x)
    if not sums:  # NaN as NaN for cummin, whose NaN sign bit XLA does not define
        want = np.stack([np.asarray(jax.jit(fn)(b)) for b in x])
        assert_bits(got, want, nan_equal=name == "cummin")
        return
    # the bounds: a sequential sum along the rows (lane_scan.py), at most 63
    # roundings; cumlogsumexp's ceil(log2 64) = 6 levels (scans.py)
    x64 = x.astype(np.float64)
    if name == "cumsum rev":
        want = np.flip(np.cumsum(np.flip(x64, 1), 1), 1)
        bound = 63 * 2.0 ** -24 * np.flip(np.cumsum(np.flip(np.abs(x64), 1), 1), 1)
    else:
        want = np.logaddexp.accumulate(x64, axis=1)
        bound = 6 * 4 * 2.0 ** -23 * (np.abs(want) + 1)
    assert np.all(np.abs(got - want) <= bound)


@pytest.mark.parametrize("name, dtype", [
    (name, dtype) for name in ("cummin", "cumsum rev", "cumlogsumexp", "sort", "argsort")
    for dtype in (F32, BF16, I32)
    # cumlogsumexp takes floats only; float sums take another order (test_lane_scan.py)
    if (name, dtype == I32) not in (("cumlogsumexp", True), ("cumsum rev", False))], ids=str)
def test_along_rows_same_bits_as_take(pipeline, monkeypatch, name, dtype):
    """Row moves and take: the same combining tree and network, so the
    same bits, in fewer instructions and wavefronts."""
    fn, _ = ALONG_ROWS[name]
    x = _inputs((64, 128), dtype)
    fast = _profile(pipeline, fn, x)
    _without_registers(monkeypatch)
    slow = _profile(pipeline, fn, x)
    np.testing.assert_array_equal(_bits(fast.outputs[0]), _bits(slow.outputs[0]))
    assert fast[INST] < slow[INST]
    assert fast[WAVEFRONTS] < slow[WAVEFRONTS]
