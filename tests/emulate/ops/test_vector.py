"""``vector`` rules against numpy indexing and folds, each on a value the
same in every thread and on one that differs per thread (a leading thread
axis), since the rules handle both."""

from __future__ import annotations

import numpy as np
import pytest

from smalti.emulate.errors import Unsupported

from .harness import FLOAT_TYPES, assert_same_bits, covers, float_edges, run

T = 32
X = np.arange(8, dtype=np.float32).reshape(2, 4) - 2.5
PER_THREAD = X + 100 * np.arange(T, dtype=np.float32)[:, None, None]


@pytest.mark.parametrize("x", [X, PER_THREAD], ids=["uniform", "per-thread"])
@covers("vector.extract", "vector.insert", "vector.broadcast", "vector.shape_cast",
        "vector.extract_strided_slice", "vector.insert_strided_slice")
def test_moves(x):
    got = run("""
      %row = vector.extract %v[1] : vector<4xf32> from vector<2x4xf32>
      %el = vector.extract %v[0, 3] : f32 from vector<2x4xf32>
      %ins = vector.insert %row, %v[0] : vector<4xf32> into vector<2x4xf32>
      %ins2 = vector.insert %s, %v[1, 2] : f32 into vector<2x4xf32>
      %b = vector.broadcast %row : vector<4xf32> to vector<3x4xf32>
      %bs = vector.broadcast %s : f32 to vector<2x2xf32>
      %flat = vector.shape_cast %v : vector<2x4xf32> to vector<8xf32>
      %sl = vector.extract_strided_slice %v offsets = [0, 1], sizes = [2, 2], strides = [1, 1]
        : vector<2x4xf32> to vector<2x2xf32>
      %st = vector.extract_strided_slice %flat offsets = [5], sizes = [3], strides = [1]
        : vector<8xf32> to vector<3xf32>
      %is = vector.insert_strided_slice %sl, %v offsets = [0, 2], strides = [1, 1]
        : vector<2x2xf32> into vector<2x4xf32>
      %is1 = vector.insert_strided_slice %row, %v offsets = [0, 0], strides = [1]
        : vector<4xf32> into vector<2x4xf32>""",
              {"v": ("vector<2x4xf32>", x), "s": ("f32", np.float32(-0.0))},
              {"row": "vector<4xf32>", "el": "f32", "ins": "vector<2x4xf32>",
               "ins2": "vector<2x4xf32>", "b": "vector<3x4xf32>", "bs": "vector<2x2xf32>",
               "flat": "vector<8xf32>", "sl": "vector<2x2xf32>", "st": "vector<3xf32>",
               "is": "vector<2x4xf32>", "is1": "vector<2x4xf32>"})
    lead = (slice(None),) * (x.ndim - 2)
    assert_same_bits(got["row"], x[lead + (1,)])
    assert_same_bits(got["el"], x[lead + (0, 3)])
    ins = x.copy()
    ins[lead + (0,)] = x[lead + (1,)]
    assert_same_bits(got["ins"], ins)
    ins2 = x.copy()
    ins2[lead + (1, 2)] = -0.0
    assert_same_bits(got["ins2"], ins2)
    assert_same_bits(got["b"], np.broadcast_to(x[lead + (1, None)], x.shape[:-2] + (3, 4)))
    assert_same_bits(got["bs"], np.full((2, 2), -0.0, np.float32))
    flat = x.reshape(x.shape[:-2] + (8,))
    assert_same_bits(got["flat"], flat)
    assert_same_bits(got["sl"], x[lead + (slice(None), slice(1, 3))])
    assert_same_bits(got["st"], flat[lead + (slice(5, 8),)])
    is_ = x.copy()
    is_[lead + (slice(None), slice(2, 4))] = x[lead + (slice(None), slice(1, 3))]
    assert_same_bits(got["is"], is_)
    is1 = x.copy()
    is1[lead + (0,)] = x[lead + (1,)]
    assert_same_bits(got["is1"], is1)


@covers("vector.extract", "vector.insert", "nvvm.read.ptx.sreg.tid.x")
def test_dynamic_positions_must_agree_between_threads():
    v = np.array([5, 6, 7, 8], np.int32)
    got = run("""
      %e = vector.extract %v[%i] : i32 from vector<4xi32>
      %w = vector.insert %x, %v[%i] : i32 into vector<4xi32>""",
              {"v": ("vector<4xi32>", v), "i": ("index", 2), "x": ("i32", -1)},
              {"e": "i32", "w": "vector<4xi32>"})
    assert got["e"] == 7 and got["w"].tolist() == [5, 6, -1, 8]
    with pytest.raises(Unsupported, match="vector.extract at a per-thread position"):
        run("""
          %t = nvvm.read.ptx.sreg.tid.x : i32
          %i = arith.index_cast %t : i32 to index
          %e = vector.extract %v[%i] : i32 from vector<4xi32>""",
            {"v": ("vector<4xi32>", v)}, {"e": "i32"})


