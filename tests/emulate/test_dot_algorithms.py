"""Tensor-core dot algorithms inside ``smalti.emulate.on_cpu``
(``emulate/dot_algorithms.py``): ``jnp.dot(..., precision=F16_F16_F32)`` and
its kin compute as the emulated GPU's tensor cores, so a matmul kernel equals
such a reference bit for bit, as jax's own tests expect of the GPU; nothing
changes outside the mode; what is not modelled is refused."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax import lax

import smalti.emulate as emu
from smalti.emulate import dot_algorithms, tensorcore

P = lax.DotAlgorithmPreset
F16, BF16, F32 = np.float16, ml_dtypes.bfloat16, np.float32
RNG = np.random.default_rng(2026)


def normal(shape, dtype=F16):
    return RNG.standard_normal(shape).astype(dtype)


def hopper_chain(a, b, operands="f16", accumulator="f32"):
    """a @ b.T ((M, K), (N, K)) as WGMMAs of K = 16 in ascending k, by the
    adder's reference code (the four steps over (M, N, K) arrays)."""
    acc = None
    for k0 in range(0, a.shape[1], 16):
        acc = tensorcore.mma_reference(a[:, k0:k0 + 16].astype(np.float64),
                                       b[:, k0:k0 + 16].astype(np.float64), acc,
                                       operands=operands, accumulator=accumulator)
    return acc


def test_outside_the_mode_nothing_changes():
    a, b = normal((32, 48)), normal((48, 16))
    with pytest.raises(ValueError, match="'F16_F16_F32' is not supported by dot_general on CPU"):
        jnp.dot(a, b, precision=P.F16_F16_F32)
    outside = np.asarray(jnp.dot(a.astype(BF16), b.astype(BF16), precision=P.BF16_BF16_F32,
                                 preferred_element_type=F32))
    with emu.on_cpu():
        inside = np.asarray(jnp.dot(a.astype(BF16), b.astype(BF16),
                                    precision=P.BF16_BF16_F32, preferred_element_type=F32))
    again = np.asarray(jnp.dot(a.astype(BF16), b.astype(BF16), precision=P.BF16_BF16_F32,
                               preferred_element_type=F32))
    np.testing.assert_array_equal(again, outside)  # not the mode's program, cached
    assert not np.array_equal(inside, outside)  # the tensor core truncates; XLA:CPU rounds


def test_the_official_hopper_matmul_equals_the_f16_f16_f32_reference_bit_for_bit():
    from jax.experimental.pallas.ops.gpu import hopper_matmul_mgpu as matmul

    config = matmul.TuningConfig(tile_m=128, tile_n=128, tile_k=64, max_concurrent_steps=2)
    a, b = normal((256, 512)), normal((512, 256))
    with emu.on_cpu():
        kernel = np.asarray(matmul.matmul(a, b, None, config))
        reference = np.asarray(jnp.dot(a, b, precision=P.F16_F16_F32))
    assert kernel.dtype == reference.dtype == F16
    np.testing.assert_array_equal(kernel, reference)
    # XLA:CPU's f32 sums, rounded to f16, differ: jax's test (rtol=1e-7) would fail
    xla = (a.astype(F32) @ b.astype(F32)).astype(F16)
    assert np.count_nonzero(xla != kernel) > 0


def test_the_official_blackwell_matmul_equals_the_reference_at_sm_100():
    from jax.experimental.pallas.ops.gpu import blackwell_matmul_mgpu as matmul

    config = matmul.TuningConfig(tile_m=128, tile_n=128, tile_k=64, max_concurrent_steps=2,
                                 collective=False)
    a, b = normal((128, 256)), normal((256, 128))  # 4 K steps, 2 slots
    with emu.on_cpu(arch=(10, 0)):
        kernel = np.asarray(matmul.matmul_kernel(a, b, config))
        reference = np.asarray(jnp.dot(a, b, precision=P.F16_F16_F32))
    np.testing.assert_array_equal(kernel, reference)


def test_the_official_mixed_type_matmul_equals_the_bf16_reference_strictly():
    from jax.experimental.pallas.ops.gpu import hopper_mixed_type_matmul_mgpu as mixed

    config = mixed.TuningConfig(tile_m=64, tile_n=128, tile_k=64, epi_tile_m=None,
                                epi_tile_n=None, max_concurrent_steps=2,
                                wg_dimension=mixed.MatmulDimension.M)
    lhs = RNG.integers(-5, 5, (128, 256)).astype(np.int8)
    rhs = normal((256, 128), BF16)
    with emu.on_cpu():
        kernel = np.asarray(mixed.mixed_matmul_kernel(lhs, rhs, out_dtype=jnp.bfloat16,
                                                      config=config))
        reference = np.asarray(jnp.dot(lhs.astype(BF16), rhs, precision=P.BF16_BF16_F32)
                               .astype(jnp.bfloat16))
    np.testing.assert_array_equal(kernel, reference)  # the test's strict=True


