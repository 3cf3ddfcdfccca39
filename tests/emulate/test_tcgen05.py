"""Blackwell on the emulator: TMEM and tcgen05 (``emulate/tmem.py``,
``emulate/ops/tcgen05.py``, cluster launch control in ``emulate/ops/clc.py``).

Kernels jax 0.11.2 lowers at arch (10, 0), against numpy: TMEM round trips
through every register layout pair jax lowers (16x256b, 16x128b with and
without (un)packing, 32x32b), f16/bf16 MMAs (SMEM and TMEM A, transposed
operands, each swizzle; M = 64 too) within the accumulation bound, the official
``blackwell_matmul_mgpu`` (collective=False) under jax's pipeline and
smalti's; TMEM races found both ways; the TMEM rules as errors."""

from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu
from jax.experimental.pallas.ops.gpu import blackwell_matmul_mgpu as matmul

import smalti.emulate as emu
from smalti.emulate import tmem
from smalti.emulate.testing import emulate_pipeline
from tests.blackwell.test_pallas_kernels import _mma
from tests.pallas_kit import kernel, swizzled, tma_in, tma_out

BLACKWELL = (10, 0)
F16, BF16, F32 = jnp.float16, jnp.bfloat16, jnp.float32
L = plgpu.Layout
RNG = np.random.default_rng(1005)


def sds(shape, dtype):
    return jax.ShapeDtypeStruct(shape, dtype)


def normal(shape, dtype):
    return RNG.standard_normal(shape).astype(dtype)


def run(f, *args, smalti_pipeline=False, **kw):
    return emulate_pipeline(f, *args, jax_pipeline=not smalti_pipeline, arch=BLACKWELL, **kw)


# --- TMEM loads and stores -------------------------------------------------------------

def roundtrip(dtype, packed, store_layout, load_layout):
    """x -> registers (store_layout) * 3 -> TMEM -> registers (load_layout) -> out."""
    def body(x_gmem, o_gmem, t, smem, bar):
        tma_in(x_gmem, smem, bar)
        plgpu.async_store_tmem(t, plgpu.load(smem, layout=store_layout, optimized=False) * 3)
        plgpu.commit_tmem()
        tma_out(plgpu.async_load_tmem(t, layout=load_layout), smem, o_gmem)

    return kernel(body, sds((128, 128), dtype),
                  [plgpu.TMEM((128, 128), dtype, packed=packed), swizzled((128, 128), dtype),
                   plgpu.Barrier()])


NATIVE2 = L.TCGEN05_TMEM_NATIVE(2)
ROUNDTRIPS = {
    # f32: 16x256b and 32x32b, and each read back through the other
    "f32-16x256b": (F32, None, L.TCGEN05, L.TCGEN05),
    "f32-32x32b": (F32, None, L.TCGEN05_TMEM_NATIVE, L.TCGEN05_TMEM_NATIVE),
    "f32-16x256b-then-32x32b": (F32, None, L.TCGEN05, L.TCGEN05_TMEM_NATIVE),
    "f32-32x32b-then-16x256b": (F32, None, L.TCGEN05_TMEM_NATIVE, L.TCGEN05),
    # bf16 packed two a column: 16x128b; and 32x32b stores read back by 16x128b
    "bf16-packed-16x128b": (BF16, True, L.TCGEN05, L.TCGEN05),
    "bf16-packed-32x32b-then-16x128b": (BF16, True, NATIVE2, L.TCGEN05),
    # bf16 one a column: 16x128b.unpack::16b / .pack::16b
    "bf16-unpacked-16x128b": (BF16, False, L.TCGEN05, L.TCGEN05),
}


@pytest.mark.parametrize("name", list(ROUNDTRIPS))
def test_tmem_round_trip(name):
    dtype, *how = ROUNDTRIPS[name]
    x = normal((128, 128), dtype)
    (got,) = run(roundtrip(dtype, *how), x)
    np.testing.assert_array_equal(got, (x * 3).astype(dtype))


def test_tmem_round_trip_under_smalti():
    x = normal((128, 128), F32)
    (got,) = run(roundtrip(F32, None, L.TCGEN05, L.TCGEN05_TMEM_NATIVE), x, smalti_pipeline=True)
    np.testing.assert_array_equal(got, x * 3)


def reducing_load_kernel(dtype, reduce):
    """x -> TMEM; loaded back (32x32b) with a row reduction (tcgen05.ld.red)."""
    def body(x_gmem, o_gmem, r_gmem, t):
        plgpu.async_store_tmem(t, plgpu.load(x_gmem, layout=L.TCGEN05, optimized=False))
        plgpu.commit_tmem()
        o_gmem[...], r_gmem[...] = plgpu.async_load_tmem(t, layout=L.TCGEN05_TMEM_NATIVE,
                                                         reduce=reduce)

    return kernel(body, (sds((128, 128), dtype), sds((128,), dtype)),
                  [plgpu.TMEM((128, 128), dtype)])


REDUCTIONS = {
    "max": lambda x: x.max(1), "min": lambda x: x.min(1),
    "absmax": lambda x: np.abs(x).max(1), "absmin": lambda x: np.abs(x).min(1),
}


@pytest.mark.parametrize("reduce", list(REDUCTIONS))
def test_reducing_tmem_load_f32(reduce):
    x = normal((128, 128), F32)
    x[3, 5] = -1e30  # the extremes of a row, with their signs
    x[4, 6] = 1e-30
    got, red = run(reducing_load_kernel(F32, reduce), x)
    np.testing.assert_array_equal(got, x)
    np.testing.assert_array_equal(red, REDUCTIONS[reduce](x))


@pytest.mark.parametrize("reduce", ["max", "min", "absmax"])
def test_reducing_tmem_load_i32(reduce):
    """.s32 for max/min; jax asks for .u32 max for "absmax" of integers: the
    unsigned maximum of the bits, which is what the emulator computes."""
    x = RNG.integers(-2 ** 31, 2 ** 31, (128, 128)).astype(np.int32)
    got, red = run(reducing_load_kernel(jnp.int32, reduce), x)
    np.testing.assert_array_equal(got, x)
    want = (x.view(np.uint32).max(1).view(np.int32) if reduce == "absmax"
            else REDUCTIONS[reduce](x))
    np.testing.assert_array_equal(red, want)


def test_layout_cast_of_a_tmem_load():
    """TMEM -> TCGEN05 registers, cast to TCGEN05_TRANSPOSED and back, stored."""
    def body(x_gmem, o_gmem, t, smem, bar):
        tma_in(x_gmem, smem, bar)
        plgpu.async_store_tmem(t, plgpu.load(smem, layout=L.TCGEN05, optimized=False))
        plgpu.commit_tmem()
        v = plgpu.layout_cast(plgpu.async_load_tmem(t) + 1, L.TCGEN05_TRANSPOSED)
        tma_out(plgpu.layout_cast(v * 2, L.TCGEN05), smem, o_gmem)

    x = normal((128, 128), F32)
    call = kernel(body, sds((128, 128), F32), [plgpu.TMEM((128, 128), F32),
                                              swizzled((128, 128), F32), plgpu.Barrier()])
    (got,) = run(call, x)
    np.testing.assert_array_equal(got, (x + 1) * 2)


