"""The tensor-core adder model (emulate/tensorcore.py) against a scalar
re-statement of its documented rule in exact rational arithmetic, on edge
values -- both ways the model is computed: numpy's planes and the compiled
sum (emulate/tensorcore_compiled.py, where numba is installed, as it is with
the test dependencies); the model against the H200 itself is
tests/emulate/test_hardware.py."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from smalti.emulate import tensorcore, tensorcore_compiled


@pytest.fixture(params=[False, True], ids=["numpy", "compiled"])
def compiled(request) -> bool:
    """Which way mma computes its sum: numpy's planes or the compiled kernel."""
    if request.param and not tensorcore_compiled.installed():
        pytest.skip("numba is not installed (pip install smalti[fast])")
    return request.param


def exponent(x: float, low: int) -> int | None:
    return None if x == 0 else max(math.floor(math.log2(abs(x))), low)


def rule(a_row, b_row, c: float, accumulator: str, low: int = -14) -> float:
    """One output: the four steps of the module's docstring, one term at a time."""
    terms = [(Fraction(float(x)) * Fraction(float(y)),
              None if x == 0 or y == 0 else exponent(x, low) + exponent(y, low))
             for x, y in zip(a_row, b_row)]
    terms.append((Fraction(float(c)), exponent(float(c), -14 if accumulator == "f16" else -126)))
    emax = max(e for _, e in terms if e is not None) if any(e is not None for _, e in terms) else 0
    unit = Fraction(2) ** (emax - 25)
    total = sum((math.trunc(v / unit) * unit for v, _ in terms), Fraction(0))
    if accumulator == "f16":
        with np.errstate(over="ignore"):
            return float(np.float16(float(total)))  # float(total) is exact here
    f = np.float32(float(total))
    if abs(Fraction(float(f))) > abs(total):
        f = np.nextafter(f, np.float32(0))
    return float(f)


def reference(a, b, c, accumulator):
    return np.array([[rule(a[m], b[n], c[m, n], accumulator) for n in range(b.shape[0])]
                     for m in range(a.shape[0])])


def f16(values) -> np.ndarray:
    return np.asarray(values, np.float16).astype(np.float64)


@pytest.mark.parametrize("accumulator", ["f32", "f16"])
def test_random_and_edge_operands_follow_the_rule(accumulator, compiled):
    rng = np.random.default_rng(0)
    a = f16(rng.standard_normal((8, 16)) * 2.0 ** rng.integers(-16, 8, (8, 16)))
    b = f16(rng.standard_normal((8, 16)))
    a[0] = 0  # all products zero
    a[1, :8] = f16([2.0 ** -24, -2.0 ** -24, 2.0 ** -20, 65504, -65504, 1, -0.0, 3 * 2.0 ** -15])
    b[2] = f16(2.0 ** -14 * np.arange(16))  # subnormal and smallest normal operands
    c = rng.standard_normal((8, 8)).astype(np.float32 if accumulator == "f32" else np.float16)
    c[3, 3] = 0
    got = tensorcore.mma(a, b, c, operands="f16", accumulator=accumulator, compiled=compiled)
    want = reference(a, b, c.astype(np.float64), accumulator)
    np.testing.assert_array_equal(got.astype(np.float64), want)


def test_truncation_drops_what_an_exact_sum_keeps(compiled):
    # 1 + 3 * 2**-26: truncated 25 bits below 2**0 -> 1 + 2**-25 -> rounded
    # towards zero to f32 -> 1.0; an exact sum rounded to nearest is also 1.0,
    # but 1 + 2**-23 + 2**-26 * 3 shows the truncation: exact -> 1 + 2**-23 (RN),
    # the adder keeps 2**-23 + 2**-25 -> rounds towards zero -> 1 + 2**-23.
    a = f16([[1.0, 2.0 ** -12, 2.0 ** -13] + [0] * 13])
    b = f16([[1.0, 2.0 ** -11, 3 * 2.0 ** -13] + [0] * 13])
    got = tensorcore.mma(a, b, None, operands="f16", accumulator="f32", compiled=compiled)
    assert got[0, 0] == np.float32(1 + 2.0 ** -23)
    assert got[0, 0] == rule(a[0], b[0], 0.0, "f32")