@covers("vector.broadcast", "vector.from_elements")
def test_broadcast_of_per_thread_scalars_and_from_elements():
    per = np.arange(T, dtype=np.int32) - 16
    got = run("""
      %s = vector.broadcast %a : i32 to vector<2x3xi32>
      %f = vector.from_elements %a, %b, %a : vector<3xi32>
      %u = vector.from_elements %b, %b : vector<2xi32>""",
              {"a": ("i32", per), "b": ("i32", np.int32(-2 ** 31))},
              {"s": "vector<2x3xi32>", "f": "vector<3xi32>", "u": "vector<2xi32>"})
    assert_same_bits(got["s"], np.broadcast_to(per[:, None, None], (T, 2, 3)))
    assert_same_bits(got["f"], np.stack([per, np.full(T, -2 ** 31, np.int32), per], -1))
    assert_same_bits(got["u"], np.full(2, -2 ** 31, np.int32))


@covers("vector.broadcast")
def test_broadcast_into_a_one_element_vector_per_thread_and_uniform():
    """A scalar into vector<1x..> (what follows every ldmatrix): the value
    itself reshaped, per thread or the same in every thread."""
    per = np.arange(T, dtype=np.int32) * 3 - 7
    got = run("""
      %p = vector.broadcast %a : i32 to vector<1xi32>
      %q = vector.broadcast %a : i32 to vector<1x1xi32>
      %u = vector.broadcast %b : i32 to vector<1xi32>""",
              {"a": ("i32", per), "b": ("i32", np.int32(5))},
              {"p": "vector<1xi32>", "q": "vector<1x1xi32>", "u": "vector<1xi32>"})
    assert_same_bits(got["p"], per[:, None])
    assert_same_bits(got["q"], per[:, None, None])
    assert_same_bits(got["u"], np.full(1, 5, np.int32))


@covers("vector.bitcast")
def test_bitcast_reinterprets_the_last_dim():
    x = float_edges("f16")[:20].reshape(2, 10)
    got = run("""
      %i = vector.bitcast %v : vector<2x10xf16> to vector<2x5xi32>
      %back = vector.bitcast %i : vector<2x5xi32> to vector<2x10xbf16>""",
              {"v": ("vector<2x10xf16>", x)}, {"i": "vector<2x5xi32>", "back": "vector<2x10xbf16>"})
    assert_same_bits(got["i"], x.view(np.int32))
    assert_same_bits(got["back"].view(np.int16), x.view(np.int16))
    with pytest.raises(Unsupported, match="vector.bitcast vector<8xi1>"):
        run("%i = vector.bitcast %v : vector<8xi1> to vector<1xi8>",
            {"v": ("vector<8xi1>", np.zeros(8, bool))}, {"i": "vector<1xi8>"})


def _fold(fn, x):
    """Left to right, as the emulator (and LLVM's ordered reduction) does."""
    acc = x[..., 0]
    for i in range(1, x.shape[-1]):
        acc = fn(acc, x[..., i])
    return acc


def _maximum(a, b):
    """IEEE maximum (NaN-propagating, -0 < +0), elementwise, from comparisons."""
    return np.where(np.isnan(a) | np.isnan(b), np.nan,
                    np.where((a > b) | ((a == b) & ~np.signbit(a)), a, b)).astype(a.dtype)


def _minimum(a, b):
    return np.where(np.isnan(a) | np.isnan(b), np.nan,
                    np.where((a < b) | ((a == b) & np.signbit(a)), a, b)).astype(a.dtype)


FLOAT_KINDS = {"add": np.add, "mul": np.multiply, "maximumf": _maximum, "minimumf": _minimum,
               "maxnumf": np.fmax, "minnumf": np.fmin}