def test_the_contraction_is_wgmmas_of_16_in_ascending_k():
    a, b = normal((24, 40)), normal((40, 8))  # K = 40: two instructions and a half
    with emu.on_cpu():
        got = np.asarray(jnp.dot(a, b, precision=P.F16_F16_F32, preferred_element_type=F32))
    np.testing.assert_array_equal(got, hopper_chain(a, b.T))


def test_an_f16_accumulator_and_bf16_operands():
    a, b = normal((16, 64)), normal((64, 16))
    with emu.on_cpu():
        f16_acc = np.asarray(jnp.dot(a, b, precision=P.F16_F16_F16))
        bf16 = np.asarray(jnp.dot(a.astype(F32), b.astype(F32), precision=P.BF16_BF16_F32))
    np.testing.assert_array_equal(f16_acc, hopper_chain(a, b.T, accumulator="f16"))
    # f32 operands are rounded to bf16 first, as the algorithm's inputs
    np.testing.assert_array_equal(
        bf16, hopper_chain(a.astype(BF16), b.T.astype(BF16), operands="bf16"))


def test_batch_and_contracting_dimensions_anywhere():
    lhs = normal((32, 3, 5))  # (K, M, batch): contracting 0, batch 2
    rhs = normal((5, 7, 32))  # (batch, N, K): contracting 2, batch 0
    numbers = (((0,), (2,)), ((2,), (0,)))
    with emu.on_cpu():
        got = np.asarray(lax.dot_general(lhs, rhs, numbers, precision=P.F16_F16_F32,
                                         preferred_element_type=F32))
    assert got.shape == (5, 3, 7)  # batch, lhs free, rhs free
    for i in range(5):
        np.testing.assert_array_equal(got[i], hopper_chain(lhs[:, :, i].T, rhs[i]))


def test_under_jit_and_grad():
    a, b = normal((32, 32)), normal((32, 16))

    def loss(a):
        return jnp.dot(a, b, precision=P.F16_F16_F32).astype(F32).sum()

    with emu.on_cpu():
        grad = np.asarray(jax.jit(jax.grad(loss))(a))
    # the cotangent's dot (ones @ b.T) is the same algorithm
    want = hopper_chain(np.ones((32, 16), F16), b).astype(F16)
    np.testing.assert_array_equal(grad, want)


def test_empty_and_non_finite_operands():
    with emu.on_cpu():
        empty = np.asarray(jnp.dot(np.zeros((4, 0), F16), np.zeros((0, 3), F16),
                                   precision=P.F16_F16_F32))
        no_batch = np.asarray(lax.dot_general(np.zeros((0, 4, 16), F16),
                                              np.zeros((0, 16, 3), F16),
                                              (((2,), (1,)), ((0,), (0,))),
                                              precision=P.F16_F16_F32))
        a, b = normal((4, 16)), normal((16, 3))
        a[1, 3] = np.inf
        inf = np.asarray(jnp.dot(a, b, precision=P.F16_F16_F32, preferred_element_type=F32))
    np.testing.assert_array_equal(empty, np.zeros((4, 3), F16))
    assert no_batch.shape == (0, 4, 3)
    direct = dot_algorithms.dot_general(  # XLA may not call back for an empty result
        np.zeros((0, 4, 16), F16), np.zeros((0, 16, 3), F16), (((2,), (1,)), ((0,), (0,))),
        dot_algorithms.MODELLED["F16_F16_F32"], (9, 0), np.dtype(F16))
    assert direct.shape == (0, 4, 3) and direct.dtype == F16
    # the IEEE sum of the exact terms where one is infinite
    np.testing.assert_array_equal(inf[1], np.inf * np.sign(b[3].astype(F32)))
    np.testing.assert_array_equal(np.delete(inf, 1, axis=0),
                                  np.delete(hopper_chain(a, b.T), 1, axis=0))


@pytest.mark.parametrize("preset", ["TF32_TF32_F32", "ANY_F8_ANY_F8_F32", "BF16_BF16_BF16",
                                    "BF16_BF16_F32_X9"])
def test_presets_not_modelled_are_refused(preset):
    a = normal((16, 16), F32)
    with emu.on_cpu(), pytest.raises(emu.Unsupported, match=f"{preset} inside smalti.emulate"
                                                             ".*fix: use one of those presets"):
        jnp.dot(a, a, precision=getattr(P, preset))


@pytest.mark.parametrize("preset", ["F32_F32_F32", "BF16_BF16_F32_X3"])
def test_presets_xla_computes_stay_xlas(preset):
    a = normal((16, 16), F32)
    outside = np.asarray(jnp.dot(a, a, precision=getattr(P, preset)))
    with emu.on_cpu():
        inside = np.asarray(jnp.dot(a, a, precision=getattr(P, preset)))
    np.testing.assert_array_equal(inside, outside)


def test_an_architecture_without_a_modelled_tensor_core_is_refused():
    a = normal((16, 16))
    with emu.on_cpu(arch=(8, 0)), pytest.raises(emu.Unsupported, match="sm_80.*fix: on_cpu"):
        jnp.dot(a, a, precision=P.F16_F16_F32)


# --- default precision: a float32 GEMM in TF32 ------------------------------------------------