# --- MMA ------------------------------------------------------------------------------------

def mma_kernel(m, n, k, dtype, swizzle=128, lhs_tmem=False, transpose_a=False,
               transpose_b=False):
    """The differential suite's MMA kernel (A, B by TMA; A maybe through TMEM;
    one MMA; the f32 accumulator out), with its operand shapes."""
    call, (a, b) = _mma(m, n, k, dtype, swizzle=swizzle, lhs_tmem=lhs_tmem,
                        transpose_a=transpose_a, transpose_b=transpose_b, out_type=F32)
    return call, a.shape, b.shape


def mma_bound(a, b):
    """Each output within (K + 1) eps_f32 sum_k |a b| of the exact product."""
    k = a.shape[1]
    return (k + 1) * 2.0 ** -24 * (np.abs(a) @ np.abs(b))


MMAS = {
    "f16": dict(m=128, n=128, k=128, dtype=F16),
    "bf16-n256-k64": dict(m=128, n=256, k=64, dtype=BF16),
    "bf16-a-transposed-swizzle32": dict(m=128, n=256, k=64, dtype=BF16, swizzle=32,
                                        transpose_a=True),
    "f16-both-transposed-swizzle64": dict(m=128, n=128, k=128, dtype=F16, swizzle=64,
                                          transpose_a=True, transpose_b=True),
    "bf16-a-in-tmem": dict(m=128, n=256, k=128, dtype=BF16, lhs_tmem=True, swizzle=64),
    "f16-a-in-tmem-n64": dict(m=128, n=64, k=64, dtype=F16, lhs_tmem=True),
    # M = 64 (data path layout F): jax issues two MMAs of N/2, the second at lane 16
    "f16-m64": dict(m=64, n=128, k=128, dtype=F16),
    "bf16-m64-n256-a-transposed-swizzle32": dict(m=64, n=256, k=64, dtype=BF16, swizzle=32,
                                                 transpose_a=True),
    "f16-m64-both-transposed-swizzle64": dict(m=64, n=128, k=128, dtype=F16, swizzle=64,
                                              transpose_a=True, transpose_b=True),
}


@pytest.mark.parametrize("name", list(MMAS))
def test_mma_matches_numpy(name):
    cfg = MMAS[name]
    call, a_shape, b_shape = mma_kernel(**cfg)
    a, b = normal(a_shape, cfg["dtype"]), normal(b_shape, cfg["dtype"])
    (got,) = run(call, a, b)
    a64 = a.astype(np.float64).T if cfg.get("transpose_a") else a.astype(np.float64)
    b64 = b.astype(np.float64).T if cfg.get("transpose_b") else b.astype(np.float64)
    want = a64 @ b64
    err = np.abs(got.astype(np.float64) - want)
    assert np.all(err <= mma_bound(a64, b64)), err.max()
    # and it is a product, not a transposed or shifted one
    assert np.abs(want).max() > 1 and np.all(err < 1e-3 * np.abs(want).max())


def test_m64_mma_under_smalti():
    """M = 64 through smalti's inference and lowering: the same product."""
    call, a_shape, b_shape = mma_kernel(**MMAS["f16-m64"])
    a, b = normal(a_shape, F16), normal(b_shape, F16)
    (got,) = run(call, a, b, smalti_pipeline=True)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    assert np.all(np.abs(got - a64 @ b64) <= mma_bound(a64, b64))


E4M3, E5M2 = jnp.float8_e4m3fn, jnp.float8_e5m2


@pytest.mark.parametrize("types", [(E4M3, E4M3), (E5M2, E4M3), (E4M3, E5M2), (E5M2, E5M2)],
                         ids=["e4m3", "e5m2xe4m3", "e4m3xe5m2", "e5m2"])
@pytest.mark.parametrize("lhs_tmem", [False, True], ids=["a-smem", "a-tmem"])
def test_fp8_mma_matches_numpy(types, lhs_tmem):
    """kind::f8f6f4 with fp8 operands (A from TMEM: four elements a cell)."""
    call, (sa, sb) = _mma(128, 128, 128, *types, lhs_tmem=lhs_tmem)
    a, b = normal(sa.shape, types[0]), normal(sb.shape, types[1])
    (got,) = run(call, a, b)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    err = np.abs(got.astype(np.float64) - a64 @ b64)
    assert got.dtype == np.float32 and np.all(err <= mma_bound(a64, b64))
    assert np.abs(a64 @ b64).max() > 1


F16_ACC_TYPES = [(F16, F16), (E4M3, E4M3), (E5M2, E4M3)]


@pytest.mark.parametrize("types", F16_ACC_TYPES, ids=["f16", "e4m3", "e5m2xe4m3"])
@pytest.mark.parametrize("lhs_tmem", [False, True], ids=["a-smem", "a-tmem"])
def test_f16_accumulator_mma_matches_numpy(types, lhs_tmem):
    """D type code 0: an f16 accumulator (one a TMEM cell, its low half), for
    kind::f16 and kind::f8f6f4. K = 128 is several instructions, each rounding
    its exact (float64) sum plus D to f16 once: within K/k_instr roundings of
    the exact product."""
    call, (sa, sb) = _mma(128, 128, 128, *types, lhs_tmem=lhs_tmem, acc_type=F16,
                          out_type=F16)
    a, b = normal(sa.shape, types[0]), normal(sb.shape, types[1])
    (got,) = run(call, a, b)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    exact = a64 @ b64
    steps = 128 // (32 // np.dtype(types[0]).itemsize)  # one rounding per instruction
    assert got.dtype == np.float16
    err = np.abs(got.astype(np.float64) - exact)
    bound = steps * 2.0 ** -11 * (np.abs(a64) @ np.abs(b64)) + 2.0 ** -24
    assert np.all(err <= bound), (err / bound).max()
    # each instruction rounds to f16: the result is not the f32-accumulated one
    assert np.abs(exact).max() > 4 and np.mean(err > 0) > 0.5


def test_f16_accumulator_rounds_each_instruction_to_f16():
    """Two instructions (K = 32 of f16): the first's sum rounded to f16, the
    second added to it and rounded again -- exactly, bit for bit."""
    call, (sa, sb) = _mma(128, 128, 32, F16, swizzle=32, acc_type=F16, out_type=F16)
    a, b = normal(sa.shape, F16), normal(sb.shape, F16)
    (got,) = run(call, a, b)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    first = (a64[:, :16] @ b64[:16]).astype(np.float16).astype(np.float64)
    want = (first + a64[:, 16:] @ b64[16:]).astype(np.float16)
    np.testing.assert_array_equal(got, want)


def ints(shape, dtype):
    info = np.iinfo(dtype)
    return RNG.integers(info.min, info.max + 1, shape).astype(dtype)


