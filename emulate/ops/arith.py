"""``arith``: integer ops on the two's-complement bits (signless integers are
kept as signed numpy integers and reinterpreted for unsigned ops), float ops
in the value's own dtype (numpy rounds f32/f64 IEEE round-to-nearest-even;
f16/bf16 are computed in f32 and rounded once, which is exact for + - * /).
``fptosi``/``fptoui`` saturate and map NaN to 0, as PTX ``cvt.rzi`` does."""

from __future__ import annotations

import re

import numpy as np

from .. import irtypes, subbyte
from ..compiler import Op, Step, rule
from ..errors import Unsupported
from ..machine import Frame
from ._util import binary, const_array, ternary, thread_axis, unary


def _dense_value(attr, t: irtypes.T) -> np.ndarray:
    from jax._src.lib.mlir import ir

    dt = t.dtype
    if isinstance(attr, ir.DenseElementsAttr):
        if attr.is_splat:
            return np.full(t.shape, _scalar(attr.get_splat_value(), dt), dt)
        if t.elem in ("bf16", "f16") or t.elem.startswith("f8"):
            body = str(attr)[len("dense<"):].split(">", 1)[0]  # not the type's ">"
            if body.startswith('"0x'):
                raw = bytes.fromhex(body.strip('"')[2:])
                return np.frombuffer(raw, dt).reshape(t.shape).copy()
            # MLIR prints a value with no decimal form (a NaN) as its bits: 0x80
            tokens = re.findall(r"0x[0-9A-Fa-f]+|[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|inf|nan)",
                                body)
            bits = irtypes.UNSIGNED[dt.itemsize * 8]
            return np.array([np.array(int(v, 16), bits).view(dt) if v.startswith("0x")
                             else np.array(float(v)).astype(dt) for v in tokens],
                            dt).reshape(t.shape)
        return np.array(attr).astype(dt).reshape(t.shape)
    return np.asarray(_scalar(attr, dt), dt)


def _scalar(attr, dt: np.dtype):
    from jax._src.lib.mlir import ir

    if isinstance(attr, ir.BoolAttr):
        return bool(attr.value)
    if isinstance(attr, ir.IntegerAttr):
        v = attr.value
        if dt == np.bool_:
            return v != 0
        bits = dt.itemsize * 8
        v &= (1 << bits) - 1
        return np.array(v, irtypes.UNSIGNED[bits]).view(dt)[()]
    if isinstance(attr, ir.FloatAttr):
        return np.array(attr.value, np.float64).astype(dt)[()]
    raise Unsupported(f"constant attribute {attr}")


@rule("arith.constant", "llvm.mlir.constant")
def constant(o: Op) -> Step:
    t = o.out_types[0]
    if t.kind not in ("scalar", "vector"):
        raise o.unsupported(f"constant of type {t.text}")
    val = const_array(_dense_value(o.attr("value"), t))
    (out,) = o.outs

    def step(fr: Frame) -> None:
        fr.regs[out] = val
    return step


def _signed_div(a, b):
    """``div.s``: truncating; by zero all ones (-1), as NVIDIA GPUs give
    (the PTX ISA leaves it machine-specific); INT_MIN / -1 wraps."""
    a, b = np.asarray(a), np.asarray(b)
    zero = b == 0
    b1 = np.where(zero, 1, b).astype(b.dtype)
    with np.errstate(over="ignore"):
        q = np.floor_divide(a, b1)
        fix = (np.remainder(a, b1) != 0) & ((a < 0) != (b1 < 0))
        q = (q + fix.astype(q.dtype)).astype(a.dtype)
    return np.where(zero, np.asarray(-1, a.dtype), q).astype(a.dtype)


def _signed_rem(a, b):
    """``rem.s``: the sign of the dividend; by zero the dividend itself
    (a - (a / 0) * 0, as the GPU computes it)."""
    a, b = np.asarray(a), np.asarray(b)
    b1 = np.where(b == 0, 1, b).astype(b.dtype)
    with np.errstate(over="ignore"):
        q = _signed_div(a, b1)
        r = (a - q * b1).astype(a.dtype)
    return np.where(b == 0, a, r).astype(a.dtype)