def tf32_chain(a, b, arch=(9, 0)):
    """a @ b.T ((M, K), (N, K) float32) as the emulated GPU's TF32 GEMM: the
    operands' low 13 bits dropped, instructions of K = 8 in ascending k (the
    H200's adder at sm_90; the exact sum rounded once at sm_100)."""
    def tf32(x):
        return (np.ascontiguousarray(x, F32).view(np.uint32)
                & np.uint32(0xFFFFE000)).view(F32).astype(np.float64)
    a, b, acc = tf32(a), tf32(b), None
    for k0 in range(0, a.shape[1], 8):
        if arch[0] == 9:
            acc = tensorcore.mma_reference(a[:, k0:k0 + 8], b[:, k0:k0 + 8], acc,
                                           operands="tf32", accumulator="f32")
        else:
            total = a[:, k0:k0 + 8] @ b[:, k0:k0 + 8].T
            acc = (total if acc is None else total + acc.astype(np.float64)).astype(F32)
    return acc


@pytest.mark.parametrize("arch", [(9, 0), (10, 0)])
def test_a_default_precision_f32_product_is_the_gpus_tf32_gemm(arch):
    a, b = normal((40, 72), F32), normal((72, 24), F32)  # K = 72: nine instructions
    want = tf32_chain(a, b.T, arch)
    with emu.on_cpu(arch):
        forms = {
            "@": a @ jnp.asarray(b),
            "precision=None": jnp.dot(a, b),
            "Precision.DEFAULT": jnp.dot(a, b, precision=lax.Precision.DEFAULT),
            "DotAlgorithmPreset.DEFAULT": jnp.dot(a, b, precision=P.DEFAULT),
            "jit": jax.jit(jnp.matmul)(a, b),
            "einsum, batched": jnp.einsum("bmk,bkn->bmn", a[None], b[None])[0],
        }
    for form, got in forms.items():
        np.testing.assert_array_equal(np.asarray(got), want, err_msg=form)
    assert not np.array_equal(want, np.asarray(jnp.dot(a, b)))  # XLA:CPU's float32 sums


@pytest.mark.parametrize("dtype", [F16, BF16])
def test_a_default_precision_16_bit_product_is_the_gpus_gemm(dtype):
    a, b = normal((24, 40), dtype), normal((40, 8), dtype)
    want = hopper_chain(a, b.T, operands="f16" if dtype is F16 else "bf16")
    with emu.on_cpu():
        to_f32 = np.asarray(lax.dot(a, b, preferred_element_type=F32))
        same = np.asarray(a @ jnp.asarray(b))
    np.testing.assert_array_equal(to_f32, want)
    np.testing.assert_array_equal(same, want.astype(dtype))  # rounded once, to nearest even


def test_a_tensor_core_kernel_meets_a_default_reference_as_on_the_gpu():
    """jax's WGMMATest: f16 operands, K = 128, f32 output, ``atol=5e-6``
    against ``x32 @ y32``. The kernel's WGMMAs (the adder) are within it of
    the TF32 reference the GPU computes; XLA:CPU's float32 sums are not."""
    x, y = (RNG.uniform(-1, 1, s).astype(F16) for s in ((128, 128), (128, 128)))
    kernel = hopper_chain(x, y.T)
    x32, y32 = x.astype(F32), y.astype(F32)
    with emu.on_cpu():
        reference = np.asarray(jnp.asarray(x32) @ y32)
    np.testing.assert_allclose(kernel, reference, atol=5e-6, rtol=0)
    assert np.abs(kernel - np.asarray(jnp.asarray(x32) @ y32)).max() > 5e-6


@pytest.mark.parametrize("case", ["HIGHEST", "float32 default", "matrix-vector",
                                  "vector-matrix", "outer product", "int32 operands",
                                  "f16 to bf16"])
def test_products_the_gpu_computes_otherwise_stay_xlas(case):
    a, b = normal((16, 32), F32), normal((32, 8), F32)

    def product():
        if case == "HIGHEST":
            return jnp.dot(a, b, precision=lax.Precision.HIGHEST)
        if case == "float32 default":
            with jax.default_matmul_precision("float32"):
                return jax.jit(jnp.dot)(a, b)
        if case == "matrix-vector":
            return jnp.dot(a, b[:, 0])
        if case == "vector-matrix":
            return jnp.dot(a[:1], b)
        if case == "outer product":
            return jnp.dot(a[:, :1], b[:1])
        if case == "int32 operands":
            return jnp.dot(a.astype(np.int32), b.astype(np.int32))
        return lax.dot(a.astype(F16), b.astype(F16), preferred_element_type=BF16)

    outside = np.asarray(product())
    with emu.on_cpu():
        inside = np.asarray(product())
    np.testing.assert_array_equal(inside, outside)


def test_a_subnormal_operand_of_a_default_product_is_refused():
    a = normal((16, 16), F32)
    a[3, 5] = 1e-40
    with emu.on_cpu(), pytest.raises(Exception, match="subnormal f32 operand.*"
                                                      "fix: precision=lax.Precision.HIGHEST"):
        np.asarray(a @ jnp.asarray(a))
