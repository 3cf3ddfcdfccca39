"""Scans and sorting inside Pallas Mosaic GPU kernels (``vocabulary/scans.py``,
``vocabulary/sorting.py``), on the emulator, against numpy (float64) and jnp
on the CPU.

Bounds (``u``: f32's unit roundoff, 2**-24; ``i``: the number of elements
combined before element ``i`` along the scan; ``n``: the axis length):

| function | f32 | f16 / bf16 (computed in f32, rounded once) | int32 |
|---|---|---|---|
| cumsum | ``ceil(log2 n) u sum|x|`` | that + 1/2 ulp | exact (wrapping) |
| cumprod | ``i u |prod|`` (first order) | that + 1/2 ulp | exact (wrapping) |
| cumlogsumexp | ``4 ceil(log2 n) eps (|r| + 1)`` | that + 1/2 ulp | - |
| cummax, cummin | exact | exact | exact |
| sort, argsort, lax.sort, top_k | exact | exact | exact |

"exact" is bit for bit equal to jnp on the CPU (NaN compared as NaN for
cummax/cummin, whose NaN sign bit XLA does not define). Inputs have ties,
duplicates, NaN (both signs), +-0 and +-inf; blocks are (16, 128) but for
one (64, 128) sort, a non-power-of-two axis and a 1-D block. Each kernel
computes several functions (one output each) to keep the file fast.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax import lax
from jax.experimental.pallas import mosaic_gpu as plgpu

import smalti
import smalti.emulate
import smalti.jax
import smalti.vocabulary
from smalti.diagnostics import SmaltiError
from smalti.vocabulary import sorting

WG = plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup)
F32, F16, BF16, I32 = (np.dtype(d) for d in (np.float32, np.float16, ml_dtypes.bfloat16,
                                              np.int32))
U = 2.0 ** -24


@pytest.fixture(scope="module")
def pipeline():
    return smalti.build_pipeline(plugins={"smalti.vocabulary": smalti.vocabulary})


def kernel(fns, args):
    """One kernel: every ``fn`` of ``fns`` applied to the loaded inputs, one
    output (or two, for top_k) each."""
    structs = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in args]
    outs = []
    for fn in fns:
        out = jax.eval_shape(fn, *structs)
        outs += list(out) if isinstance(out, (tuple, list)) else [out]

    def body(*refs):
        ins, outs_refs = refs[:len(args)], refs[len(args):]
        values = [r[...] for r in ins]
        results = []
        for fn in fns:
            r = fn(*values)
            results += list(r) if isinstance(r, (tuple, list)) else [r]
        for ref, r in zip(outs_refs, results):
            ref[...] = r

    return plgpu.kernel(body, out_type=tuple(jax.ShapeDtypeStruct(o.shape, o.dtype) for o in outs),
                        compiler_params=WG)


def emulate(pipeline, fns, *args):
    with smalti.jax.installed(pipeline):
        return smalti.emulate.run(kernel(fns, args), *args)


def jnp_answers(fns, *args):
    out = []
    for fn in fns:
        r = jax.jit(fn)(*args)
        out += [np.asarray(a) for a in (r if isinstance(r, (tuple, list)) else [r])]
    return out


def bits(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a)
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[a.dtype.itemsize])


def assert_bits(got, want, *, nan_equal=False):
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape
    if nan_equal and got.dtype.kind not in "iu":
        nan = np.isnan(want.astype(np.float32))
        assert np.array_equal(nan, np.isnan(got.astype(np.float32)))
        got, want = (np.where(nan, 0, got).astype(got.dtype),
                     np.where(nan, 0, want).astype(got.dtype))
    bad = bits(got) != bits(want)
    assert not bad.any(), f"{bad.sum()} differ, first at {np.argwhere(bad)[0]}: " \
                          f"{got[tuple(np.argwhere(bad)[0])]} vs {want[tuple(np.argwhere(bad)[0])]}"


# --- inputs -------------------------------------------------------------------------------


def ties(rng, shape, dtype) -> np.ndarray:
    """Few distinct values (ties, duplicates) and specials: NaN of both signs,
    +-0, +-inf; integers with their extremes."""
    dtype = np.dtype(dtype)
    n = int(np.prod(shape))
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        v = rng.integers(info.min, int(info.max) + 1, n, dtype=np.int64)
        v[::3] = rng.integers(-3, 4, v[::3].size)
        v[:4] = [info.min, info.max, info.min, 0]
        return v.astype(dtype).reshape(shape)
    v = (rng.integers(-8, 9, n) / 2).astype(dtype)
    specials = np.array([0.0, -0.0, np.nan, -np.nan, np.inf, -np.inf], np.float32).astype(dtype)
    where = rng.choice(n, n // 5, replace=False)
    v[where] = specials[rng.integers(0, specials.size, where.size)]
    return v.reshape(shape)


def spacing(v: np.ndarray, dtype) -> np.ndarray:
    """One ulp of ``dtype`` at |v|."""
    info = ml_dtypes.finfo(dtype)
    a = np.maximum(np.abs(v), float(info.smallest_normal))
    return 2.0 ** (np.floor(np.log2(a)) - info.nmant)


def along(fn, x, axis, reverse):
    """numpy's sequential ``fn`` (float64) as a scan along ``axis``."""
    flip = (lambda a: np.flip(a, axis)) if reverse else (lambda a: a)
    return flip(fn(flip(x), axis))


