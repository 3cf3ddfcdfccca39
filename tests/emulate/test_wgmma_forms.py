"""WGMMA forms beyond f16/bf16 into f32: 8-bit A in registers (s8, e4m3),
fp8 operands (e4m3, e5m2), f16 accumulators and tf32 (f32 operands, their
low 13 bits truncated as the PTX ISA says: bit for bit where every sum is
exact, edge values, within the adder's bound otherwise), against the exact
product.

The model (``emulate/ops/wgmma.py``): each instruction's K products are exact,
summed in float64 with the accumulator and rounded once to the accumulator's
type -- so a kernel of K / k instructions is within (K / k) rounding units of
the partial sums of the exact product (s8 -> s32 is exact)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

import smalti.emulate as emu

WG = plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup)


def _matmul(dtype, acc_dtype, a_in_registers: bool, n: int, k: int):
    """o (64, n) = a (64, k) @ b.T, with b given (n, k) (K-major, as fp8 needs)."""
    e = jnp.dtype(dtype).itemsize
    t = (plgpu.TilingTransform((8, 128 // e)), plgpu.SwizzleTransform(128))
    layout = plgpu.Layout.WGMMA_8BIT if e == 1 else plgpu.Layout.WGMMA

    def body(a_gmem, b_gmem, o_gmem, a, b, bar):
        plgpu.copy_gmem_to_smem(a_gmem, a, bar)
        plgpu.barrier_wait(bar)
        plgpu.copy_gmem_to_smem(b_gmem, b, bar)
        plgpu.barrier_wait(bar)

        def scope(acc):
            lhs = plgpu.load(a, layout=layout) if a_in_registers else a
            plgpu.wgmma(acc, lhs, b.transpose((1, 0)))
            plgpu.wgmma_wait(0)
            return acc[...]
        o_gmem[...] = pl.run_scoped(scope, plgpu.ACC((64, n), acc_dtype))

    return plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((64, n), acc_dtype),
                        compiler_params=WG,
                        scratch_types=[plgpu.SMEM((64, k), dtype, transforms=t),
                                       plgpu.SMEM((n, k), dtype, transforms=t), plgpu.Barrier()])


def _operands(dtype, n, k, seed):
    rng = np.random.default_rng(seed)
    if jnp.issubdtype(dtype, jnp.integer):
        return (rng.integers(-128, 128, (64, k)).astype(dtype),
                rng.integers(-128, 128, (n, k)).astype(dtype))
    return (rng.uniform(-2, 2, (64, k)).astype(dtype), rng.uniform(-2, 2, (n, k)).astype(dtype))


@pytest.mark.parametrize("a_in_registers", [True, False], ids=["a_regs", "a_smem"])
def test_s8_wgmma_is_exact(a_in_registers):
    """s8 x s8 -> s32, A from SMEM or from registers (the 8-bit fragment: four
    b32 registers of four bytes each): bit-exact."""
    a, b = _operands(jnp.int8, 128, 256, 0)
    (o,) = emu.run(_matmul(jnp.int8, jnp.int32, a_in_registers, 128, 256), a, b)
    np.testing.assert_array_equal(o, a.astype(np.int64) @ b.astype(np.int64).T)


@pytest.mark.parametrize("dtype,acc,a_in_registers", [
    (jnp.float8_e4m3fn, jnp.float32, True), (jnp.float8_e4m3fn, jnp.float32, False),
    (jnp.float8_e5m2, jnp.float32, False), (jnp.float16, jnp.float16, False),
    (jnp.float16, jnp.float16, True), (jnp.float8_e4m3fn, jnp.float16, False),
    (jnp.float8_e5m2, jnp.float16, True)])
def test_float_wgmma_forms_are_within_one_rounding_per_instruction(dtype, acc, a_in_registers):
    n = 64
    k = 2 * 128 // jnp.dtype(dtype).itemsize  # two tiles: several instructions
    a, b = _operands(dtype, n, k, 1)
    (o,) = emu.run(_matmul(dtype, acc, a_in_registers, n, k), a, b)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    exact = a64 @ b64.T
    steps = k // (32 // jnp.dtype(dtype).itemsize)  # instructions along K
    eps = float(np.finfo(acc).eps) / 2
    bound = steps * eps * (np.abs(a64) @ np.abs(b64).T) * 1.01 + float(np.finfo(acc).tiny)
    err = np.abs(o.astype(np.float64) - exact)
    assert np.all(err <= bound), float(np.max(err / bound))
    assert not np.array_equal(o.astype(np.float64), np.zeros_like(exact))


def test_the_f16_accumulator_is_rounded_per_instruction_not_at_the_end():
    """The model's rounding, pinned down: an f16 accumulator is rounded to f16
    after every instruction (K = 16 for f16), so a long K differs from the
    exact product rounded once -- by design, as the accumulator is f16."""
    a, b = _operands(jnp.float16, 64, 128, 2)
    (o,) = emu.run(_matmul(jnp.float16, jnp.float16, False, 64, 128), a, b)
    acc = np.zeros((64, 64), np.float16)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    for s in range(0, 128, 16):
        acc = (acc.astype(np.float64) + a64[:, s:s + 16] @ b64[:, s:s + 16].T).astype(np.float16)
    np.testing.assert_array_equal(o, acc)


# --- tf32: f32 operands, K = 8 an instruction, the low 13 bits truncated -------

def _tf32(x: np.ndarray) -> np.ndarray:
    """f32 values with their low 13 bits cleared (the PTX ISA's truncation)."""
    return (np.asarray(x, np.float32).view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32)


def _low_bits(x: np.ndarray, rng) -> np.ndarray:
    """``x`` (tf32-exact f32) with random low 13 bits set in every nonzero element."""
    junk = rng.integers(1, 1 << 13, x.shape).astype(np.uint32) * (x != 0)
    return (np.asarray(x, np.float32).view(np.uint32) | junk.astype(np.uint32)).view(np.float32)


def test_tf32_wgmma_drops_the_low_13_bits_and_sums_exactly():
    """Small integers with junk in their low 13 bits: the tensor core reads the
    integers (every sum is exact), so the result equals numpy's product of the
    truncated inputs bit for bit -- and differs from the product of the inputs."""
    rng = np.random.default_rng(3)
    a = _low_bits(rng.integers(1, 17, (64, 64)) * rng.choice([-1.0, 1.0], (64, 64)), rng)
    b = _low_bits(rng.integers(1, 17, (128, 64)) * rng.choice([-1.0, 1.0], (128, 64)), rng)
    assert np.all(_tf32(a) != a)
    (o,) = emu.run(_matmul(jnp.float32, jnp.float32, False, 128, 64), a, b)
    want = (_tf32(a).astype(np.float64) @ _tf32(b).astype(np.float64).T).astype(np.float32)
    np.testing.assert_array_equal(o, want)
    untruncated = a.astype(np.float64) @ b.astype(np.float64).T
    assert np.mean(o != untruncated.astype(np.float32)) > 0.9


def test_tf32_wgmma_of_random_operands_is_within_one_rounding_per_instruction():
    """Random f32 operands: within the adder's bound of the exact product of the
    truncated inputs (each of the K / 8 instructions truncates its terms 25 bits
    below the largest and rounds towards zero), but not of the inputs themselves."""
    rng = np.random.default_rng(4)
    a, b = (rng.uniform(-2, 2, s).astype(np.float32) for s in ((64, 128), (64, 128)))
    (o,) = emu.run(_matmul(jnp.float32, jnp.float32, False, 64, 128), a, b)
    ta, tb = _tf32(a).astype(np.float64), _tf32(b).astype(np.float64)
    exact = ta @ tb.T
    bound = (128 // 8) * (2.0 ** -23 + 9 * 2.0 ** -25) * (np.abs(ta) @ np.abs(tb).T)
    err = np.abs(o.astype(np.float64) - exact)
    assert np.all(err <= bound), float(np.max(err / bound))
    full = a.astype(np.float64) @ b.astype(np.float64).T
    assert np.max(np.abs(o - full) / bound) > 10  # the truncation is far above the rounding


F32_BITS = {"qnan": 0x7FC00000, "nan_low_payload": 0x7F800001, "inf": 0x7F800000,
            "-inf": 0xFF800000, "-0": 0x80000000, "max": 0x7F7FFFFF,
            "tiny_subnormal": 0x00000001, "-tiny_subnormal": 0x80001FFF}


def _bits(name: str) -> np.float32:
    return np.uint32(F32_BITS[name]).view(np.float32)


def test_tf32_wgmma_edge_values():
    """Rows of A hold edge values; B is all powers of two (no zero, so no
    inf * 0), so each output is 2^j times the sum of its row's truncated
    values, and numpy's float64 sum of those is exact. Per the ISA's
    truncation a NaN whose payload lies only in the low 13 bits reads as
    infinity, a subnormal with only low bits is zero (and so runs); -0 sums
    to +0 (the zero accumulator is +0); inf - inf is NaN; 2 * f32 max
    overflows, rounded towards zero to f32 max (the adder's rounding)."""
    a = np.zeros((64, 32), np.float32)
    a[:, 0] = np.arange(64, dtype=np.float32)  # a plain row sum everywhere else
    rows = {1: ["qnan"], 2: ["nan_low_payload"], 3: ["inf"], 4: ["inf", "-inf"],
            5: ["-0", "-0"], 6: ["tiny_subnormal", "-tiny_subnormal"], 7: ["-inf"],
            8: ["max", "max"]}
    for r, names in rows.items():
        a[r, :] = 0
        a[r, :len(names)] = [_bits(x) for x in names]
    a[5, 2:] = _bits("-0")
    b = np.float32(2.0) ** (np.arange(64)[:, None] % 4 + np.zeros((1, 32))).astype(np.float32)
    (o,) = emu.run(_matmul(jnp.float32, jnp.float32, False, 64, 32), a, b)
    with np.errstate(invalid="ignore", over="ignore"):
        want = (_tf32(a).astype(np.float64) @ b.astype(np.float64).T).astype(np.float32)
    want[8] = np.finfo(np.float32).max  # 2^(j%4) * 2 max: rounded towards zero, not to inf
    assert np.isnan(o[1]).all() and np.isinf(o[2]).all() and (o[2] > 0).all()
    assert np.isnan(o[4]).all() and (o[3] == np.inf).all() and (o[7] == -np.inf).all()
    assert not np.signbit(o[5]).any() and (o[5] == 0).all() and (o[6] == 0).all()
    np.testing.assert_array_equal(o, want)  # NaN where want has NaN, the rest bit for bit


def test_accumulator_registers_side_by_side_per_thread_uniform_or_mixed():
    """A WGMMA's accumulator registers as (threads, registers): per-thread
    (T, 1) registers, uniform ones (a zero-initialized accumulator: every
    thread's row the same), and a mix."""
    from smalti.emulate.ops.wgmma import _per_thread_columns
    T = 4
    per = [np.arange(T, dtype=np.float32)[:, None] + 10 * j for j in range(3)]
    uni = [np.full(1, j, np.float32) for j in range(3)]
    np.testing.assert_array_equal(_per_thread_columns(per, T), np.hstack(per))
    got = _per_thread_columns(uni, T)
    assert got.shape == (T, 3) and got.dtype == np.float32
    np.testing.assert_array_equal(got, np.tile([0, 1, 2], (T, 1)))
    mixed = _per_thread_columns([per[0], uni[1], per[2]], T)
    np.testing.assert_array_equal(mixed, np.stack([per[0][:, 0], np.ones(T), per[2][:, 0]], 1))
