r"""``dot_general`` of register values in Warpgroup kernels (smalti.vocabulary,
``vocabulary/dot.py``), on the emulator, against numpy and jnp on the CPU.
Each test also checks which path the lowering took (``wgmma.mma_async`` in
the lowered module or not).

Bounds (K: the contracted size; eps: f32's machine epsilon; exact: float64):

| operands | result | path | check |
|---|---|---|---|
| f32 | f32 | in-order loop (never tf32) | bit-equal to numpy's f32 loop ``acc = acc + a[:, k] * b[k, :]`` (each op rounded once); ``\|got - exact\| <= K eps (\|a\| @ \|b\|)``; NaN where numpy has it |
| f16, bf16 | f32 | WGMMA (sm_90, WGMMA shapes) | ``\|got - exact\| <= K eps (\|a\| @ \|b\|)`` |
| f16, bf16 | f32 | loop (precision=HIGHEST, sm_100) | as f32 (the products are exact in f32) |
| bf16 | bf16 | WGMMA | the f32 result rounded once to bf16 |
| int8 | int32, int8 | WGMMA and loop (precision=HIGHEST) | exact; int8 wraps as jnp |
| int32 | int32 | loop | exact modulo 2**32, as jnp |
| f32, int32 | 0-D | jnp.sum of the products | f32 within the bound; int32 exact |

On a GPU the compiler may fuse the loop's ``acc + x * y`` into an FMA (jnp
on the CPU does: it differs from the loop in the last bits), and the tensor
core's accumulation is undocumented; the bound holds either way. Edge
inputs: NaN, +-inf, -0.0 in f32 operands, int8 -128 / 127, int32 values
that wrap.
"""  # noqa: E501 -- a table's rows

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax import lax
from jax.experimental.pallas import mosaic_gpu as plgpu

import smalti
import smalti.emulate
import smalti.jax
import smalti.vocabulary
from smalti.diagnostics import SmaltiError

WG = plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup)
BF16 = np.dtype(ml_dtypes.bfloat16)
EPS = float(np.finfo(np.float32).eps)
MATMUL = (((1,), (0,)), ((), ()))


@pytest.fixture(scope="module")
def pipeline():
    return smalti.build_pipeline(plugins={"smalti.vocabulary": smalti.vocabulary})


def kernel(fn, *args):
    """The refs loaded into registers, ``fn`` of them stored to GMEM."""
    out = jax.eval_shape(fn, *(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in args))

    def body(*refs):
        *ins, o = refs
        o[...] = fn(*(r[...] for r in ins))
    return plgpu.kernel(body, out_type=out, compiler_params=WG)