def _udiv(a, b):
    """``div.u``: by zero all ones (0xFF..F)."""
    ua, ub = irtypes.unsigned(a), irtypes.unsigned(b)
    zero = ub == 0
    q = ua // np.where(zero, 1, ub).astype(ub.dtype)
    q = np.where(zero, np.asarray(np.iinfo(ua.dtype).max if ua.dtype != np.bool_ else True,
                                  ua.dtype), q)
    return np.asarray(q).astype(ua.dtype).view(np.asarray(a).dtype)


def _urem(a, b):
    """``rem.u``: by zero the dividend."""
    ua, ub = irtypes.unsigned(a), irtypes.unsigned(b)
    zero = ub == 0
    r = np.where(zero, ua, ua % np.where(zero, 1, ub).astype(ub.dtype))
    return np.asarray(r).astype(ua.dtype).view(np.asarray(a).dtype)


def _u(fn):
    def f(a, b):
        ua, ub = irtypes.unsigned(a), irtypes.unsigned(b)
        return np.asarray(fn(ua, ub)).astype(ua.dtype).view(np.asarray(a).dtype)
    return f


class _ZeroDivisor(Exception):
    """A ceildiv/floordiv by zero: its value depends on how MLIR expands the
    op into div.s/div.u, which varies between versions -- not modelled."""


def _no_zero(b):
    if np.any(np.asarray(b) == 0):
        raise _ZeroDivisor
    return b


def _ceildiv_s(a, b):
    b = _no_zero(b)
    q = _signed_div(a, b)
    r = np.asarray(a) - q * np.asarray(b)
    return (q + ((r != 0) & ((r < 0) == (np.asarray(b) < 0))).astype(q.dtype)).astype(q.dtype)


def _ceildiv_u(a, b):
    _no_zero(b)
    ua, ub = irtypes.unsigned(a), irtypes.unsigned(b)
    q = ua // ub + (ua % ub != 0).astype(ua.dtype)
    return q.astype(ua.dtype).view(np.asarray(a).dtype)


def _floordiv_s(a, b):
    return np.floor_divide(a, _no_zero(np.asarray(b)))


def _shift(kind: str):
    def f(a, b):
        a = np.asarray(a)
        bits = 1 if a.dtype == np.bool_ else a.dtype.itemsize * 8
        sh = irtypes.unsigned(b).astype(np.uint64)
        big = sh >= bits
        shc = np.minimum(sh, bits - 1).astype(a.dtype if a.dtype != np.bool_ else np.uint8)
        if kind == "shl":
            res = np.left_shift(a, shc)
            return np.where(big, np.zeros_like(a), res).astype(a.dtype)
        if kind == "shrsi":
            return np.right_shift(a, shc).astype(a.dtype)  # saturating amount: sign fill
        ua = irtypes.unsigned(a)
        res = np.right_shift(ua, shc.astype(ua.dtype))
        return np.where(big, np.zeros_like(ua), res).astype(ua.dtype).view(a.dtype)
    return f


INT_BINARY = {
    "arith.addi": np.add, "arith.subi": np.subtract, "arith.muli": np.multiply,
    "arith.andi": np.bitwise_and, "arith.ori": np.bitwise_or, "arith.xori": np.bitwise_xor,
    "arith.divsi": _signed_div, "arith.remsi": _signed_rem,
    "arith.divui": _udiv, "arith.remui": _urem,
    "arith.ceildivsi": _ceildiv_s, "arith.ceildivui": _ceildiv_u, "arith.floordivsi": _floordiv_s,
    "arith.maxsi": np.maximum, "arith.minsi": np.minimum,
    "arith.maxui": _u(np.maximum), "arith.minui": _u(np.minimum),
    "arith.shli": _shift("shl"), "arith.shrsi": _shift("shrsi"), "arith.shrui": _shift("shrui"),
}
def maximumf(a, b):
    """IEEE maximum: NaN if either is NaN, and -0.0 < +0.0 (np.maximum may
    return either of two equal operands, so the sign of a zero is chosen here)."""
    a, b = np.asarray(a), np.asarray(b)
    return np.where(a == b, np.where(np.signbit(a), b, a), np.maximum(a, b))