def test_a_negative_sum_rounds_towards_zero(compiled):
    a = f16([[1.0, -(2.0 ** -12)] + [0] * 14])
    b = f16([[-1.0, 2.0 ** -12] + [0] * 14])  # -1 - 2**-24: towards zero is -1
    got = tensorcore.mma(a, b, None, operands="f16", accumulator="f32", compiled=compiled)
    assert got[0, 0] == np.float32(-1.0)


def test_infinities_and_nan_propagate_as_ieee(compiled):
    a = f16([[np.inf, 1.0] + [0] * 14, [-np.inf, 1.0] + [0] * 14])
    b = f16([[1.0, 1.0] + [0] * 14, [-0.5, np.inf] + [0] * 14])
    with np.errstate(invalid="ignore"):
        got = tensorcore.mma(a, b, None, operands="f16", accumulator="f32", compiled=compiled)
    assert got[0, 0] == np.inf  # inf * 1 + 1 * 1
    assert got[1, 0] == -np.inf  # -inf * 1 + 1 * 1
    assert np.isnan(got[0, 1])  # inf * -0.5 + 1 * inf


def test_an_overflowing_sum_saturates_towards_zero(compiled):
    a = f16([[65504.0] * 16])
    b = f16([[65504.0] * 16])
    c = np.full((1, 1), np.finfo(np.float32).max, np.float32)
    got = tensorcore.mma(a, b, c, operands="f16", accumulator="f32", compiled=compiled)
    assert got[0, 0] == np.finfo(np.float32).max


def tf32(values) -> np.ndarray:
    """f32 values truncated to tf32 (low 13 bits cleared), as float64."""
    v = np.asarray(values, np.float32).view(np.uint32) & np.uint32(0xFFFFE000)
    return v.view(np.float32).astype(np.float64)


def test_tf32_operands_across_the_f32_range_follow_the_rule(compiled):
    """The model's assumptions for tf32 (K = 8): products of 11-bit significands
    with exponents from -126 (the smallest normal) to 127 are exact in float64,
    and the shifted sum stays exact -- at both ends of the range, where f16
    and bf16 operands never reach together."""
    rng = np.random.default_rng(1)
    a = tf32(rng.uniform(1, 2, (8, 8)) * 2.0 ** rng.integers(-126, 64, (8, 8))
             * rng.choice([-1, 1], (8, 8)))
    b = tf32(rng.uniform(1, 2, (8, 8)) * 2.0 ** rng.integers(-126, 64, (8, 8)))
    a[0] = tf32(2.0 ** -126 * (1 + np.arange(8) / 1024))  # products near 2^-252
    b[0] = tf32(np.full(8, 2.0 ** -126))
    a[1, :2] = tf32([2.0 ** 63 * 1.999, -(2.0 ** 63) * 1.999])  # cancelling giants
    b[1, :2] = tf32([2.0 ** 63, 2.0 ** 63])
    c = (rng.standard_normal((8, 8)) * 2.0 ** rng.integers(-126, 100, (8, 8))).astype(np.float32)
    c[0, 0] = np.float32(2.0 ** -126)  # an accumulator far above products of 2^-252
    got = tensorcore.mma(a, b, c, operands="tf32", accumulator="f32", compiled=compiled)
    want = np.array([[rule(a[m], b[n], c[m, n], "f32", low=-126) for n in range(8)]
                     for m in range(8)])
    np.testing.assert_array_equal(got.astype(np.float64), want)
    assert got[0, 0] == np.float32(2.0 ** -126)  # the 2^-252 products fall below the 25 bits


FORMATS = {"f16": np.float16, "bf16": "bfloat16", "e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2",
           "tf32": None}


