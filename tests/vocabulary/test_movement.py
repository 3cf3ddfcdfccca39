"""Data movement in Pallas Mosaic GPU kernels (Warpgroup semantics), on the emulator.

``smalti.vocabulary.movement.take`` and what is built on it -- ``x.T``
(transpose), ``x[::-1]`` / ``jnp.flip`` (rev), ``jnp.pad`` / ``lax.pad``
(low/high, negative and interior padding), unaligned ``jnp.concatenate``,
strided slices, ``jnp.roll``, ``jnp.tile``, ``lax.dynamic_slice`` /
``dynamic_update_slice`` and outer broadcasts ``x[:, :1] + x[:1, :]`` --
which jax 0.11.2 refuses, each compared with numpy / jnp on the CPU bit for
bit (values are only moved, so every result is exact, NaN payloads and signed
zeros included), in f32, f16, bf16 and int32, from plain loads and from TMA
into 128-byte-swizzled SMEM.
"""

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
from benchmarks.vocabulary import kernel as tma_kernel
from smalti.diagnostics import SmaltiNotImplementedError
from smalti.vocabulary import lanes, movement
from smalti.vocabulary.movement import take

WG = plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup)
F32, F16, I32 = np.dtype(np.float32), np.dtype(np.float16), np.dtype(np.int32)
BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPES = (F32, F16, BF16, I32)


@pytest.fixture(scope="module")
def pipeline():
    return smalti.build_pipeline(plugins={"smalti.vocabulary": smalti.vocabulary})


def data(shape, dtype, seed=0) -> np.ndarray:
    """Distinct values, with NaN, infinities and signed zeros for floats."""
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind == "i":
        return rng.integers(-2 ** 31, 2 ** 31 - 1, shape, dtype=np.int64).astype(dtype)
    x = rng.standard_normal(shape) * 100
    x.flat[:6] = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1.5]
    return x.astype(dtype)


def plain_kernel(fn, args):
    out = jax.eval_shape(fn, *(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in args))

    def body(*refs):
        *ins, o_ref = refs
        o_ref[...] = fn(*(r[...] for r in ins))

    return plgpu.kernel(body, out_type=jax.ShapeDtypeStruct(out.shape, out.dtype),
                        compiler_params=WG)


def emulate(pipeline, fn, *args, build=plain_kernel):
    with smalti.jax.installed(pipeline):
        (got,) = smalti.emulate.run(build(fn, args), *args)
    return got


def check(pipeline, fn, *args, build=plain_kernel):
    """The kernel's result is bit for bit jnp's on the CPU."""
    got = emulate(pipeline, fn, *args, build=build)
    want = np.asarray(jax.jit(fn)(*args))
    assert got.shape == want.shape and got.dtype == want.dtype
    bits = {1: np.uint8, 2: np.uint16, 4: np.uint32}[got.dtype.itemsize]
    np.testing.assert_array_equal(got.view(bits), want.view(bits))


# --- take ---------------------------------------------------------------------------------


def test_take_on_the_cpu():
    """take is x.reshape(-1)[indices], under jit and not."""
    x = data((8, 16), F32)
    idx = np.random.default_rng(1).integers(0, x.size, (4, 32)).astype(np.int32)
    np.testing.assert_array_equal(np.asarray(jax.jit(take)(x, idx)), x.reshape(-1)[idx])
    np.testing.assert_array_equal(np.asarray(take(x[0], idx[0] % 16)), x[0][idx[0] % 16])
    assert jax.eval_shape(take, x, idx).shape == (4, 32)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_take_random_permutation(pipeline, dtype):
    """A (64, 128) block permuted into a (128, 64) one."""
    x = data((64, 128), dtype)
    perm = np.random.default_rng(2).permutation(x.size).reshape(128, 64).astype(np.int32)
    check(pipeline, take, x, perm)


@pytest.mark.parametrize("fn", [lambda x: x[::-1], lambda x: x[:, ::-1],
                                lambda x: jnp.roll(x, 3, 1)], ids=["rows", "cols", "roll"])