def minimumf(a, b):
    """IEEE minimum: NaN if either is NaN, and -0.0 < +0.0."""
    a, b = np.asarray(a), np.asarray(b)
    return np.where(a == b, np.where(np.signbit(a), a, b), np.minimum(a, b))


def maximum_number(a, b):
    """IEEE 754-2019 maximumNumber: a NaN operand gives the other operand
    (NaN only if both are), and -0.0 < +0.0 (PTX ``max`` without ``.NaN``)."""
    a, b = np.asarray(a), np.asarray(b)
    return np.where(np.isnan(a), b, np.where(np.isnan(b), a, maximumf(a, b)))


def minimum_number(a, b):
    """IEEE 754-2019 minimumNumber (PTX ``min`` without ``.NaN``)."""
    a, b = np.asarray(a), np.asarray(b)
    return np.where(np.isnan(a), b, np.where(np.isnan(b), a, minimumf(a, b)))


def extremum(larger: bool, nan_propagates: bool):
    """PTX's float ``max``/``min`` (``.NaN``: NaN-propagating), and the
    reductions built on them: ``+0.0 > -0.0`` either way (the PTX ISA's
    pseudo-code for ``max``)."""
    if nan_propagates:
        return maximumf if larger else minimumf
    return maximum_number if larger else minimum_number


def reduce_columns(fn, x: np.ndarray) -> np.ndarray:
    """``fn`` folded over the columns of the 2-D ``x``, left to right (for
    an :func:`extremum`, whose numpy reductions do not order -0.0 and
    +0.0)."""
    r = x[:, 0]
    for k in range(1, x.shape[1]):
        r = fn(r, x[:, k])
    return r


FLOAT_BINARY = {
    "arith.addf": np.add, "arith.subf": np.subtract, "arith.mulf": np.multiply,
    "arith.divf": np.divide, "arith.remf": np.fmod,
    "arith.maximumf": maximumf, "arith.minimumf": minimumf,
    "arith.maxnumf": np.fmax, "arith.minnumf": np.fmin,
}


def _bool_ok(fn, name):
    def f(a, b):
        a, b = np.asarray(a), np.asarray(b)
        if a.dtype == np.bool_ and name in ("arith.addi", "arith.subi"):
            return np.logical_xor(a, b)
        if a.dtype == np.bool_ and name in ("arith.muli", "arith.maxsi"):
            return np.logical_and(a, b)  # signed, true is -1: the max is true iff both are
        if a.dtype == np.bool_ and name == "arith.minsi":
            return np.logical_or(a, b)
        return fn(a, b)
    return f


def _fastmath(o: Op) -> None:
    if o.has("fastmath"):
        text = str(o.attr("fastmath"))
        if text not in ("#arith.fastmath<none>", "#arith.fastmath<contract>"):
            raise o.unsupported(f"{o.name} with {text} (approximate rounding not modelled)")


#: integer ops whose function is a plain elementwise numpy one (..batching)
BATCHED_INT = frozenset({"arith.addi", "arith.subi", "arith.muli", "arith.andi", "arith.ori",
                         "arith.xori", "arith.maxsi", "arith.minsi"})