def edge_operands(rng, shape, fmt: str) -> np.ndarray:
    """Values of ``fmt`` over its whole range (subnormals, the largest finite,
    zeros of both signs), as float64."""
    if fmt == "tf32":
        return tf32(rng.uniform(1, 2, shape) * 2.0 ** rng.integers(-126, 100, shape)
                    * rng.choice([-1, 1, 0, -0.0], shape, p=[.45, .45, .05, .05]))
    import ml_dtypes
    dt = np.dtype(getattr(ml_dtypes, FORMATS[fmt]) if isinstance(FORMATS[fmt], str)
                  else FORMATS[fmt])
    info = ml_dtypes.finfo(dt)
    low, high = int(np.log2(float(info.smallest_subnormal))), int(np.log2(float(info.max)))
    x = rng.standard_normal(shape) * 2.0 ** rng.integers(low - 2, high + 1, shape)
    x[rng.random(shape) < 0.1] = 0
    x[rng.random(shape) < 0.05] = -0.0
    x.flat[:2] = [float(info.max), -float(info.smallest_subnormal)]
    return np.clip(x, -float(info.max), float(info.max)).astype(dt).astype(np.float64)


@pytest.mark.parametrize("operands,accumulator,k", [
    ("f16", "f32", 16), ("f16", "f16", 16), ("bf16", "f32", 16), ("tf32", "f32", 8),
    (("e4m3", "e5m2"), "f32", 32), (("e5m2", "e5m2"), "f16", 32)])
def test_the_plane_by_plane_sum_has_the_reference_bits(operands, accumulator, k, compiled):
    """mma (term by term over (M, N) planes) against mma_reference (the four
    steps over (M, N, K) arrays), bit for bit: every operand format and
    accumulator, edge values, no accumulator, all-zero rows and accumulators
    far above and below the products (so f16 and fp8 terms go through both
    the float32 and the float64 planes)."""
    rng = np.random.default_rng(7)
    fa, fb = (operands, operands) if isinstance(operands, str) else operands
    acc_type = np.float32 if accumulator == "f32" else np.float16
    word = np.uint32 if accumulator == "f32" else np.uint16
    for trial in range(20):
        a, b = edge_operands(rng, (16, k), fa), edge_operands(rng, (16, k), fb)
        a[trial % 16] = 0
        low, high = (-149, 127) if accumulator == "f32" else (-24, 15)
        c = (rng.standard_normal((16, 16)) * 2.0 ** rng.integers(low, high, (16, 16)))
        with np.errstate(over="ignore"):
            c = c.astype(acc_type)
        c[rng.random((16, 16)) < 0.2] = rng.choice([0.0, -0.0])
        for acc in (c, None):
            got = tensorcore.mma(a, b, acc, operands=operands, accumulator=accumulator,
                                 compiled=compiled)
            want = tensorcore.mma_reference(a, b, acc, operands=operands, accumulator=accumulator)
            assert got.dtype == want.dtype == acc_type
            np.testing.assert_array_equal(got.view(word), want.view(word))


def test_infinite_terms_take_the_reference_path(compiled):
    a = f16([[np.inf, 1.0] + [0] * 14])
    b = f16([[1.0, 1.0] + [0] * 14])
    c = np.full((1, 1), np.nan, np.float32)
    with np.errstate(invalid="ignore"):
        got = tensorcore.mma(a, b, None, operands="f16", accumulator="f32", compiled=compiled)
        assert got[0, 0] == np.inf
        assert np.isnan(tensorcore.mma(f16([[1.0] * 16]), f16([[1.0] * 16]), c,
                                       operands="f16", accumulator="f32", compiled=compiled)[0, 0])


def test_rounding_towards_zero_to_f32_across_the_range():
    """Step 4 for an f32 accumulator, both ways it is computed (the float64
    bits dropped inside float32's normal range; otherwise rounding to nearest
    and stepping back): the f32 value nearest zero no farther than the sum."""
    rng = np.random.default_rng(3)
    inner = rng.uniform(1, 2, 4000) * 2.0 ** rng.integers(-126, 128, 4000) * \
        rng.choice([-1, 1], 4000)
    inner[:4] = [2.0 ** -126, -(2.0 ** 128 - 2.0 ** 75), 1 + 2.0 ** -24, -(1 + 2.0 ** -23)]
    edges = np.concatenate([inner, [0.0, -0.0, 2.0 ** -140, -(2.0 ** -149) * 1.5, 2.0 ** 130]])
    with np.errstate(over="ignore"):  # the largest finite f32's step away is infinite
        for s in (inner, edges):
            got = tensorcore._round_towards_zero_f32(s)
            assert got.dtype == np.float32
            assert (np.abs(got.astype(np.float64)) <= np.abs(s)).all()
            away = np.nextafter(got, np.copysign(np.float32(np.inf), got)).astype(np.float64)
            finite = np.abs(s) < float(np.finfo(np.float32).max)
            assert (np.abs(away[finite]) > np.abs(s[finite])).all()
            assert (np.signbit(got) == np.signbit(s)).all()
        assert tensorcore._round_towards_zero_f32(np.array([2.0 ** 130]))[0] == \
            np.finfo(np.float32).max


