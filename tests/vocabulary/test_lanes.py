"""Moves along a block's minor axis in registers (:mod:`smalti.vocabulary.lanes`,
:mod:`smalti.vocabulary.lane_exchange`) on the emulator.

Kernels bring blocks into 128-byte-swizzled SMEM by TMA (values in WGMMA's
layout, where the register path applies) or load them plainly from global
memory (where it does not: ``take`` moves them). Every result is compared
with numpy / jnp bit for bit (values only move; NaN payloads and signed
zeros included); scans and sorts, whose register path computes the same
combining tree as the ``take`` path, are compared bit for bit with that
path too. The profiler shows the register path adds no shared-memory
traffic to the identity kernel (the checker runs on every kernel, with one
and two Pallas warpgroups); the lowered module is accepted by jax's own
middle-end as well as smalti's.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax import lax
from jax.experimental.mosaic.gpu import core as mgpu_core
from jax.experimental.pallas import mosaic_gpu as plgpu

import smalti
import smalti.emulate
import smalti.jax
import smalti.vocabulary
from benchmarks.vocabulary import _transforms
from benchmarks.vocabulary import kernel as tma_kernel
from smalti.emulate.profiling import INST, WAVEFRONTS
from smalti.vocabulary import lanes
from tests.official import capture_modules
from tests.vocabulary.test_movement import data, plain_kernel
from tests.vocabulary.test_scans_sort import assert_bits, ties

F32, F16, I32 = np.dtype(np.float32), np.dtype(np.float16), np.dtype(np.int32)
BF16 = np.dtype(ml_dtypes.bfloat16)
U16 = np.dtype(np.uint16)
DTYPES = (F32, F16, BF16, I32, U16)
RNG = np.random.default_rng(41)

COLUMNS = {
    "flip": lanes.flipped(128),
    "roll 3": lanes.shifted(128, 3),
    "roll -21": lanes.shifted(128, -21),
    "roll 8": lanes.shifted(128, 8),
    **{f"xor {m}": lanes.xor_partners(128, m) for m in (1, 2, 4, 8, 3, 7, 127)},
    "permutation": tuple(int(c) for c in RNG.permutation(128)),
    "any map": tuple(int(c) for c in RNG.integers(0, 128, 128)),  # repeats: several rounds
    "relabelling": lanes.relabelling(128),  # a sort's placement back: the butterfly
}


def _bits(a: np.ndarray) -> np.ndarray:
    return np.asarray(a).view({2: np.uint16, 4: np.uint32}[np.dtype(a.dtype).itemsize])


def _want(x: np.ndarray, columns, fill=None) -> np.ndarray:
    cols = np.asarray(columns)
    got = x[..., np.maximum(cols, 0)]
    return got if fill is None else np.where(cols >= 0, got, np.asarray(fill, x.dtype))


def _inputs(shape, dtype):
    if np.dtype(dtype) == U16:
        return RNG.integers(0, 2 ** 16, shape).astype(U16)
    return data(shape, dtype, seed=5)


def _as_jax(pipeline, fn, x):
    """``fn`` of the block ``x`` on the emulator is jax's answer bit for bit."""
    with smalti.jax.installed(pipeline):
        (got,) = smalti.emulate.run(tma_kernel(fn, [x]), x)
    assert_bits(got, np.asarray(jax.jit(fn)(x)))


def _profile(pipeline, fn, x):
    with smalti.jax.installed(pipeline):
        return smalti.emulate.profile(tma_kernel(fn, [x]), x)


