"""PTX conversions (``smalti.emulate.floats``, ``emulate/ops/ptx_block.py``):
every fp8/fp6/fp4/ue8m0 ``cvt`` form, on edge values, against references
computed independently -- ml_dtypes' round-to-nearest-even with PTX's
``.satfinite`` applied explicitly (ml_dtypes turns an overflow into NaN or
infinity; PTX clamps it to MAX_NORM), and ``math.frexp`` for ue8m0's directed
roundings -- then the very strings jax emits, taken from lowered kernels, then
Pallas kernels that cast (``x.astype(jnp.float8_e4m3fn)``) run end to end,
and the official int8 x bf16 mixed-type matmul."""

from __future__ import annotations

import math
import re
from types import SimpleNamespace
from unittest import mock

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import smalti.emulate as emu
from smalti.emulate import floats
from smalti.emulate.capture import lower_for_cuda
from smalti.emulate.compiler import Compiler, Op
from smalti.emulate.ops import inline_asm, ptx_block
from smalti.emulate.testing import emulate_pipeline

NARROW = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2,
          "e2m1": ml_dtypes.float4_e2m1fn, "e2m3": ml_dtypes.float6_e2m3fn,
          "e3m2": ml_dtypes.float6_e3m2fn}
WIDE = {"f32": np.dtype(np.float32), "f16": np.dtype(np.float16),
        "bf16": np.dtype(ml_dtypes.bfloat16)}
RNG = np.random.default_rng(35)


def edge_values(dt) -> np.ndarray:
    """Zeros, subnormals and the ties around them, ties between normals,
    MAX_NORM and beyond, infinities, NaN, and random values, of format ``dt``
    (from ml_dtypes' description of it), as float64."""
    fi = ml_dtypes.finfo(dt)
    tiny, sub, top = float(fi.smallest_normal), float(fi.smallest_subnormal), float(fi.max)
    eps = float(fi.eps)
    v = [0.0, -0.0, sub, -sub, sub / 2, -sub / 2, sub / 4, 1.5 * sub, 2.5 * sub, 3 * sub / 4,
         tiny - sub, tiny - sub / 2, tiny, tiny * (1 + eps / 2), 1 + eps / 2, 1 + 1.5 * eps,
         -(1 + eps / 2), 1.0, 3.0, top, -top, top * (1 + eps / 4), top * (1 + eps / 2),
         -top * (1 + eps / 2), top * 1.01, top * 4, -top * 4, 1e30, -1e30,
         math.inf, -math.inf, math.nan, -math.nan]
    rnd = RNG.standard_normal(400) * top / 4
    return np.concatenate([np.array(v), rnd, rnd / 2 ** 8])


def satfinite(x: np.ndarray, dt) -> np.ndarray:
    """The codes PTX's cvt.rn.satfinite gives: ml_dtypes' nearest-even rounding
    of the value clamped to +-MAX_NORM (a value that rounds beyond MAX_NORM
    rounds to it); NaN left NaN here (checked apart)."""
    top = float(ml_dtypes.finfo(dt).max)
    clamped = np.clip(np.asarray(x, np.float64), -top, top)
    return clamped.astype(dt).view(np.uint8)