@pytest.mark.parametrize("fmt,k", [("f16", 16), ("e4m3", 32), ("e5m2", 32), ("f16", 8)])
def test_the_largest_alignment_by_one_matrix_product_is_the_maximum(fmt, k):
    """The f16/fp8 emax (a sum of 2 ** (q (E(a) + E(b))) by one matrix
    product) against the maximum taken term by term: extreme exponents at
    both ends, all K terms at the top (the sum's largest), zero operands."""
    rng = np.random.default_rng(11)
    a, b = edge_operands(rng, (24, k), fmt), edge_operands(rng, (24, k), fmt)
    import ml_dtypes
    info = ml_dtypes.finfo(getattr(ml_dtypes, FORMATS[fmt]) if fmt != "f16" else np.float16)
    a[0], b[0] = float(info.max), float(info.max)  # every term at the largest exponent
    a[1], b[1] = float(info.smallest_subnormal), -float(info.smallest_subnormal)
    a[2] = 0.0  # no nonzero term in row 2
    low = tensorcore.MIN_EXPONENT[fmt]
    got = tensorcore._largest_alignment_by_matmul(a, b, low, low)
    ea, eb = tensorcore._exponents(a, low), tensorcore._exponents(b, low)
    align = ea[:, None, :] + eb[None, :, :]
    want = np.where(align.max(axis=2) < tensorcore._NONE // 2, tensorcore._NONE,
                    align.max(axis=2))
    np.testing.assert_array_equal(got, want)
    assert (got[2] == tensorcore._NONE).all() and got[0, 0] == 2 * ea[0, 0]


@pytest.fixture
def compiled_calls(monkeypatch) -> list:
    """The compiled sum's calls (it returns zeros), numba taken as installed."""
    calls: list = []

    def spy(*args):
        calls.append(args)
        return np.zeros((args[0].shape[0], args[1].shape[0]))
    monkeypatch.setattr(tensorcore_compiled, "aligned_sum", spy)
    monkeypatch.setattr(tensorcore_compiled, "installed", lambda: True)
    monkeypatch.delenv(tensorcore_compiled.SWITCH, raising=False)
    return calls


def test_mma_takes_the_compiled_sum_where_available_and_not_switched_off(monkeypatch,
                                                                          compiled_calls):
    """By default mma adds through the compiled kernel where numba is
    installed (once loaded); SMALTI_EMULATE_COMPILED=0 (or compiled=False)
    keeps numpy's."""
    calls = compiled_calls
    _let_a_loader_finish()
    monkeypatch.setattr(tensorcore_compiled, "_loaded", lambda *args: None)
    a, b = f16(np.ones((2, 16))), f16(np.ones((3, 16)))
    assert tensorcore.mma(a, b, None, operands="f16", accumulator="f32").shape == (2, 3)
    assert len(calls) == 1
    monkeypatch.setenv(tensorcore_compiled.SWITCH, "0")
    assert not tensorcore_compiled.available()
    assert (tensorcore.mma(a, b, None, operands="f16", accumulator="f32") == 16).all()
    assert (tensorcore.mma(a, b, None, operands="f16", accumulator="f32",
                           compiled=False) == 16).all()
    assert len(calls) == 1


def _let_a_loader_finish() -> None:
    """Waits for a loading thread this process started (in an earlier test),
    which would otherwise set the loaded kernel in the middle of a test."""
    if tensorcore_compiled._loader is not None:
        tensorcore_compiled._loader.join(timeout=120)