@pytest.mark.parametrize("dtype", (F32, BF16), ids=lambda d: d.name)
def test_take_scratch_is_swizzled(pipeline, monkeypatch, fn, dtype):
    """take's scratch rows of 128-byte multiples are swizzled: a flip of the
    rows or the columns and a roll (WGMMA's 8 rows x 4 lanes per scalar
    access) cost one wavefront per scalar store and load -- the ideal pass
    for f32, twice it for 2-byte elements -- where the row-major scratch
    hit each bank 8 times; the results stay bit for bit jnp's. (The
    register moves, which flip and roll columns without SMEM, are off.)"""
    from smalti.emulate.profiling import WAVEFRONTS

    monkeypatch.setattr(lanes, "registers_allowed", lambda: False)

    x = data((64, 128), dtype)
    with smalti.jax.installed(pipeline):
        base = smalti.emulate.profile(tma_kernel(lambda v: v, [x]), x)
        moved = smalti.emulate.profile(tma_kernel(fn, [x]), x)
    scalar_accesses = 2 * x.size // 32  # a store and a load of each element, per warp
    assert moved[WAVEFRONTS] - base[WAVEFRONTS] == scalar_accesses
    want = np.asarray(jax.jit(fn)(x))
    bits = {2: np.uint16, 4: np.uint32}[x.dtype.itemsize]
    np.testing.assert_array_equal(moved.outputs[0].view(bits), want.view(bits))


def test_take_1d_with_repeats(pipeline):
    """Arbitrary indices (repeated, any order) into a 1-D operand, 2-D result."""
    x = data((128,), F32)
    idx = np.random.default_rng(3).integers(0, 128, (64, 128)).astype(np.int32)
    check(pipeline, take, x, idx)


# --- transpose, rev ---------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(64, 128), (128, 64), (64, 64)])
def test_transpose_shapes(pipeline, shape):
    check(pipeline, lambda x: x.T, data(shape, F32))


@pytest.mark.parametrize("dtype", (F16, BF16, I32), ids=lambda d: d.name)
def test_transpose_dtypes(pipeline, dtype):
    check(pipeline, lambda x: x.T, data((64, 128), dtype))


def test_transpose_from_swizzled_smem(pipeline):
    check(pipeline, lambda x: x.T, data((128, 64), F16), build=tma_kernel)


@pytest.mark.parametrize("fn", [lambda x: x[::-1], lambda x: x[:, ::-1], jnp.flip],
                         ids=["rows", "cols", "both"])
def test_rev(pipeline, fn):
    check(pipeline, fn, data((64, 128), F32))


def test_rev_1d_and_dtypes(pipeline):
    check(pipeline, lambda x: x[::-1], data((128,), I32))
    check(pipeline, lambda x: jnp.flip(x, 1), data((64, 128), BF16), build=tma_kernel)


# --- pad ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_pad_high(pipeline, dtype):
    """As the benchmark writes it: zeros after a (64, 64) slice, from swizzled
    SMEM (jax slices only tiled values, which plain loads from GMEM are not)."""
    check(pipeline, lambda x: jnp.pad(x[:, :64], ((0, 0), (0, 64))), data((64, 128), dtype),
          build=tma_kernel)


def test_aligned_pad_both_dims(pipeline):
    """Tile-aligned pads of a value from swizzled SMEM: concatenations with
    blocks of the pad value (jax's rule), NaN as the value."""
    check(pipeline, lambda x: lax.pad(x, jnp.float32(np.nan), ((64, 0, 0), (8, 56, 0))),
          data((64, 64), F32), build=tma_kernel)


@pytest.mark.parametrize("dtype", (F32, BF16), ids=lambda d: d.name)
def test_aligned_pad_moves_nothing_through_smem(pipeline, dtype):
    """The benchmark's pad costs no shared wavefront beyond the identity's
    (take's round trip costs 3,072), and the fallback pad still does."""
    from smalti.emulate.profiling import WAVEFRONTS

    x = data((64, 128), dtype)
    with smalti.jax.installed(pipeline):
        base = smalti.emulate.profile(tma_kernel(lambda v: v, [x]), x)
        aligned = smalti.emulate.profile(
            tma_kernel(lambda v: jnp.pad(v[:, :64], ((0, 0), (0, 64))), [x]), x)
        unaligned = smalti.emulate.profile(
            tma_kernel(lambda v: jnp.pad(v[:, :64], ((0, 0), (3, 61))), [x]), x)
    assert aligned[WAVEFRONTS] == base[WAVEFRONTS]
    assert unaligned[WAVEFRONTS] > base[WAVEFRONTS]


