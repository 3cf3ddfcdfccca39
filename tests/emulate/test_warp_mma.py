"""jax's Ampere-style warp MMA (``mgpu.mma``: ``mma.sync`` per warp, operands
in ``MMALayouts``) in whole kernels on the emulator, against numpy: the
kernel of jax's ``test_warp_mma``, for one type of each width and every
arrangement of the four warps."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax._src.interpreters import mlir
from jax._src.lib.mlir import ir
from jax.experimental.mosaic import gpu as mgpu
from jax.experimental.mosaic.gpu import utils

import smalti.emulate as emu
from smalti.emulate import profiling


def warp_mma_kernel(dtype, m_warps: int, shape):
    """``acc + a @ b.T`` for (M, K) a and (N, K) b, as jax's test writes it."""
    acc_dtype = jnp.int32 if jnp.issubdtype(dtype, jnp.integer) else jnp.float32
    m, n, k = shape

    def kernel(ctx, acc, a, b, out, _):
        layouts = mgpu.MMALayouts(utils.dtype_to_ir_type(dtype), m_warps=m_warps)
        signed = utils.is_signed(dtype)
        a_fa = mgpu.FragmentedArray.load_untiled(a, layout=layouts.lhs, is_signed=signed,
                                                 optimized=False)
        b_fa = mgpu.FragmentedArray.load_untiled(utils.memref_transpose(b, (1, 0)),
                                                 layout=layouts.rhs, is_signed=signed,
                                                 optimized=False)
        acc_fa = mgpu.FragmentedArray.load_untiled(acc, layout=layouts.acc,
                                                   is_signed=utils.is_signed(acc_dtype),
                                                   optimized=False)
        mgpu.mma(acc_fa, a_fa, b_fa).store_untiled(out, optimized=False)

    context = mlir.make_ir_context()
    mgpu.dialect.register_dialect(context)
    S = jax.ShapeDtypeStruct
    with context, ir.Location.unknown():
        return mgpu.as_gpu_kernel(
            kernel, (1, 1, 1), (128, 1, 1),
            (S((m, n), acc_dtype), S((m, k), dtype), S((n, k), dtype)),
            S((m, n), acc_dtype), ())


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float8_e5m2, jnp.uint8, jnp.int4],
                         ids=["bf16", "e5m2", "u8", "s4"])
@pytest.mark.parametrize("m_warps", [1, 2, 4])
def test_jax_warp_mma_kernel_computes_acc_plus_a_times_b(dtype, m_warps):
    dtype = jnp.dtype(dtype)
    rng = np.random.default_rng(m_warps)
    m, n, k = 64, 64, 128
    if jnp.issubdtype(dtype, jnp.integer):
        info = ml_dtypes.iinfo(dtype)
        a = rng.integers(int(info.min), int(info.max) + 1, (m, k)).astype(dtype)
        b = rng.integers(int(info.min), int(info.max) + 1, (n, k)).astype(dtype)
        acc = rng.integers(-100, 100, (m, n)).astype(np.int32)
        want = acc + a.astype(np.int64) @ b.astype(np.int64).T
    else:  # small integers: every sum is exact
        a = rng.integers(-4, 5, (m, k)).astype(dtype)
        b = rng.integers(-4, 5, (n, k)).astype(dtype)
        acc = rng.integers(-100, 100, (m, n)).astype(np.float32)
        want = acc + a.astype(np.float64) @ b.astype(np.float64).T
    with emu.on_cpu():
        got = np.asarray(warp_mma_kernel(dtype, m_warps, (m, n, k))(acc, a, b))
    np.testing.assert_array_equal(got, want.astype(got.dtype))


def test_pallas_mma_through_smaltis_warpgroup_pipeline():
    """``plgpu.mma`` in a Warpgroup-semantics Pallas kernel, lowered by smalti
    (``mosaic_gpu.mma`` -> ``mma.sync``), on the emulator: A and the
    accumulator from iotas (relaid out to the MMA layouts), B a splat. (B is
    not an iota: jax's ``FragmentedArray.foreach`` steps a register's second
    element along the last dimension, which MMALayouts.rhs -- vectorized
    along K -- does not, so an iota in that layout is wrong on any backend.)"""
    from jax import lax
    from jax.experimental.pallas import mosaic_gpu as plgpu

    import smalti.jax
    from tests.emulate.kernels import WG

    m, n, k = 64, 32, 32

    def iota(shape, dim):
        return lax.broadcasted_iota(jnp.int32, shape, dim)

    def body(o_ref):
        a = ((iota((m, k), 0) * 3 + iota((m, k), 1)) % 7 - 3).astype(jnp.float16)
        acc = ((iota((m, n), 0) * 7 + iota((m, n), 1)) % 11 - 5).astype(jnp.float32)
        b = jnp.full((k, n), 2, jnp.float16)
        o_ref[...] = plgpu.mma(acc, a, b)

    kernel = plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((m, n), jnp.float32),
                          compiler_params=WG)
    i, j = np.arange(m)[:, None], np.arange(k)[None]
    a = (i * 3 + j) % 7 - 3
    acc = (np.arange(m)[:, None] * 7 + np.arange(n)[None]) % 11 - 5
    want = acc + a @ np.full((k, n), 2)
    with emu.on_cpu(), smalti.jax.installed():
        got = np.asarray(kernel())
    np.testing.assert_array_equal(got, want.astype(np.float32))


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.uint8], ids=["bf16", "u8"])
def test_the_profiler_counts_each_warps_mma_sync_and_the_whole_products_flops(dtype):
    dtype = jnp.dtype(dtype)
    m, n, k = 64, 64, 128
    acc_dtype = np.int32 if jnp.issubdtype(dtype, jnp.integer) else np.float32
    a, b = np.ones((m, k), dtype), np.ones((n, k), dtype)
    p = emu.profile(warp_mma_kernel(dtype, 4, (m, n, k)), np.zeros((m, n), acc_dtype), a, b)
    np.testing.assert_array_equal(p.outputs[0], np.full((m, n), k, acc_dtype))
    integer = jnp.issubdtype(dtype, jnp.integer)
    k_per_instruction = 256 // (8 * dtype.itemsize)  # m16n8k16 for 16 bits, k32 for 8
    instructions = (m // 16) * (n // 8) * (k // k_per_instruction)
    tensor = profiling.IMMA if integer else profiling.HMMA
    other = profiling.HMMA if integer else profiling.IMMA
    assert p[tensor] == instructions and p[other] == 0
    assert p[profiling.FLOPS] == 2 * m * n * k