def count_before(shape, axis, reverse):
    i = np.arange(shape[axis])[::-1] if reverse else np.arange(shape[axis])
    return np.expand_dims(i, 1 - axis) if len(shape) == 2 else i


# --- scans --------------------------------------------------------------------------------

SHAPE = (16, 128)
FLOAT_SCANS = [  # (name, fn of (x, y, z), axis, reverse)
    ("cumsum", lambda x, y, z: jnp.cumsum(x, 1), 1, False),
    ("cumsum", lambda x, y, z: lax.cumsum(x, 0, reverse=True), 0, True),
    ("cumprod", lambda x, y, z: jnp.cumprod(z, 1), 1, False),
    ("cumlogsumexp", lambda x, y, z: lax.cumlogsumexp(x * 8, 1, reverse=True), 1, True),
    ("cummax", lambda x, y, z: lax.cummax(y, 0), 0, False),
    ("cummin", lambda x, y, z: lax.cummin(y, 1, reverse=True), 1, True),
]


def _float_inputs(dtype, seed=3):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(SHAPE).astype(dtype)
    x[:, 5] = 0.0
    x[3, :] = -0.0
    y = ties(rng, SHAPE, dtype)
    y[:, 9] = -0.0  # zeros of both signs met by max and min
    y[:, 10] = 0.0
    z = rng.uniform(0.9, 1.1, SHAPE).astype(dtype)
    return x, y, z


def _float_truth(name, x, y, z, axis, reverse):
    x64, z64 = (np.asarray(a).astype(np.float64) for a in (x, z))
    n = SHAPE[axis]
    depth = math.ceil(math.log2(n))
    if name == "cumsum":
        return along(np.cumsum, x64, axis, reverse), \
            depth * U * along(np.cumsum, np.abs(x64), axis, reverse)
    if name == "cumprod":
        want = along(np.cumprod, z64, axis, reverse)
        i = count_before(SHAPE, axis, reverse)
        return want, (i * U) * (1 + i * U) * np.abs(want)
    want = along(np.logaddexp.accumulate, x64 * 8, axis, reverse)
    return want, 4 * depth * 2 * U * (np.abs(want) + 1)


@pytest.mark.parametrize("dtype", [F32, F16, BF16], ids=lambda d: d.name)
def test_float_scans(pipeline, dtype):
    x, y, z = _float_inputs(dtype)
    fns = [fn for _, fn, _, _ in FLOAT_SCANS]
    got = emulate(pipeline, fns, x, y, z)
    jnp_got = jnp_answers(fns, x, y, z)
    for (name, _, axis, reverse), g, j in zip(FLOAT_SCANS, got, jnp_got):
        assert g.dtype == dtype, name
        if name in ("cummax", "cummin"):
            assert_bits(g, j, nan_equal=True)
            continue
        want, bound = _float_truth(name, x, y, z, axis, reverse)
        if dtype != F32:
            bound = bound + 0.5 * spacing(want, dtype) * (1 + 2 ** -8)
        err = np.abs(g.astype(np.float64) - want)
        assert np.all(err <= bound), (name, axis, reverse, float((err / bound).max()))