def test_pad_value_negative_and_interior(pipeline):
    x = data((64, 64), F32)
    # low and high, one negative, with a NaN pad value
    check(pipeline, lambda x: lax.pad(x, jnp.float32(np.nan), ((-8, 8, 0), (32, 32, 0))), x)
    # interior padding with -0.0 in between: 64 + 63 + 1 columns
    check(pipeline, lambda x: lax.pad(x, jnp.float32(-0.0), ((0, 0, 0), (0, 1, 1))), x)
    # 1-D, both ends, a value in the dtype
    check(pipeline, lambda x: jnp.pad(x, (64, 64), constant_values=7), data((128,), I32))


def test_pad_low_high_plain(pipeline):
    check(pipeline, lambda x: jnp.pad(x, ((32, 32), (0, 0)), constant_values=2.5),
          data((64, 128), F16))


# --- slices, concatenation, roll --------------------------------------------------------------


@pytest.mark.parametrize("fn", [lambda x: x[:, ::2], lambda x: x[::2], lambda x: x[1::2, 1::2],
                                lambda x: x[:32]],
                         ids=["cols", "rows", "both-offset", "rows-unaligned"])
def test_strided_and_unaligned_slices(pipeline, fn):
    check(pipeline, fn, data((64, 128), F32))


def test_unaligned_concatenate(pipeline):
    x = data((64, 128), BF16)
    check(pipeline, lambda x: jnp.concatenate([x[48:], x[:16], x[16:48]], 0), x)


@pytest.mark.parametrize("dtype", (F32, BF16, I32), ids=lambda d: d.name)
def test_roll(pipeline, dtype):
    check(pipeline, lambda x: jnp.roll(x, 3, 1), data((64, 128), dtype))


def test_views_of_one_array_share_one_take():
    """jnp.roll's two slices of x, fused into the concatenation: one move of
    x (a static permutation of its columns, whose fallback is one take),
    jnp.roll's answer on the CPU; views of two arrays: a take each."""
    x, y = data((8, 16), F32), data((8, 16), F32, seed=1)
    views = (((0, 13), (1, 1), (8, 3)), ((0, 0), (1, 1), (8, 13)))

    def fused(a, b):
        return movement.concatenate_f(a, b, dimension=1, views=views)

    def takes(f, *args, primitive=movement.take_p):
        return sum(e.primitive is primitive for e in jax.make_jaxpr(f)(*args).eqns)

    np.testing.assert_array_equal(np.asarray(fused(x, x)), np.roll(x, 3, 1))
    assert takes(lambda a: fused(a, a), x, primitive=lanes.permute_p) == 1
    assert takes(lambda a: fused(a, a), x) == 0
    assert takes(fused, x, y) == 2
    np.testing.assert_array_equal(np.asarray(fused(x, y)),
                                  np.concatenate([x[:, 13:], y[:, :13]], 1))


def test_roll_rows_from_swizzled_smem(pipeline):
    check(pipeline, lambda x: jnp.roll(x, -5, 0), data((64, 128), F32), build=tma_kernel)


@pytest.mark.parametrize("dtype", (F32, F16), ids=lambda d: d.name)
def test_outer_broadcast(pipeline, dtype):
    check(pipeline, lambda x: x[:, :1] + x[:1, :], data((64, 128), dtype), build=tma_kernel)


def test_tile(pipeline):
    check(pipeline, lambda x: jnp.tile(x[:32], (2, 1)), data((64, 128), I32))
    check(pipeline, lambda x: jnp.tile(x[:, :64], (1, 2)), data((64, 128), F16), build=tma_kernel)