@pytest.mark.parametrize("lhs_tmem", [False, True], ids=["a-smem", "a-tmem"])
def test_int8_mma_is_exact(lhs_tmem):
    """kind::i8, s8 x s8 -> s32: exact (the extremes included)."""
    call, (sa, sb) = _mma(128, 128, 128, jnp.int8, swizzle=64, lhs_tmem=lhs_tmem,
                          acc_type=jnp.int32)
    a, b = ints(sa.shape, np.int8), ints(sb.shape, np.int8)
    a[0, :] = -128
    b[:, 0] = -128
    (got,) = run(call, a, b)
    np.testing.assert_array_equal(got, (a.astype(np.int64) @ b.astype(np.int64)).astype(np.int32))


def test_m64_int8_mma_is_exact():
    """M = 64, kind::i8: exact, the extremes included."""
    call, (sa, sb) = _mma(64, 128, 128, jnp.int8, swizzle=64, acc_type=jnp.int32)
    a, b = ints(sa.shape, np.int8), ints(sb.shape, np.int8)
    a[63, :], b[:, 127] = -128, -128
    (got,) = run(call, a, b)
    np.testing.assert_array_equal(got, (a.astype(np.int64) @ b.astype(np.int64)).astype(np.int32))


def test_uint8_mma_is_computed_signed_as_jax_encodes_it():
    """jax 0.11.2 encodes any 8-bit integer input as signed in the instruction
    descriptor (``i8`` is signless in MLIR), so uint8 operands are multiplied
    as the int8 values of their bits: what the descriptor asks the GPU for."""
    call, (sa, sb) = _mma(128, 128, 128, jnp.uint8, swizzle=64, acc_type=jnp.int32)
    a, b = ints(sa.shape, np.uint8), ints(sb.shape, np.uint8)
    (got,) = run(call, a, b)
    signed = a.view(np.int8).astype(np.int64) @ b.view(np.int8).astype(np.int64)
    np.testing.assert_array_equal(got, signed.astype(np.int32))
    assert not np.array_equal(got, (a.astype(np.int64) @ b.astype(np.int64)).astype(np.int32))


# --- SMEM -> TMEM copies (tcgen05.cp) --------------------------------------------------------

def smem_to_tmem_kernel(shape, dtype, swizzle, wait=True):
    """x -> SMEM (TMA) -> TMEM (tcgen05.cp from one warp, committed to a
    barrier) -> registers -> out. ``swizzle`` None: 16-byte-wide tiles, no
    swizzle (128x128b copies); else a swizzle (128x256b copies)."""
    width = (swizzle or 16) // np.dtype(dtype).itemsize
    transforms = (plgpu.TilingTransform((8, width)),) + (
        (plgpu.SwizzleTransform(swizzle),) if swizzle else ())

    def body(x_gmem, o_gmem, smem, t, loaded, copied):
        tma_in(x_gmem, smem, loaded)

        @plgpu.warp_map
        def _(warp):
            @pl.when(warp == 0)
            def _():
                plgpu.async_copy_smem_to_tmem(smem, t)  # <cp>
                plgpu.tcgen05_commit_arrive(copied)

        if wait:
            plgpu.barrier_wait(copied)
        o_gmem[...] = plgpu.async_load_tmem(t)  # <ld>
        if not wait:
            plgpu.barrier_wait(copied)

    packed = True if np.dtype(dtype).itemsize == 2 else None
    call = kernel(body, sds(shape, dtype),
                  [plgpu.SMEM(shape, dtype, transforms=transforms),
                   plgpu.TMEM(shape, dtype, packed=packed), plgpu.Barrier(),
                   plgpu.Barrier(orders_tensor_core=True)])
    return call, body


@pytest.mark.parametrize("shape, dtype, swizzle", [
    ((128, 64), jnp.int32, 128), ((128, 128), F16, 128), ((128, 128), F16, 32),
    ((128, 64), jnp.int32, None), ((128, 128), F16, None)],
    ids=["i32-swizzle128", "f16-swizzle128", "f16-swizzle32", "i32-unswizzled",
         "f16-unswizzled"])
def test_smem_to_tmem_copy(shape, dtype, swizzle):
    x = (normal(shape, np.float32) * 1000).astype(dtype)
    call, _ = smem_to_tmem_kernel(shape, dtype, swizzle)
    (got,) = run(call, x)
    np.testing.assert_array_equal(got, x)


def test_reading_tmem_before_the_copy_is_committed_races():
    call, body = smem_to_tmem_kernel((128, 64), jnp.int32, 128, wait=False)
    assert_tmem_race(call, [np.arange(128 * 64, dtype=np.int32).reshape(128, 64)], body,
                     ("tcgen05.cp", "<cp>"), ("tcgen05.ld", "<ld>"), "tcgen05.commit")


# --- the official Blackwell matmul ----------------------------------------------------------

SMALLEST = matmul.TuningConfig(tile_m=128, tile_n=128, tile_k=64, max_concurrent_steps=2,
                               collective=False)


def official_matmul(a, b):
    return matmul.matmul_kernel(a, b, SMALLEST)


@pytest.mark.parametrize("shape", [(128, 128, 128), (256, 256, 128), (128, 128, 256)],
                         ids=["one-tile", "four-tiles-by-cluster-launch-control",
                              "k-steps-beyond-the-slots: the TMA warp waits for the MMA warp"])
@pytest.mark.parametrize("pipeline", ["jax", "smalti"])
def test_official_blackwell_matmul(shape, pipeline):
    m, n, k = shape
    a, b = normal((m, k), F16), normal((k, n), F16)
    (got,) = run(official_matmul, a, b, smalti_pipeline=pipeline == "smalti")
    want = np.asarray(jnp.dot(a, b, preferred_element_type=jnp.float32)).astype(np.float64)
    exact = a.astype(np.float64) @ b.astype(np.float64)
    # f32 accumulation (bound above), then one rounding to f16
    bound = mma_bound(a.astype(np.float64), b.astype(np.float64)) + np.abs(exact) * 2.0 ** -11
    assert got.dtype == np.float16
    assert np.all(np.abs(got.astype(np.float64) - want) <= bound + np.abs(want - exact))


def test_official_matmul_smalti_equals_jax():
    a, b = normal((256, 128), F16), normal((128, 256), F16)
    (mine,) = run(official_matmul, a, b, smalti_pipeline=True)
    (theirs,) = run(official_matmul, a, b)
    np.testing.assert_array_equal(mine, theirs)


# --- races on TMEM, both ways ------------------------------------------------------------

def _line(fn, marker: str) -> int:
    """The source line of ``fn`` holding ``marker`` (a comment)."""
    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, s in enumerate(lines) if marker in s)


