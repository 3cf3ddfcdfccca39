"""Sub-byte element types (i4/u4, i2) bit-packed in memory as on the GPU
(element 0 in the low bits of byte 0), and bitcasts between packed vectors."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import smalti.emulate as emu
from smalti.emulate import subbyte
from tests.emulate.test_wrong_answers import lane_kernel


def _packed_words(x: np.ndarray) -> np.ndarray:
    """32-bit words of a sub-byte array packed as the GPU holds it."""
    b = subbyte.bits_of(x.dtype)
    per = 32 // b
    bits = (x.view(np.uint8) & ((1 << b) - 1)).astype(np.uint64).reshape(-1, per)
    return (bits << (np.arange(per, dtype=np.uint64) * b)).sum(1).astype(np.uint32).view(np.int32)


def _vector_pointer(ref, i, vec_ty):
    """A pointer to the ``i``-th ``vec_ty`` of ``ref``, as jax addresses
    sub-byte data (``utils.memref_ptr`` + a GEP over the vector type)."""
    from jax._src.lib.mlir import ir
    from jax._src.lib.mlir.dialects import arith
    from jax.experimental.mosaic.gpu import utils as mgpu_utils

    i64 = ir.IntegerType.get_signless(64)
    return mgpu_utils.getelementptr(mgpu_utils.memref_ptr(ref), [arith.extui(i64, i)], vec_ty)


@pytest.mark.parametrize("dtype", [jnp.int4, jnp.uint4, jnp.int2])
def test_a_packed_vector_read_as_words_is_the_gpus_packing(dtype):
    """Each thread loads ``vector<Nxi4>`` (or i2) of the sub-byte input through
    a pointer, bitcasts it to one i32 and stores it: the words are the input's
    packed bits."""
    from jax._src.lib.mlir import ir
    from jax._src.lib.mlir.dialects import arith, llvm, memref, vector
    from jax.experimental.mosaic.gpu import utils as mgpu_utils

    bits = subbyte.bits_of(np.dtype(dtype))
    per = 32 // bits

    def kernel(ctx, x_ref, o_ref, _):
        i32 = ir.IntegerType.get_signless(32)
        vec_ty = ir.VectorType.get([per], ir.IntegerType.get_signless(bits))
        tid = mgpu_utils.thread_idx()
        v = llvm.load(vec_ty, _vector_pointer(x_ref, tid, vec_ty))
        w = vector.extract(vector.bitcast(ir.VectorType.get([1], i32), v), dynamic_position=[],
                           static_position=ir.DenseI64ArrayAttr.get([0]))
        memref.store(w, o_ref, [arith.index_cast(ir.IndexType.get(), tid)])

    x = np.random.default_rng(1).integers(jnp.iinfo(dtype).min, jnp.iinfo(dtype).max + 1,
                                          128 * per).astype(dtype)
    f = lane_kernel(kernel, [jax.ShapeDtypeStruct(x.shape, dtype)],
                    [jax.ShapeDtypeStruct((128,), jnp.int32)])
    (words,) = emu.run(f, x)
    np.testing.assert_array_equal(words, _packed_words(x))


def test_packed_words_stored_as_i4_round_trip():
    """The other way round: i32 words bitcast to ``vector<8xi4>`` and stored
    through pointers into an i4 output read back as the words' nibbles, low
    nibble first."""
    from jax._src.lib.mlir import ir
    from jax._src.lib.mlir.dialects import arith, llvm, memref, vector
    from jax.experimental.mosaic.gpu import utils as mgpu_utils

    def kernel(ctx, w_ref, o_ref, _):
        i32 = ir.IntegerType.get_signless(32)
        vec_ty = ir.VectorType.get([8], ir.IntegerType.get_signless(4))
        tid = mgpu_utils.thread_idx()
        w = memref.load(w_ref, [arith.index_cast(ir.IndexType.get(), tid)])
        v = vector.bitcast(vec_ty, vector.broadcast(ir.VectorType.get([1], i32), w))
        llvm.store(v, _vector_pointer(o_ref, tid, vec_ty))

    words = np.random.default_rng(2).integers(-2**31, 2**31, 128).astype(np.int32)
    f = lane_kernel(kernel, [jax.ShapeDtypeStruct((128,), jnp.int32)],
                    [jax.ShapeDtypeStruct((1024,), jnp.int4)])
    (out,) = emu.run(f, words)
    nibbles = (words.view(np.uint32)[:, None] >> (4 * np.arange(8, dtype=np.uint32))) & 0xF
    want = np.where(nibbles >= 8, nibbles.astype(np.int64) - 16, nibbles).reshape(-1)
    np.testing.assert_array_equal(out.astype(np.int64), want)


def test_an_indexed_access_of_i4_elements_is_unsupported():
    """``vector.load`` of ``vector<8xi4>`` from an i4 memref: MLIR's lowering
    would put the elements a byte apart over packed data (jax avoids it), so
    the emulator refuses rather than pick one."""
    from jax._src.lib.mlir import ir
    from jax._src.lib.mlir.dialects import arith, vector
    from jax.experimental.mosaic.gpu import utils as mgpu_utils

    def kernel(ctx, x_ref, o_ref, _):
        index = ir.IndexType.get()
        tid = arith.index_cast(index, mgpu_utils.thread_idx())
        at = arith.muli(tid, mgpu_utils.c(8, index))
        v = vector.load(ir.VectorType.get([8], ir.IntegerType.get_signless(4)), x_ref, [at])
        vector.store(v, o_ref, [at])

    sds = jax.ShapeDtypeStruct((1024,), jnp.int4)
    with pytest.raises(emu.Unsupported, match="vector.load of a memref of int4"):
        emu.run(lane_kernel(kernel, [sds], [sds]), np.zeros(1024, jnp.int4))


@pytest.mark.parametrize("layouts", [("WGMMA_LAYOUT", "WGMMA_LAYOUT"),
                                     ("WGMMA_LAYOUT_UPCAST_2X", "WGMMA_LAYOUT_UPCAST_2X"),
                                     ("WGMMA_LAYOUT_UPCAST_4X", "WGMMA_LAYOUT"),
                                     ("WGMMA_LAYOUT_8BIT", "WGMMA_LAYOUT_8BIT")])
@pytest.mark.parametrize("dst", [jnp.int8, jnp.int32])
def test_uint4_upcast_through_jax_layouts(layouts, dst):
    """jax's FragmentedArray loads packed u4 in each layout (relayouts too) and
    widens it: every element equals numpy's conversion."""
    from jax.experimental.mosaic import gpu as mgpu
    from jax.experimental.mosaic.gpu import fragmented_array as fa
    from jax.experimental.mosaic.gpu import utils

    lf, lt = (getattr(fa, name) for name in layouts)

    def kernel(ctx, inp, out, _):
        t = mgpu.FragmentedArray.load_untiled(inp, is_signed=False, layout=lf, optimized=False)
        if lf != lt:
            t = t.to_layout(lt)
        t.astype(utils.dtype_to_ir_type(dst), is_signed=True).store_untiled(out, optimized=False)

    x = np.random.default_rng(3).integers(0, 16, (128, 256)).astype(jnp.uint4)
    f = lane_kernel(kernel, [jax.ShapeDtypeStruct(x.shape, jnp.uint4)],
                    [jax.ShapeDtypeStruct(x.shape, dst)])
    (y,) = emu.run(f, x)
    np.testing.assert_array_equal(y, x.astype(np.int64).astype(dst))