@pytest.mark.parametrize("name", COLUMNS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_permute_in_registers(pipeline, name, dtype):
    """Any static map of the columns, bit for bit, with no shared-memory
    traffic beyond the identity kernel's (nothing goes through SMEM)."""
    x = _inputs((64, 128), dtype)
    columns = COLUMNS[name]
    moved = _profile(pipeline, lambda v: lanes.permute(v, columns), x)
    base = _profile(pipeline, lambda v: v, x)
    np.testing.assert_array_equal(_bits(moved.outputs[0]), _bits(_want(x, columns)))
    assert moved[WAVEFRONTS] == base[WAVEFRONTS]


@pytest.mark.parametrize("shape", [(64, 64), (128, 64), (64, 256), (128, 128)])
@pytest.mark.parametrize("dtype", (F32, BF16), ids=lambda d: d.name)
def test_permute_shapes(pipeline, shape, dtype):
    x = _inputs(shape, dtype)
    n = shape[1]
    for columns in (lanes.flipped(n), lanes.shifted(n, 5), tuple(RNG.permutation(n))):
        moved = _profile(pipeline, lambda v, c=columns: lanes.permute(v, c), x)
        np.testing.assert_array_equal(_bits(moved.outputs[0]), _bits(_want(x, columns)))


@pytest.mark.parametrize("n, dtype", [(32, F32), (64, F32), (128, F32), (256, F32), (64, BF16),
                                      (128, BF16), (256, BF16)])  # TMA tiles: 128-byte rows
def test_relabelling_back_is_a_butterfly(pipeline, n, dtype):
    """A sort's relabelled positions back in column order (the lanes' bits
    exchanged with two register bits: a 4 x 4 transpose per quad) in two
    butterfly steps: bit for bit, nothing through SMEM, at most 4
    instructions per 32-bit word (a select, a shuffle and two selects per
    pair of words and step), so 2 per bf16 element, and some 20 per
    thread of lane predicates and thread ids."""
    x = _inputs((64, n), dtype)
    columns = lanes.relabelling(n)
    moved = _profile(pipeline, lambda v: lanes.permute(v, columns), x)
    base = _profile(pipeline, lambda v: v, x)
    np.testing.assert_array_equal(_bits(moved.outputs[0]), _bits(_want(x, columns)))
    assert moved[WAVEFRONTS] == base[WAVEFRONTS]
    words = x.size * dtype.itemsize // 4  # 32-bit words of the block
    assert moved[INST] - base[INST] <= 4 * words // 32 + 24 * 4  # warp instructions, 4 warps


@pytest.mark.parametrize("dtype", (F32, BF16, I32), ids=lambda d: d.name)
@pytest.mark.parametrize("s", [1, -3, 8, -64])
def test_shift_with_fill(pipeline, dtype, s):
    """A shift (no wrap-around) with the vacated columns filled."""
    x = _inputs((64, 128), dtype)
    fill = 7 if dtype == I32 else -0.0
    columns = lanes.shifted(128, s, wrap=False)
    moved = _profile(pipeline, lambda v: lanes.permute(v, columns, fill), x)
    np.testing.assert_array_equal(_bits(moved.outputs[0]), _bits(_want(x, columns, fill)))


@pytest.mark.parametrize("name", ["flip", "roll 3", "any map"])
def test_plain_loads_take_the_take_path(pipeline, name):
    """A block loaded plainly from global memory (a strided layout no
    relayout makes WGMMA's) is moved by take, with the same result."""
    x = _inputs((64, 128), F32)
    columns = COLUMNS[name]
    with smalti.jax.installed(pipeline):
        (got,) = smalti.emulate.run(plain_kernel(lambda v: lanes.permute(v, columns), [x]), x)
    np.testing.assert_array_equal(_bits(got), _bits(_want(x, columns)))


@pytest.mark.parametrize("shape, dtype, fits", [
    ((64, 128), F32, True), ((64, 8), BF16, True), ((128, 40), I32, True), ((64, 128), U16, True),
    ((64, 4), F32, False),  # not a whole WGMMA tile's 8 columns
    ((32, 128), F32, False), ((64, 128), np.dtype(np.int8), False),
    ((64, 128), np.dtype(np.bool_), False), ((128,), F32, False), ((2, 64, 64), F32, False),
])
def test_fits(shape, dtype, fits):
    assert lanes.fits(jax.core.ShapedArray(shape, dtype)) is fits


def test_other_shapes_fall_back_to_take(pipeline):
    """1-D and narrow blocks: take, the same answer."""
    for shape in [(128,), (64, 4)]:
        x = _inputs(shape, F32)
        columns = lanes.flipped(shape[-1])
        with smalti.jax.installed(pipeline):
            (got,) = smalti.emulate.run(
                plain_kernel(lambda v, c=columns: lanes.permute(v, c), [x]), x)
        np.testing.assert_array_equal(_bits(got), _bits(_want(x, columns)))


def test_lowers_under_jax_middle_end_too(pipeline):
    """The register path is a custom_primitive in WGMMA's layout: jax's own
    layout inference and dialect lowering accept it and emit the same
    shuffles smalti's does."""
    x = _inputs((64, 128), BF16)
    ours, theirs = lowered_by_both(pipeline, lambda v: lanes.permute(v, lanes.shifted(128, 3)), x)
    assert ours.count("nvvm.shfl.sync") == theirs.count("nvvm.shfl.sync") > 0


def lowered_by_both(pipeline, fn, x) -> tuple[str, str]:
    """The Lane-level module of ``fn``'s TMA kernel on ``x``, by smalti's
    middle-end and by jax's own (the vocabulary plugin installed for both)."""
    k = tma_kernel(fn, [x])
    sds = jax.ShapeDtypeStruct(x.shape, x.dtype)
    with smalti.jax.installed(pipeline):
        [ours] = capture_modules(k, sds)
        mine = mgpu_core.lower_mgpu_module
        mgpu_core.lower_mgpu_module = smalti.jax._state["original"]
        try:
            [theirs] = capture_modules(k, sds)
        finally:
            mgpu_core.lower_mgpu_module = mine
    return ours, theirs


def _blocks_kernel(fn, shape, dtype, warpgroups):
    """Each Pallas warpgroup moves its own block (of ``x[wg]``) in registers."""
    t = _transforms(dtype)

    def body(x_gmem, o_gmem, x_smem, o_smem, bar):
        wg = lax.axis_index("wg")
        plgpu.copy_gmem_to_smem(x_gmem.at[wg], x_smem.at[wg], bar.at[wg])
        plgpu.barrier_wait(bar.at[wg])
        o_smem.at[wg][...] = fn(x_smem.at[wg][...])
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(o_smem.at[wg], o_gmem.at[wg])
        plgpu.wait_smem_to_gmem(0)

    n = warpgroups
    return plgpu.kernel(
        body, out_type=jax.ShapeDtypeStruct((n, *shape), dtype),
        scratch_types=[plgpu.SMEM((n, *shape), dtype, transforms=t),
                       plgpu.SMEM((n, *shape), dtype, transforms=t),
                       plgpu.Barrier(num_barriers=n)],
        num_threads=n, thread_name="wg",
        compiler_params=plgpu.CompilerParams(
            lowering_semantics=plgpu.LoweringSemantics.Warpgroup))


def blocks_on_emulator(pipeline, fn, x):
    """(the emulator's result of ``fn`` on each warpgroup's block of ``x``,
    jnp's for each block stacked): a run that races raises."""
    with smalti.jax.installed(pipeline):
        (got,) = smalti.emulate.run(_blocks_kernel(fn, x.shape[1:], x.dtype, x.shape[0]), x)
    return got, np.stack([np.asarray(jax.jit(fn)(b)) for b in x])


VOCABULARY = {
    "flip": (lambda v: jnp.flip(v, 1), lambda v: v[:, ::-1]),
    "roll": (lambda v: jnp.roll(v, 3, 1), lambda v: np.roll(v, 3, 1)),
    "sort": (lambda v: jnp.sort(v, 1), None),
    "argsort": (lambda v: jnp.argsort(v, 1).astype(v.dtype), None),
    "cummax": (lambda v: lax.cummax(v, 1), None),
}


@pytest.mark.parametrize("warpgroups", [1, 2])
@pytest.mark.parametrize("name", VOCABULARY)
def test_warpgroups_are_race_free(pipeline, name, warpgroups):
    """Clean under the synchronization checker (emulate.run raises on a
    race) with one and two Pallas warpgroups; jnp's answer for each block."""
    fn, _ = VOCABULARY[name]
    x = data((warpgroups, 64, 128), F32, seed=9)
    with smalti.jax.installed(pipeline):
        (got,) = smalti.emulate.run(_blocks_kernel(fn, (64, 128), F32, warpgroups), x)
    want = np.stack([np.asarray(jax.jit(fn)(b)) for b in x])
    # NaN as NaN for cummax, whose NaN sign bit XLA does not define
    assert_bits(got, want, nan_equal=name == "cummax")


def _without_registers(monkeypatch):
    monkeypatch.setattr(lanes, "registers_allowed", lambda: False)


SAME_AS_TAKE = {  # (the float sums and products: test_lane_scan.py)
    "cummax": lambda v: lax.cummax(v, 1),
    "cummin rev": lambda v: lax.cummin(v, 1, reverse=True),
    "cumlogsumexp": lambda v: lax.cumlogsumexp(v, 1),
    "sort": lambda v: jnp.sort(v, 1),
    "argsort": lambda v: jnp.argsort(v, 1).astype(jnp.int32),
    "top_k": lambda v: lax.top_k(v, 8)[1],
    "sort 2": lambda v: lax.sort((v, -v), dimension=1, num_keys=1)[1],
}


@pytest.mark.parametrize("name, dtype", [
    (name, dtype) for name in SAME_AS_TAKE for dtype in (F32, BF16, I32)
    if not (name == "cumlogsumexp" and dtype == I32)],  # it takes floats only
    ids=str)
def test_scans_and_sorts_same_bits_as_take(pipeline, monkeypatch, name, dtype):
    """In registers and through take: the same bits (maxima and minima are
    exact in any order; cumlogsumexp keeps Hillis--Steele's tree; the
    sorts the same network), in fewer instructions; jnp's own answer is
    checked by test_scans_sort.py."""
    fn = SAME_AS_TAKE[name]
    x = _inputs((64, 128), dtype)
    fast = _profile(pipeline, fn, x)
    _without_registers(monkeypatch)
    slow = _profile(pipeline, fn, x)
    np.testing.assert_array_equal(_bits(fast.outputs[0]), _bits(slow.outputs[0]))
    assert fast[INST] < slow[INST]
    if name == "cumlogsumexp":  # shifts in registers: nothing through SMEM
        base = _profile(pipeline, lambda v: v, x)
        assert fast[WAVEFRONTS] == base[WAVEFRONTS]


@pytest.mark.parametrize("name, most", [("flip", 1.5), ("roll", 4)])
def test_movement_costs(pipeline, name, most):
    """Issue 37's target for movement: at most 4 extra thread-instructions
    per element (flip: one shuffle per element, roll: a shuffle and a
    select), no extra shared-memory wavefronts."""
    fn, _ = VOCABULARY[name]
    x = _inputs((64, 128), F32)
    moved, base = _profile(pipeline, fn, x), _profile(pipeline, lambda v: v, x)
    assert moved[WAVEFRONTS] == base[WAVEFRONTS]
    assert (moved[INST] - base[INST]) * 32 / x.size <= most


@pytest.mark.parametrize("shape", [(64, 128), (128, 64)])
@pytest.mark.parametrize("dimension", [0, 1])
def test_iota_in_registers(pipeline, shape, dimension):
    """The register iota: each element's row or column."""
    x = RNG.integers(-1000, 1000, shape).astype(I32)
    fn = lambda v: v + lanes.iota_p.bind(shape=v.shape, dimension=dimension)  # noqa: E731
    got = _profile(pipeline, fn, x).outputs[0]
    np.testing.assert_array_equal(got, x + np.asarray(lax.broadcasted_iota(I32, shape, dimension)))


WIDTHS = {  # results of another width than the block: slices, tiles, repeats of columns
    "strided slice": (lambda v: v[:, ::2], lambda v: v[:, ::2]),
    "unaligned slice": (lambda v: v[:, 3:67], lambda v: v[:, 3:67]),
    "stride 4 from 1": (lambda v: v[:, 1::4], lambda v: v[:, 1::4]),
    "tile": (lambda v: jnp.tile(v, (1, 2)), lambda v: np.tile(v, (1, 2))),
    "permute to 24": (lambda v: lanes.permute(v, [5, 127, 0] * 8), lambda v: v[:, [5, 127, 0] * 8]),
}


@pytest.mark.parametrize("name", WIDTHS)
@pytest.mark.parametrize("dtype", (F32, BF16), ids=lambda d: d.name)
def test_other_widths_in_registers(pipeline, monkeypatch, name, dtype):
    """Column maps whose result is narrower or wider than the block: bit for
    bit, in fewer instructions and shared wavefronts than through take, and
    within issue 37's movement target (4 extra instructions per element of
    the block) where the result is no wider."""
    fn, want = WIDTHS[name]
    x = _inputs((64, 128), dtype)
    fast = _profile(pipeline, fn, x)
    np.testing.assert_array_equal(_bits(fast.outputs[0]), _bits(want(x)))
    _without_registers(monkeypatch)
    slow = _profile(pipeline, fn, x)
    np.testing.assert_array_equal(_bits(slow.outputs[0]), _bits(want(x)))
    assert fast[INST] < slow[INST] and fast[WAVEFRONTS] < slow[WAVEFRONTS]
    if fast.outputs[0].shape[1] <= x.shape[1]:
        base = _profile(pipeline, lambda v: v, x)
        assert (fast[INST] - base[INST]) * 32 / x.size <= 4


def test_top_k_rounds_compute_only_the_columns_read_later(pipeline):
    """top_k(x, 8) of rows of 128 keeps the 8 smallest of each pair of runs
    per round; with ``live=`` its later rounds skip the dead registers: jnp's
    answer, at under 100 extra instructions per element (its full-width
    rounds cost 175), and less than sorting the whole row."""
    x = _inputs((64, 128), F32)
    base = _profile(pipeline, lambda v: v, x)
    top = _profile(pipeline, lambda v: lax.top_k(v, 8)[0], x)
    full = _profile(pipeline, lambda v: jnp.sort(v, 1), x)
    np.testing.assert_array_equal(top.outputs[0], np.asarray(jax.jit(
        lambda v: lax.top_k(v, 8)[0])(x)))
    extra = (top[INST] - base[INST]) * 32 / x.size
    assert extra < 100 and top[INST] < full[INST], extra


@pytest.mark.parametrize("axis,mask,half", [(1, 1, 1), (1, 7, 4), (1, 16, 16), (1, 127, 64),
                                            (1, 2, 32), (0, 1, 1), (0, 8, 8), (0, 63, 32)])
def test_compare_exchange_carries_the_words_past_its_keys(pipeline, axis, mask, half):
    """``keys=1``: a stage compares the float32 key alone and moves the int32
    word beside it with it, in registers (sides static, by the lane, by the
    thread's row, across warps): the key and the carried word are those of
    the same element, as the jnp stage computes, for distinct keys with
    infinities and the extreme normals among them."""
    from smalti.vocabulary import lane_exchange

    rng = np.random.default_rng(31)
    key = rng.permutation(64 * 128).reshape(64, 128).astype(np.float32) - 4000
    key[0, :4] = [np.inf, -np.inf, np.finfo(np.float32).max, np.finfo(np.float32).tiny]
    word = rng.integers(-2 ** 31, 2 ** 31 - 1, (64, 128)).astype(np.int32)

    def fn(k, w):
        k2, w2 = lane_exchange.compare_exchange([k, w], mask=mask, half=half, axis=axis, keys=1)
        return lax.bitcast_convert_type(k2, jnp.int32) ^ w2

    with smalti.jax.installed(pipeline):
        (got,) = smalti.emulate.run(tma_kernel(fn, [key, word]), key, word)
    want = np.asarray(jax.jit(lambda k, w: fn(k, w))(key, word))
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", [BF16, F16], ids=lambda d: d.name)
@pytest.mark.parametrize("mask,half", [(2, 2), (4, 4), (8, 8), (16, 16), (6, 4), (14, 8),
                                       (32, 32), (96, 64), (126, 64), (2, 32), (1, 1),
                                       (127, 64)])
def test_compare_exchange_of_a_16_bit_float_word(pipeline, dtype, mask, half):
    """A lone f16 or bf16 word: where the mask leaves a register's halves
    paired with the same halves of the partner register (bit 0 clear), both
    halves go through one packed min or max (sides static, by the lane, the
    partner in this thread or shuffled from another lane); bit 0 set, per
    element. Each stage is the jnp stage's answer bit for bit, on distinct
    values with infinities, the extreme normals and subnormals among them;
    a packed stage costs one instruction per register, plus its shuffle,
    and where the side is the lane's, the other extremum and a select."""
    from smalti.vocabulary import lane_exchange

    info = ml_dtypes.finfo(dtype)
    rng = np.random.default_rng(37)
    x = (rng.permutation(64 * 128).reshape(64, 128) / 64 - 60).astype(dtype)
    x[0, :6] = [np.inf, -np.inf, info.max, info.min, info.smallest_normal,
                info.smallest_subnormal]

    def fn(v):
        [out] = lane_exchange.compare_exchange([v], mask=mask, half=half)
        return out

    base = _profile(pipeline, lambda v: v, x)
    got = _profile(pipeline, fn, x)
    assert_bits(got.outputs[0], np.asarray(jax.jit(fn)(x)))
    per_register = (got[INST] - base[INST]) * 32 / (x.size / 2)
    if not mask & 1:  # the lane's side: a predicate made once per thread (0.5-0.7)
        shuffle, by_lane = bool(mask & 6), bool(half & 6)
        assert per_register <= 1 + shuffle + 2 * by_lane + 0.75 * by_lane, per_register
    else:  # a min or a max per element at least
        assert per_register >= 2, per_register


def test_compare_exchange_live_columns_are_checked():
    from smalti.vocabulary import lane_exchange

    words = [jnp.zeros((64, 128), jnp.int32)]
    with pytest.raises(ValueError, match="live= names each column of axis 1"):
        lane_exchange.compare_exchange(words, mask=1, half=1, live=(True,) * 64)
    with pytest.raises(ValueError, match="live= names each column of axis 1"):
        lane_exchange.compare_exchange(words, mask=1, half=1, axis=0, live=(True,) * 128)


@pytest.mark.parametrize("n", [8, 16, 32, 64, 128, 256])
def test_relabelling_is_a_bit_permutation_with_the_lane_bits_on_top(n):
    """Positions placed so that XOR partners and side bits carry over, and
    only the two top bits of a position are lane bits (columns' bits 1, 2)."""
    from smalti.vocabulary import sorting

    place = sorting.relabelling(n)
    assert sorted(place) == list(range(n))
    for m in range(n):
        column_mask = sorting._relabel_bits(m, place)
        assert all(place[p ^ m] == place[p] ^ column_mask for p in range(n))
    lane_bits = {p for p in range(n) if place[p] & 6}
    assert all(p >= n // 4 for p in lane_bits)


def test_sort_of_int32_rows_within_the_target(pipeline):
    """jnp.sort of (64, 128) int32 rows on relabelled positions: jnp's
    answer, at most issue 37's 57 extra instructions per element (2x a
    bitonic network's 28 stages of a min and a max)."""
    rng = np.random.default_rng(3)
    x = rng.integers(-1000, 1000, (64, 128)).astype(np.int32)
    base = _profile(pipeline, lambda v: v, x)
    got = _profile(pipeline, lambda v: jnp.sort(v, 1), x)
    assert_bits(got.outputs[0], np.asarray(jax.jit(lambda v: jnp.sort(v, 1))(x)))
    assert (got[INST] - base[INST]) * 32 / x.size <= 57


def _lone_specials(rng, shape, axis) -> np.ndarray:
    """Ordinary f32 values (no zero, no NaN) but for what a sort on bare
    total-order keys would get wrong, along ``axis``: in one row (column) a
    +0.0 before a -0.0 (lax.sort keeps them so, total order swaps them), in
    others a single NaN with its sign bit set (lax.sort puts it last, total
    order first)."""
    x = rng.standard_normal(shape).astype(np.float32)
    x[x == 0] = 1.0
    x = np.moveaxis(x, axis, 1)  # a view: rows along the sorted axis
    x[2, 7], x[2, 50] = 0.0, -0.0
    x[5, 3] = -np.float32(np.nan)
    x[9, 11] = np.uint32(0xFFC00123).view(np.float32)  # a payload, sign set
    return np.moveaxis(x, 1, axis)


@pytest.mark.parametrize("dtype", [F32, BF16, F16], ids=lambda d: d.name)
@pytest.mark.parametrize("axis", [1, 0])
def test_sort_screened_float_blocks(pipeline, axis, dtype):
    """A block without zeros and NaNs sorts its bare values (f16 and bf16
    two to a register: packed min and max), one with a lone pair of zeros
    or a lone NaN takes the path that keeps lax.sort's order (a wrong screen
    would swap the zeros or put the NaN first); both bit for bit jnp's, and
    the ordinary block cheaper (issue 37's 57 extra instructions per
    element along the columns; along the rows, f32 keys and the special
    blocks' int32 words take a column to a thread, column_sort.py)."""
    rng = np.random.default_rng(12)
    ordinary = rng.standard_normal((64, 128)).astype(dtype)
    ordinary[ordinary == 0] = 1
    ordinary[1, :8] = ordinary[1, 8:16]  # ties: equal values, either order right
    special = _lone_specials(rng, (64, 128), axis).astype(dtype)
    fn = lambda v: jnp.sort(v, axis)  # noqa: E731
    costs = []
    for x in (ordinary, special):
        base = _profile(pipeline, lambda v: v, x)
        got = _profile(pipeline, fn, x)
        assert_bits(got.outputs[0], np.asarray(jax.jit(fn)(x)))
        costs.append((got[INST] - base[INST]) * 32 / x.size)
    assert costs[0] <= 57 and costs[0] < costs[1] - 5, costs


@pytest.mark.parametrize("dtype", [BF16, F16], ids=lambda d: d.name)
def test_sort_screened_16_bit_blocks_of_other_shapes(pipeline, dtype):
    """f16 and bf16 blocks without zeros and NaNs, sorted on their own values
    along rows of 64 (fewer registers per row: the packed stages reach other
    lanes sooner) and along the rows of a (128, 64) block (its transpose's
    minor axis): jax's answer bit for bit."""
    rng = np.random.default_rng(43)
    for shape, axis in [((64, 64), 1), ((128, 64), 0), ((128, 64), 1)]:
        x = rng.standard_normal(shape).astype(dtype)
        x[x == 0] = 1
        _as_jax(pipeline, lambda v, axis=axis: jnp.sort(v, axis), x)


def test_sort_along_rows_through_transposes(pipeline):
    """jnp.sort and argsort along the rows of (64, 128) blocks sort the
    transpose's minor axis (two vector transposes around the register
    network, the second with the permutation back to position order folded
    into its stores): bit for bit jnp's, race-free, int32 and f32 without
    zeros and NaNs within issue 37's 43 extra instructions per element (2x a
    bitonic network of 64)."""
    rng = np.random.default_rng(13)
    ints = rng.integers(-1000, 1000, (64, 128)).astype(np.int32)
    floats = ties(rng, (64, 128), np.float32)
    normal = rng.standard_normal((64, 128)).astype(np.float32)
    for x in (ints, floats, normal):
        for fn in (lambda v: jnp.sort(v, 0), lambda v: jnp.argsort(v, 0).astype(jnp.int32)):
            _as_jax(pipeline, fn, x)
    for x in (ints, normal):
        base = _profile(pipeline, lambda v: v, x)
        got = _profile(pipeline, lambda v: jnp.sort(v, 0), x)
        assert (got[INST] - base[INST]) * 32 / x.size <= 43, x.dtype




def test_sorted_operands_without_gathers(pipeline):
    """lax.sort's outputs where the network's words already hold them:
    argsort's iota is the sorted index, and the first operand is decoded
    from its sorted keys where they keep it (integers of a narrow span;
    else read at the sorted indices). Bit for bit jax's on ties, specials
    and ordinary blocks, an iota along the other axis still read at the
    indices; an ordinary f32 argsort moves nothing through SMEM but its
    three reductions to a flag, 20 wavefronts each (the largest magnitude
    and a sample's test for a wide dynamic range before its network, the
    test of equal neighbours after it; 2,278 extra wavefronts when both
    operands were gathered)."""
    rng = np.random.default_rng(14)
    ordinary = rng.standard_normal((64, 128)).astype(np.float32)
    floats = ties(rng, (64, 128), np.float32)
    ints = rng.integers(-50, 50, (64, 128)).astype(np.int32)

    def two(v):  # a key and an iota along the rows, sorted along the columns
        return lax.sort((v, lax.broadcasted_iota(jnp.int32, v.shape, 0)), dimension=1,
                        num_keys=1)

    def argsort(v):
        return jnp.argsort(v, 1).astype(jnp.int32)

    def keys(v):
        return two(v)[0]

    def rows(v):
        return two(v)[1]

    for fn, x in [(argsort, ordinary), (argsort, floats), (argsort, ints),
                  (argsort, floats.astype(ml_dtypes.bfloat16)), (keys, floats), (keys, ordinary),
                  (keys, ints), (rows, floats)]:
        _as_jax(pipeline, fn, x)
    base = _profile(pipeline, lambda v: v, ordinary)
    sorted_ = _profile(pipeline, argsort, ordinary)
    assert sorted_[WAVEFRONTS] - base[WAVEFRONTS] <= 3 * 20


def _sort_pairs(axis):
    """An int key sorted with a float payload (num_keys=1), both read back."""
    def fn(v):
        key, payload = lax.sort((v, (v % 7).astype(jnp.float32) + 0.5), dimension=axis,
                                num_keys=1)
        return key + payload.astype(v.dtype)
    return fn


def _argsort(axis):
    return lambda v: jnp.argsort(v, axis).astype(v.dtype)


def test_integer_keys_of_a_narrow_span_share_a_word_with_their_index(pipeline):
    """A 32-bit integer key sorted with other operands shares one word with
    its index where the block's keys span less than 2**31 / 128 (2**24 for
    rows of 128): bit for bit jax's on both sides of that bound, on spans
    that wrap int32, on uint32 keys across 2**31, along either axis, with
    the key decoded and a payload read at the sorted index; an argsort of
    ids in [-50, 50) costs less than half the two-word network's
    instructions (58.3 extra per element against 146)."""
    rng = np.random.default_rng(19)
    limit = 2 ** 24
    ids = rng.integers(-50, 50, (64, 128)).astype(np.int32)
    under = rng.integers(-7, -7 + limit, (64, 128)).astype(np.int32)
    under[3, [5, 9]] = [-7, -8 + limit]  # the span is limit - 1: one word
    over = under.copy()
    over[3, 9] = -7 + limit  # the span is limit: two words
    wraps = rng.integers(-50, 50, (64, 128)).astype(np.int32)
    wraps[0, :2] = [np.iinfo(np.int32).min, np.iinfo(np.int32).max]
    unsigned = (2 ** 31 + rng.integers(-50, 50, (64, 128))).astype(np.uint32)

    for x in (ids, under, over, wraps, unsigned):
        for fn in (_argsort(1), _argsort(0), _sort_pairs(1), _sort_pairs(0)):
            _as_jax(pipeline, fn, x)
    base = _profile(pipeline, lambda v: v, ids)
    costs = [(_profile(pipeline, _argsort(1), x)[INST] - base[INST]) * 32 / x.size
             for x in (ids, wraps)]
    assert costs[0] < costs[1] / 2, costs


def test_argsort_s_iota_is_fused_into_the_sort():
    """The ``argsort`` rewrite drops an iota along the sorted axis that only
    the sort reads and marks the outputs nobody reads; it leaves an iota
    read elsewhere too, one along the other axis and one among the keys."""
    from smalti.vocabulary import sorting

    def fused(fn, *args):
        jaxpr = jax.make_jaxpr(fn)(*args).jaxpr
        while [e.primitive.name for e in jaxpr.eqns] in (["pjit"], ["jit"]):
            jaxpr = jaxpr.eqns[0].params["jaxpr"].jaxpr  # jnp's jitted function
        out = sorting.fuse(jaxpr)
        return None if out is None else [(e.primitive.name, e.params.get("indices"),
                                          e.params.get("unused")) for e in out.eqns]

    x = np.zeros((64, 128), np.float32)
    iota = lax.broadcasted_iota
    assert fused(lambda v: jnp.argsort(v, 1), x) == [
        ("smalti_sort_index", ((1, "int32"),), (0,))]
    assert fused(lambda v: jnp.argsort(v, 0), x) == [
        ("smalti_sort_index", ((1, "int32"),), (0,))]
    shared = fused(lambda v: (lambda i: lax.sort((v, i), dimension=1, num_keys=1)[1] + i)(
        iota(jnp.int32, v.shape, 1)), x)
    assert [p for p, _, _ in shared] == ["iota", "smalti_sort_index", "add"]
    assert shared[1][1:] == ((), (0,))
    across = fused(lambda v: lax.sort((v, iota(jnp.int32, v.shape, 0)), dimension=1,
                                      num_keys=1), x)
    assert across is None  # both outputs read, no iota along the axis
    keyed = fused(lambda v: lax.sort((iota(jnp.int32, v.shape, 1), v), dimension=1,
                                     num_keys=2), x)
    assert keyed is None


def test_fused_sorts_compute_jax_s_answer(pipeline):
    """Sorts through the ``argsort`` rewrite: argsort along either axis of
    f32, bf16 and int32 blocks with ties, zeros and NaNs, an iota shared
    with other code, an unread key and a payload; bit for bit jax's. A
    bf16 argsort builds no iota (4.5 instructions per element) and no key
    screen for the keys nobody reads (1.9 and 20 wavefronts): 66.1 -> 57.0
    extra instructions per element when the profiler still counted dead
    ops (60.0 without)."""
    rng = np.random.default_rng(23)
    floats = ties(rng, (64, 128), np.float32)
    blocks = [floats, floats.astype(ml_dtypes.bfloat16),
              rng.integers(-9, 9, (64, 128)).astype(np.int32)]

    def shared(v):
        i = lax.broadcasted_iota(jnp.int32, v.shape, 1)
        return lax.sort((v, i), dimension=1, num_keys=1)[1] * 2 + i

    def payload(v):
        return lax.sort((v, -v), dimension=0, num_keys=1)[1]

    fns = [lambda v: jnp.argsort(v, 1).astype(jnp.int32),
           lambda v: jnp.argsort(v, 0).astype(jnp.int32), shared, payload]
    for x in blocks:
        for fn in fns:
            _as_jax(pipeline, fn, x)
    x = rng.standard_normal((64, 128)).astype(ml_dtypes.bfloat16)
    got = _profile(pipeline, fns[0], x)
    assert_bits(got.outputs[0], np.asarray(jax.jit(fns[0])(x)))
    lines = " ".join(got.by_line)
    assert "<iota>" not in lines and "<reduce_min>" not in lines, sorted(got.by_line)


def test_top_k_and_argsort_pairs_share_their_compare(pipeline):
    """Two-word elements (an f32 key and its index) whose partner is in the
    same thread's registers compare once per pair: top_k(x, 8) within issue
    37's 57 extra instructions per element (68.1 with a compare per element)
    and jax's answer."""
    x = np.random.default_rng(15).standard_normal((64, 128)).astype(np.float32)
    base = _profile(pipeline, lambda v: v, x)
    got = _profile(pipeline, lambda v: lax.top_k(v, 8)[0], x)
    assert_bits(got.outputs[0], np.asarray(jax.jit(lambda v: lax.top_k(v, 8)[0])(x)))
    assert (got[INST] - base[INST]) * 32 / x.size <= 57


def test_float_words_along_the_rows_in_registers(pipeline):
    """A screened f32 block sorted along rows that no transpose takes (32
    columns: not a multiple of 64) runs its stages along the rows on the
    float word itself (an ordered compare and selects, the partner by
    shuffle or through the scratch across warps): jax's answer bit for bit,
    race-free (the emulator raises on a race), and the same bits as the
    integer-key path without registers; a block with zeros and NaNs takes
    the exact path and is right too."""
    rng = np.random.default_rng(17)
    ordinary = rng.standard_normal((128, 32)).astype(np.float32)
    special = ties(rng, (128, 32), np.float32)
    fn = lambda v: jnp.sort(v, 0)  # noqa: E731
    for x in (ordinary, special):
        _as_jax(pipeline, fn, x)
    base = _profile(pipeline, lambda v: v, ordinary)
    screened = _profile(pipeline, fn, ordinary)
    assert screened[WAVEFRONTS] > base[WAVEFRONTS]  # the exchanges across warps
