"""``arith`` rules against Python integers and numpy floats, on edge values:
zeros and signed zeros, infinities, NaN, INT_MIN/INT_MAX, shifts past the
width, unsigned wraparound. Expected values follow the MLIR op definitions;
where MLIR leaves a result undefined (shifts past the width, INT_MIN / -1) the
emulator follows PTX, which it models: ``shl``/``shr`` clamp the amount,
``div.s32`` wraps. Division by zero is left out (its PTX result is being
settled elsewhere): those pairs are not run."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from smalti.emulate import irtypes
from smalti.emulate.errors import Unsupported

from .harness import (
    FLOAT_TYPES,
    INT_TYPES,
    assert_same_bits,
    covers,
    float_edges,
    int_edges,
    pairs,
    run,
    wrap,
)


def _bits(ty: str) -> int:
    return np.dtype(INT_TYPES[ty]).itemsize * 8


def _binary(op: str, ty: str, a, b, out_ty: str | None = None):
    n = len(a)
    vt = f"vector<{n}x{ty}>"
    ot = f"vector<{n}x{out_ty or ty}>"
    return run(f"%r = {op} %a, %b : {vt}", {"a": (vt, a), "b": (vt, b)}, {"r": ot})["r"]


def _sdiv(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a < 0) == (b < 0) else -q


def _u(x: int, bits: int) -> int:
    return x & ((1 << bits) - 1)


# name -> reference on Python ints (None: undefined, not asserted)
INT_OPS = {
    "arith.addi": lambda a, b, n: wrap(a + b, n),
    "arith.subi": lambda a, b, n: wrap(a - b, n),
    "arith.muli": lambda a, b, n: wrap(a * b, n),
    "arith.andi": lambda a, b, n: wrap(a & b, n),
    "arith.ori": lambda a, b, n: wrap(a | b, n),
    "arith.xori": lambda a, b, n: wrap(a ^ b, n),
    "arith.divsi": lambda a, b, n: None if b == 0 else wrap(_sdiv(a, b), n),
    "arith.remsi": lambda a, b, n: None if b == 0 else wrap(a - b * _sdiv(a, b), n),
    "arith.divui": lambda a, b, n: None if b == 0 else wrap(_u(a, n) // _u(b, n), n),
    "arith.remui": lambda a, b, n: None if b == 0 else wrap(_u(a, n) % _u(b, n), n),
    "arith.ceildivsi": lambda a, b, n: None if b == 0 else wrap(-((-a) // b), n),
    "arith.ceildivui": lambda a, b, n: None if b == 0 else wrap(-((-_u(a, n)) // _u(b, n)), n),
    "arith.floordivsi": lambda a, b, n: None if b == 0 else wrap(a // b, n),
    "arith.maxsi": lambda a, b, n: max(a, b),
    "arith.minsi": lambda a, b, n: min(a, b),
    "arith.maxui": lambda a, b, n: wrap(max(_u(a, n), _u(b, n)), n),
    "arith.minui": lambda a, b, n: wrap(min(_u(a, n), _u(b, n)), n),
    "arith.shli": lambda a, b, n: 0 if _u(b, n) >= n else wrap(a << _u(b, n), n),
    "arith.shrsi": lambda a, b, n: a >> min(_u(b, n), n - 1),
    "arith.shrui": lambda a, b, n: 0 if _u(b, n) >= n else wrap(_u(a, n) >> _u(b, n), n),
}


def check_int_binary(op: str, ref, ty: str) -> None:
    """``op`` on every pair of ``ty``'s edge values against ``ref``; the pairs
    ``ref`` leaves undefined (a zero divisor) are not run at all."""
    a, b = pairs(int_edges(ty))
    dt = INT_TYPES[ty]
    want = [ref(int(x), int(y), _bits(ty)) for x, y in zip(a, b)]
    keep = np.array([w is not None for w in want])
    got = _binary(op, ty, a[keep].astype(dt), b[keep].astype(dt))
    assert_same_bits(got, np.array([w for w in want if w is not None], dt))


@pytest.mark.parametrize("ty", ["i8", "i16", "i32", "i64"])
@covers(*INT_OPS)
def test_integer_binary_ops(ty):
    for op, ref in INT_OPS.items():
        check_int_binary(op, ref, ty)


# i1: true is -1 when signed, 1 when unsigned
I1_OPS = {
    "arith.addi": lambda a, b: a ^ b, "arith.subi": lambda a, b: a ^ b,
    "arith.muli": lambda a, b: a & b, "arith.andi": lambda a, b: a & b,
    "arith.ori": lambda a, b: a | b, "arith.xori": lambda a, b: a ^ b,
    "arith.maxsi": lambda a, b: a & b, "arith.minsi": lambda a, b: a | b,
    "arith.maxui": lambda a, b: a | b, "arith.minui": lambda a, b: a & b,
}


@covers(*I1_OPS)
def test_i1_ops_are_one_bit_arithmetic():
    a, b = pairs([False, True])
    for op, ref in I1_OPS.items():
        got = _binary(op, "i1", a, b)
        assert got.tolist() == [bool(ref(int(x), int(y))) for x, y in zip(a, b)], op


CMPI = {
    "eq": lambda a, b, n: a == b, "ne": lambda a, b, n: a != b,
    "slt": lambda a, b, n: a < b, "sle": lambda a, b, n: a <= b,
    "sgt": lambda a, b, n: a > b, "sge": lambda a, b, n: a >= b,
    "ult": lambda a, b, n: _u(a, n) < _u(b, n), "ule": lambda a, b, n: _u(a, n) <= _u(b, n),
    "ugt": lambda a, b, n: _u(a, n) > _u(b, n), "uge": lambda a, b, n: _u(a, n) >= _u(b, n),
}


@pytest.mark.parametrize("ty", ["i8", "i32", "i64"])
@covers("arith.cmpi")
def test_cmpi_every_predicate(ty):
    a, b = pairs(int_edges(ty))
    vt, n = f"vector<{a.size}x{ty}>", _bits(ty)
    for pred, ref in CMPI.items():
        got = run(f"%r = arith.cmpi {pred}, %a, %b : {vt}", {"a": (vt, a), "b": (vt, b)},
                  {"r": f"vector<{a.size}xi1>"})["r"]
        assert got.tolist() == [ref(int(x), int(y), n) for x, y in zip(a, b)], pred


def _f64_ref(fn, a, b, dt):
    with np.errstate(all="ignore"):
        return fn(a.astype(np.float64), b.astype(np.float64)).astype(dt)


def _maximum(a: float, b: float) -> float:
    """MLIR arith.maximumf: NaN if either is; -0.0 < +0.0."""
    if math.isnan(a) or math.isnan(b):
        return math.nan
    if a == b:
        return b if math.copysign(1, a) < 0 else a
    return max(a, b)


def _minimum(a: float, b: float) -> float:
    if math.isnan(a) or math.isnan(b):
        return math.nan
    if a == b:
        return a if math.copysign(1, a) < 0 else b
    return min(a, b)


def _maxnum(a: float, b: float) -> float:
    """MLIR arith.maxnumf (IEEE maxNum): the other operand if one is NaN."""
    return b if math.isnan(a) else a if math.isnan(b) else max(a, b)


def _minnum(a: float, b: float) -> float:
    return b if math.isnan(a) else a if math.isnan(b) else min(a, b)


@pytest.mark.parametrize("ty", list(FLOAT_TYPES))
@covers("arith.addf", "arith.subf", "arith.mulf", "arith.divf", "arith.remf",
        "arith.maximumf", "arith.minimumf")
def test_float_binary_ops_round_once(ty):
    """IEEE results, rounded once to the type (computed exactly in float64)."""
    a, b = pairs(float_edges(ty))
    dt = np.dtype(FLOAT_TYPES[ty])
    for op, fn in [("arith.addf", np.add), ("arith.subf", np.subtract),
                   ("arith.mulf", np.multiply), ("arith.divf", np.divide),
                   ("arith.remf", np.fmod)]:
        got = _binary(op, ty, a, b)
        want = _f64_ref(fn, a, b, dt)
        if op == "arith.divf":
            keep = b != 0  # x / ±0 is ±inf or NaN in IEEE, checked below
            assert_same_bits(got[keep], want[keep])
            zero = ~keep
            assert np.all(np.isnan(got[zero]) == (np.isnan(a[zero]) | (a[zero] == 0)))
        else:
            assert_same_bits(got, want)
    for op, ref in [("arith.maximumf", _maximum), ("arith.minimumf", _minimum)]:
        want = np.array([ref(float(x), float(y)) for x, y in zip(a, b)], np.float64).astype(dt)
        assert_same_bits(_binary(op, ty, a, b), want)


@pytest.mark.parametrize("ty", ["f16", "f32"])
@covers("arith.maxnumf", "arith.minnumf")
def test_maxnumf_minnumf_ignore_nan(ty):
    a, b = pairs(float_edges(ty))
    dt = np.dtype(FLOAT_TYPES[ty])
    for op, ref in [("arith.maxnumf", _maxnum), ("arith.minnumf", _minnum)]:
        got = _binary(op, ty, a, b).astype(np.float64)
        want = np.array([ref(float(x), float(y)) for x, y in zip(a, b)], np.float64)
        # the sign of a zero result is left open by IEEE maxNum: compare values
        np.testing.assert_array_equal(got, want.astype(dt).astype(np.float64), err_msg=op)


@covers("arith.addf")
def test_fastmath_other_than_contract_is_unsupported():
    with pytest.raises(Unsupported, match="arith.addf with #arith.fastmath<fast>"):
        run("%r = arith.addf %a, %a fastmath<fast> : f32", {"a": ("f32", 1.0)}, {"r": "f32"})


@pytest.mark.parametrize("ty", ["f16", "bf16", "f32"])
@covers("arith.negf")
def test_negf_flips_the_sign_of_everything(ty):
    x = float_edges(ty)
    vt = f"vector<{x.size}x{ty}>"
    got = run(f"%r = arith.negf %a : {vt}", {"a": (vt, x)}, {"r": vt})["r"]
    assert_same_bits(got, (-x.astype(np.float64)).astype(x.dtype))
    assert np.all(np.signbit(got.astype(np.float32)) != np.signbit(x.astype(np.float32)))


def _ord(a, b):
    return not (math.isnan(a) or math.isnan(b))


CMPF = {
    "false": lambda a, b: False, "oeq": lambda a, b: _ord(a, b) and a == b,
    "ogt": lambda a, b: _ord(a, b) and a > b, "oge": lambda a, b: _ord(a, b) and a >= b,
    "olt": lambda a, b: _ord(a, b) and a < b, "ole": lambda a, b: _ord(a, b) and a <= b,
    "one": lambda a, b: _ord(a, b) and a != b, "ord": _ord,
    "ueq": lambda a, b: not _ord(a, b) or a == b, "ugt": lambda a, b: not _ord(a, b) or a > b,
    "uge": lambda a, b: not _ord(a, b) or a >= b, "ult": lambda a, b: not _ord(a, b) or a < b,
    "ule": lambda a, b: not _ord(a, b) or a <= b, "une": lambda a, b: not _ord(a, b) or a != b,
    "uno": lambda a, b: not _ord(a, b), "true": lambda a, b: True,
}


@covers("arith.cmpf")
def test_cmpf_every_predicate_with_nan_and_signed_zeros():
    a, b = pairs(float_edges("f32"))
    vt = f"vector<{a.size}xf32>"
    for pred, ref in CMPF.items():
        got = run(f"%r = arith.cmpf {pred}, %a, %b : {vt}", {"a": (vt, a), "b": (vt, b)},
                  {"r": f"vector<{a.size}xi1>"})["r"]
        assert got.tolist() == [ref(float(x), float(y)) for x, y in zip(a, b)], pred


@covers("arith.select", "llvm.select")
def test_select_uniform_vector_and_per_thread_conditions():
    x, y = np.arange(4, dtype=np.int32), -np.arange(4, dtype=np.int32) - 10
    for op in ("arith.select", "llvm.select"):
        for c in (True, False):
            got = run(f"%r = {op} %c, %x, %y : vector<4xi32>" if op == "arith.select"
                      else f"%r = {op} %c, %x, %y : i1, vector<4xi32>",
                      {"c": ("i1", c), "x": ("vector<4xi32>", x), "y": ("vector<4xi32>", y)},
                      {"r": "vector<4xi32>"})["r"]
            assert_same_bits(got, x if c else y)
    mask = np.array([True, False, False, True])
    got = run("%r = arith.select %c, %x, %y : vector<4xi1>, vector<4xi32>",
              {"c": ("vector<4xi1>", mask), "x": ("vector<4xi32>", x),
               "y": ("vector<4xi32>", y)}, {"r": "vector<4xi32>"})["r"]
    assert_same_bits(got, np.where(mask, x, y))
    # an i1 per thread choosing whole vectors
    c = np.arange(32) % 3 == 0
    got = run("%r = arith.select %c, %x, %y : vector<4xi32>",
              {"c": ("i1", c), "x": ("vector<4xi32>", x), "y": ("vector<4xi32>", y)},
              {"r": "vector<4xi32>"})["r"]
    assert_same_bits(got, np.where(c[:, None], x, y))


def _cast(op: str, src: str, dst: str, x):
    n = len(x)
    return run(f"%r = {op} %a : vector<{n}x{src}> to vector<{n}x{dst}>",
               {"a": (f"vector<{n}x{src}>", x)}, {"r": f"vector<{n}x{dst}>"})["r"]


@pytest.mark.parametrize("src,dst", [("f16", "f32"), ("bf16", "f32"), ("f32", "f64"),
                                     ("f16", "f64")])
@covers("arith.extf")
def test_extf_is_exact(src, dst):
    x = float_edges(src)
    assert_same_bits(_cast("arith.extf", src, dst, x),
                     x.astype(np.float64).astype(FLOAT_TYPES[dst]))


@pytest.mark.parametrize("src,dst", [("f32", "f16"), ("f32", "bf16"), ("f64", "f32"),
                                     ("f64", "f16")])
@covers("arith.truncf")
def test_truncf_rounds_to_nearest_even_and_overflows_to_inf(src, dst):
    dt = np.dtype(FLOAT_TYPES[dst])
    info = np.finfo(dt)
    big = float(info.max)
    # ties between neighbours, values just past the largest finite, subnormal edges
    one_ulp = float(np.spacing(dt.type(1.0)))
    extra = [1 + one_ulp / 2, 1 + 3 * one_ulp / 2, big * (1 + float(info.eps) / 4),
             big * (1 + float(info.eps)), float(info.smallest_subnormal) / 2,
             float(info.smallest_subnormal) * 0.75, 1e30, -1e30]
    with np.errstate(over="ignore"):
        x = np.concatenate([float_edges(src).astype(np.float64), extra]).astype(FLOAT_TYPES[src])
        want = x.astype(dt)
    assert_same_bits(_cast("arith.truncf", src, dst, x), want)
    got = _cast("arith.truncf", src, dst, x[-6:-2])
    assert got[0] == dt.type(big) and np.isinf(got[1]), "overflow rounds to nearest"
    assert got[2] == 0 and got[3] == info.smallest_subnormal, "subnormal ties to even"


@covers("arith.truncf")
def test_truncf_to_f8_or_with_a_rounding_mode_is_unsupported():
    with pytest.raises(Unsupported, match="to f8E4M3FN"):
        _cast("arith.truncf", "f32", "f8E4M3FN", np.zeros(2, np.float32))
    with pytest.raises(Unsupported, match="rounding mode"):
        run("%r = arith.truncf %a to_nearest_even : f32 to f16", {"a": ("f32", 1.0)},
            {"r": "f16"})


INT_CASTS = [  # op, src, dst, reference on Python ints
    ("arith.extsi", "i8", "i32", lambda x: x),
    ("arith.extsi", "i32", "i64", lambda x: x),
    ("arith.extui", "i8", "i32", lambda x: _u(x, 8)),
    ("arith.extui", "i32", "i64", lambda x: _u(x, 32)),
    ("arith.trunci", "i64", "i32", lambda x: wrap(x, 32)),
    ("arith.trunci", "i32", "i8", lambda x: wrap(x, 8)),
    ("arith.index_cast", "i32", "index", lambda x: x),
    ("arith.index_cast", "index", "i32", lambda x: wrap(x, 32)),
    ("arith.index_castui", "i32", "index", lambda x: _u(x, 32)),
    ("arith.index_castui", "index", "i32", lambda x: wrap(x, 32)),
    ("llvm.sext", "i8", "i32", lambda x: x),
    ("llvm.zext", "i8", "i32", lambda x: _u(x, 8)),
    ("llvm.trunc", "i64", "i16", lambda x: wrap(x, 16)),
]


@covers("arith.extsi", "arith.extui", "arith.trunci", "arith.index_cast",
        "arith.index_castui", "llvm.sext", "llvm.zext", "llvm.trunc")
def test_integer_casts():
    for op, src, dst, ref in INT_CASTS:
        x = np.array(int_edges("i64" if src == "index" else src),
                     INT_TYPES.get(src, np.int64))
        if op.startswith("llvm."):
            got = run(f"%r = {op} %a : vector<{x.size}x{src}> to vector<{x.size}x{dst}>",
                      {"a": (f"vector<{x.size}x{src}>", x)},
                      {"r": f"vector<{x.size}x{dst}>"})["r"]
        else:
            got = _cast(op, src, dst, x)
        want = np.array([ref(int(v)) for v in x], INT_TYPES.get(dst, np.int64))
        assert_same_bits(got, want)


@covers("arith.extsi", "arith.extui", "arith.trunci")
def test_i1_casts_sign_and_zero_extend_and_truncate_to_the_low_bit():
    b = np.array([False, True])
    assert _cast("arith.extsi", "i1", "i32", b).tolist() == [0, -1]
    assert _cast("arith.extui", "i1", "i32", b).tolist() == [0, 1]
    x = np.array([0, 1, 2, 3, -1, -2], np.int32)
    assert _cast("arith.trunci", "i32", "i1", x).tolist() == [bool(v & 1) for v in x]


def _round_int(n: int, mant: int) -> float:
    """``n`` rounded to ``mant`` significant bits, to nearest, ties to even."""
    m = abs(n)
    shift = m.bit_length() - mant
    if shift > 0:
        q, r = divmod(m, 1 << shift)
        half = 1 << (shift - 1)
        if r > half or (r == half and q & 1):
            q += 1
        m = q << shift
    return float(math.copysign(m, n)) if m else 0.0


MANTISSA = {"f16": 11, "bf16": 8, "f32": 24, "f64": 53}


@pytest.mark.parametrize("src,dst", [("i32", "f32"), ("i64", "f32"), ("i32", "f16"),
                                     ("i64", "f64"), ("i8", "bf16"), ("i32", "bf16")])
@covers("arith.sitofp", "arith.uitofp")
def test_int_to_float_rounds_once(src, dst):
    bits = _bits(src)
    x = np.array(int_edges(src) + [(1 << 24) + 1, (1 << 25) + 3, 65519, 65520, 2049]
                 if bits >= 32 else int_edges(src), np.int64)
    x = np.array([wrap(int(v), bits) for v in x], INT_TYPES[src])
    dt = FLOAT_TYPES[dst]
    for op, conv in [("arith.sitofp", int), ("arith.uitofp", lambda v: _u(int(v), bits))]:
        want = np.array([_round_int(conv(v), MANTISSA[dst]) for v in x], np.float64)
        with np.errstate(over="ignore"):
            want = want.astype(dt)  # exact, or an overflow to inf
        assert_same_bits(_cast(op, src, dst, x), want)


def _fp_to_int(x: float, bits: int, unsigned: bool) -> int:
    lo, hi = (0, (1 << bits) - 1) if unsigned else (-(1 << (bits - 1)), (1 << (bits - 1)) - 1)
    if math.isnan(x):
        return 0
    if math.isinf(x):
        return wrap(hi if x > 0 else lo, bits)
    return wrap(min(max(math.trunc(x), lo), hi), bits)


@pytest.mark.parametrize("src,dst", [("f32", "i32"), ("f32", "i8"), ("f16", "i16"),
                                     ("f64", "i64"), ("f32", "i64")])
@covers("arith.fptosi", "arith.fptoui")
def test_float_to_int_truncates_saturates_and_maps_nan_to_zero(src, dst):
    bits = _bits(dst)
    extra = [2.0 ** (bits - 1), -(2.0 ** (bits - 1)), 2.0 ** bits, 2.0 ** (bits - 1) - 1,
             -0.99, 0.99, -1.5, 255.5, 256.0]
    x = np.concatenate([float_edges(src).astype(np.float64), extra])
    with np.errstate(over="ignore"):
        x = x.astype(FLOAT_TYPES[src])
    for op, unsigned in [("arith.fptosi", False), ("arith.fptoui", True)]:
        want = np.array([_fp_to_int(float(v), bits, unsigned) for v in x], INT_TYPES[dst])
        assert_same_bits(_cast(op, src, dst, x), want)


@covers("arith.bitcast", "llvm.bitcast")
def test_bitcast_keeps_the_bits():
    x = float_edges("f32")
    got = _cast("arith.bitcast", "f32", "i32", x)
    assert_same_bits(got, x.view(np.int32))
    back = _cast("arith.bitcast", "i32", "f32", got)
    assert_same_bits(back.view(np.int32), x.view(np.int32))  # NaN payloads too
    h = float_edges("bf16")
    got = run(f"%r = llvm.bitcast %a : vector<{h.size}xbf16> to vector<{h.size}xi16>",
              {"a": (f"vector<{h.size}xbf16>", h)}, {"r": f"vector<{h.size}xi16>"})["r"]
    assert_same_bits(got, h.view(np.int16))


@covers("arith.bitcast")
def test_bitcast_between_4_bit_types_keeps_each_element_s_bits():
    """f4E2M1FN <-> i4 (jax's float abs of fp4 masks the sign as integers):
    all 16 codes, fp4's -0 (0x8) and the i4 extremes included."""
    codes = np.arange(16, dtype=np.uint8)
    f4 = codes.view(ml_dtypes.float4_e2m1fn)
    got = _cast("arith.bitcast", "f4E2M1FN", "i4", f4)
    assert got.dtype == np.dtype(ml_dtypes.int4)
    assert [int(v) for v in got] == [c - 16 if c >= 8 else c for c in range(16)]
    back = _cast("arith.bitcast", "i4", "f4E2M1FN", got)
    assert (back.view(np.uint8) & 0xF).tolist() == codes.tolist()


@covers("arith.constant", "llvm.mlir.constant")
def test_constants_of_every_kind():
    got = run("""
      %i = arith.constant -2147483648 : i32
      %l = arith.constant 9223372036854775807 : i64
      %u = arith.constant 4294967295 : i32
      %t = arith.constant true
      %n = arith.constant 0x7FC00000 : f32
      %z = arith.constant -0.0 : f32
      %s = arith.constant dense<-1.5> : vector<3xf16>
      %d = arith.constant dense<[1, -2, 2147483647]> : vector<3xi32>
      %h = arith.constant dense<[1.0, -0.0, 65504.0]> : vector<3xf16>
      %b = arith.constant dense<[1.0, 3.0e38, -2.5]> : vector<3xbf16>
      %m = llvm.mlir.constant(-1 : i16) : i16""", {},
              {"i": "i32", "l": "i64", "u": "i32", "t": "i1", "n": "f32", "z": "f32",
               "s": "vector<3xf16>", "d": "vector<3xi32>", "h": "vector<3xf16>",
               "b": "vector<3xbf16>", "m": "i16"})
    assert got["i"] == -2 ** 31 and got["i"].dtype == np.int32
    assert got["l"] == 2 ** 63 - 1 and got["u"] == -1 and got["t"] == np.True_
    assert np.isnan(got["n"]) and got["z"] == 0 and np.signbit(got["z"])
    assert_same_bits(got["s"], np.full(3, -1.5, np.float16))
    assert_same_bits(got["d"], np.array([1, -2, 2 ** 31 - 1], np.int32))
    assert_same_bits(got["h"], np.array([1.0, -0.0, 65504.0], np.float16))
    assert_same_bits(got["b"], np.array([1.0, 3.0e38, -2.5]).astype(FLOAT_TYPES["bf16"]))
    assert got["m"] == -1 and got["m"].dtype == np.int16


# --- FNUZ fp8 (f8E5M2FNUZ, f8E4M3FNUZ, f8E4M3B11FNUZ) ------------------------
# (exponent bits, mantissa bits, bias): no infinities, no negative zero, and
# the one NaN is 0x80, the code of -0 in the other formats
FNUZ = {"f8E5M2FNUZ": (5, 2, 16), "f8E4M3FNUZ": (4, 3, 8), "f8E4M3B11FNUZ": (4, 3, 11)}


def _fnuz_value(code: int, exp: int, man: int, bias: int) -> float:
    """The value of an FNUZ code, from the format's definition."""
    if code == 0x80:
        return math.nan
    sign = -1.0 if code & 0x80 else 1.0
    e, m = (code >> man) & ((1 << exp) - 1), code & ((1 << man) - 1)
    if e == 0:
        return sign * m * 2.0 ** (1 - bias - man)
    return sign * (1 + m / (1 << man)) * 2.0 ** (e - bias)


def _fnuz_code(value: float, exp: int, man: int, bias: int) -> int:
    """The code of an exactly representable value (reference for constants)."""
    codes = [c for c in range(256) if c != 0x80 and _fnuz_value(c, exp, man, bias) == value]
    assert len(codes) == 1, (value, codes)  # +0 is the only zero
    return codes[0]


@pytest.mark.parametrize("ty", sorted(FNUZ))
@pytest.mark.parametrize("dst", ["f32", "f16"])
@covers("arith.extf")
def test_extf_from_fnuz_is_exact_and_0x80_is_the_only_nan(ty, dst):
    codes = np.arange(256, dtype=np.uint8)
    x = codes.view(irtypes.SCALARS[ty])
    got = _cast("arith.extf", ty, dst, x).astype(np.float64)
    want = np.array([_fnuz_value(int(c), *FNUZ[ty]) for c in codes])
    assert np.array_equal(np.isnan(got), np.isnan(want)) and np.isnan(got).sum() == 1
    finite = ~np.isnan(want)
    assert np.array_equal(got[finite], want[finite])
    assert not np.signbit(got[finite & (want == 0)]).any(), "no negative zero"
    assert got[finite].max() == ml_dtypes.finfo(irtypes.SCALARS[ty]).max  # cross-check


@pytest.mark.parametrize("ty", sorted(FNUZ))
@covers("arith.constant")
def test_fnuz_constants_fold_as_mlir_does(ty):
    """MLIR rounds a literal to nearest even; -0.0 becomes +0; a magnitude
    past the largest finite value becomes NaN (0x80: no infinity to round to,
    and no saturation in APFloat's conversion); 0x80 is read as bits."""
    exp, man, bias = FNUZ[ty]
    finite = [_fnuz_value(c, exp, man, bias) for c in range(256) if c != 0x80]
    top = max(finite)
    below = max(v for v in finite if v < top)
    one_ulp = 2.0 ** -man
    lits = [1.0, -1.0, -0.0, top, -top, 2 * top, -4 * top, 1 + one_ulp / 2,
            1 + 3 * one_ulp / 2, (top + below) / 2, top + (top - below) / 4]
    want = [_fnuz_code(v, exp, man, bias) for v in (1.0, -1.0, 0.0, top, -top)]
    want += [0x80, 0x80,  # overflow: NaN, whatever the sign
             _fnuz_code(1.0, exp, man, bias),  # a tie goes to the even mantissa
             _fnuz_code(1 + 2 * one_ulp, exp, man, bias),
             _fnuz_code(below, exp, man, bias),  # MAX's mantissa is odd: the tie goes down
             _fnuz_code(top, exp, man, bias)]  # within half an ulp of MAX: MAX
    body = ", ".join(repr(v) for v in lits) + ", 0x80"
    n = len(lits) + 1
    got = run(f"%c = arith.constant dense<[{body}]> : vector<{n}x{ty}>\n"
              f"%s = arith.constant -0.0 : {ty}", {},
              {"c": f"vector<{n}x{ty}>", "s": ty})
    assert got["c"].view(np.uint8).tolist() == want + [0x80]
    assert int(np.asarray(got["s"]).view(np.uint8)) == 0


@pytest.mark.parametrize("ty", sorted(FNUZ))
@covers("arith.bitcast", "llvm.bitcast", "arith.truncf")
def test_fnuz_bitcasts_keep_the_bits_and_truncf_to_fnuz_is_unsupported(ty):
    codes = np.arange(256, dtype=np.uint8)
    f8 = _cast("arith.bitcast", "i8", ty, codes.view(np.int8))
    assert f8.dtype == irtypes.SCALARS[ty] and f8.view(np.uint8).tolist() == codes.tolist()
    back = _cast("arith.bitcast", ty, "i8", f8)
    assert back.view(np.uint8).tolist() == codes.tolist()  # 0x80 (NaN) included
    word = run(f"%r = llvm.bitcast %a : vector<4x{ty}> to i32",
               {"a": (f"vector<4x{ty}>", codes[[0x80, 1, 0x7F, 0xFF]].view(f8.dtype))},
               {"r": "i32"})["r"]
    assert int(np.asarray(word).view(np.uint32)) == 0xFF7F0180  # element 0 in the low byte
    # no instruction converts to FNUZ (jax converts narrow floats through PTX)
    with pytest.raises(Unsupported, match=f"to {ty}"):
        _cast("arith.truncf", "f32", ty, np.zeros(2, np.float32))