def test_dynamic_slice_and_update(pipeline):
    """Starts computed in the kernel (from the grid index), clamped as jax does."""
    def body(x_ref, o_ref):
        i = lax.axis_index("g")
        x = x_ref[...]
        window = lax.dynamic_slice(x, (i * 8 + 3, 0), (32, 128))
        updated = lax.dynamic_update_slice(x, jnp.full((32, 64), -0.0, jnp.float32),
                                           (i * 30, i * 64))
        o_ref[i] = window + updated[:32]

    kernel = plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((2, 32, 128), jnp.float32),
                          grid=(2,), grid_names=("g",), compiler_params=WG)
    x = data((64, 128), F32)
    with smalti.jax.installed(pipeline):
        (got,) = smalti.emulate.run(kernel, x)
    for i in range(2):
        start, (r, c) = i * 8 + 3, (min(i * 30, 32), i * 64)  # 30 + 32 > 64: clamped
        updated = x.copy()
        updated[r:r + 32, c:c + 64] = -0.0
        np.testing.assert_array_equal(got[i], x[start:start + 32] + updated[:32])


def test_aligned_slices_stay_with_jax():
    """Slices and concatenations jax lowers reserve no scratch (jax's rule is used)."""
    aval = jax.core.ShapedArray((64, 128), jnp.float32)
    half = jax.core.ShapedArray((64, 64), jnp.float32)
    assert movement.estimate_slice(None, aval, start_indices=(0, 64), limit_indices=(64, 128),
                                   strides=None).smem_scratch_bytes == 0
    assert movement.estimate_concatenate(None, half, half, dimension=1).smem_scratch_bytes == 0
    assert movement.estimate_slice(None, aval, start_indices=(0, 0), limit_indices=(64, 128),
                                   strides=(1, 2)).smem_scratch_bytes == 64 * 128 * 4


def test_jax_lowerings_keep_their_ir(pipeline):
    """A slice and a concatenation jax lowers give the same module with the
    plugin as without it."""
    import re

    blocked = smalti.build_pipeline(plugins={"smalti.vocabulary": smalti.vocabulary},
                                    block=["smalti.vocabulary"])
    x = data((64, 128), F32)
    texts = []
    for p in (pipeline, blocked):
        kernel = tma_kernel(lambda x: jnp.concatenate([x[:, 64:], x[:, :64]], 1), [x])
        with smalti.jax.installed(p):
            module, _ = smalti.emulate.lower(kernel, x)
        texts.append(re.sub(r'dump_basename = "[^"]*"', "", str(module)))
    assert texts[0] == texts[1]


# --- refusals ------------------------------------------------------------------------------------


def _per_warpgroup(fn, n: int = 2):
    """Each Pallas warpgroup moves its own (64, 64) block, loaded from GMEM."""
    def body(x_ref, o_ref):
        wg = lax.axis_index("wg")
        o_ref[wg] = fn(x_ref[wg])

    return plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((n, 64, 64), jnp.float32),
                        num_threads=n, thread_name="wg", compiler_params=WG)


@pytest.mark.parametrize("fn", [lambda v: v.T, lambda v: v[::-1], lambda v: jnp.roll(v, 3, 1)],
                         ids=["transpose", "flip", "roll"])
def test_several_warpgroups_take_slices_of_their_own(pipeline, fn):
    """Two Pallas warpgroups, each through its own slice of take's scratch:
    clean under the synchronization checker, jnp's answer for each block."""
    x = data((2, 64, 64), F32)
    with smalti.jax.installed(pipeline):
        (got,) = smalti.emulate.run(_per_warpgroup(fn), x)
    want = np.stack([np.asarray(jax.jit(fn)(a)) for a in x])
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def test_warpgroups_sharing_one_slice_race(pipeline, monkeypatch):
    """The twin: were both warpgroups given the same slice (the count taken
    as 1), the checker finds them writing and reading each other's bytes."""
    monkeypatch.setattr(movement.smem_transpose, "warpgroups", lambda *args: 1)
    x = data((2, 64, 64), F32)
    with smalti.jax.installed(pipeline), pytest.raises(smalti.emulate.RaceError) as err:
        smalti.emulate.run(_per_warpgroup(lambda v: v[::-1]), x)
    assert all("test_movement.py" in r.first.location and "test_movement.py" in r.second.location
               for r in err.value.races)


