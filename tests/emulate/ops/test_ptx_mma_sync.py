"""Warp-level ``mma.sync`` (:mod:`smalti.emulate.ops.mma_sync`) as jax's
``mosaic_gpu/mma.py`` writes it, against numpy: operands packed into each
lane's registers here from the PTX ISA's fragment formulas ("Matrix Fragments
for mma.m16n8k*", written per element ``a_i`` / ``b_i`` / ``c_i`` as the ISA
states them), two warps with different data, on random values whose sums are
exact, on values placed so that a wrong lane/register/element mapping shows,
and on edge values (infinities, NaN, extremes, wrapping s32 sums,
``.satfinite``)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from smalti.emulate.errors import Unsupported

from .harness import assert_same_bits, covers, run
from .test_ptx import form

WARPS = 2
T = 32 * WARPS

# PTX type -> (numpy dtype of the values, bits per element)
TYPES = {"f16": (np.float16, 16), "bf16": (ml_dtypes.bfloat16, 16),
         "e4m3": (ml_dtypes.float8_e4m3fn, 8), "e5m2": (ml_dtypes.float8_e5m2, 8),
         "s8": (np.int8, 8), "u8": (np.uint8, 8), "s4": (ml_dtypes.int4, 4),
         "u4": (ml_dtypes.uint4, 4)}

# (k, A type, B type): jax's four shapes, every mix the ISA allows, and the
# half-K shapes of two A registers
FORMS = [(16, "f16", "f16"), (16, "bf16", "bf16"), (32, "e4m3", "e4m3"), (32, "e5m2", "e5m2"),
         (32, "e4m3", "e5m2"), (32, "e5m2", "e4m3"), (32, "s8", "s8"), (32, "u8", "u8"),
         (32, "s8", "u8"), (32, "u8", "s8"), (64, "s4", "s4"), (64, "u4", "u4"),
         (64, "s4", "u4"), (64, "u4", "s4"), (8, "f16", "f16"), (16, "s8", "u8"),
         (32, "s4", "s4")]
IDS = [f"k{k}-{a}-{b}" for k, a, b in FORMS]


def is_int(ty: str) -> bool:
    return ty[0] in "su"


def opcode(k: int, a: str, b: str, satfinite: bool = False) -> str:
    acc = "s32" if is_int(a) else "f32"
    sat = ".satfinite" if satfinite else ""
    return f"mma.sync.aligned.m16n8k{k}.row.col{sat}.{acc}.{a}.{b}.{acc}"


MMA_FORM = form(opcode(16, "f16", "f16") + " {$0,$1,$2,$3}, {$4,$5,$6,$7}, {$8,$9}, "
                "{$10,$11,$12,$13};")


# --- the ISA's fragments, element by element -----------------------------------

def per_reg(ty: str) -> int:
    return 32 // TYPES[ty][1]


def a_position(lane: int, i: int, p: int) -> tuple[int, int]:
    """(row, col) of A element a_i: row groupID for i in [0, p) or [2p, 3p),
    groupID + 8 otherwise; col threadID_in_group * p + (i mod p), + 4p from
    i = 2p on (m16n8k16 f16: p = 2; m16n8k32 8-bit: 4; m16n8k64 4-bit: 8)."""
    gid, tig = lane >> 2, lane % 4
    row = gid if (i < p or 2 * p <= i < 3 * p) else gid + 8
    col = tig * p + (i & (p - 1)) + (4 * p if i >= 2 * p else 0)
    return row, col


def b_position(lane: int, i: int, p: int) -> tuple[int, int]:
    """(row k, col n) of B element b_i: row threadID_in_group * p + (i mod p),
    + 4p from i = p on; col groupID."""
    gid, tig = lane >> 2, lane % 4
    return tig * p + (i & (p - 1)) + (4 * p if i >= p else 0), gid


def c_position(lane: int, i: int) -> tuple[int, int]:
    """(row, col) of C/D element c_i: row groupID for c0, c1, groupID + 8 for
    c2, c3; col threadID_in_group * 2 + (i & 1)."""
    gid, tig = lane >> 2, lane % 4
    return (gid if i < 2 else gid + 8), tig * 2 + (i & 1)


def codes(values: np.ndarray, ty: str) -> np.ndarray:
    """Each element's bit pattern (uint32, ``bits`` wide)."""
    dt, bits = TYPES[ty]
    v = np.asarray(values).astype(dt)
    if bits == 4:
        return (np.asarray(v).astype(np.int64) & 0xF).astype(np.uint32)
    return v.view(np.dtype(f"u{bits // 8}")).astype(np.uint32)