def assert_same_floats(got, want) -> None:
    """Equal values, NaN where NaN, and the same sign (of zeros too)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    ok = ~np.isnan(want)
    np.testing.assert_array_equal(got[ok], want[ok])
    np.testing.assert_array_equal(np.signbit(got[ok]), np.signbit(want[ok]))


def ue8m0_reference(v: float, mode: str) -> int:
    """cvt.{rz,rp}.satfinite.ue8m0 of one value: 2^k for k = floor/ceil(log2 v),
    clamped to [2^-127, 2^127]; NaN 0xFF."""
    if math.isnan(v):
        return 0xFF
    if v <= 2.0 ** -127:
        return 0
    if v >= 2.0 ** 127:
        return 0xFE
    m, e = math.frexp(v)  # v = m 2^e, 0.5 <= m < 1
    k = e - 1 if (m == 0.5 or mode == "rz") else e
    return min(max(k + 127, 0), 254)


# --- the numbers -------------------------------------------------------------

@pytest.mark.parametrize("name", list(NARROW))
@pytest.mark.parametrize("src", ["f32", "f16", "bf16"])
def test_encode_is_round_to_nearest_even_with_satfinite(name, src):
    dt, fmt = NARROW[name], floats.FORMATS[name]
    with np.errstate(all="ignore"):
        x = edge_values(dt).astype(WIDE[src]).astype(np.float64)
    got = floats.encode(x, fmt)
    nan = np.isnan(x)
    np.testing.assert_array_equal(got[~nan], satfinite(x[~nan], dt))
    if fmt.nan_code is None:  # e2m1, e2m3, e3m2 have no NaN: PTX gives +MAX_NORM
        assert np.all(got[nan] == satfinite(np.array([np.inf]), dt)[0])
    else:
        assert np.all(np.isnan(floats.decode(got[nan], fmt)))
    # the overflows are where ml_dtypes and PTX differ: check they were exercised
    assert np.any(np.isinf(x))
    assert np.any(np.abs(x[np.isfinite(x)]) > float(ml_dtypes.finfo(dt).max))


@pytest.mark.parametrize("name", list(NARROW))
def test_relu_makes_negative_results_zero_and_keeps_nan(name):
    dt, fmt = NARROW[name], floats.FORMATS[name]
    x = edge_values(dt)
    got = floats.encode(x, fmt, relu=True)
    plain = floats.encode(x, fmt)
    neg = (np.signbit(x)) & ~np.isnan(x)
    assert np.all(got[neg] == 0)
    np.testing.assert_array_equal(got[~neg], plain[~neg])


@pytest.mark.parametrize("name", list(NARROW))
def test_decode_is_exact(name):
    dt, fmt = NARROW[name], floats.FORMATS[name]
    codes = np.arange(1 << fmt.bits, dtype=np.uint8)
    want = codes.view(dt).astype(np.float64) if fmt.bits == 8 else \
        codes.astype(np.uint8).view(dt).astype(np.float64)
    got = floats.decode(codes, fmt)
    assert_same_floats(got, want)


@pytest.mark.parametrize("mode", ["rz", "rp"])
def test_ue8m0_rounds_towards_zero_or_up_and_saturates(mode):
    x = np.concatenate([
        [0.0, -0.0, -1.0, 1e-45, 2.0 ** -127, 2.0 ** -126, 1.0, 1.5, 2.0, 3.0, 2.0 ** 127,
         1.5 * 2.0 ** 127, 3e38, math.inf, -math.inf, math.nan],
        np.abs(RNG.standard_normal(300)) * 2.0 ** RNG.integers(-120, 120, 300)])
    x = x.astype(np.float32).astype(np.float64)
    got = floats.encode(x, floats.FORMATS["ue8m0"], mode)
    np.testing.assert_array_equal(got, [ue8m0_reference(v, mode) for v in x])
    dec = floats.decode(np.arange(256), floats.FORMATS["ue8m0"])
    want = np.arange(256).astype(np.uint8).view(ml_dtypes.float8_e8m0fnu).astype(np.float64)
    np.testing.assert_array_equal(dec[:255], want[:255])
    assert np.isnan(dec[255])


# --- the strings jax emits -----------------------------------------------------

def _cast_kernel(src, chain):
    """A Pallas kernel casting its (128, 128) input through ``chain`` to f32."""
    from jax.experimental.pallas import mosaic_gpu as plgpu
    wg = plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup)

    def body(x, o):
        y = x[...]
        for dt in chain:
            y = y.astype(dt)
        o[...] = y.astype(jnp.float32)
    return plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((128, 128), jnp.float32),
                        compiler_params=wg)


def _asm_ops(module) -> list:
    found = []

    def walk(op):
        for region in op.regions:
            for block in region.blocks:
                for inner in block.operations:
                    if inner.operation.name == "llvm.inline_asm":
                        found.append(inner.operation)
                    walk(inner.operation)
    walk(module.operation)
    return found


def jax_conversion_strings(src, chain, arch=(9, 0), isa=0):
    """(asm text, op) of every conversion string in the lowered cast kernel, jax
    believing ptxas speaks PTX ISA ``isa`` (``0``: the CPU's answer)."""
    from jax.experimental.mosaic.gpu import fragmented_array as fa
    fake = fa.mgpu_lib if isa == 0 else SimpleNamespace(
        _mosaic_gpu_ext=SimpleNamespace(_get_ptxas_isa_version=lambda: isa))
    with mock.patch.object(fa, "mgpu_lib", fake):
        (module,), _ = lower_for_cuda(_cast_kernel(src, chain), [np.zeros((128, 128), src)],
                                      arch=arch)
    from jax._src.lib.mlir import ir
    out = {}
    for op in _asm_ops(module):
        text = ir.StringAttr(op.attributes["asm_string"]).value
        if "cvt." in text:
            out.setdefault(text, (op, module))
    return out


CASES = [  # (source dtype, cast chain, arch, ptxas ISA)
    (np.float32, [jnp.float8_e4m3fn], (9, 0), 0),
    (np.float32, [jnp.float8_e5m2], (9, 0), 0),
    (np.float16, [jnp.float8_e4m3fn, jnp.float16], (9, 0), 0),
    (np.float16, [jnp.float8_e5m2, jnp.float16], (9, 0), 0),
    (ml_dtypes.bfloat16, [jnp.float8_e4m3fn, jnp.bfloat16], (9, 0), 92),
    (ml_dtypes.bfloat16, [jnp.float8_e5m2, jnp.bfloat16], (9, 0), 92),
    (np.float32, [jnp.float4_e2m1fn], (10, 0), 92),
    (np.float16, [jnp.float4_e2m1fn, jnp.float16], (10, 0), 92),
    (ml_dtypes.bfloat16, [jnp.float4_e2m1fn, jnp.bfloat16], (10, 0), 92),
    (np.float32, [jnp.float8_e8m0fnu], (10, 0), 0),
    (ml_dtypes.bfloat16, [jnp.float8_e8m0fnu, jnp.bfloat16], (10, 0), 0),
]


def _elements(regs: list[np.ndarray], bits: int) -> np.ndarray:
    """The elements (uint64 codes, ``bits`` each) of registers laid end to end,
    each register's least significant element first."""
    out = []
    for r in regs:
        r = np.asarray(r)
        width = r.dtype.itemsize * 8 * (r.shape[-1] if r.ndim > 1 else 1)
        u = ptx_block._to_bits(r, SimpleNamespace(
            kind="vector" if r.ndim > 1 else "scalar", dtype=r.dtype,
            bits=r.dtype.itemsize * 8, shape=r.shape[-1:]))
        out += [(u >> np.uint64(bits * k)) & np.uint64((1 << bits) - 1)
                for k in range(width // bits)]
    return np.stack(out, -1)


def _reference(opcode: str, src_codes: np.ndarray) -> np.ndarray:
    """What ``opcode`` gives each source element, independently of floats.encode."""
    if m := ptx_block.CVT_DOWN.fullmatch(opcode):
        rnd, _, narrow, src = m.groups()
        wide = WIDE[src.removesuffix("x2")]
        vals = src_codes.astype(np.uint32 if wide.itemsize == 4 else np.uint16).view(wide)
        vals = vals.astype(np.float64)
        if narrow == "ue8m0":
            return np.array([ue8m0_reference(v, rnd) for v in vals.ravel()]).reshape(vals.shape)
        dt = NARROW[narrow]
        codes = satfinite(vals, dt).astype(np.int64)
        if floats.FORMATS[narrow].nan_code is not None:
            codes = np.where(np.isnan(vals), -1, codes)  # any NaN (checked apart)
        else:
            codes = np.where(np.isnan(vals), satfinite(np.array([np.inf]), dt)[0], codes)
        return codes
    m = ptx_block.CVT_UP.fullmatch(opcode)
    _, wide, narrow = m.groups()
    dt = ml_dtypes.float8_e8m0fnu if narrow == "ue8m0" else NARROW[narrow]
    vals = src_codes.astype(np.uint8).view(dt).astype(WIDE[wide])
    bits = vals.view(np.uint16).astype(np.int64)
    return np.where(np.isnan(vals.astype(np.float64)), -1, bits)


@pytest.mark.parametrize("src,chain,arch,isa", CASES,
                         ids=[f"{np.dtype(c[0]).name}-{'-'.join(np.dtype(d).name for d in c[1])}"
                              for c in CASES])
def test_jax_conversion_strings_compute_ptx_semantics(src, chain, arch, isa):
    """Every cvt string jax emits for the cast, run on edge values packed into
    its operand registers as jax packs them, equals the reference per element."""
    check_conversion_strings(src, chain, arch, isa)


def check_conversion_strings(src, chain, arch, isa, compiler: Compiler | None = None) -> None:
    """Runs each cvt string jax emits for the cast (compiled by ``compiler``,
    the emulator's by default) and checks it against the reference."""
    strings = jax_conversion_strings(src, chain, arch, isa)
    assert strings, "jax emitted no cvt for this cast"
    compiler = compiler or Compiler()
    for text, (raw, module) in strings.items():
        with module.context:
            op = Op(raw, compiler)
            step = compiler.op(op)
            (opcode,) = {w for w in text.split() if w.startswith("cvt.")}
            down = ptx_block.CVT_DOWN.fullmatch(opcode)
            narrow = (down or ptx_block.CVT_UP.fullmatch(opcode))[3]
            narrow_bits = floats.FORMATS[narrow].bits if narrow != "e2m1" else 4
            src_bits = (32 if down[4] == "f32" else 16) if down else narrow_bits
            dst_bits = narrow_bits if down else 16
            # edge values of the source type, as bit patterns in each register
            if down:
                wide = WIDE[down[4].removesuffix("x2")]
                with np.errstate(all="ignore"):
                    pool = edge_values(NARROW.get(narrow, ml_dtypes.float8_e8m0fnu)) \
                        .astype(wide).view(np.uint32 if wide.itemsize == 4 else np.uint16)
            else:
                pool = np.arange(1 << narrow_bits, dtype=np.uint64)
            regs = []
            for t in op.in_types:
                count = max(t.bits * (t.shape[0] if t.kind == "vector" else 1) // src_bits, 1)
                elems = RNG.choice(pool.astype(np.uint64), (256, count))
                bits = sum(elems[:, k] << np.uint64(src_bits * k) for k in range(count))
                regs.append(ptx_block._from_bits(bits, t) if t.kind == "vector" else
                            bits.astype(inline_asm.irtypes.UNSIGNED[t.bits]).view(t.dtype))
            frame = SimpleNamespace(regs=dict(zip(op.ins, regs)))
            step(frame)
            outs = frame.regs[op.outs[0]]
            outs = list(outs) if isinstance(outs, tuple) else [outs]
            src_elems = _elements(regs, src_bits)
            got = _elements(outs, dst_bits)
            k = min(src_elems.shape[1], got.shape[1])
            want = _reference(opcode, src_elems[:, :k])
            got = got[:, :k].astype(np.int64)
            nan = want == -1
            np.testing.assert_array_equal(got[~nan], want[~nan], err_msg=text)
            if nan.any():
                fmt_out = floats.FORMATS[narrow] if down else None
                vals = (floats.decode(got[nan], fmt_out) if down else
                        got[nan].astype(np.uint16).view(WIDE[ptx_block.CVT_UP.fullmatch(
                            opcode)[2]]).astype(np.float64))
                assert np.all(np.isnan(vals)), text


# --- kernels -------------------------------------------------------------------

def _store_kernel(dt):
    from jax.experimental.pallas import mosaic_gpu as plgpu
    wg = plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup)

    def body(x, o):
        o[...] = x[...].astype(dt)
    return plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((128, 128), dt), compiler_params=wg)


@pytest.mark.parametrize("pipeline", ["jax", "smalti"])
@pytest.mark.parametrize("dt,name", [(jnp.float8_e4m3fn, "e4m3"), (jnp.float8_e5m2, "e5m2")])
def test_astype_to_fp8_in_a_kernel_equals_jnp(dt, name, pipeline):
    """In range, the kernel's cast equals jnp's; beyond it (where jnp -- ml_dtypes
    -- gives NaN or infinity) it saturates as PTX's satfinite does."""
    edges = edge_values(dt).astype(np.float32)
    x = np.resize(edges, 128 * 128).reshape(128, 128)
    x.ravel()[len(edges):] = RNG.standard_normal(128 * 128 - len(edges)) * 100
    (got,) = emulate_pipeline(_store_kernel(dt), x, jax_pipeline=pipeline == "jax")
    got = np.asarray(got).view(np.uint8)
    want = np.asarray(jnp.asarray(x).astype(dt)).view(np.uint8)
    top = float(ml_dtypes.finfo(dt).max)
    # in range: everything jnp does not round past MAX_NORM
    in_range = np.isfinite(np.asarray(jnp.asarray(x).astype(dt), np.float32)) | np.isnan(x)
    in_range &= ~np.isnan(x)
    np.testing.assert_array_equal(got[in_range], want[in_range])
    over = ~in_range & ~np.isnan(x)
    assert over.any()
    np.testing.assert_array_equal(got[over], satfinite(x[over], dt))
    assert np.all(np.isnan(np.asarray(got[np.isnan(x)].view(dt), np.float32)))
    assert np.all(np.abs(np.asarray(got.view(dt), np.float32)[~np.isnan(x)]) <= top)


@pytest.mark.parametrize("dt", [jnp.float8_e4m3fn, jnp.float8_e5m2])
def test_fp8_to_f32_in_a_kernel_is_exact(dt):
    """The upcast (cvt.rn.f16x2.<fp8>x2, then f16 -> f32) of every fp8 code."""
    codes = np.resize(np.arange(256, dtype=np.uint8), 128 * 128).reshape(128, 128)
    x = codes.view(dt)
    (got,) = emu.run(_cast_kernel(dt, []), x)
    want = np.asarray(jnp.asarray(x).astype(jnp.float32))
    assert_same_floats(got, want)


@pytest.mark.parametrize("pipeline", ["jax", "smalti"])
def test_official_mixed_type_matmul_int8_bf16_equals_jnp(pipeline):
    """hopper_mixed_type_matmul_mgpu with int8 A and bf16 B (the prmt.b32 +
    sub.bf16x2 dequantization) at its smallest configuration of
    benchmarks/emulate.py, on all 256 int8 values, equals the product rounded
    to bf16 wherever f32 accumulation (in any order: the hardware's, jnp's and
    the emulator's differ) cannot change that rounding, and is within one of
    the two candidates elsewhere."""
    from jax.experimental.pallas.ops.gpu import hopper_mixed_type_matmul_mgpu as mixed
    cfg = mixed.TuningConfig(tile_m=128, tile_n=128, tile_k=64, max_concurrent_steps=2)
    a = np.resize(np.arange(-128, 128, dtype=np.int8), 128 * 128).reshape(128, 128)
    a = RNG.permuted(a, axis=1)
    b = RNG.standard_normal((128, 256)).astype(ml_dtypes.bfloat16)

    def f(a, b):
        return mixed.mixed_matmul_kernel(a, b, out_dtype=jnp.bfloat16, config=cfg)
    (got,) = emulate_pipeline(f, a, b, jax_pipeline=pipeline == "jax")
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    exact = a64 @ b64  # every product is exact in f32; only the sums round
    bound = (a.shape[1] + 1) * 2.0 ** -24 * (np.abs(a64) @ np.abs(b64))

    def to_bf16(v):  # f32 accumulator, then the kernel's cast: both monotone
        return v.astype(np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)
    lo, hi = to_bf16(exact - bound), to_bf16(exact + bound)
    got = np.asarray(got).astype(np.float64)
    assert np.all((lo <= got) & (got <= hi))
    decided = lo == hi
    np.testing.assert_array_equal(got[decided], lo[decided])
    assert decided.mean() > 0.9  # the bound decides almost every element
    want = np.asarray(jnp.dot(jnp.asarray(a).astype(jnp.bfloat16), jnp.asarray(b),
                              preferred_element_type=jnp.float32).astype(jnp.bfloat16))
    np.testing.assert_array_equal(got[decided], want.astype(np.float64)[decided])


# --- int4 blocks (register instructions, no cvt) ------------------------------

def _int4_strings(target):
    """The asm ops of a Lane-semantics kernel converting an int4 vector of 8 to
    ``target`` (jax lowers it; the emulator cannot run int4 memory yet, so each
    string is run on its own)."""
    from jax._src.interpreters import mlir
    from jax._src.lib.mlir import ir
    from jax.experimental.mosaic import gpu as mgpu

    def kernel(ctx, x_ref, o_ref, _):
        x = mgpu.FragmentedArray.load_strided(x_ref, is_signed=True, vec_size=8)
        y = x.astype(target(), is_signed=True if target is not ir.BF16Type.get else None)
        y.store_untiled(o_ref)

    out = jnp.int8 if target is not ir.BF16Type.get else jnp.bfloat16
    with mlir.make_ir_context(), ir.Location.unknown():
        fn = mgpu.as_gpu_kernel(kernel, (1, 1, 1), (128, 1, 1),
                                (jax.ShapeDtypeStruct((1024,), ml_dtypes.int4),),
                                jax.ShapeDtypeStruct((1024,), out), ())
    (module,), _ = lower_for_cuda(fn, [np.zeros(1024, ml_dtypes.int4)])
    from jax._src.lib.mlir import ir as ir_
    return [(ir_.StringAttr(op.attributes["asm_string"]).value, op, module)
            for op in _asm_ops(module)]


def _run_asm(op, module, *ins):
    with module.context:
        o = Op(op, Compiler())
        step = inline_asm.inline_asm(o)
        frame = SimpleNamespace(regs=dict(zip(o.ins, ins)))
        step(frame)
        return frame.regs[o.outs[0]]


def _nibbles(n: int) -> np.ndarray:
    """n registers of 8 random signed nibbles (every value -8..7 appears), and
    their values."""
    vals = RNG.integers(-8, 8, (n, 8))
    vals[:16] = np.arange(-8, 8)[:, None]
    regs = sum((vals[:, k].astype(np.int64) & 0xF) << (4 * k) for k in range(8))
    return regs.astype(np.uint32).view(np.int32), vals


def test_int4_to_bf16_block_as_jax_emits_it():
    """prmt + lop3 + sub.bf16x2: part p of register r (with r >> 4 beside it,
    as jax passes it) gives nibbles 2p and 2p + 1 as bf16."""
    from jax._src.lib.mlir import ir
    found = [(t, op, m) for t, op, m in _int4_strings(ir.BF16Type.get) if "sub.bf16x2" in t]
    assert len(found) == 4
    regs, vals = _nibbles(512)
    for text, op, module in found:
        part = int(re.search(r"0xF\d+F(\d)", text)[1])
        shifted = (regs.view(np.uint32) >> 4).view(np.int32)
        out = _run_asm(op, module, regs, shifted).view(np.uint32)
        got = np.stack([out & 0xFFFF, out >> 16], -1).astype(np.uint16).view(ml_dtypes.bfloat16)
        np.testing.assert_array_equal(got.astype(np.float64), vals[:, 2 * part:2 * part + 2])


def test_int4_to_int8_block_as_jax_emits_it():
    """shl/shr + prmt sign replication + lop3 blends: the two i32 results hold
    the 8 nibbles of the register as int8, in order."""
    from jax._src.lib.mlir import ir
    found = [(t, op, m) for t, op, m in _int4_strings(lambda: ir.IntegerType.get_signless(8))
             if "lop3.b32" in t]
    assert found
    regs, vals = _nibbles(512)
    for _, op, module in found:
        lo, hi = _run_asm(op, module, regs)
        got = np.stack([lo, hi], -1).astype(np.int32).view(np.int8).reshape(-1, 8)
        np.testing.assert_array_equal(got, vals)