def _int_rule(o: Op, fn) -> Step:
    plain = o.name in BATCHED_INT
    if o.in_types[0].dtype in (None, np.dtype(np.bool_)):  # i1 (or unknown): decided per call
        fn, plain = _bool_ok(fn, o.name), False
    if o.name not in ("arith.ceildivsi", "arith.ceildivui", "arith.floordivsi"):
        return binary(o, fn, batch=plain)
    (a, b), (out,) = o.ins, o.outs
    vrank, loc, name = o.in_types[1].vrank, o.loc, o.name

    def step(fr: Frame) -> None:
        x, y = fr.regs[a], np.asarray(fr.regs[b])
        if fr.mask is not None and y.ndim > vrank:  # inactive threads' divisors do not count
            y = np.where(thread_axis(fr.mask, vrank), y, np.ones_like(y))
        try:
            fr.regs[out] = fn(x, y)
        except _ZeroDivisor:
            raise Unsupported(f"{name} by zero (its value depends on how MLIR expands it "
                              "into div.s/div.u; keep the divisor nonzero)", loc) from None
    return step


for _name, _fn in INT_BINARY.items():
    rule(_name)(lambda o, fn=_fn: _int_rule(o, fn))
for _name, _fn in FLOAT_BINARY.items():
    def _frule(o: Op, fn=_fn) -> Step:
        _fastmath(o)
        return binary(o, fn, batch=True)
    rule(_name)(_frule)


@rule("arith.negf")
def negf(o: Op) -> Step:
    return unary(o, np.negative, batch=True)


CMPI = {0: np.equal, 1: np.not_equal, 2: np.less, 3: np.less_equal, 4: np.greater,
        5: np.greater_equal}
CMPI_U = {6: np.less, 7: np.less_equal, 8: np.greater, 9: np.greater_equal}


@rule("arith.cmpi")
def cmpi(o: Op) -> Step:
    p = int(o.attr("predicate").value)
    if p in CMPI:
        return binary(o, CMPI[p], batch=True)
    fn = CMPI_U[p]
    return binary(o, lambda a, b: fn(irtypes.unsigned(a), irtypes.unsigned(b)))


def _ord(a, b):
    return ~(np.isnan(a) | np.isnan(b))


CMPF = {
    0: lambda a, b: np.zeros(np.broadcast(a, b).shape, bool),
    1: lambda a, b: np.equal(a, b), 2: lambda a, b: np.greater(a, b),
    3: lambda a, b: np.greater_equal(a, b), 4: lambda a, b: np.less(a, b),
    5: lambda a, b: np.less_equal(a, b), 6: lambda a, b: np.not_equal(a, b) & _ord(a, b),
    7: _ord,
    8: lambda a, b: np.equal(a, b) | ~_ord(a, b), 9: lambda a, b: ~np.less_equal(a, b),
    10: lambda a, b: ~np.less(a, b), 11: lambda a, b: ~np.greater_equal(a, b),
    12: lambda a, b: ~np.greater(a, b), 13: lambda a, b: ~np.equal(a, b),
    14: lambda a, b: ~_ord(a, b),
    15: lambda a, b: np.ones(np.broadcast(a, b).shape, bool),
}


@rule("arith.cmpf")
def cmpf(o: Op) -> Step:
    return binary(o, CMPF[int(o.attr("predicate").value)], batch=True)


@rule("arith.select")
def select(o: Op) -> Step:
    vr = o.out_types[0].vrank
    cond_vrank = o.in_types[0].vrank

    def sel(c, a, b):
        c = np.asarray(c)
        if cond_vrank == 0 and c.ndim == 1 and vr:  # per-thread i1 choosing vectors
            c = c.reshape(c.shape + (1,) * vr)
        return np.where(c, a, b)
    return ternary(o, sel)


def _cast(o: Op, fn) -> Step:
    return unary(o, fn)


@rule("arith.extf", "arith.truncf")
def float_resize(o: Op) -> Step:
    dst = o.out_types[0]
    if dst.elem.startswith("f8") or dst.elem.startswith("f4"):
        raise o.unsupported(
            f"{o.name} to {dst.elem} (saturation of the PTX conversion not modelled)")
    if o.has("roundingmode"):
        raise o.unsupported(f"{o.name} with a rounding mode")
    dt = dst.dtype
    return _cast(o, lambda x: np.asarray(x).astype(dt))