def assert_tmem_race(call, args, body, first, second, fix: str) -> None:
    """``call`` raises one read-after-write race on TMEM: ``first`` and ``second``
    are (op prefix, marker of its line in ``body``)."""
    with pytest.raises(emu.RaceError) as e:
        run(call, *args)
    (race,) = [r for r in e.value.races if r.space == "tmem"]
    assert race.kind == "read-after-write"
    for access, (op, marker) in ((race.first, first), (race.second, second)):
        assert access.op.startswith(op)
        assert access.location.endswith(f":{_line(body, marker)}")
    assert fix in race.fix


def store_load_kernel(wait: bool):
    def body(x_gmem, o_gmem, t, smem, bar):
        tma_in(x_gmem, smem, bar)
        plgpu.async_store_tmem(t, plgpu.load(smem, layout=L.TCGEN05, optimized=False))  # <st>
        if wait:
            plgpu.commit_tmem()
        tma_out(plgpu.async_load_tmem(t, layout=L.TCGEN05) + 1, smem, o_gmem)  # <ld>

    call = kernel(body, sds((128, 128), F32), [plgpu.TMEM((128, 128), F32),
                                              swizzled((128, 128), F32), plgpu.Barrier()])
    return call, body


def acc_before_commit_kernel(wait: bool):
    def body(a_gmem, b_gmem, o_gmem, a_smem, b_smem, loaded, done, acc):
        tma_in(a_gmem, a_smem, loaded.at[0])
        tma_in(b_gmem, b_smem, loaded.at[1])
        plgpu.tcgen05_mma(acc, a_smem, b_smem, done, accumulate=False)  # <mma>
        if wait:
            plgpu.barrier_wait(done)
        o_gmem[...] = plgpu.async_load_tmem(acc)  # <ld>
        if not wait:
            plgpu.barrier_wait(done)

    scratch = [swizzled((128, 64), F16), swizzled((64, 128), F16), plgpu.Barrier(num_barriers=2),
               plgpu.Barrier(orders_tensor_core=True), plgpu.TMEM((128, 128), F32)]
    return kernel(body, sds((128, 128), F32), scratch), body


def test_tmem_load_before_the_store_is_waited_for_races():
    call, body = store_load_kernel(wait=False)
    assert_tmem_race(call, [normal((128, 128), F32)], body, ("tcgen05.st", "<st>"),
                     ("tcgen05.ld", "<ld>"), "commit_tmem")


def test_tmem_load_after_commit_tmem_is_clean():
    call, _ = store_load_kernel(wait=True)
    x = normal((128, 128), F32)
    (got,) = run(call, x)
    np.testing.assert_array_equal(got, x + 1)


def test_reading_the_accumulator_before_the_commit_races():
    call, body = acc_before_commit_kernel(wait=False)
    assert_tmem_race(call, [normal((128, 64), F16), normal((64, 128), F16)], body,
                     ("tcgen05.mma", "<mma>"), ("tcgen05.ld", "<ld>"), "tcgen05.commit")


def test_reading_the_accumulator_after_the_commit_is_clean():
    call, _ = acc_before_commit_kernel(wait=True)
    a, b = normal((128, 64), F16), normal((64, 128), F16)
    (got,) = run(call, a, b)
    want = a.astype(np.float64) @ b.astype(np.float64)
    assert np.all(np.abs(got - want) <= mma_bound(a.astype(np.float64), b.astype(np.float64)))


# --- the TMEM rules as errors -------------------------------------------------------------

def lane_kernel(lane_offset: int):
    """Lane semantics: warp 0 allocates 32 columns; every warp stores its threads'
    x to one 32x32b column at the allocation's address plus ``lane_offset``
    lanes, waits, loads it back and writes 2x; warp 0 frees the columns."""
    from jax._src.interpreters import mlir
    from jax._src.lib.mlir import ir
    from jax._src.lib.mlir.dialects import arith, gpu, memref
    from jax.experimental.mosaic import gpu as mgpu
    from jax.experimental.mosaic.gpu import tcgen05 as jtc
    from jax.experimental.mosaic.gpu import utils as mu

    def body(ctx, x_ref, o_ref, addr_ref):
        i32 = ir.IntegerType.get_signless(32)
        warp0 = arith.cmpi(arith.CmpIPredicate.eq, mu.warp_idx(), mu.c(0, i32))
        with mu.when(warp0):
            jtc.tmem_alloc(addr_ref, 32)
        gpu.barrier()
        addr = arith.addi(memref.load(addr_ref, []), mu.c(lane_offset << 16, i32))
        idx = arith.index_cast(ir.IndexType.get(), mu.thread_idx())
        jtc._tmem_store(addr, "32x32b", 1, [memref.load(x_ref, [idx])], unpack=False)
        jtc.commit_tmem()
        (v,) = jtc._tmem_load(addr, "32x32b", 1, pack=False)
        memref.store(arith.addi(v, v), o_ref, [idx])
        gpu.barrier()
        with mu.when(warp0):
            jtc.tmem_dealloc(addr, 32)

    s = jax.ShapeDtypeStruct((128,), jnp.int32)
    with mlir.make_ir_context(), ir.Location.unknown(), _blackwell():
        return mgpu.as_gpu_kernel(body, (1, 1, 1), (128, 1, 1), (s,), s,
                                  jax.ShapeDtypeStruct((), jnp.int32))


def _blackwell():
    from smalti.emulate.capture import gpu_facts
    return gpu_facts(BLACKWELL)


def test_a_warp_reaching_another_warps_lanes_is_an_error_naming_the_op():
    fn = lane_kernel(64)  # warp 2's slab: warps 0, 1 and 3 may not
    with pytest.raises(tmem.TmemError, match=r"tcgen05\.st\.sync\.aligned\.32x32b\.x1\.b32 .*"
                       r"warp 0 addresses TMEM lanes 64 to 95.*32\*\(w%4\)"):
        emu.run(fn, np.zeros(128, np.int32), arch=BLACKWELL)


def test_lane_addresses_relative_to_the_slab_read_the_warps_own_lanes():
    fn = lane_kernel(0)
    x = np.arange(128, dtype=np.int32)
    (got,) = emu.run(fn, x, arch=BLACKWELL)
    np.testing.assert_array_equal(got, 2 * x)


def test_allocation_rules():
    t = tmem.TensorMemory("block (0, 0, 0)")
    with pytest.raises(tmem.TmemError, match="power of 2 from 32 to 512"):
        t.alloc(48, "tcgen05.alloc", "k.py:1")
    assert t.alloc(256, "tcgen05.alloc", "k.py:1") == 0
    assert t.alloc(32, "tcgen05.alloc", "k.py:2") == 256
    assert t.alloc(128, "tcgen05.alloc", "k.py:3") == 384
    with pytest.raises(tmem.TmemError, match="no 256 free columns"):
        t.alloc(256, "tcgen05.alloc", "k.py:4")
    with pytest.raises(tmem.TmemError, match="which no tcgen05.alloc returned"):
        t.dealloc(256, 64, "tcgen05.dealloc", "k.py:5")
    t.dealloc(256, 32, "tcgen05.dealloc", "k.py:5")
    with pytest.raises(tmem.TmemError, match="reaches TMEM columns 256..257 that are not"):
        t.check_columns(np.array([255, 256, 257]), "tcgen05.ld", "k.py:6")
    t.relinquish("k.py:7")
    with pytest.raises(tmem.TmemError, match="after tcgen05.relinquish_alloc_permit at k.py:7"):
        t.alloc(32, "tcgen05.alloc", "k.py:8")
    with pytest.raises(tmem.TmemError, match="exited with TMEM still allocated: 256 columns"):
        t.check_released()
    t.dealloc(0, 256, "tcgen05.dealloc", "k.py:9")
    t.dealloc(384, 128, "tcgen05.dealloc", "k.py:9")
    t.check_released()