def test_odd_slices_are_refused_unless_fused(pipeline):
    """A (64, 3) slice has no register layout: SM206 with the way out, a
    jax.jit around the slices and their concatenation (as in jnp.roll)."""
    def rotate(x):
        return jnp.concatenate([x[:, 125:], x[:, :125]], 1)

    x = data((64, 128), F32)
    with pytest.raises(SmaltiNotImplementedError) as err:
        emulate(pipeline, rotate, x)
    assert err.value.code == "SM206" and "(64, 3)" in err.value.message
    check(pipeline, jax.jit(rotate), x)


def test_booleans_are_refused(pipeline):
    with pytest.raises(SmaltiNotImplementedError) as err:
        emulate(pipeline, lambda x: (x > 0).T.astype(jnp.int32), data((64, 64), I32))
    assert err.value.code == "SM206" and "bool" in err.value.message


# --- the dialect ops themselves: masks and pass-through values ---------------------------------


def _masked_kernel(n: int = 256):
    """A Warpgroup ``mgpu.as_gpu_kernel``: scatter x's first half (masked),
    gather it reversed where the index is below n / 2, -1 elsewhere."""
    from jax._src.interpreters import mlir
    from jax._src.lib.mlir import ir
    from jax._src.lib.mlir.dialects import arith, vector
    from jax.experimental.mosaic import gpu as mgpu

    def body(ctx, x_ref, o_ref, smem):
        i32, f32 = ir.IntegerType.get_signless(32), ir.F32Type.get()

        def vt(t):
            return ir.VectorType.get((n,), t)

        def splat(t, v):
            attr = ir.IntegerAttr.get(t, v) if t == i32 else ir.FloatAttr.get(t, v)
            return arith.constant(vt(t), ir.DenseElementsAttr.get_splat(vt(t), attr))

        x = mgpu.dialect.vector_load(x_ref)
        idx = mgpu.dialect.broadcasted_iota(vt(i32), 0)
        low = arith.cmpi(arith.CmpIPredicate.slt, idx, splat(i32, n // 2))
        zero = arith.constant(ir.IndexType.get(), 0)
        vector.scatter(None, smem, [zero], idx, low, x)
        back = arith.subi(splat(i32, n - 1), idx)
        wanted = arith.cmpi(arith.CmpIPredicate.slt, back, splat(i32, n // 2))
        mgpu.dialect.vector_store(
            vector.gather(vt(f32), smem, [zero], back, wanted, splat(f32, -1.0)), o_ref)

    sds = jax.ShapeDtypeStruct((n,), jnp.float32)
    with mlir.make_ir_context(), ir.Location.unknown():
        return mgpu.as_gpu_kernel(body, (1, 1, 1), (128, 1, 1), (sds,), sds, sds,
                                  thread_semantics=mgpu.LoweringSemantics.Warpgroup)


def test_masked_scatter_and_gather(pipeline):
    """Masked-off elements are neither stored nor loaded (pass_thru instead)."""
    x = np.arange(256, dtype=np.float32) + 0.5
    with smalti.jax.installed(pipeline):
        (got,) = smalti.emulate.run(_masked_kernel(), x)
    np.testing.assert_array_equal(got, np.where(np.arange(256) >= 128, x[::-1], -1.0))


def test_warpgroups_at_takes_of_different_sizes_keep_apart(pipeline):
    """Each warpgroup flips its (64, 64) block, then a (64, 32) half of it:
    one warpgroup may be at the second take while the other is still at the
    first, so each warpgroup's slices start at the same stride whatever the
    take's size -- clean under the checker, jnp's answer."""
    def body(x_ref, o_ref, h_ref):
        wg = lax.axis_index("wg")
        o_ref[wg] = x_ref[wg][::-1]
        h_ref[wg] = x_ref[wg, :, :32][:, ::-1]

    out = (jax.ShapeDtypeStruct((2, 64, 64), jnp.float32),
           jax.ShapeDtypeStruct((2, 64, 32), jnp.float32))
    kernel = plgpu.kernel(body, out_type=out, num_threads=2, thread_name="wg",
                          compiler_params=WG)
    x = data((2, 64, 64), F32)
    with smalti.jax.installed(pipeline):
        flipped, half = smalti.emulate.run(kernel, x)
    np.testing.assert_array_equal(flipped, x[:, ::-1])
    np.testing.assert_array_equal(half, x[:, :, :32][:, :, ::-1])