def test_pack_and_unpack_are_inverse_and_little_endian():
    x = np.array([1, -2, 7, -8, 0], ml_dtypes.int4)
    packed = subbyte.pack(x)
    np.testing.assert_array_equal(packed, [0xE1, 0x87, 0x00])
    np.testing.assert_array_equal(subbyte.unpack(packed, x.dtype, x.shape), x)


@pytest.mark.parametrize("swizzle", [32, 64])
def test_a_tma_copy_of_packed_int4(swizzle):
    """TMA through a map of 4-bit elements (Mosaic's type code 0): a tile at
    an offset of the packed input into swizzled SMEM and back out to GMEM."""
    from jax.experimental.mosaic import gpu as mgpu

    cols = swizzle * 2  # one swizzle row of 4-bit elements

    def kernel(ctx, x_ref, o_ref, smem):
        tile, bar = smem
        ctx.async_copy(src_ref=x_ref, dst_ref=tile, barrier=bar[0], swizzle=swizzle,
                       gmem_slice=(mgpu.ds(64, 64), mgpu.ds(cols, cols)))
        bar[0].wait()
        ctx.async_copy(src_ref=tile, dst_ref=o_ref, swizzle=swizzle)
        ctx.await_async_copy(0)

    x = np.random.default_rng(4).integers(-8, 8, (128, 2 * cols)).astype(jnp.int4)
    f = lane_kernel(kernel, [jax.ShapeDtypeStruct(x.shape, jnp.int4)],
                    [jax.ShapeDtypeStruct((64, cols), jnp.int4)],
                    (jax.ShapeDtypeStruct((64, cols), jnp.int4), mgpu.Barrier(1)))
    (y,) = emu.run(f, x)
    np.testing.assert_array_equal(y, x[64:, cols:])