INT_SCANS = [
    lambda x: jnp.cumsum(x, 0),
    lambda x: lax.cumsum(x, 1, reverse=True),
    lambda x: jnp.cumprod(x, 1),
    lambda x: lax.cummax(x, 1, reverse=True),
    lambda x: lax.cummin(x, 0),
]


def test_int32_scans(pipeline):
    """Exact: sums and products wrap as in jnp."""
    x = ties(np.random.default_rng(4), SHAPE, I32)
    for g, w in zip(emulate(pipeline, INT_SCANS, x), jnp_answers(INT_SCANS, x)):
        assert_bits(g, w)


def test_one_dimensional(pipeline):
    """A 1-D block of 256: the longest axis; scans, sort, and top_k of all
    256 (the whole network rather than runs of k)."""
    rng = np.random.default_rng(5)
    x = ties(rng, (256,), F32)
    v = rng.standard_normal(256).astype(np.float32)
    fns = [lambda x, v: jnp.sort(x), lambda x, v: lax.cummax(x, 0, reverse=True),
           lambda x, v: jnp.cumsum(v), lambda x, v: lax.top_k(x, 256)]
    got = emulate(pipeline, fns, x, v)
    want = jnp_answers(fns, x, v)
    assert_bits(got[0], want[0])
    assert_bits(got[1], want[1], nan_equal=True)
    v64 = v.astype(np.float64)
    assert np.all(np.abs(got[2] - np.cumsum(v64)) <= 8 * U * np.cumsum(np.abs(v64)))
    for g, w in zip(got[3:], want[3:]):
        assert_bits(g, w)


# --- sorting ------------------------------------------------------------------------------


def test_sort_f32_large(pipeline):
    """jnp.sort of a (64, 128) f32 block along its rows: stable (-0.0 and 0.0
    equal and in their order, NaNs of either sign last in theirs)."""
    x = ties(np.random.default_rng(6), (64, 128), F32)
    fns = [lambda x: jnp.sort(x, 1)]
    assert_bits(emulate(pipeline, fns, x)[0], jnp_answers(fns, x)[0])


EDGES = {  # dtype: (ordinary bit patterns, zeros, subnormals and NaNs)
    F32: ([0x00800000, 0x80800000, 0x00800001, 0x7F7FFFFF, 0xFF7FFFFF, 0x7F800000, 0xFF800000,
           0x3F800000, 0xBF800000],
          [0x00000000, 0x80000000, 0x00000001, 0x80000001, 0x007FFFFF, 0x7F800001, 0x7FC00000,
           0x7FFFFFFF, 0xFF800001, 0xFFC00000, 0xFFFFFFFF]),
    BF16: ([0x0080, 0x8080, 0x7F7F, 0xFF7F, 0x7F80, 0xFF80, 0x3F80],
           [0x0000, 0x8000, 0x0001, 0x807F, 0x7F81, 0x7FC0, 0x7FFF, 0xFF81, 0xFFFF]),
    F16: ([0x0400, 0x8400, 0x7BFF, 0xFBFF, 0x7C00, 0xFC00, 0x3C00],
          [0x0000, 0x8000, 0x0001, 0x83FF, 0x7C01, 0x7E00, 0x7FFF, 0xFC01, 0xFFFF]),
}


@pytest.mark.parametrize("dtype", list(EDGES), ids=lambda d: d.name)
def test_has_zero_subnormal_or_nan_on_edge_values(dtype):
    """The block-wide screen of the float sorts: true exactly where a zero, a
    subnormal or a NaN (either sign, any payload) is in the block; the
    smallest normal numbers, the largest finite ones and infinities are
    ordinary."""
    ordinary, special = EDGES[dtype]
    unsigned = np.uint32 if dtype.itemsize == 4 else np.uint16
    edges = np.array(ordinary, unsigned).view(dtype)
    assert not bool(jax.jit(sorting._has_zero_subnormal_or_nan)(edges))
    for bits_ in special:
        block = edges.copy()
        block[4] = np.array(bits_, unsigned).view(dtype)
        assert bool(jax.jit(sorting._has_zero_subnormal_or_nan)(block)), hex(bits_)