@rule("arith.extsi", "arith.trunci", "arith.index_cast")
def int_signed_cast(o: Op) -> Step:
    dst = o.out_types[0]
    dt = dst.dtype
    if dt == np.bool_:
        return _cast(o, lambda x: (np.asarray(x) & 1).astype(bool))

    def f(x):
        x = np.asarray(x)
        if x.dtype == np.bool_:
            return np.negative(x.astype(dt))
        return x.astype(dt)
    return _cast(o, f)


@rule("arith.extui", "arith.index_castui")
def int_unsigned_cast(o: Op) -> Step:
    dt = o.out_types[0].dtype
    if dt == np.bool_:
        return _cast(o, lambda x: (np.asarray(x) & 1).astype(bool))

    def f(x):
        x = np.asarray(x)
        if dt.itemsize < x.dtype.itemsize:
            return x.astype(dt)
        return irtypes.unsigned(x).astype(dt)
    return _cast(o, f)


@rule("arith.sitofp")
def sitofp(o: Op) -> Step:
    dt = o.out_types[0].dtype
    return _cast(o, lambda x: np.asarray(x).astype(np.float64).astype(dt)
                 if dt.itemsize < 4 else np.asarray(x).astype(dt))


@rule("arith.uitofp")
def uitofp(o: Op) -> Step:
    dt = o.out_types[0].dtype
    return _cast(o, lambda x: irtypes.unsigned(x).astype(np.float64).astype(dt)
                 if dt.itemsize < 4 else irtypes.unsigned(x).astype(dt))


def _fp_to_int(dt: np.dtype, unsigned: bool):
    bits = dt.itemsize * 8
    lo, hi = (0, 2 ** bits - 1) if unsigned else (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)

    out = irtypes.UNSIGNED[bits] if unsigned else dt

    def f(x):
        x = np.asarray(x).astype(np.float64)
        t = np.trunc(np.nan_to_num(x, nan=0.0))
        # compare in float64, but take the limits as integers: 2**63 - 1 (and
        # 2**64 - 1) round up to a float that no longer fits
        res = np.clip(t, lo, hi).astype(out)
        res = np.where(t >= hi, np.array(hi).astype(out), res)
        return np.where(t <= lo, np.array(lo).astype(out), res).astype(out).view(dt)
    return f


@rule("arith.fptosi")
def fptosi(o: Op) -> Step:
    return _cast(o, _fp_to_int(o.out_types[0].dtype, False))


@rule("arith.fptoui")
def fptoui(o: Op) -> Step:
    return _cast(o, _fp_to_int(o.out_types[0].dtype, True))


@rule("arith.bitcast")
def bitcast(o: Op) -> Step:
    src, dst = o.in_types[0], o.out_types[0]
    dt = dst.dtype
    if (src.bits == dst.bits < 8 and np.bool_ not in (src.dtype, dt)
            and src.shape == dst.shape):  # i4 <-> f4E2M1FN, i2 <-> ui2: the element's bits
        return _cast(o, lambda x: subbyte.cook(subbyte.raw(x, src.dtype), dt))
    if dst.dtype == np.bool_ or src.bits < 8 or dst.bits < 8:
        raise o.unsupported(f"arith.bitcast {src.text} -> {dst.text}")
    if src.bits == dst.bits:
        return _cast(o, lambda x: np.array(x).view(dt))
    # a scalar and a 1-D vector of the same width (i32 <-> vector<2xbf16>)
    total = [t.bits * (int(np.prod(t.shape)) if t.kind == "vector" else 1) for t in (src, dst)]
    if total[0] != total[1] or sorted((src.vrank, dst.vrank)) != [0, 1]:
        raise o.unsupported(f"arith.bitcast {src.text} -> {dst.text}")
    if src.vrank == 0:
        return _cast(o, lambda x: np.ascontiguousarray(np.asarray(x)[..., None]).view(dt))
    return _cast(o, lambda x: np.ascontiguousarray(np.asarray(x)).view(dt)[..., 0])