def pack(matrix: np.ndarray, ty: str, n_elems: int, position) -> np.ndarray:
    """(T, registers) int32: each lane's elements ``position(lane, i, p)`` of
    its warp's ``matrix`` (W, rows, cols), the first element in the low bits."""
    p = per_reg(ty)
    bits = TYPES[ty][1]
    words = np.zeros((T, n_elems // p), np.uint32)
    c = codes(matrix, ty)
    for t in range(T):
        w, lane = divmod(t, 32)
        for i in range(n_elems):
            r, col = position(lane, i, p)
            words[t, i // p] |= c[w, r, col] << np.uint32(bits * (i % p))
    return words.view(np.int32)


def mma(k: int, a_ty: str, b_ty: str, a: np.ndarray, b: np.ndarray, c: np.ndarray,
        satfinite: bool = False) -> np.ndarray:
    """Runs the instruction on (W, 16, K) A, (W, K, 8) B and (W, 16, 8) C; D as
    (W, 16, 8)."""
    p = per_reg(a_ty)
    n_a, n_b = (4, 2) if k == 8 * p else (2, 1)
    a_regs = pack(a, a_ty, n_a * p, a_position)
    b_regs = pack(b, b_ty, n_b * p, b_position)
    acc, cons = ("i32", "r") if is_int(a_ty) else ("f32", "f")
    c_regs = np.zeros((T, 4), c.dtype)
    for t in range(T):
        w, lane = divmod(t, 32)
        for i in range(4):
            c_regs[t, i] = c[(w, *c_position(lane, i))]
    inputs = {f"a{g}": ("i32", a_regs[:, g]) for g in range(n_a)}
    inputs |= {f"b{h}": ("i32", b_regs[:, h]) for h in range(n_b)}
    inputs |= {f"c{i}": (acc, c_regs[:, i]) for i in range(4)}
    counter = iter(range(100))
    group = lambda n: "{" + ",".join(f"${next(counter)}" for _ in range(n)) + "}"  # noqa: E731
    text = (f"{opcode(k, a_ty, b_ty, satfinite)} {group(4)}, {group(n_a)}, {group(n_b)}, "
            f"{group(4)};")
    constraints = ",".join([f"={cons}"] * 4 + ["r"] * (n_a + n_b) + [cons] * 4)
    struct = f"!llvm.struct<({', '.join([acc] * 4)})>"
    operands = ", ".join("%" + n for n in inputs)
    types = ", ".join(t for t, _ in inputs.values())
    body = (f'%r = llvm.inline_asm "{text}", "{constraints}" {operands} : ({types}) -> {struct}\n'
            + "\n".join(f"%d{i} = llvm.extractvalue %r[{i}] : {struct}" for i in range(4)))
    out = run(body, inputs, {f"d{i}": acc for i in range(4)}, threads=T)
    d = np.zeros(c.shape, c.dtype)
    for t in range(T):
        w, lane = divmod(t, 32)
        for i in range(4):
            d[(w, *c_position(lane, i))] = np.asarray(out[f"d{i}"]).reshape(T)[t]
    return d


def reference(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """A @ B + C per warp: exact integers wrapped to s32, or the IEEE f64 sum
    of the exact products rounded to f32 (exact where these tests use it)."""
    if c.dtype == np.int32:
        exact = np.einsum("wmk,wkn->wmn", a.astype(np.int64), b.astype(np.int64)) + c
        return exact.astype(np.uint64).astype(np.uint32).view(np.int32)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        exact = (a64[:, :, :, None] * b64[:, None, :, :]).sum(axis=2) + c
    return exact.astype(np.float32)


def small_values(rng, ty: str, shape) -> np.ndarray:
    """Random values ``ty`` holds exactly, small enough that every sum is exact
    (integers: the type's whole range)."""
    ranges = {"s8": (-128, 127), "u8": (0, 255), "s4": (-8, 7), "u4": (0, 15)}
    if ty in ranges:
        lo, hi = ranges[ty]
        return rng.integers(lo, hi + 1, shape)
    return rng.integers(-7, 8, shape) * (0.5 if ty in ("f16", "bf16") else 1.0)


def accumulator(rng, ty: str) -> np.ndarray:
    if is_int(ty):
        return rng.integers(-1000, 1000, (WARPS, 16, 8)).astype(np.int32)
    return (rng.integers(-64, 64, (WARPS, 16, 8)) * 0.25).astype(np.float32)


@pytest.mark.parametrize("k,a_ty,b_ty", FORMS, ids=IDS)
@covers(MMA_FORM)
def test_random_operands_give_numpys_product(k, a_ty, b_ty):
    rng = np.random.default_rng(k * 31 + len(a_ty + b_ty))
    a = small_values(rng, a_ty, (WARPS, 16, k))
    b = small_values(rng, b_ty, (WARPS, k, 8))
    c = accumulator(rng, a_ty)
    a = a.astype(TYPES[a_ty][0]).astype(np.float64 if not is_int(a_ty) else np.int64)
    b = b.astype(TYPES[b_ty][0]).astype(np.float64 if not is_int(b_ty) else np.int64)
    assert_same_bits(mma(k, a_ty, b_ty, a, b, c), reference(a, b, c))


def distinct(ty: str, n: int) -> np.ndarray:
    """``n`` different values of ``ty`` (nonzero, finite), as float64 or int64."""
    if is_int(ty):
        lo = -(1 << (TYPES[ty][1] - 1)) if ty[0] == "s" else 0
        vals = np.arange(lo, lo + (1 << TYPES[ty][1]))
        vals = vals[vals != 0]
        return np.resize(vals, n).astype(np.int64) if len(vals) < n else vals[:n].astype(np.int64)
    dt = np.dtype(TYPES[ty][0])
    with np.errstate(invalid="ignore"):  # the NaN codes
        all_codes = np.arange(1 << (8 * dt.itemsize), dtype=np.uint32).astype(
            np.dtype(f"u{dt.itemsize}")).view(dt).astype(np.float64)
    # magnitudes the f32 sum with C (< 256) keeps exactly, many enough to be distinct
    lo, hi = (1.0, 64.0) if dt.itemsize == 2 else (2.0 ** -8, 2.0 ** 8)
    ok = np.isfinite(all_codes) & (np.abs(all_codes) >= lo) & (np.abs(all_codes) <= hi)
    vals = all_codes[ok]
    return vals[np.linspace(0, len(vals) - 1, n).astype(int)]


@pytest.mark.parametrize("k,a_ty,b_ty", [f for f in FORMS if TYPES[f[1]][1] >= 8],
                         ids=[i for i, f in zip(IDS, FORMS) if TYPES[f[1]][1] >= 8])
@covers(MMA_FORM)
def test_every_element_lands_where_the_isa_places_it(k, a_ty, b_ty):
    """A holds 16 x 8 different values in each 8-column slice; B = a one-hot
    selector of slice q (B[n + 8q, n] = 1) gives D = A[:, 8q:8q+8] + C, C
    also all different: any element read from the wrong lane, register or
    position moves a value. Then the same with B's columns: A selects B's
    rows."""
    acc = np.int32 if is_int(a_ty) else np.float32
    c = np.stack([np.arange(128).reshape(16, 8) + 128 * w for w in range(WARPS)]).astype(acc)
    for q in range(k // 8):
        a = np.stack([distinct(a_ty, 16 * k).reshape(16, k) for _ in range(WARPS)])
        a[1] = a[1][::-1]  # the second warp's data differ
        b = np.zeros((WARPS, k, 8))
        b[:, np.arange(8) + 8 * q, np.arange(8)] = 1
        b = b.astype(a.dtype)
        d = mma(k, a_ty, b_ty, a, b, c)
        assert_same_bits(d, reference(a, b, c))
    # B's k x 8 values, read back row by row: A[m, m'] = 1 picks B's row m' (< 16)
    b = np.stack([distinct(b_ty, 8 * k).reshape(k, 8) for _ in range(WARPS)])
    b[1] = b[1][::-1]
    for q in range(k // 16 if k >= 16 else 1):
        a = np.zeros((WARPS, 16, k), b.dtype)
        rows = np.arange(min(16, k))
        a[:, rows, rows + 16 * q] = 1
        d = mma(k, a_ty, b_ty, a, b, np.zeros_like(c))
        assert_same_bits(d, reference(a, b, np.zeros_like(c)))


def _float_edges(ty: str) -> np.ndarray:
    dt = np.dtype(TYPES[ty][0])
    info = ml_dtypes.finfo(dt)
    vals = [1.0, -1.0, 0.5, float(info.max), -float(info.max), float(info.smallest_normal),
            float(info.smallest_subnormal), -float(info.smallest_subnormal), np.nan, 2.0, -0.0]
    if ty != "e4m3":  # e4m3 has no infinities
        vals += [np.inf, -np.inf]
    return np.array(vals, np.float64).astype(dt).astype(np.float64)


@pytest.mark.parametrize("k,a_ty,b_ty", [f for f in FORMS if not is_int(f[1])],
                         ids=[i for i, f in zip(IDS, FORMS) if not is_int(f[1])])
@covers(MMA_FORM)
def test_float_edge_values_one_product_per_output(k, a_ty, b_ty):
    """Each output is one product of edge values plus an edge accumulator (the
    other products exact zeros): infinities, NaN (inf x 0, inf - inf), the
    largest finite values squared, subnormal products -- as IEEE arithmetic
    gives them in f32."""
    ea, eb = _float_edges(a_ty), _float_edges(b_ty)
    ec = np.array([0.0, 1.0, -np.inf, np.inf, np.nan, 3.0e38, -2.0 ** -149], np.float64)
    rng = np.random.default_rng(7)
    # A row m has one nonzero at column m % k; B column n one at row (n * 3) % k
    a = np.zeros((WARPS, 16, k))
    b = np.zeros((WARPS, k, 8))
    for w in range(WARPS):
        for m in range(16):
            a[w, m, m % k] = rng.choice(ea)
        for n in range(8):
            b[w, (n * 3) % k, n] = rng.choice(eb)
    c = rng.choice(ec, (WARPS, 16, 8)).astype(np.float32)
    assert_same_bits(mma(k, a_ty, b_ty, a, b, c), reference(a, b, c))


@pytest.mark.parametrize("k,a_ty,b_ty", [f for f in FORMS if is_int(f[1])],
                         ids=[i for i, f in zip(IDS, FORMS) if is_int(f[1])])
@covers(MMA_FORM)
def test_integer_extremes_wrap_and_satfinite_clamps(k, a_ty, b_ty):
    """Every element at its type's extreme and accumulators near the s32
    limits: the exact sum wraps modulo 2^32; with .satfinite it is clamped."""
    def extreme(ty: str) -> int:
        bits = TYPES[ty][1]
        return -(1 << (bits - 1)) if ty[0] == "s" else (1 << bits) - 1
    a = np.full((WARPS, 16, k), extreme(a_ty), np.int64)
    b = np.full((WARPS, k, 8), extreme(b_ty), np.int64)
    a[1, ::2] = -1 if a_ty[0] == "s" else 1  # warp 1: other signs, half the rows
    big = np.iinfo(np.int32)
    c = np.zeros((WARPS, 16, 8), np.int32)
    c[:, :, ::2] = big.max - 5
    c[:, :, 1::2] = big.min + 5
    d = mma(k, a_ty, b_ty, a, b, c)
    assert_same_bits(d, reference(a, b, c))
    exact = np.einsum("wmk,wkn->wmn", a, b) + c
    assert (exact != d).any(), "the test should overflow somewhere"
    sat = mma(k, a_ty, b_ty, a, b, c, satfinite=True)
    assert_same_bits(sat, np.clip(exact, big.min, big.max).astype(np.int32))


@pytest.mark.parametrize("text", [
    opcode(16, "f16", "s8"), opcode(32, "s8", "s4"), opcode(16, "f16", "f16", satfinite=True),
    "mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16", opcode(48, "s8", "s8"),
    "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32", opcode(16, "f16", "bf16")])
def test_forms_not_modelled_raise_unsupported_naming_them(text):
    with pytest.raises(Unsupported, match="mma.sync"):
        run(f'%r = llvm.inline_asm "{text} {{$0,$1,$2,$3}}, {{$4,$5,$6,$7}}, {{$8,$9}}, '
            '{$10,$11,$12,$13};", "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f" '
            "%a, %a, %a, %a, %a, %a, %c, %c, %c, %c : (i32, i32, i32, i32, i32, i32, f32, f32, "
            "f32, f32) -> !llvm.struct<(f32, f32, f32, f32)>",
            {"a": ("i32", np.zeros(32, np.int32)), "c": ("f32", np.zeros(32, np.float32))},
            threads=32)


def test_part_of_a_warp_raises_unsupported():
    """mma.sync.aligned needs every lane of the warp."""
    text = (opcode(16, "f16", "f16") + " {$0,$1,$2,$3}, {$4,$5,$6,$7}, {$8,$9}, "
            "{$10,$11,$12,$13};")
    body = f"""
    %tid = gpu.thread_id x
    %c16 = arith.constant 16 : index
    %p = arith.cmpi ult, %tid, %c16 : index
    scf.if %p {{
      %r = llvm.inline_asm "{text}", "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f"
        %a, %a, %a, %a, %a, %a, %c, %c, %c, %c : (i32, i32, i32, i32, i32, i32, f32, f32,
        f32, f32) -> !llvm.struct<(f32, f32, f32, f32)>
    }}"""
    with pytest.raises(Unsupported, match="part of a warp"):
        run(body, {"a": ("i32", np.zeros(32, np.int32)), "c": ("f32", np.zeros(32, np.float32))},
            threads=32)