@pytest.mark.parametrize("shape", list(tmem.SHAPES))
@pytest.mark.parametrize("num", [1, 4])
def test_fragments_cover_their_cells_once(shape, num):
    """Each shape's fragment moves lanes x (columns per repetition * num) cells,
    every one by exactly one register of one thread."""
    lanes, cols, _ = tmem.SHAPES[shape]
    f = tmem.fragment(shape, num)
    cells = f.lane * 10_000 + f.col
    assert np.unique(cells).size == cells.size == lanes * cols * num
    assert f.lane.max() == lanes - 1 and f.col.max() == cols * num - 1



# --- CTA pairs: collective (cta_group::2) MMAs ----------------------------------------------

COLLECTIVE = matmul.TuningConfig(tile_m=128, tile_n=128, tile_k=64, max_concurrent_steps=2,
                                 collective=True)


def collective_matmul(a, b):
    return matmul.matmul_kernel(a, b, COLLECTIVE)


def f16_matmul_bound(a, b):
    """f32 accumulation (the MMA bound), then one rounding to f16."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    return mma_bound(a64, b64) + np.abs(a64 @ b64) * 2.0 ** -11, a64 @ b64


@pytest.mark.parametrize("pipeline", ["jax", "smalti"])
def test_official_collective_blackwell_matmul(pipeline):
    """One (256, 256) tile over a CTA pair: TMA loads of the pair tracked by the
    leader, cta_group::2 MMAs (each CTA's A rows, B columns split between the
    two), the multicast commit, a ClusterBarrier. Both CTAs of the pair issue
    the cluster-launch-control request (jax's dynamic_scheduling_loop without
    cluster_axes), so their two responses race on each CTA's response buffer:
    the checker says so, and only that."""
    a, b = normal((256, 128), F16), normal((128, 256), F16)
    with pytest.warns(emu.RaceWarning) as record:
        (got,) = run(collective_matmul, a, b, smalti_pipeline=pipeline == "smalti",
                     on_race="warn")
    races = [str(w.message) for w in record if isinstance(w.message, emu.RaceWarning)]
    assert races and all("clusterlaunchcontrol" in r for r in races)
    bound, exact = f16_matmul_bound(a, b)
    assert np.all(np.abs(got.astype(np.float64) - exact) <= bound)


@pytest.mark.parametrize("k", [128, 256], ids=["k-in-the-slots", "k-steps-beyond-the-slots"])
@pytest.mark.parametrize("pipeline", ["jax", "smalti"])
def test_official_blackwell_ragged_dot(pipeline, k):
    """blackwell_ragged_dot_mgpu (collective, its smallest tiles): two groups of
    rows, neither on a tile boundary, against numpy; with more K steps than
    slots its TMA warp waits for its MMA warp (warps as tasks)."""
    import types

    from jax.experimental.pallas.ops.gpu import blackwell_ragged_dot_mgpu as ragged

    cfg = ragged.TuningConfig(tile_m=128, tile_n=128, tile_k=64, max_concurrent_steps=2,
                              collective=True, grid_tile_width=1,
                              grid_minor_dim=matmul.MatmulDimension.N)
    a, b = normal((256, k), F16), normal((2, k, 256), F16)
    sizes = np.array([100, 156], np.int32)
    device = types.SimpleNamespace(core_count=132)
    saved = jax.local_devices
    jax.local_devices = lambda *args, **kw: [device]  # the kernel sizes its grid by it
    try:
        (got,) = run(lambda a, b, g: ragged.ragged_dot_kernel(a, b, g, cfg), a, b, sizes,
                     smalti_pipeline=pipeline == "smalti")
    finally:
        jax.local_devices = saved
    rows = np.repeat([0, 1], sizes)
    exact = np.einsum("mk,mkn->mn", a.astype(np.float64), b[rows].astype(np.float64))
    bound = np.einsum("mk,mkn->mn", np.abs(a.astype(np.float64)),
                      np.abs(b[rows].astype(np.float64))) * (k + 1) * 2.0 ** -24 \
        + np.abs(exact) * 2.0 ** -11
    assert np.all(np.abs(got.astype(np.float64) - exact) <= bound)


# --- block-scaled MMAs (kind::mxf8f6f4, kind::mxf4nvf4) ---------------------------------------

E8M0, F4 = jnp.float8_e8m0fnu, jnp.float4_e2m1fn


def tile(x, rows, cols):
    """(R, C) -> (R // rows, C // cols, rows, cols): the SMEM tiling of a TMA copy."""
    r, c = x.shape
    return x.reshape(r // rows, rows, c // cols, cols).transpose(0, 2, 1, 3)


def scales_for_tmem(s):
    """(MN, K // block) scales -> (MN_pad // 128, K // block // 4, 32, 16): what
    ``async_copy_scales_smem_to_tmem`` copies (PTX's scale-factor layout 1X:
    row r's 4 scales of a K group at bytes 4 (r // 32) .. of SMEM row r % 32)."""
    mn, ks = s.shape
    pad = -mn % 128
    s = np.pad(s, ((0, pad), (0, 0)))
    return s.reshape(-1, 4, 32, ks // 4, 4).transpose(0, 3, 2, 1, 4).reshape(-1, ks // 4, 32, 16)


def scales_for_m64_pair(sa, sb):
    """A's and B's scales for an M = 128 pair MMA (64 rows a CTA), formatted as
    jax's ``async_copy_scales_smem_to_tmem`` documents: A's per CTA, its 64 rows
    padded to 128; B's for ``b_scales_m64_collective_layout`` (1, K // 4, 64, 16),
    SMEM row h 32 + i holding column h N / 2 + 32 c + i's scales at bytes 4 c.."""
    m, ks = sa.shape
    sa = np.pad(sa.reshape(2, m // 2, ks), ((0, 0), (0, 128 - m // 2), (0, 0)))
    n = sb.shape[0]
    cols = n // 64
    sb = sb.reshape(2, cols, 32, ks // 4, 4).transpose(3, 0, 2, 1, 4).reshape(1, ks // 4, 64,
                                                                              cols * 4)
    return scales_for_tmem(sa.reshape(256, ks)), np.pad(
        sb, ((0, 0), (0, 0), (0, 0), (0, 16 - cols * 4)))


def block_scaled_kernel(m, n, k, in_dtype, scale_dtype, block, swizzle, lhs_tmem=False,
                        collective=False, sparse=False):
    """A (m, k) and B (n, k), both K-major, by TMA (sparse: A (m, k // 2), 4:8
    pair-wise compressed, and its metadata by TMA and
    ``async_copy_sparse_metadata_smem_to_tmem``); their scales by TMA and
    ``async_copy_scales_smem_to_tmem``; A maybe through TMEM
    (``async_copy_smem_to_tmem``); one ``tcgen05.mma`` call with a_scale/b_scale
    (collective: over a CTA pair, each CTA its m // 2 rows of A and n // 2 of B's
    columns, B's scales in both -- with m = 128, in
    ``b_scales_m64_collective_layout``, copied by
    ``tcgen05.cp.64x128b.warpx2::01_23``); the f32 accumulator out."""
    from jax._src.interpreters import mlir
    from jax._src.lib.mlir import ir
    from jax._src.lib.mlir.dialects import arith, gpu
    from jax.experimental.mosaic import gpu as mgpu
    from jax.experimental.mosaic.gpu import tcgen05 as jtc
    from jax.experimental.mosaic.gpu import utils as mu

    bits = jax.dtypes.itemsize_bits(in_dtype)
    width = 8 * swizzle // bits
    tiling = (8, width)
    ctas = 2 if collective else 1
    mc, nc = m // ctas, n // ctas

    ka = k // 2 if sparse else k  # A's stored K

    def body(ctx, a, b, *rest):
        meta, sa, sb, out, scratch = rest if sparse else (None, *rest)
        (a_smem, b_smem, sa_smem, sb_smem, meta_smem, loaded, done, pair, acc, a_scales,
         b_scales, a_tmem, meta_tmem) = scratch
        index = ir.IndexType.get()
        rank = gpu.cluster_block_id(gpu.Dimension.x) if collective else mu.c(0, index)
        kw = dict(swizzle=swizzle, gmem_transform=mgpu.TileTransform(tiling))
        ctx.async_copy(src_ref=a, dst_ref=a_smem, barrier=loaded[0],
                       gmem_slice=(mu.ds(arith.muli(rank, mu.c(mc, index)), mc), slice(None)),
                       **kw)
        ctx.async_copy(src_ref=b, dst_ref=b_smem, barrier=loaded[1],
                       gmem_slice=(mu.ds(arith.muli(rank, mu.c(nc, index)), nc), slice(None)),
                       **kw)
        ctx.async_copy(src_ref=sa, dst_ref=sa_smem, barrier=loaded[2],
                       gmem_slice=(mu.ds(rank, 1),))
        ctx.async_copy(src_ref=sb, dst_ref=sb_smem, barrier=loaded[3])
        if sparse:
            ctx.async_copy(src_ref=meta, dst_ref=meta_smem, barrier=loaded[4])
        for i in range(5 if sparse else 4):
            loaded[i].wait()
        if collective:
            pair.arrive(orders_tensor_core=True)
            pair.wait(orders_tensor_core=True)
        leader = mu.single_thread_predicate()
        if collective:
            leader = arith.andi(leader, arith.cmpi(arith.CmpIPredicate.eq, rank,
                                                   mu.c(0, index)))
        with mu.when(leader):
            if lhs_tmem:
                jtc.async_copy_smem_to_tmem(a_smem, a_tmem, swizzle, collective=collective)
            jtc.async_copy_scales_smem_to_tmem(sa_smem, a_scales, collective=collective)
            jtc.async_copy_scales_smem_to_tmem(sb_smem, b_scales, collective=collective)
            if sparse:
                jtc.async_copy_sparse_metadata_smem_to_tmem(meta_smem, meta_tmem)
            jtc.mma(acc, a_tmem if lhs_tmem else a_smem,
                    mgpu.memref_transpose(b_smem, (1, 0, 3, 2)), a_swizzle=swizzle,
                    b_swizzle=swizzle, a_scale=a_scales, b_scale=b_scales, accumulate=False,
                    collective=collective, a_sparse_metadata=meta_tmem)  # <mma>
            jtc.commit_arrive(done, collective=collective, ctx=ctx)
        done.wait(orders_tensor_core=True)
        acc.load().store_untiled(
            mu.memref_slice(out, mu.ds(arith.muli(rank, mu.c(mc, index)), mc)), optimized=False)

    m64 = mc == 64  # 64 rows a CTA: B's scales in b_scales_m64_collective_layout
    sa_shape = (ctas, k // block // 4, 32, 16)
    sb_shape = (1, k // block // 4, 64, 16) if m64 else (-(-n // 128), k // block // 4, 32, 16)
    sb_layout = jtc.b_scales_m64_collective_layout() if m64 else jtc.scales_layout()
    meta_shape = (m // 128, k // 4 // 64, 128, 64)  # 2 entries a group of 8 logical K
    a_s = jax.ShapeDtypeStruct((m, ka), in_dtype)
    b_s = jax.ShapeDtypeStruct((n, k), in_dtype)
    args = (a_s, b_s) + ((jax.ShapeDtypeStruct(meta_shape, jnp.uint2),) if sparse else ()) + (
        jax.ShapeDtypeStruct(sa_shape, scale_dtype), jax.ShapeDtypeStruct(sb_shape, scale_dtype))
    with mlir.make_ir_context(), ir.Location.unknown(), _blackwell():
        scratch = [
            jax.ShapeDtypeStruct((mc // 8, ka // width, 8, width), in_dtype),
            jax.ShapeDtypeStruct((nc // 8, k // width, 8, width), in_dtype),
            jax.ShapeDtypeStruct((1,) + sa_shape[1:], scale_dtype),
            jax.ShapeDtypeStruct(sb_shape, scale_dtype),
            jax.ShapeDtypeStruct(meta_shape, jnp.uint2) if sparse else None,
            mgpu.Barrier(1, 5 if sparse else 4), mgpu.Barrier(1),
            mgpu.ClusterBarrier(collective_dims=(gpu.Dimension.x,)) if collective else None,
            mgpu.TMEM((mc, n), jnp.float32, collective=collective),
            mgpu.TMEM((max(mc, 128), k // block), scale_dtype, layout=jtc.scales_layout(),
                      collective=collective),
            mgpu.TMEM((256 if m64 else -(-n // 128) * 128, k // block), scale_dtype,
                      layout=sb_layout, collective=collective),
            mgpu.TMEM((mc, k), in_dtype, packing=32 // bits, collective=collective)
            if lhs_tmem else None,
            mgpu.TMEM((m, k // 4), jnp.uint2, layout=jtc.sparse_meta_layout())
            if sparse else None,
        ]
        return mgpu.as_gpu_kernel(body, (ctas, 1, 1), (128, 1, 1), args,
                                  jax.ShapeDtypeStruct((m, n), jnp.float32), scratch,
                                  cluster=(ctas, 1, 1)), body


def sample_scales(shape, dtype):
    if dtype == E8M0:  # 2^-5 .. 2^4
        return RNG.integers(122, 132, shape).astype(np.uint8).view(E8M0)
    return np.abs(RNG.standard_normal(shape)).astype(E4M3)


def uniform(shape, dtype):
    return RNG.uniform(-1, 1, shape).astype(dtype)


def check_block_scaled(m, n, k, in_dtype, scale_dtype, block, swizzle, **kw):
    fn, _ = block_scaled_kernel(m, n, k, in_dtype, scale_dtype, block, swizzle, **kw)
    a, b = uniform((m, k), in_dtype), uniform((n, k), in_dtype)
    sa, sb = sample_scales((m, k // block), scale_dtype), sample_scales((n, k // block),
                                                                         scale_dtype)
    ctas = 2 if kw.get("collective") else 1
    tmem_scales = (scales_for_m64_pair(sa, sb) if m // ctas == 64
                   else (scales_for_tmem(sa), scales_for_tmem(sb)))
    (got,) = emu.run(fn, a, b, *tmem_scales, arch=BLACKWELL)
    a64 = a.astype(np.float64) * np.repeat(sa.astype(np.float64), block, axis=1)
    b64 = b.astype(np.float64) * np.repeat(sb.astype(np.float64), block, axis=1)
    exact = a64 @ b64.T
    steps = k // (256 // jax.dtypes.itemsize_bits(in_dtype))
    bound = (steps + 1) * 2.0 ** -24 * (np.abs(a64) @ np.abs(b64).T)
    err = np.abs(got.astype(np.float64) - exact)
    assert np.all(err <= bound), (err / np.maximum(bound, 1e-300)).max()
    # the scales matter: without them, or with A's transposed, it is far off
    assert np.abs(exact).max() > 1 and ctas in (1, 2)
    unscaled = a.astype(np.float64) @ b.astype(np.float64).T
    assert np.abs(got - unscaled).max() > 1e3 * bound.max()


BLOCK_SCALED = {
    # kind::mxf8f6f4.block_scale.scale_vec::1X: fp8, ue8m0 scales a block of 32
    "e4m3-ue8m0-n128-swizzle128": (128, 128, 256, E4M3, E8M0, 32, 128),
    "e5m2-ue8m0-n8-swizzle32": (128, 8, 128, E5M2, E8M0, 32, 32),
    # kind::mxf4nvf4.block_scale.scale_vec::2X: e2m1, ue8m0 scales a block of 32
    "e2m1-ue8m0-block32-n256": (128, 256, 256, F4, E8M0, 32, 128),
    # kind::mxf4nvf4.block_scale.scale_vec::4X: e2m1, ue8m0 / ue4m3 a block of 16
    "e2m1-ue8m0-block16-n64": (128, 64, 256, F4, E8M0, 16, 128),
    "e2m1-ue4m3-block16-n32-swizzle32": (128, 32, 256, F4, E4M3, 16, 32),
}


@pytest.mark.parametrize("name", list(BLOCK_SCALED))
def test_block_scaled_mma_matches_numpy(name):
    check_block_scaled(*BLOCK_SCALED[name])


@pytest.mark.parametrize("in_dtype, block", [(E4M3, 32), (F4, 16)], ids=["e4m3", "e2m1"])
def test_block_scaled_mma_with_a_in_tmem(in_dtype, block):
    """A copied to TMEM (tcgen05.cp.128x256b: four fp8 or eight e2m1 a cell)."""
    check_block_scaled(128, 128, 256, in_dtype, E8M0, block, 128, lhs_tmem=True)


@pytest.mark.parametrize("in_dtype, block", [(E5M2, 32), (F4, 32)], ids=["e5m2", "e2m1"])
def test_collective_block_scaled_mma(in_dtype, block):
    """cta_group::2, M = 256: each CTA its A rows and A scales, B's columns split,
    B's scales copied to both CTAs (tcgen05.cp.cta_group::2.32x128b.warpx4)."""
    check_block_scaled(256, 128, 256, in_dtype, E8M0, block, 128, collective=True)


@pytest.mark.parametrize("n", [64, 256])
def test_block_scaled_mma_over_a_pair_with_64_rows_a_cta(n):
    """cta_group::2, M = 128 (data path layout B): each CTA its 64 rows of A and
    their scales (padded to a 128-row tile), D's column halves in lanes 0-63
    and 64-127; B's scales copied by tcgen05.cp.64x128b.warpx2::01_23, each
    lane quarter reading those of the columns it computes. Within the bound of
    the exact product; far from it without the scales."""
    check_block_scaled(128, n, 256, E5M2, E8M0, 32, 128, collective=True)


@pytest.mark.parametrize("scale_dtype, block", [(E8M0, 64), (E8M0, 32), (E4M3, 32)],
                         ids=["ue8m0-block64", "ue8m0-block32", "ue4m3-block32"])
def test_sparse_block_scaled_e2m1_mma(scale_dtype, block):
    """kind::mxf4(nvf4).block_scale with .sp: A 4:8 pair-wise sparse -- each group of
    8 logical K holds 2 of its 4 element pairs, the metadata naming them (8-bit
    kinds' TMEM layout); scales over the logical K (128 an instruction: blocks of
    64 or 32 are scale_vec::2X or 4X)."""
    m, n, k = 128, 128, 512  # A's stored rows: one 128-byte swizzle span of e2m1
    fn, _ = block_scaled_kernel(m, n, k, F4, scale_dtype, block, 128, sparse=True)
    a, b = uniform((m, k // 2), F4), uniform((n, k), F4)
    pairs = PAIRS[RNG.integers(0, 6, (m, k // 8))]
    sa, sb = sample_scales((m, k // block), scale_dtype), sample_scales((n, k // block),
                                                                         scale_dtype)
    (got,) = emu.run(fn, a, b, metadata_for_tmem(pairs, 1), scales_for_tmem(sa),
                     scales_for_tmem(sb), arch=BLACKWELL)
    stored = a.astype(np.float64).reshape(m, k // 8, 2, 2)  # (row, group, pair, element)
    logical = np.zeros((m, k // 8, 4, 2))
    np.put_along_axis(logical, pairs[..., None], stored, axis=2)
    a64 = logical.reshape(m, k) * np.repeat(sa.astype(np.float64), block, axis=1)
    b64 = b.astype(np.float64) * np.repeat(sb.astype(np.float64), block, axis=1)
    exact = a64 @ b64.T
    bound = (k // 128 + 1) * 2.0 ** -24 * (np.abs(a64) @ np.abs(b64).T)
    assert np.all(np.abs(got.astype(np.float64) - exact) <= bound)
    # the metadata matters: the stored pairs read as the group's first two is far off
    dense = np.zeros((m, k // 8, 4, 2))
    dense[:, :, :2] = stored
    scaled_dense = dense.reshape(m, k) * np.repeat(sa.astype(np.float64), block, axis=1)
    assert np.abs(got - scaled_dense @ b64.T).max() > 1e3 * bound.max()


# --- sparse MMAs (tcgen05.mma.sp) -------------------------------------------------------------

def sparse_kernel(m, n, k, dtype, swizzle, lhs_tmem=False):
    """A (m, k // 2) 2:4-compressed and B (k, n) by TMA, A's metadata by TMA and
    ``async_copy_sparse_metadata_smem_to_tmem``; A maybe through TMEM; one
    ``tcgen05.mma`` with ``a_sparse_metadata``; the accumulator out."""
    from jax._src.interpreters import mlir
    from jax._src.lib.mlir import ir
    from jax.experimental.mosaic import gpu as mgpu
    from jax.experimental.mosaic.gpu import tcgen05 as jtc
    from jax.experimental.mosaic.gpu import utils as mu

    width = swizzle // np.dtype(dtype).itemsize
    acc_type = jnp.int32 if np.dtype(dtype) == np.int8 else jnp.float32

    def body(ctx, a, b, meta, out, scratch):
        a_smem, b_smem, meta_smem, loaded, done, acc, meta_tmem, a_tmem = scratch
        kw = dict(swizzle=swizzle, gmem_transform=mgpu.TileTransform((8, width)))
        ctx.async_copy(src_ref=a, dst_ref=a_smem, barrier=loaded[0], **kw)
        ctx.async_copy(src_ref=b, dst_ref=b_smem, barrier=loaded[1], **kw)
        ctx.async_copy(src_ref=meta, dst_ref=meta_smem, barrier=loaded[2])
        for i in range(3):
            loaded[i].wait()
        with mu.single_thread():
            if lhs_tmem:
                jtc.async_copy_smem_to_tmem(a_smem, a_tmem, swizzle)
            jtc.async_copy_sparse_metadata_smem_to_tmem(meta_smem, meta_tmem)
            jtc.mma(acc, a_tmem if lhs_tmem else a_smem, b_smem, a_swizzle=swizzle,
                    b_swizzle=swizzle, a_sparse_metadata=meta_tmem, accumulate=False)
            jtc.commit_arrive(done)
        done.wait(orders_tensor_core=True)
        signed = True if acc_type == jnp.int32 else None
        acc.load(is_signed=signed).store_untiled(out, optimized=False)

    meta_shape = (m // 128, k // 128, 128, 64)
    args = (jax.ShapeDtypeStruct((m, k // 2), dtype), jax.ShapeDtypeStruct((k, n), dtype),
            jax.ShapeDtypeStruct(meta_shape, jnp.uint2))
    with mlir.make_ir_context(), ir.Location.unknown(), _blackwell():
        scratch = [
            jax.ShapeDtypeStruct((m // 8, k // 2 // width, 8, width), dtype),
            jax.ShapeDtypeStruct((k // 8, n // width, 8, width), dtype),
            jax.ShapeDtypeStruct(meta_shape, jnp.uint2),
            mgpu.Barrier(1, 3), mgpu.Barrier(1),
            mgpu.TMEM((m, n), acc_type),
            mgpu.TMEM((m, k // 2), jnp.uint2, layout=jtc.sparse_meta_layout()),
            mgpu.TMEM((m, k // 2), dtype, packing=4 // np.dtype(dtype).itemsize)
            if lhs_tmem else None,
        ]
        return mgpu.as_gpu_kernel(body, (1, 1, 1), (128, 1, 1), args,
                                  jax.ShapeDtypeStruct((m, n), acc_type), scratch)


PAIRS = np.array([(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)])


def metadata_for_tmem(pairs, itemsize):
    """(m, k // 4, 2) positions -> (m // 128, k // 128, 128, 64) uint2: the
    formatting jax's own sparse MMA tests give the hardware (16-bit operands
    interleave rows and entries; 8-bit ones do not)."""
    m, groups, _ = pairs.shape
    e = 2 * groups  # entries a row
    if itemsize == 1:
        tiled = pairs.reshape(m // 128, 128, e // 64, 64).transpose(0, 2, 1, 3)
    else:
        tiled = pairs.reshape(m // 128, 8, 2, 8, e // 64, 4, 2, 8).transpose(0, 4, 1, 6, 3, 5, 2, 7)
    return tiled.reshape(m // 128, e // 64, 128, 64).astype(jnp.uint2)


def check_sparse(m, n, k, dtype, swizzle, **kw):
    fn = sparse_kernel(m, n, k, dtype, swizzle, **kw)
    if np.dtype(dtype) == np.int8:
        a = RNG.integers(-128, 128, (m, k // 2)).astype(np.int8)
        b = RNG.integers(-128, 128, (k, n)).astype(np.int8)
    else:
        a, b = normal((m, k // 2), dtype), normal((k, n), dtype)
    pairs = PAIRS[RNG.integers(0, 6, (m, k // 4))]
    (got,) = emu.run(fn, a, b, metadata_for_tmem(pairs, np.dtype(dtype).itemsize),
                     arch=BLACKWELL)
    logical = np.zeros((m, k // 4, 4))
    np.put_along_axis(logical, pairs, a.astype(np.float64).reshape(m, k // 4, 2), axis=-1)
    logical = logical.reshape(m, k)
    exact = logical @ b.astype(np.float64)
    if np.dtype(dtype) == np.int8:
        np.testing.assert_array_equal(got, exact.astype(np.int64).astype(np.int32))
    else:
        err = np.abs(got.astype(np.float64) - exact)
        assert np.all(err <= mma_bound(logical, b.astype(np.float64))), err.max()
    # the metadata matters: A read densely (the stored pairs at positions 0, 1) is far off
    dense = np.zeros((m, k // 4, 4))
    dense[..., :2] = a.astype(np.float64).reshape(m, k // 4, 2)
    assert np.abs(got - dense.reshape(m, k) @ b.astype(np.float64)).max() > 1


SPARSE = {
    "f16-swizzle128": (128, 128, 256, F16, 128),
    "bf16-n256-swizzle64": (128, 256, 256, BF16, 64),
    "e4m3-swizzle128": (128, 128, 256, E4M3, 128),
    "e5m2-n64-swizzle64": (128, 64, 256, E5M2, 64),
    "s8-swizzle128": (128, 128, 256, jnp.int8, 128),
}


@pytest.mark.parametrize("name", list(SPARSE))
def test_sparse_mma_matches_numpy(name):
    check_sparse(*SPARSE[name])


@pytest.mark.parametrize("dtype", [BF16, E4M3], ids=["bf16", "e4m3"])
def test_sparse_mma_with_a_in_tmem(dtype):
    check_sparse(128, 128, 256, dtype, 128, lhs_tmem=True)


def test_sparse_metadata_that_is_not_an_increasing_pair_is_an_error():
    fn = sparse_kernel(128, 128, 256, F16, 128)
    pairs = PAIRS[RNG.integers(0, 6, (128, 64))]
    pairs[5, 3] = (2, 1)
    with pytest.raises(emu.EmulationError, match=r"A row 5, group 3 names positions 2 and 1"):
        emu.run(fn, normal((128, 128), F16), normal((256, 128), F16),
                metadata_for_tmem(pairs, 2), arch=BLACKWELL)