@pytest.fixture
def fresh_loading(monkeypatch):
    """The loading state of a process that has summed nothing yet, with a
    loader that takes what ``load`` gives (a kernel, or an exception)."""
    _let_a_loader_finish()
    monkeypatch.setattr(tensorcore_compiled, "LOAD_AFTER", 3)
    monkeypatch.setattr(tensorcore_compiled, "_numpy_sums", 0)
    monkeypatch.setattr(tensorcore_compiled, "_loaded", None)
    monkeypatch.setattr(tensorcore_compiled, "_loader", None)
    monkeypatch.setattr(tensorcore_compiled, "_load_failed", [])
    load: list = []

    def kernel():
        if isinstance(load[0], Exception):
            raise load[0]
        tensorcore_compiled._loaded = load[0]
        return load[0]
    monkeypatch.setattr(tensorcore_compiled, "kernel", kernel)
    return load


def test_a_process_adds_its_first_sums_with_numpy_then_loads_beside(fresh_loading,
                                                                    compiled_calls):
    """A small kernel does not wait for numba: the first LOAD_AFTER sums of a
    process are numpy's, the next start a thread that loads the compiled
    adder (sums stay numpy's meanwhile), the sums after it run compiled."""
    fresh_loading.append(lambda *args: None)
    a, b = f16(np.ones((2, 16))), f16(np.ones((3, 16)))

    def numpy_sum() -> bool:
        return bool((tensorcore.mma(a, b, None, operands="f16", accumulator="f32") == 16).all())
    assert [numpy_sum() for _ in range(2)] == [True, True]
    assert tensorcore_compiled._loader is None
    assert numpy_sum()  # the third: still numpy's, and the loading starts
    loader = tensorcore_compiled._loader
    assert loader is not None and loader.name == "smalti tensor-core adder loader"
    loader.join(timeout=30)
    assert [numpy_sum() for _ in range(2)] == [False, False]  # the spy's zeros
    assert len(compiled_calls) == 2 and tensorcore_compiled._loader is loader


def test_a_loader_that_fails_says_so_once_and_numpy_goes_on(fresh_loading, compiled_calls):
    fresh_loading.append(ImportError("no numba here"))
    a, b = f16(np.ones((2, 16))), f16(np.ones((3, 16)))
    with pytest.warns(RuntimeWarning, match="could not be loaded.*no numba here.*the same bits"):
        for _ in range(3):
            tensorcore.mma(a, b, None, operands="f16", accumulator="f32")
        tensorcore_compiled._loader.join(timeout=30)
    sums = [tensorcore.mma(a, b, None, operands="f16", accumulator="f32") for _ in range(3)]
    assert all((s == 16).all() for s in sums) and not compiled_calls
    assert tensorcore_compiled._numpy_sums == 3  # no more counting, no second loader


@pytest.mark.skipif(not tensorcore_compiled.available(), reason="numba is not installed")
def test_the_real_kernel_loads_in_a_thread_and_sums_the_same_bits(monkeypatch):
    """The compiled adder, loaded by the thread (as a process past LOAD_AFTER
    sums does), sums what numpy's code sums, bit for bit."""
    _let_a_loader_finish()
    monkeypatch.setattr(tensorcore_compiled, "LOAD_AFTER", 1)
    monkeypatch.setattr(tensorcore_compiled, "_numpy_sums", 0)
    monkeypatch.setattr(tensorcore_compiled, "_loader", None)
    rng = np.random.default_rng(7)
    a, b = f16(rng.standard_normal((64, 16))), f16(rng.standard_normal((128, 16)))
    c = rng.standard_normal((64, 128)).astype(np.float32)
    want = tensorcore.mma(a, b, c, operands="f16", accumulator="f32", compiled=False)
    tensorcore.mma(a, b, c, operands="f16", accumulator="f32")  # starts the loader
    if tensorcore_compiled._loader is not None:  # (None: loaded by an earlier test)
        tensorcore_compiled._loader.join(timeout=120)
    assert tensorcore_compiled.chosen()
    np.testing.assert_array_equal(tensorcore.mma(a, b, c, operands="f16", accumulator="f32"),
                                  want)
