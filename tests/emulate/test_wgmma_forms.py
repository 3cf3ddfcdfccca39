"""WGMMA forms beyond f16/bf16 into f32: 8-bit A in registers (s8, e4m3),
fp8 operands (e4m3, e5m2) and f16 accumulators, against the exact product.

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