def test_high_sort_key_on_every_bfloat16():
    """The bfloat16 key made in its word's high half, on all 65,536 bit
    patterns: IEEE order with zeros of both signs one key and NaNs of any
    sign and payload one key above +inf's, subnormals and infinities in
    order, the low half zero (left for the index); and every other value
    decoded back from it bit for bit."""
    bits = np.arange(2 ** 16, dtype=np.uint32).astype(np.uint16)
    x = bits.view(BF16)
    high = np.asarray(jax.jit(sorting.high_sort_key)(x)).astype(np.int64)
    magnitude = (bits & 0x7FFF).astype(np.int64)
    key = np.where(bits & 0x8000, -magnitude, magnitude)
    key = np.where(magnitude > 0x7F80, 0x7FFF, key)  # NaNs: one, above +inf
    np.testing.assert_array_equal(high, key << 16)
    ordinary = (magnitude > 0) & (magnitude <= 0x7F80)
    back = np.asarray(jax.jit(sorting.from_high_sort_key, static_argnums=1)(
        high.astype(np.int32) | 0x1234, BF16))
    np.testing.assert_array_equal(back.view(np.uint16)[ordinary], bits[ordinary])


SORTS = [
    lambda x: jnp.sort(x, 0),
    lambda x: jnp.argsort(x, 1),
    lambda x: jnp.argsort(x, 0),
    lambda x: lax.top_k(x, 8),
]


@pytest.mark.parametrize("dtype", [F32, F16, BF16, I32], ids=lambda d: d.name)
def test_sort_argsort_top_k(pipeline, dtype):
    x = ties(np.random.default_rng(7), SHAPE, dtype)
    for g, w in zip(emulate(pipeline, SORTS, x), jnp_answers(SORTS, x)):
        assert_bits(g, w)


def test_sort_several_operands(pipeline):
    """lax.sort on two keys (f32 with ties, then int32) carrying an f16
    payload; and on one key carrying two (num_keys=1)."""
    rng = np.random.default_rng(8)
    a = ties(rng, SHAPE, F32)
    b = rng.integers(-2, 3, SHAPE).astype(np.int32)
    c = rng.standard_normal(SHAPE).astype(np.float16)
    fns = [lambda a, b, c: lax.sort((a, b, c), dimension=1, num_keys=2),
           lambda a, b, c: lax.sort((c.astype(jnp.bfloat16), a, b), dimension=0, num_keys=1,
                                    is_stable=True)]
    for g, w in zip(emulate(pipeline, fns, a, b, c), jnp_answers(fns, a, b, c)):
        assert_bits(g, w)


def test_non_power_of_two_axis(pipeline):
    """An axis of 96: padded to 128 inside, cut back by the reading take."""
    rng = np.random.default_rng(9)
    x = ties(rng, (16, 96), F32)
    y = ties(rng, (16, 96), F16)
    fns = [lambda x, y: jnp.sort(x, 1), lambda x, y: jnp.argsort(y, 1),
           lambda x, y: lax.top_k(x, 8), lambda x, y: jnp.cumsum(y.astype(jnp.int32), 1)]
    for g, w in zip(emulate(pipeline, fns, x, y), jnp_answers(fns, x, y)):
        assert_bits(g, w)


# --- what Pallas sees: resources, refusals ------------------------------------------------


def test_resource_estimates():
    """The scratch of the largest take: the whole block in the compute type
    (scans), an int32 word of the padded block or an operand (sorts)."""
    from jax._src import core as jax_core

    from smalti.vocabulary import scans, sorting

    def aval(shape, dtype):
        return jax_core.ShapedArray(shape, np.dtype(dtype))

    assert scans.estimate_scan(None, aval((16, 128), F16), axis=1, reverse=False) \
        .smem_scratch_bytes == 16 * 128 * 4
    assert scans.estimate_scan(None, aval((16, 128), I32), axis=0, reverse=True) \
        .smem_scratch_bytes == 16 * 128 * 4
    assert sorting.estimate_sort(None, aval((16, 96), F16), dimension=1, is_stable=True,
                                 num_keys=1).smem_scratch_bytes == 16 * 128 * 4
    assert sorting.estimate_top_k(None, aval((8, 128), F32), k=4, axis=1) \
        .smem_scratch_bytes == 8 * 128 * 4