def tma_kernel(fn, *args):
    """The inputs brought by TMA into 128-byte-swizzled SMEM, loaded from there
    (so in tiled register layouts, not a plain load's strided one)."""
    out = jax.eval_shape(fn, *(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in args))
    n = len(args)

    def body(*refs):
        gins, o, smem, bar = refs[:n], refs[n], refs[n + 1:2 * n + 1], refs[-1]
        for g, s in zip(gins, smem):
            plgpu.copy_gmem_to_smem(g, s, bar)
        plgpu.barrier_wait(bar)
        o[...] = fn(*(s[...] for s in smem))

    def transforms(dtype):
        return (plgpu.TilingTransform((8, 128 // np.dtype(dtype).itemsize)),
                plgpu.SwizzleTransform(128))

    scratch = [plgpu.SMEM(a.shape, a.dtype, transforms=transforms(a.dtype)) for a in args]
    return plgpu.kernel(body, out_type=out, compiler_params=WG,
                        scratch_types=[*scratch, plgpu.Barrier(num_arrivals=n)])


def emulate(pipeline, fn, *args, wgmma: bool, arch=(9, 0), build=kernel):
    """The kernel's result on the emulator; whether it went through WGMMA
    (``wgmma.mma_async`` in the lowered module) is checked against ``wgmma``."""
    with smalti.jax.installed(pipeline):
        module, outs = smalti.emulate.lower(build(fn, *args), *args, arch=arch)
    assert ("wgmma.mma_async" in str(module)) == wgmma
    (got,) = smalti.emulate.run_module(module, list(args),
                                       [(tuple(o.shape), np.dtype(o.dtype)) for o in outs])
    return got


def dot(dimension_numbers=MATMUL, preferred=None, precision=None):
    return lambda a, b: lax.dot_general(a, b, dimension_numbers, precision=precision,
                                        preferred_element_type=preferred)


def _as_matmul(a, b, dimension_numbers):
    """(a', b') with the product a' @ b' in dot_general's result order."""
    (ca, cb), (ba, bb) = dimension_numbers
    assert not ba and not bb
    a = np.moveaxis(a, ca[0], -1) if a.ndim == 2 else a
    b = np.moveaxis(b, cb[0], 0) if b.ndim == 2 else b
    return a, b


def in_order_f32(a, b, dimension_numbers=MATMUL):
    """numpy's f32 loop over k, acc = acc + a[.., k] * b[k, ..], each op rounded once."""
    a, b = _as_matmul(a.astype(np.float32), b.astype(np.float32), dimension_numbers)
    acc = np.zeros(a.shape[:-1] + b.shape[1:], np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        for k in range(b.shape[0]):
            acc = acc + np.multiply.outer(a[..., k], b[k])
    return acc


def check_f32(got, a, b, dimension_numbers=MATMUL, in_order=True):
    """Bit-equal to the in-order loop (``in_order``); within K eps (|a| @ |b|)
    of the exact product (where that is finite)."""
    if in_order:
        np.testing.assert_array_equal(got, in_order_f32(a, b, dimension_numbers))
    a64, b64 = _as_matmul(a.astype(np.float64), b.astype(np.float64), dimension_numbers)
    with np.errstate(invalid="ignore"):
        exact = a64 @ b64
        bound = b64.shape[0] * EPS * (np.abs(a64) @ np.abs(b64))
    ok = np.isfinite(exact) & np.isfinite(bound)
    assert ok.mean() > 0.9
    assert np.all(np.abs(got[ok] - exact[ok]) <= bound[ok])
    np.testing.assert_array_equal(np.isnan(got), np.isnan(exact))


def normal(rng, shape, dtype=np.float32, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(dtype)


# --- floats --------------------------------------------------------------------------------


def test_f32_matmul_with_edges(pipeline):
    """(64, 128) @ (128, 64): NaN, +-inf and -0.0 among the operands."""
    rng = np.random.default_rng(0)
    a, b = normal(rng, (64, 128)), normal(rng, (128, 64))
    a[0, 3], a[1, 5], a[2, 7] = np.nan, np.inf, -np.inf
    a[3, :] = -0.0                 # a row of -0: the sum starts at +0, as numpy's loop
    b[9, 4] = np.inf               # inf * 0 in row 3 -> NaN, elsewhere +-inf
    got = emulate(pipeline, lambda x, y: x @ y, a, b, wgmma=False)  # f32: never tf32
    assert got.dtype == np.float32 and got.shape == (64, 64)
    check_f32(got, a, b)
    assert np.isnan(got[0]).all() and np.isnan(got[3, 4])


def test_f32_transposed_contractions(pipeline):
    """Contracting dims (0, 0) and (1, 1) (x.T @ y and x @ y.T as dot_general)."""
    rng = np.random.default_rng(1)
    a, b = normal(rng, (64, 32)), normal(rng, (64, 128))
    dn = (((0,), (0,)), ((), ()))
    check_f32(emulate(pipeline, dot(dn), a, b, wgmma=False), a, b, dn)
    c = normal(rng, (128, 32))
    dn = (((1,), (1,)), ((), ()))
    check_f32(emulate(pipeline, dot(dn), a, c, wgmma=False), a, c, dn)
    # x @ x.T as written: a register transpose (movement.py), then a plain matmul
    got = emulate(pipeline, lambda x: x @ x.T, a, wgmma=False)
    check_f32(got, a, a, dn)


def test_matrix_vector(pipeline):
    """(128, 128) @ (128,) and (128,) @ (128, 128) (a 1-D operand), in order."""
    rng = np.random.default_rng(2)
    m, v = normal(rng, (128, 128)), normal(rng, (128,))
    check_f32(emulate(pipeline, jnp.dot, m, v, wgmma=False), m, v)
    check_f32(emulate(pipeline, jnp.dot, v, m, wgmma=False), v, m)


def test_matrix_vector_with_a_short_result(pipeline):
    """(64, 128) @ (128,) and (128,) @ (128, 64): a 1-D result of 64
    elements, which no register iota holds: the (64, 128) products summed
    along K (a tree: within the bound, not in order)."""
    rng = np.random.default_rng(12)
    m, v = normal(rng, (64, 128)), normal(rng, (128,))
    got = emulate(pipeline, jnp.dot, m, v, wgmma=False)
    assert got.shape == (64,)
    check_f32(got, m, v, in_order=False)
    got = emulate(pipeline, jnp.dot, v, m.T.copy(), wgmma=False)
    check_f32(got, v, m.T.copy(), in_order=False)


def test_full_contractions(pipeline):
    """0-D results: vector-vector in f32 (within the bound; jnp.sum's order)
    and int32 (exact modulo 2**32), and every dimension of 2-D operands
    contracted (sum(a * b.T))."""
    rng = np.random.default_rng(9)
    u, v = normal(rng, (128,)), normal(rng, (128,))
    got = emulate(pipeline, jnp.dot, u, v, wgmma=False)
    assert got.shape == ()
    check_f32(got, u, v, in_order=False)
    i, j = rng.integers(-2 ** 31, 2 ** 31, (2, 128), dtype=np.int64).astype(np.int32)
    got = emulate(pipeline, jnp.dot, i, j, wgmma=False)
    assert got == (i.astype(np.int64) @ j.astype(np.int64)).astype(np.int32)
    a, b = normal(rng, (64, 128)), normal(rng, (128, 64))
    got = emulate(pipeline, dot((((0, 1), (1, 0)), ((), ()))), a, b, wgmma=False)
    check_f32(got.reshape(1), a.reshape(1, -1), b.T.reshape(-1), in_order=False)


def test_f16_into_f32(pipeline):
    """(64, 32) @ (32, 128) f16 with preferred_element_type=f32: WGMMA on
    sm_90 (swizzle 64: K = 32 halves), the in-order loop with precision=HIGHEST
    and on sm_100 (no WGMMA)."""
    rng = np.random.default_rng(3)
    a, b = normal(rng, (64, 32), np.float16), normal(rng, (32, 128), np.float16)
    got = emulate(pipeline, dot(preferred=jnp.float32), a, b, wgmma=True)
    assert got.dtype == np.float32
    check_f32(got, a, b, in_order=False)
    highest = dot(preferred=jnp.float32, precision=lax.Precision.HIGHEST)
    check_f32(emulate(pipeline, highest, a, b, wgmma=False), a, b)
    check_f32(emulate(pipeline, dot(preferred=jnp.float32), a, b, wgmma=False, arch=(10, 0)),
              a, b)


def test_bf16_x_x_transposed(pipeline):
    """x @ x.T of a (64, 128) bf16 block as dot_general contracting (1, 1)
    (WGMMA, a K-major rhs), into f32 and into bf16 (rounded once), from
    registers loaded from GMEM and from swizzled SMEM; x.T @ y (contracting
    (0, 0): the lhs staged transposed, K = 64)."""
    rng = np.random.default_rng(4)
    x = normal(rng, (64, 128), BF16)
    dn = (((1,), (1,)), ((), ()))
    got = emulate(pipeline, dot(dn, jnp.float32), x, x, wgmma=True)
    check_f32(got, x, x, dn, in_order=False)
    np.testing.assert_array_equal(got, got.T)
    rounded = emulate(pipeline, dot(dn), x, x, wgmma=True, build=tma_kernel)
    assert rounded.dtype == BF16
    np.testing.assert_array_equal(rounded, got.astype(BF16))
    dn = (((0,), (0,)), ((), ()))
    y = normal(rng, (64, 64), BF16)
    check_f32(emulate(pipeline, dot(dn, jnp.float32), x, y, wgmma=True), x, y, dn,
              in_order=False)


@pytest.mark.parametrize("a_shape,b_shape,dtype", [
    ((64, 64), (8, 64), np.float16),     # N = 8: a K-major rhs, 128-byte swizzle
    ((192, 32), (24, 32), BF16),         # M = 192, N = 24, 64-byte swizzle
], ids=["n8-f16", "m192-n24-bf16"])
def test_wgmma_shapes(pipeline, a_shape, b_shape, dtype):
    """x @ y.T at WGMMA's edges: within the bound of the exact product."""
    rng = np.random.default_rng(8)
    a, b = normal(rng, a_shape, dtype), normal(rng, b_shape, dtype)
    dn = (((1,), (1,)), ((), ()))
    got = emulate(pipeline, dot(dn, jnp.float32), a, b, wgmma=True)
    check_f32(got, a, b, dn, in_order=False)


def test_batch_and_outer(pipeline):
    """A batch dimension (row-wise dot products) and no contraction (outer product)."""
    rng = np.random.default_rng(5)
    a, b = normal(rng, (128, 64)), normal(rng, (128, 64))
    got = emulate(pipeline, dot((((1,), (1,)), ((0,), (0,)))), a, b, wgmma=False)
    acc = np.zeros(128, np.float32)
    for k in range(64):
        acc = acc + a[:, k] * b[:, k]
    np.testing.assert_array_equal(got, acc)
    u, v = normal(rng, (128,)), normal(rng, (256,))
    got = emulate(pipeline, dot((((), ()), ((), ()))), u, v, wgmma=False)
    np.testing.assert_array_equal(got, u[:, None] * v[None, :])


# --- integers --------------------------------------------------------------------------------


def test_int8_into_int32(pipeline):
    """int8 -> int32 exactly: (64, 128) @ (128, 64) and x @ y.T by WGMMA
    (B staged K-major either way), the first by the loop too
    (precision=HIGHEST); into int8 it wraps, as jnp."""
    rng = np.random.default_rng(6)
    a = rng.integers(-128, 128, (64, 128)).astype(np.int8)
    b = rng.integers(-128, 128, (128, 64)).astype(np.int8)
    a[0, :], b[:, 0] = -128, -128   # 128 * 16384: the largest sum
    a[1, :], b[:, 1] = 127, -128
    exact = a.astype(np.int64) @ b.astype(np.int64)
    np.testing.assert_array_equal(emulate(pipeline, dot(preferred=jnp.int32), a, b, wgmma=True),
                                  exact)
    highest = dot(preferred=jnp.int32, precision=lax.Precision.HIGHEST)
    np.testing.assert_array_equal(emulate(pipeline, highest, a, b, wgmma=False), exact)
    dn = (((1,), (1,)), ((), ()))
    bt = np.ascontiguousarray(b.T)
    np.testing.assert_array_equal(emulate(pipeline, dot(dn, jnp.int32), a, bt, wgmma=True),
                                  exact)
    wrapped = emulate(pipeline, dot(dn), a, bt, wgmma=True)
    assert wrapped.dtype == np.int8
    np.testing.assert_array_equal(wrapped, np.asarray(jax.jit(dot(dn))(a, bt)))


def test_int32_wraps(pipeline):
    """(64, 32) @ (32, 128) int32 with products that overflow: modulo 2**32, as jnp."""
    rng = np.random.default_rng(7)
    a = rng.integers(-2 ** 31, 2 ** 31, (64, 32), dtype=np.int64).astype(np.int32)
    b = rng.integers(-2 ** 31, 2 ** 31, (32, 128), dtype=np.int64).astype(np.int32)
    got = emulate(pipeline, jnp.matmul, a, b, wgmma=False)
    want = (a.astype(np.int64) @ b.astype(np.int64)).astype(np.int32)  # wraps mod 2**64 first
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got, np.asarray(jax.jit(jnp.matmul)(a, b)))


# --- what jax does, estimates and refusals ----------------------------------------------------


def test_jax_alone_refuses_it():
    """Pallas has no dot_general rule in any semantics: nothing to delegate to."""
    from jax._src.pallas.mosaic_gpu import lowering as pallas_lowering

    assert all(lax.dot_general_p not in rules
               for rules in pallas_lowering.mosaic_lowering_rules.values())
    a = np.ones((64, 128), np.float32)
    with pytest.raises(NotImplementedError, match="dot_general") as info:
        smalti.emulate.run(kernel(lambda x, y: x @ y, a, a.T.copy()), a, a.T.copy())
    assert not isinstance(info.value, SmaltiError)


def test_estimates(pipeline):
    """The estimator reports the SMEM either path takes: take's scratch (the
    larger operand) for the loop, both operands (each 1024-aligned) where
    WGMMA applies; and it is Pallas' table entry only while smalti is installed."""
    from jax._src.pallas.mosaic_gpu import lowering as pallas_lowering

    ctx = pallas_lowering.ResourceEstimatorContext(
        reduction_scratch_bytes=2048, axis_names=pallas_lowering._AxisNames(grid=()),
        lowering_semantics=plgpu.LoweringSemantics.Warpgroup)

    def scratch(a_shape, b_shape, dtype, **params):
        params = dict(dimension_numbers=MATMUL, precision=None,
                      preferred_element_type=jnp.float32) | params
        a, b = (jax.core.ShapedArray(s, dtype) for s in (a_shape, b_shape))
        return estimate(ctx, a, b, **params).smem_scratch_bytes

    with smalti.jax.installed(pipeline):
        estimate = pallas_lowering._resource_estimators[lax.dot_general_p]
        assert scratch((64, 128), (128, 64), jnp.float32) == 64 * 128 * 4
        assert scratch((64, 128), (128, 32), jnp.float16) == 64 * 128 * 2 + 128 * 32 * 2
        assert scratch((64, 128), (128, 32), jnp.float16,
                       precision=(lax.Precision.HIGHEST,) * 2) == 64 * 128 * 2
        batched = (((2,), (1,)), ((0,), (0,)))
        assert scratch((2, 64, 32), (2, 32, 64), jnp.float32,  # refused when lowered
                       dimension_numbers=batched) == 0
    assert lax.dot_general_p not in pallas_lowering._resource_estimators


def _refused(pipeline, fn, *args):
    with smalti.jax.installed(pipeline), pytest.raises(SmaltiError) as info:
        smalti.emulate.run(kernel(fn, *args), *args)
    error = info.value
    assert error.code == "SM206" and isinstance(error, NotImplementedError)
    assert "dot_general" in error.message and error.fixes
    assert error.location and "test_dot.py" in error.location
    return error


def test_refusals(pipeline):
    """Batched 3-D operands and operands too large for take's scratch: SM206
    naming the shapes, with plgpu.wgmma among the fixes."""
    x = np.ones((2, 64, 32), np.float32)
    y = np.ones((2, 32, 64), np.float32)
    error = _refused(pipeline, jnp.matmul, x, y)
    assert "rank 3" in error.message and any("plgpu.wgmma" in f for f in error.fixes)
    big, other = np.ones((128, 512), np.float32), np.ones((512, 64), np.float32)
    error = _refused(pipeline, jnp.matmul, big, other)
    assert "float32[128,512]" in error.message and "scratch" in error.message


def test_unsupported_dtypes_are_named():
    """float64, int64, bool and mixed float/int operands (which a kernel only
    meets with jax_enable_x64 or unusual refs): the reason names the dtypes."""
    from smalti.vocabulary.dot import problem

    def why(a_dtype, b_dtype, out_dtype, shape=(64, 64)):
        a, b = (jax.core.ShapedArray(shape, d) for d in (a_dtype, b_dtype))
        return problem(a, b, jax.core.ShapedArray(shape, out_dtype))

    for dtype in (np.float64, np.int64, np.bool_):
        message, fixes = why(dtype, dtype, dtype)
        assert np.dtype(dtype).name in message and fixes
    assert "float16 and int8" in why(np.int8, np.float16, np.float32)[0]
    assert "preferred_element_type=float32" in why(np.int8, np.int8, np.float32)[0]
    assert why(np.float16, np.float16, np.float32) is None
