"""Validation kernels: what jax 0.11.2 itself lowers, with numpy's answer.

Each case is (function, inputs, reference, tolerance in ulp of the output
dtype; 0 means bit-exact)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

WG = plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup)
S = jax.ShapeDtypeStruct
BF16 = np.dtype(ml_dtypes.bfloat16)
RNG = np.random.default_rng(26)


@dataclass
class Case:
    name: str
    fn: Callable
    args: list
    ref: Callable[..., Any]
    ulp: int = 0
    abs_bound: Callable[..., Any] | None = None  # per-element |got - want| bound from the inputs


def K(body, out, scratch=(), **kw):
    return plgpu.kernel(body, out_type=out, scratch_types=scratch, compiler_params=WG, **kw)


def normal(shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def ints(shape, lo=-1000, hi=1000):
    return RNG.integers(lo, hi, shape).astype(np.int32)


def f64(x):
    return np.asarray(x).astype(np.float64)


def r32(x):
    return np.asarray(x).astype(np.float32).astype(np.float64)


def _elementwise(name, dtype, fn, ref, ulp, shape=(128, 128), gen=normal):
    def body(x, y, o):
        o[...] = fn(x[...], y[...])
    x, y = gen(shape, dtype), gen(shape, dtype)
    if np.dtype(dtype).kind == "i":
        return Case(name, K(body, S(shape, dtype)), [x, y], ref, ulp)
    return Case(name, K(body, S(shape, dtype)), [x, y],
                lambda x, y: ref(f64(x), f64(y)).astype(dtype), ulp)


def _swizzled_copy(swizzle, dtype=np.float16):
    cols = swizzle // np.dtype(dtype).itemsize

    def body(x_gmem, o_gmem, direct_gmem, smem, bar):
        plgpu.copy_gmem_to_smem(x_gmem, smem, bar)
        plgpu.barrier_wait(bar)
        direct_gmem[...] = smem[...]  # registers (swizzled SMEM addressing) -> GMEM
        smem[...] = smem[...] * 2 + 1
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(smem, o_gmem)
        plgpu.wait_smem_to_gmem(0)
    t = (plgpu.TilingTransform((8, cols)), plgpu.SwizzleTransform(swizzle))
    fn = K(body, (S((64, cols), dtype), S((64, cols), dtype)),
           [plgpu.SMEM((64, cols), dtype, transforms=t), plgpu.Barrier()])
    # x * 2 + 1 rounds twice in the kernel, as here
    return Case(f"tma_smem_swizzle{swizzle}", fn, [normal((64, cols), dtype)],
                lambda x: ((x * 2).astype(dtype) + 1, x.copy()), 0)


def _tma_oob():
    """A (96, 64) tensor in (64, 64) boxes: the second box is half outside.
    TMA fills the outside with zeros (visible through ``full``) and does not
    store it back."""

    def body(x_gmem, o_gmem, full_gmem, smem, bar):
        i = lax.axis_index("x")
        plgpu.copy_gmem_to_smem(x_gmem.at[pl.ds(i * 64, 64)], smem, bar)
        plgpu.barrier_wait(bar)
        smem[...] = smem[...] + 1
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(smem, o_gmem.at[pl.ds(i * 64, 64)])
        full_gmem[pl.ds(i * 64, 64)] = smem[...]
        plgpu.wait_smem_to_gmem(0)
    fn = K(body, (S((96, 64), jnp.float32), S((128, 64), jnp.float32)),
           [plgpu.SMEM((64, 64), jnp.float32), plgpu.Barrier()], grid=(2,), grid_names=("x",))

    def ref(x):
        full = np.ones((128, 64), np.float32)
        full[:96] = x + 1
        return x + 1, full
    return Case("tma_oob_edges", fn, [normal((96, 64))], ref)


def _rowsum():
    def body(x, o):
        o[...] = jnp.sum(plgpu.load(x, layout=plgpu.Layout.WGMMA, optimized=False), axis=1)
    # any summation order: |error| <= (n - 1) * eps * sum |x|
    return Case("row_sum_wgmma", K(body, S((128,), jnp.float32)), [normal((128, 128))],
                lambda x: f64(x).sum(1).astype(np.float32), 0,
                abs_bound=lambda x: 127 * np.finfo(np.float32).eps * np.abs(f64(x)).sum(1))


def _colmax():
    def body(x, o):
        o[...] = jnp.max(plgpu.load(x, layout=plgpu.Layout.WGMMA, optimized=False), axis=0)
    return Case("col_max_wgmma", K(body, S((128,), jnp.float32)), [normal((128, 128))],
                lambda x: x.max(0))


def _broadcast():
    def body(x, r, o):
        row = plgpu.load(r, layout=plgpu.Layout.WGMMA.reduce(0), optimized=False)
        v = plgpu.load(x, layout=plgpu.Layout.WGMMA, optimized=False)
        o[...] = v * lax.broadcast_in_dim(row, (128, 128), (1,))
    return Case("broadcast_row", K(body, S((128, 128), jnp.float32)),
                [normal((128, 128)), normal((128,))], lambda x, r: x * r[None, :])


def _layout_cast():
    def body(x, o):
        v = plgpu.load(x, layout=plgpu.Layout.WGMMA, optimized=False)
        w = plgpu.layout_cast(v * 3, plgpu.Layout.WG_STRIDED((128, 128), vec_size=2))
        o[...] = w + 1
    return Case("layout_cast_wgmma_to_strided", K(body, S((128, 128), jnp.float32)),
                [normal((128, 128))], lambda x: (f64(x) * 3).astype(np.float32) + 1)


def _loop():
    def body(x, o):
        def step(i, acc):
            return acc * 0.5 + x[...] * i.astype(jnp.float32)
        o[...] = lax.fori_loop(0, 5, step, jnp.zeros((128, 128), jnp.float32))

    def ref(x):
        acc = np.zeros_like(x)
        for i in range(5):
            acc = acc * np.float32(0.5) + x * np.float32(i)
        return acc
    return Case("scf_for_carrying_vectors", K(body, S((128, 128), jnp.float32)),
                [normal((128, 128))], ref)


def _grid_when():
    def body(x, o):
        i = lax.axis_index("x")
        o[pl.ds(i * 64, 64)] = x[pl.ds(i * 64, 64)] + i

        @pl.when(i % 2 == 1)
        def _():
            o[pl.ds(i * 64, 64)] = x[pl.ds(i * 64, 64)] * 3
    fn = K(body, S((256, 128), jnp.int32), grid=(4,), grid_names=("x",))

    def ref(x):
        out = x.copy()
        for i in range(4):
            blk = slice(i * 64, i * 64 + 64)
            out[blk] = x[blk] * 3 if i % 2 else x[blk] + i
        return out
    return Case("grid_and_scf_if", fn, [ints((256, 128))], ref)


def _lane_kernel(kernel, in_sds, out_sds):
    """``mgpu.as_gpu_kernel`` lowers when built: build it in an MLIR context."""
    from jax._src.interpreters import mlir
    from jax._src.lib.mlir import ir
    from jax.experimental.mosaic import gpu as mgpu

    with mlir.make_ir_context(), ir.Location.unknown():
        return mgpu.as_gpu_kernel(kernel, (1, 1, 1), (128, 1, 1), (in_sds,), out_sds, ())


def _lane_divergent_if():
    """A Lane-semantics kernel (``mgpu.as_gpu_kernel``): threads < 64 double
    their element, the others add one -- a per-thread ``scf.if``."""
    from jax._src.lib.mlir import ir
    from jax._src.lib.mlir.dialects import arith, memref, scf
    from jax.experimental.mosaic.gpu import utils as mgpu_utils

    def kernel(ctx, x_ref, o_ref, _):
        i32, f32 = ir.IntegerType.get_signless(32), ir.F32Type.get()
        tid = mgpu_utils.thread_idx()
        idx = arith.index_cast(ir.IndexType.get(), tid)
        v = memref.load(x_ref, [idx])
        cond = arith.cmpi(arith.CmpIPredicate.ult, tid, mgpu_utils.c(64, i32))
        if_op = scf.IfOp(cond, [f32], has_else=True)
        with ir.InsertionPoint(if_op.then_block):
            scf.yield_([arith.mulf(v, mgpu_utils.c(2.0, f32))])
        with ir.InsertionPoint(if_op.else_block):
            scf.yield_([arith.addf(v, mgpu_utils.c(1.0, f32))])
        memref.store(if_op.result, o_ref, [idx])

    sds = S((128,), jnp.float32)
    fn = _lane_kernel(kernel, sds, sds)

    def ref(x):
        out = x + 1
        out[:64] = x[:64] * 2
        return out
    return Case("lane_semantics_divergent_if", fn, [normal((128,))], ref)


def _lane_fragmented():
    """Lane semantics through jax's FragmentedArray (strided layout), f16."""
    from jax.experimental.mosaic import gpu as mgpu

    def kernel(ctx, x_ref, o_ref, _):
        x = mgpu.FragmentedArray.load_strided(x_ref)
        (x * x + x).store_untiled(o_ref)

    sds = S((64, 64), jnp.float16)
    fn = _lane_kernel(kernel, sds, sds)
    return Case("lane_fragmented_array_f16", fn, [normal((64, 64), np.float16)],
                lambda x: (x * x + x), 0)