def _refusal(pipeline, fn, x, *, located=True):
    with smalti.jax.installed(pipeline), pytest.raises(SmaltiError) as info:
        smalti.emulate.run(kernel([fn], [x]), x)
    error = info.value
    assert error.code == "SM206" and isinstance(error, NotImplementedError) and error.fixes
    if located:  # inside jnp's jit wrappers Pallas keeps only the primitive's name
        assert error.location and "test_scans_sort.py" in error.location
    return error


def test_sort_results_move_on_in_plain_load_kernels(pipeline):
    """Sorts whose block came from a plain load of global memory, moved
    again (flip, roll) or scanned: the later rule must see, through the
    sort's long chain of ops, that its operand comes from that load (a
    strided layout) and take ``take``'s path. The walk that decides it
    compared ops by ``id()`` of temporary Python objects, which a freed
    object hands on to another op: it lost the load, took the register path
    and the load failed to lower (SM203). An f32 sort of such a block is not
    screened: the screen's reduction cannot take a strided layout either."""
    x = ties(np.random.default_rng(16), (64, 128), F32)
    fns = [lambda v: jnp.flip(jnp.sort(v.astype(jnp.int32), 1), 1),
           lambda v: jnp.roll(jnp.argsort(v, 1), 3, 1),
           lambda v: jnp.flip(jnp.argsort(v, 1).astype(jnp.float32), 1),
           lambda v: jnp.cumsum(jnp.sort(v, 1), 1),
           lambda v: jnp.flip(jnp.sort(v, 1), 1)]  # f32: not screened (a strided block)
    for fn in fns:
        (got,) = emulate(pipeline, [fn], x)
        want = np.asarray(jax.jit(fn)(x))
        if got.dtype.kind == "f":
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
        else:
            assert_bits(got, want)


def test_refusals(pipeline):
    long_axis = np.zeros((2, 512), np.float32)
    assert "512" in _refusal(pipeline, lambda x: lax.sort(x, dimension=1), long_axis).message
    assert "512" in _refusal(pipeline, lambda x: lax.cumsum(x, 1), long_axis).message
    assert "512" in _refusal(pipeline, lambda x: jnp.sort(x, 1), long_axis, located=False).message
    flags = np.zeros(SHAPE, np.int32)
    assert "bool" in _refusal(pipeline, lambda x: lax.sort(x > 0, dimension=1), flags).message


@pytest.mark.parametrize("fn", [lambda v: lax.cumsum(v, 1), lambda v: lax.cummax(v, 0),
                                lambda v: jnp.sort(v, 1), lambda v: lax.top_k(v, 4)[0],
                                lambda v: jnp.argsort(v, 0),
                                lambda v: jnp.argsort((v * 8).astype(jnp.int32), 1)],
                         ids=["cumsum", "cummax", "sort", "top_k", "argsort", "argsort ids"])
def test_several_warpgroups_scan_and_sort_through_slices_of_their_own(pipeline, fn):
    """Two Pallas warpgroups, each its own (64, 64) block: each takes through
    its own slice of the scratch, clean under the synchronization checker,
    jnp's answer for each block."""
    x = np.random.default_rng(37).standard_normal((2, 64, 64)).astype(np.float32)
    out = jax.eval_shape(fn, jax.ShapeDtypeStruct((64, 64), jnp.float32))

    def body(x_ref, o_ref):
        wg = lax.axis_index("wg")
        o_ref[wg] = fn(x_ref[wg])

    k = plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((2, *out.shape), out.dtype),
                     compiler_params=WG, num_threads=2, thread_name="wg")
    with smalti.jax.installed(pipeline):
        (got,) = smalti.emulate.run(k, x)
    want = np.stack([np.asarray(jax.jit(fn)(a)) for a in x])
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-5)


def test_jax_alone_refuses_them():
    x = np.ones(SHAPE, np.float32)
    for fn in (lambda x: jnp.cumsum(x, 1), lambda x: jnp.sort(x, 1),
               lambda x: lax.top_k(x, 2)[0]):
        with pytest.raises(NotImplementedError):
            smalti.emulate.run(kernel([fn], [x]), x)