INT_KINDS = {"add": np.add, "mul": np.multiply, "maxsi": np.maximum, "minsi": np.minimum,
             "and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor}


@covers("vector.reduction")
def test_reductions_fold_in_order():
    e = float_edges("f32")
    # rows of four edge values each, so every pair meets somewhere
    rng = np.random.default_rng(0)
    x = np.stack([rng.permutation(e)[:4] for _ in range(64)])
    x[0] = [0.0, -0.0, 0.0, -0.0]
    x[1] = [-0.0, -0.0, -0.0, -0.0]
    for kind, fn in FLOAT_KINDS.items():
        got = run(f"%r = vector.reduction <{kind}>, %v : vector<4xf32> into f32",
                  {"v": ("vector<4xf32>", x)}, {"r": "f32"}, threads=64)["r"]
        with np.errstate(all="ignore"):
            want = _fold(fn, x)
        if kind in ("maxnumf", "minnumf"):  # the sign of a zero is left open
            np.testing.assert_array_equal(got, want, err_msg=kind)
        else:
            assert_same_bits(got, want)
    i = np.array([[-2 ** 31, -1, 3, 2 ** 31 - 1], [7, -7, 0, 1]], np.int32)
    for kind, fn in INT_KINDS.items():
        got = run(f"%r = vector.reduction <{kind}>, %v : vector<4xi32> into i32",
                  {"v": ("vector<4xi32>", i[1])}, {"r": "i32"})["r"]
        assert_same_bits(got, _fold(fn, i[1]))
        got = run(f"%r = vector.reduction <{kind}>, %v : vector<4xi32> into i32",
                  {"v": ("vector<4xi32>", np.resize(i, (T, 4)))}, {"r": "i32"})["r"]
        with np.errstate(all="ignore"):
            assert_same_bits(got, _fold(fn, np.resize(i, (T, 4))))
    with pytest.raises(Unsupported, match="vector.reduction <maxui>"):
        run("%r = vector.reduction <maxui>, %v : vector<4xi32> into i32",
            {"v": ("vector<4xi32>", i[0])}, {"r": "i32"})


@pytest.mark.parametrize("ty", ["f16", "bf16"])
@covers("vector.reduction")
def test_half_precision_sums_round_every_step(ty):
    dt = np.dtype(FLOAT_TYPES[ty])
    x = np.array([2048.0, 1.0, 1.0, 1.0] if ty == "f16" else [256.0, 1.0, 1.0, 1.0], dt)
    got = run(f"%r = vector.reduction <add>, %v : vector<4x{ty}> into {ty}",
              {"v": (f"vector<4x{ty}>", x)}, {"r": ty})["r"]
    want = x[0]
    for v in x[1:]:
        want = (np.float64(want) + np.float64(v)).astype(dt)
    assert_same_bits(got, want)  # 2048 + 1 rounds back to 2048 each time


@covers("vector.load", "vector.store", "memref.load", "memref.store")
def test_load_and_store_at_per_thread_indices():
    """Thread t loads row t % 4 of a (4, 8) memref from column 2, and stores it
    doubled into row t of a (32, 8) one, at column 4; a memref.load/store pair
    checks the scalar path."""
    src = np.arange(32, dtype=np.float32).reshape(4, 8)
    got = run("""
      %t = gpu.thread_id x
      %c4 = arith.constant 4 : index
      %c2 = arith.constant 2 : index
      %c0 = arith.constant 0 : index
      %r = arith.remui %t, %c4 : index
      %v = vector.load %src[%r, %c2] : memref<4x8xf32>, vector<4xf32>
      %w = arith.addf %v, %v : vector<4xf32>
      vector.store %w, %dst[%t, %c4] : memref<32x8xf32>, vector<4xf32>
      %s = memref.load %src[%r, %c0] : memref<4x8xf32>
      memref.store %s, %dst[%t, %c0] : memref<32x8xf32>""",
              {"src": ("memref<4x8xf32>", src), "dst": ("memref<32x8xf32>", np.zeros((32, 8)))})
    want = np.zeros((32, 8), np.float32)
    rows = np.arange(32) % 4
    want[:, 4:8] = 2 * src[rows, 2:6]
    want[:, 0] = src[rows, 0]
    assert_same_bits(got["dst"], want)


@covers("vector.shuffle")
def test_shuffle_concatenates_then_picks():
    a = np.array([1, 2, 3, 4], np.int16)
    b = np.arange(T * 4, dtype=np.int16).reshape(T, 4)
    got = run("%r = vector.shuffle %a, %b [7, 0, 5, 5, 2] : vector<4xi16>, vector<4xi16>",
              {"a": ("vector<4xi16>", a), "b": ("vector<4xi16>", b)},
              {"r": "vector<5xi16>"})["r"]
    both = np.concatenate([np.broadcast_to(a, (T, 4)), b], -1)
    assert_same_bits(got, both[:, [7, 0, 5, 5, 2]])