def cases() -> list[Case]:
    # each op rounded to f32 once, as the kernel does (math functions correctly rounded)
    exp_tanh = lambda x, y: r32(r32(r32(np.exp(x)) * 2) + r32(np.tanh(y)))
    return [
        _elementwise("f32_add_mul_sub", np.float32, lambda x, y: x * y + (x - y),
                     lambda x, y: r32(r32(x * y) + r32(x - y)), 0),
        _elementwise("f32_div_max", np.float32, lambda x, y: jnp.maximum(x / y, y),
                     lambda x, y: np.maximum((x / y).astype(np.float32), y), 0),
        _elementwise("f32_exp_tanh", np.float32, lambda x, y: jnp.exp(x) * 2 + jnp.tanh(y),
                     exp_tanh, 0),
        _elementwise("f16_arith", np.float16, lambda x, y: x * y - y,
                     lambda x, y: (x * y).astype(np.float16).astype(np.float64) - y, 0),
        _elementwise("bf16_arith", BF16, lambda x, y: (x + y) * x,
                     lambda x, y: (x + y).astype(BF16).astype(np.float64) * x, 0),
        _elementwise("bf16_via_f32", BF16,
                     lambda x, y: (x.astype(jnp.float32) * 3 + y.astype(jnp.float32)).astype(jnp.bfloat16),
                     lambda x, y: (x * 3).astype(np.float32).astype(np.float64) + y, 0),
        _elementwise("i32_arith", np.int32, lambda x, y: (x * 7 - y) // 3 + x % 5 + (x & y) ^ (x >> 2),
                     lambda x, y: i32_ref(x, y), 0, gen=lambda s, d: ints(s)),
        _elementwise("i32_max_select", np.int32, lambda x, y: jnp.where(x > y, x - y, jnp.maximum(x, -y)),
                     lambda x, y: np.where(x > y, x - y, np.maximum(x, -y)), 0,
                     gen=lambda s, d: ints(s)),
        _swizzled_copy(32), _swizzled_copy(64), _swizzled_copy(128),
        _swizzled_copy(128, np.float32),
        _tma_oob(), _rowsum(), _colmax(), _broadcast(), _loop(), _grid_when(),
        _lane_divergent_if(), _lane_fragmented(),
    ]


def i32_ref(x, y):
    x, y = x.astype(np.int64), y.astype(np.int64)
    q = (x * 7 - y)
    q = np.floor_divide(q, 3)  # jnp's // floors
    r = np.remainder(x, 5)  # jnp's % takes the divisor's sign
    return (q + r + (x & y) ^ (x >> 2)).astype(np.int32)
