"""TMA reductions (``cp.reduce.async.bulk.tensor``): every operation jax
emits, of every element type it allows, of boxes of rank 1 to 3, against
numpy; reductions from several blocks into one tensor are not races."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import smalti.emulate as emu

OPS = {  # jax's op name: numpy, given (dst, src)
    "add": lambda d, s: d + s, "smin": np.minimum, "smax": np.maximum, "umin": np.minimum,
    "umax": np.maximum, "min": np.minimum, "max": np.maximum,
    "and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor,
    "inc": lambda d, s: np.where(d >= s, 0, d + 1).astype(d.dtype),
    "dec": lambda d, s: np.where((d == 0) | (d > s), s, d - 1).astype(d.dtype),
}
CASES = [(jnp.float32, "add"), (jnp.float16, "add"), (jnp.bfloat16, "add"),
         (jnp.float16, "min"), (jnp.bfloat16, "max"), (jnp.int32, "add"), (jnp.int32, "smin"),
         (jnp.int32, "smax"), (jnp.uint32, "umin"), (jnp.uint32, "umax"), (jnp.int32, "and"),
         (jnp.int32, "or"), (jnp.int32, "xor"), (jnp.uint32, "inc"), (jnp.uint32, "dec")]


def _reduce_kernel(shape, dtype, op, blocks=1):
    """Loads ``src`` into SMEM with TMA, then reduces it into the in-out ``dst``."""
    from jax._src.interpreters import mlir
    from jax._src.lib.mlir import ir
    from jax.experimental.mosaic import gpu as mgpu

    def body(ctx, src, dst, smem):
        tile, bar = smem
        ctx.async_copy(src_ref=src, dst_ref=tile, barrier=bar[0])
        bar[0].wait()
        ctx.async_copy(src_ref=tile, dst_ref=dst, reduction_op=op)
        ctx.await_async_copy(0)

    sds = jax.ShapeDtypeStruct(shape, dtype)
    with mlir.make_ir_context(), ir.Location.unknown():
        return mgpu.as_gpu_kernel(body, (blocks, 1, 1), (128, 1, 1), (sds,), (),
                                  (sds, mgpu.Barrier(1)), inout_shape=(sds,))


def _values(shape, dtype, seed):
    rng = np.random.default_rng(seed)
    if jnp.issubdtype(dtype, jnp.floating):
        return rng.uniform(-10, 10, shape).astype(dtype)
    return rng.integers(-10, 10, shape).astype(dtype)


@pytest.mark.parametrize("dtype,op", CASES)
@pytest.mark.parametrize("shape", [(256,), (8, 128), (2, 4, 64)])
def test_a_tma_reduction_combines_each_element(dtype, op, shape):
    src, dst = _values(shape, dtype, 1), _values(shape, dtype, 2)
    (out,) = emu.run(_reduce_kernel(shape, dtype, op), src, dst)
    want = OPS[op](dst, src)
    if jnp.issubdtype(dtype, jnp.floating) and op == "add":  # one rounding of the exact sum
        want = (dst.astype(np.float64) + src.astype(np.float64)).astype(dtype)
    np.testing.assert_array_equal(out, want)


def test_reductions_of_several_blocks_into_one_tensor_do_not_race():
    """Four blocks each add the same source into the one in-out tensor
    (unordered between blocks, atomic per element): four times the source."""
    src, dst = _values((8, 128), np.int32, 3), np.zeros((8, 128), np.int32)
    (out,) = emu.run(_reduce_kernel((8, 128), jnp.int32, "add", blocks=4), src, dst)
    np.testing.assert_array_equal(out, 4 * src)


@pytest.mark.parametrize("dtype,shape", [(jnp.float32, (64, 32)), (jnp.float16, (2, 3, 5, 64)),
                                         (jnp.int4, (5, 256))])
def test_a_tma_prefetch_then_copy(dtype, shape):
    """``ctx.async_prefetch`` (cp.async.bulk.prefetch.tensor) before the TMA load
    of the same tensor changes nothing: the copy round-trips."""
    from jax._src.interpreters import mlir
    from jax._src.lib.mlir import ir
    from jax.experimental.mosaic import gpu as mgpu

    def body(ctx, src, dst, smem):
        tmp, bar = smem
        ctx.async_prefetch(gmem_ref=src)
        ctx.async_copy(src_ref=src, dst_ref=tmp, barrier=bar)
        bar.wait()
        ctx.async_copy(src_ref=tmp, dst_ref=dst)
        ctx.await_async_copy(0)

    x = _values(shape, dtype, 4)
    sds = jax.ShapeDtypeStruct(shape, dtype)
    with mlir.make_ir_context(), ir.Location.unknown():
        f = mgpu.as_gpu_kernel(body, (1, 1, 1), (128, 1, 1), sds, sds, (sds, mgpu.Barrier(1)))
    (y,) = emu.run(f, x)
    np.testing.assert_array_equal(y, x)
