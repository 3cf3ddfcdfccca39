"""Pallas Mosaic GPU kernels with Warpgroup semantics, written the way jax's own
Pallas tests write them, lowered for sm_90a: smalti's modules equal jax's.

Each test builds one kernel (``plgpu.kernel``, ``emit_pipeline``, warp
specialization, ``core_map``, WGMMA, TMA with transforms, barriers, control
flow...), lowers it for CUDA on the CPU through jax and through smalti, and
asserts the two Mosaic GPU modules are identical.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from tests.official import assert_same_modules, gpu_facts
from tests.pallas_kit import WARPGROUP, kernel, swizzled, tma_in, tma_out, transforms

F16, BF16, F32 = jnp.float16, jnp.bfloat16, jnp.float32
I8, I16, I32, U8, U32 = jnp.int8, jnp.int16, jnp.int32, jnp.uint8, jnp.uint32


def sds(shape, dtype=F32):
    return jax.ShapeDtypeStruct(shape, dtype)


def same(monkeypatch, call, *args) -> str:
    with gpu_facts(monkeypatch, arch=(9, 0)):
        return assert_same_modules(call, *args)


def mapped(fn, in_types, out_type, smem=plgpu.SMEM, params=WARPGROUP):
    """A kernel that TMA-loads its inputs to SMEM, computes ``fn`` on their
    values in registers and TMA-stores the result."""
    n = len(in_types)

    def body(*refs):
        ins, out, smems, out_smem, barrier = (refs[:n], refs[n], refs[n + 1:2 * n + 1],
                                              refs[2 * n + 1], refs[2 * n + 2])
        for i, (gmem, s) in enumerate(zip(ins, smems)):
            tma_in(gmem, s, barrier.at[i])
        tma_out(fn(*(s[...] for s in smems)), out_smem, out)

    scratch = [*(smem(t.shape, t.dtype) for t in in_types), smem(out_type.shape, out_type.dtype),
               plgpu.Barrier(num_barriers=n)]
    return kernel(body, out_type, scratch, params=params)


# --- elementwise math ----------------------------------------------------------------

UNARY = {
    "neg": lax.neg, "exp": jnp.exp, "exp2": jnp.exp2, "log": jnp.log, "log2": jnp.log2,
    "tanh": jnp.tanh, "logistic": jax.nn.sigmoid, "rsqrt": lax.rsqrt, "sqrt": jnp.sqrt,
    "sin": jnp.sin, "cos": jnp.cos, "abs": jnp.abs, "round": lax.round,
    "round-even": lambda x: lax.round(x, lax.RoundingMethod.TO_NEAREST_EVEN),
    "square": jnp.square, "cube": lambda x: x ** 3, "sign": jnp.sign, "gelu": jax.nn.gelu,
    "silu": jax.nn.silu, "reciprocal": lambda x: 1 / x, "relu": lambda x: jnp.maximum(x, 0.0),
}


APPROX = ["exp", "log2", "tanh", "logistic", "rsqrt", "sin"]


@pytest.mark.parametrize("op, approx", [*((op, False) for op in UNARY),
                                        *((op, True) for op in APPROX)])
def test_unary_float_math(monkeypatch, op, approx):
    params = plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup,
                                  approx_math=approx)
    call = mapped(UNARY[op], [sds((128, 64))], sds((128, 64)), params=params)
    same(monkeypatch, call, sds((128, 64)))


BINARY = {
    "add": lax.add, "sub": lax.sub, "mul": lax.mul, "div": lax.div, "min": jnp.minimum,
    "max": jnp.maximum, "add-scalar": lambda x, _: x + 3,
    "where-gt": lambda x, y: jnp.where(x > y, x, y),
    "eq-select": lambda x, y: jnp.where(x == y, 1, 0).astype(x.dtype),
    "ne-or-le": lambda x, y: ((x != y) | (x <= y)).astype(x.dtype),
}


@pytest.mark.parametrize("dtype", [F32, I32])
@pytest.mark.parametrize("op", list(BINARY))
def test_binary_ops(monkeypatch, op, dtype):
    t = sds((256,), dtype)
    same(monkeypatch, mapped(BINARY[op], [t, t], t), t, t)


@pytest.mark.parametrize("dtype", [U32, F16, BF16, I16])
@pytest.mark.parametrize("op", ["div", "where-gt"])
def test_binary_ops_on_more_dtypes(monkeypatch, op, dtype):
    t = sds((128, 64), dtype)
    same(monkeypatch, mapped(BINARY[op], [t, t], t), t, t)


@pytest.mark.parametrize("dtype", [I32, U32])
def test_integer_remainder(monkeypatch, dtype):
    t = sds((256,), dtype)
    same(monkeypatch, mapped(lambda x, y: lax.rem(x, y | 1), [t, t], t), t, t)


FUSED = {
    "layer-norm-ish": lambda x, y: (x - y) * lax.rsqrt(y * y + 1e-5),
    "mixed-precision": lambda x, y: (x.astype(F16) * y.astype(F16)).astype(F32) + x,
    "clamp": lambda x, y: lax.clamp(-1.0, x * y, 1.0),
    "tanh-gelu": lambda x, y: 0.5 * x * (1 + jnp.tanh(0.79788456 * (x + 0.044715 * x ** 3))) + y,
    "select-chain": lambda x, y: jnp.where(x > 0, jnp.where(y > 0, x + y, x), -y),
}


@pytest.mark.parametrize("expr", list(FUSED))
def test_fused_expressions(monkeypatch, expr):
    t = sds((128, 128))
    same(monkeypatch, mapped(FUSED[expr], [t, t], t), t, t)


INTEGER = {
    "and": lax.bitwise_and, "or": lax.bitwise_or, "xor": lax.bitwise_xor,
    "not": lambda x, _: lax.bitwise_not(x), "shl": lax.shift_left,
    "shr-logical": lax.shift_right_logical, "shr-arith": lax.shift_right_arithmetic,
    "clz": lambda x, _: lax.clz(x),
}


@pytest.mark.parametrize("op, dtype", [*((op, I32) for op in INTEGER),
                                       *((op, U32) for op in ("not", "shr-logical", "shr-arith"))])
def test_integer_bit_ops(monkeypatch, op, dtype):
    t = sds((128, 64), dtype)
    same(monkeypatch, mapped(INTEGER[op], [t, t], t), t, t)


@pytest.mark.parametrize("dtype, shape", [
    *((d, shape) for d in (F16, F32, I32) for shape in ((256,), (128, 128), (2, 64, 64))),
    (BF16, (128, 128)), (I16, (128, 128))])
def test_polynomial_across_dtypes(monkeypatch, dtype, shape):
    t = sds(shape, dtype)
    same(monkeypatch, mapped(lambda x: x * x + x * 3 - 1, [t], t), t)


@pytest.mark.parametrize("dtype", [I8, U8])
def test_bitwise_ops_on_8_bit_integers(monkeypatch, dtype):
    t = sds((128, 128), dtype)
    same(monkeypatch, mapped(lambda x, y: (x & y) ^ (x | 3), [t, t], t), t, t)


@pytest.mark.parametrize("src, dst", [(F32, F16), (F16, F32), (F32, BF16), (BF16, F32),
                                      (I32, F32), (F32, I32), (I8, I32), (I32, I8),
                                      (U8, F32), (I16, F16), (F16, BF16)])
def test_dtype_conversions(monkeypatch, src, dst):
    same(monkeypatch, mapped(lambda x: x.astype(dst), [sds((128, 128), src)],
                             sds((128, 128), dst)), sds((128, 128), src))


def test_bitcast_and_optimization_barrier(monkeypatch):
    def fn(x):
        y = lax.optimization_barrier(x * 2)
        return lax.bitcast_convert_type(y, I32) ^ 1

    same(monkeypatch, mapped(fn, [sds((128, 64))], sds((128, 64), I32)), sds((128, 64)))


# --- broadcasting, reductions, layouts --------------------------------------------------

@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("reduce, dtype", [("sum", F32), ("max", F32), ("min", I32),
                                           ("sum", I32)])
def test_reduction_and_broadcast_back(monkeypatch, axis, reduce, dtype):
    r = {"sum": jnp.sum, "max": jnp.max, "min": jnp.min}[reduce]

    def fn(x):
        x = plgpu.layout_cast(x, plgpu.Layout.WGMMA)
        return x - r(x, axis=axis, keepdims=True)

    t = sds((128, 128), dtype)
    same(monkeypatch, mapped(fn, [t], t), t)


@pytest.mark.parametrize("dtype", [F32, I32])
@pytest.mark.parametrize("reduce", ["sum", "max"])
def test_full_reduction_to_a_scalar(monkeypatch, reduce, dtype):
    r = {"sum": jnp.sum, "max": jnp.max}[reduce]
    t = sds((128, 64), dtype)
    same(monkeypatch, mapped(lambda x: x * r(x), [t], t), t)


@pytest.mark.parametrize("axis", [0, 1])
def test_reduction_to_a_vector(monkeypatch, axis):
    def body(x_gmem, o_gmem, x_smem, barrier):
        tma_in(x_gmem, x_smem, barrier)
        o_gmem[...] = jnp.sum(plgpu.layout_cast(x_smem[...], plgpu.Layout.WGMMA), axis=axis)

    call = kernel(body, sds((128,)), [plgpu.SMEM((128, 128), F32), plgpu.Barrier()])
    same(monkeypatch, call, sds((128, 128)))


def test_row_softmax(monkeypatch):
    def softmax(x):
        x = plgpu.layout_cast(x, plgpu.Layout.WGMMA).astype(F32)
        e = jnp.exp(x - jnp.max(x, axis=1, keepdims=True))
        return (e / jnp.sum(e, axis=1, keepdims=True)).astype(F16)

    t = sds((128, 128), F16)
    same(monkeypatch, mapped(softmax, [t], t), t)


@pytest.mark.parametrize("dimension", [0, 1])
@pytest.mark.parametrize("dtype", [I32, F32])
def test_iota(monkeypatch, dimension, dtype):
    def body(o_gmem, o_smem):
        tma_out(lax.broadcasted_iota(dtype, (128, 64), dimension) * 2, o_smem, o_gmem)

    same(monkeypatch, kernel(body, sds((128, 64), dtype), [plgpu.SMEM((128, 64), dtype)]))


@pytest.mark.parametrize("layout", [plgpu.Layout.WGMMA, plgpu.Layout.WG_STRIDED((128, 128), 2),
                                    plgpu.Layout.WG_STRIDED((128, 128), 8)],
                         ids=["wgmma", "strided", "strided-8"])
def test_layout_cast(monkeypatch, layout):
    def fn(x):
        return plgpu.layout_cast(x + 1, layout) * 2

    t = sds((128, 128), F16)
    same(monkeypatch, mapped(fn, [t], t), t)


def test_plgpu_iota_with_a_layout(monkeypatch):
    def body(o_gmem, o_smem):
        tma_out(plgpu.broadcasted_iota(I32, (128, 128), 1, layout=plgpu.Layout.WGMMA), o_smem,
                o_gmem)

    same(monkeypatch, kernel(body, sds((128, 128), I32), [plgpu.SMEM((128, 128), I32)]))


def test_broadcast_in_dim_of_a_row(monkeypatch):
    def fn(x, row):
        return x + lax.broadcast_in_dim(row, (128, 128), (1,))

    same(monkeypatch, mapped(fn, [sds((128, 128)), sds((128,))], sds((128, 128))),
         sds((128, 128)), sds((128,)))


def test_scalar_splat_from_gmem(monkeypatch):
    def body(x_gmem, s_gmem, o_gmem, x_smem, o_smem, barrier):
        tma_in(x_gmem, x_smem, barrier)
        tma_out(x_smem[...] * s_gmem[0] + s_gmem[1], o_smem, o_gmem)

    call = kernel(body, sds((128, 64)), [plgpu.SMEM((128, 64), F32), plgpu.SMEM((128, 64), F32),
                                         plgpu.Barrier()])
    same(monkeypatch, call, sds((128, 64)), sds((2,)))


@pytest.mark.parametrize("what", ["slice", "reshape", "concatenate", "squeeze"])
def test_shape_manipulation(monkeypatch, what):
    fn, out = {
        "slice": (lambda x: plgpu.layout_cast(x, plgpu.Layout.WGMMA)[:, 64:] * 2, (128, 64)),
        "reshape": (lambda x: x.reshape(256, 64) + 1, (256, 64)),
        "concatenate": (lambda x: jnp.concatenate(
            [plgpu.layout_cast(x, plgpu.Layout.WGMMA)] * 2, axis=0), (256, 128)),
        "squeeze": (lambda x: x.reshape(1, 128, 128)[0] * 3, (128, 128)),
    }[what]
    same(monkeypatch, mapped(fn, [sds((128, 128))], sds(out)), sds((128, 128)))


def test_gmem_load_and_store_without_smem(monkeypatch):
    def body(x_gmem, o_gmem):
        o_gmem[...] = x_gmem[...] * 2 + 1

    same(monkeypatch, kernel(body, sds((256,))), sds((256,)))


def test_plgpu_load_with_a_layout(monkeypatch):
    def body(x_gmem, o_gmem, o_smem):
        x = plgpu.load(x_gmem, layout=plgpu.Layout.WGMMA, optimized=False)
        tma_out(x * 2, o_smem, o_gmem)

    same(monkeypatch, kernel(body, sds((128, 64), F16), [plgpu.SMEM((128, 64), F16)]),
         sds((128, 64), F16))


# --- control flow ----------------------------------------------------------------------

@pytest.mark.parametrize("force_while, unroll", [(False, 1), (False, 2), (True, 1)],
                         ids=["static", "static-unrolled", "dynamic"])
def test_fori_loop_carrying_vectors(monkeypatch, force_while, unroll):

    def fn(x):
        lb, ub = (jnp.int32(0), jnp.int32(4)) if force_while else (0, 4)
        def step(i, carry):
            acc, y = carry
            return acc + y * i.astype(F32), y * 0.5
        acc, _ = lax.fori_loop(lb, ub, step, (jnp.zeros_like(x), x), unroll=unroll)
        return acc

    same(monkeypatch, mapped(fn, [sds((128, 64))], sds((128, 64))), sds((128, 64)))


def test_fori_loop_over_smem_rows(monkeypatch):
    def body(x_gmem, o_gmem, x_smem, o_smem, barrier):
        tma_in(x_gmem, x_smem, barrier)

        @pl.loop(0, 4)
        def _(i):
            o_smem.at[i][...] = x_smem.at[i][...] + i.astype(F32)

        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(o_smem, o_gmem)
        plgpu.wait_smem_to_gmem(0)

    call = kernel(body, sds((4, 64, 64)), [plgpu.SMEM((4, 64, 64), F32),
                                           plgpu.SMEM((4, 64, 64), F32), plgpu.Barrier()])
    same(monkeypatch, call, sds((4, 64, 64)))


def test_cond_with_vector_results(monkeypatch):
    def body(x_gmem, o_gmem, x_smem, o_smem, barrier):
        tma_in(x_gmem, x_smem, barrier)
        x = x_smem[...]
        y = lax.cond(lax.axis_index("x") == 0, lambda: jnp.exp(x), lambda: x * 2)
        tma_out(y, o_smem, o_gmem.at[lax.axis_index("x")])

    call = kernel(body, sds((2, 128, 64)), [plgpu.SMEM((128, 64), F32),
                                            plgpu.SMEM((128, 64), F32), plgpu.Barrier()],
                  grid=(2,), grid_names=("x",))
    same(monkeypatch, call, sds((128, 64)))


def test_when_and_switch_on_block_index(monkeypatch):
    def body(x_gmem, o_gmem, x_smem, o_smem, barrier):
        i = lax.axis_index("x")
        tma_in(x_gmem.at[i], x_smem, barrier)
        x = x_smem[...]
        y = lax.switch(i, [lambda: x + 1, lambda: x * x, lambda: -x])

        @pl.when(i != 1)
        def _():
            tma_out(y, o_smem, o_gmem.at[i])

    call = kernel(body, sds((3, 128, 64)), [plgpu.SMEM((128, 64), F32),
                                            plgpu.SMEM((128, 64), F32), plgpu.Barrier()],
                  grid=(3,), grid_names=("x",))
    same(monkeypatch, call, sds((3, 128, 64)))


# --- emit_pipeline ---------------------------------------------------------------------

@pytest.mark.parametrize("block, steps", [(128, 1), (256, 2), (128, 3)])
def test_emit_pipeline_elementwise_1d(monkeypatch, block, steps):
    def body(x_gmem, o_gmem):
        def step(_, x_smem, o_smem):
            o_smem[...] = jnp.tanh(x_smem[...]) + 1

        plgpu.emit_pipeline(step, grid=(2048 // block,),
                            in_specs=[pl.BlockSpec((block,), lambda i: (i,))],
                            out_specs=[pl.BlockSpec((block,), lambda i: (i,))],
                            max_concurrent_steps=steps)(x_gmem, o_gmem)

    same(monkeypatch, kernel(body, sds((2048,))), sds((2048,)))


@pytest.mark.parametrize("swizzle", [None, 64, 128])
def test_emit_pipeline_2d_grid_two_inputs(monkeypatch, swizzle):
    t = {} if swizzle is None else {"transforms": transforms(F16, swizzle)}

    def body(x_gmem, y_gmem, o_gmem):
        def step(_, x_smem, y_smem, o_smem):
            o_smem[...] = x_smem[...] * y_smem[...] + x_smem[...]

        spec = plgpu.BlockSpec((64, 64), lambda i, j: (i, j), **t)
        plgpu.emit_pipeline(step, grid=(2, 4), in_specs=[spec, spec], out_specs=[spec],
                            max_concurrent_steps=2)(x_gmem, y_gmem, o_gmem)

    t2 = sds((128, 256), F16)
    same(monkeypatch, kernel(body, t2), t2, t2)


def test_emit_pipeline_in_a_parallel_grid(monkeypatch):
    def body(x_gmem, o_gmem):
        m = lax.axis_index("m")

        def step(_, x_smem, o_smem):
            o_smem[...] = x_smem[...].astype(F32) * 2

        plgpu.emit_pipeline(step, grid=(4,),
                            in_specs=[pl.BlockSpec((64, 128), lambda k: (m, k))],
                            out_specs=[pl.BlockSpec((64, 128), lambda k: (m, k))],
                            max_concurrent_steps=2)(x_gmem, o_gmem)

    call = kernel(body, sds((128, 512)), grid=(2,), grid_names=("m",))
    same(monkeypatch, call, sds((128, 512), F16))


def test_emit_pipeline_with_a_carry(monkeypatch):
    def body(x_gmem, o_gmem, o_smem):
        def step(_, x_smem, acc):
            return acc + x_smem[...]

        acc = plgpu.emit_pipeline(step, grid=(8,),
                                  in_specs=[pl.BlockSpec((128, 64), lambda i: (0, i))],
                                  max_concurrent_steps=2,
                                  init_carry=jnp.zeros((128, 64), F32))(x_gmem)
        tma_out(acc, o_smem, o_gmem)

    call = kernel(body, sds((128, 64)), [plgpu.SMEM((128, 64), F32)])
    same(monkeypatch, call, sds((128, 512)))


def test_emit_pipeline_reduction_into_a_revisited_output(monkeypatch):
    def body(x_gmem, o_gmem):
        def step(idx, x_smem, o_smem):
            i, = idx

            @pl.when(i == 0)
            def _():
                o_smem[...] = jnp.zeros_like(o_smem)

            o_smem[...] += x_smem[...]

        plgpu.emit_pipeline(step, grid=(4,),
                            in_specs=[pl.BlockSpec((64, 128), lambda i: (i, 0))],
                            out_specs=[pl.BlockSpec((64, 128), lambda i: (0, 0))])(x_gmem,
                                                                                  o_gmem)

    same(monkeypatch, kernel(body, sds((64, 128))), sds((256, 128)))


@pytest.mark.parametrize("tile_k, swizzle", [(32, 64), (64, 128)])
def test_emit_pipeline_wgmma_matmul(monkeypatch, tile_k, swizzle):
    """A 2x2 grid of 64x64 output tiles; each accumulates over K in a pipeline."""
    def body(a_gmem, b_gmem, o_gmem):
        m, n = lax.axis_index("m"), lax.axis_index("n")
        t = transforms(F16, swizzle)

        def step(idx, a_smem, b_smem, o_smem):
            k, = idx

            def mma(acc_ref):
                plgpu.wgmma(acc_ref, a_smem, b_smem)
                return acc_ref[...]

            acc = pl.run_scoped(mma, plgpu.ACC((64, 64), F32)).astype(F16)
            lax.cond(k == 0, lambda: o_smem.__setitem__(..., acc),
                     lambda: o_smem.__setitem__(..., o_smem[...] + acc))

        plgpu.emit_pipeline(
            step, grid=(256 // tile_k,),
            in_specs=[plgpu.BlockSpec((64, tile_k), lambda k: (m, k), transforms=t),
                      plgpu.BlockSpec((tile_k, 64), lambda k: (k, n), transforms=t)],
            out_specs=[plgpu.BlockSpec((64, 64), lambda k: (m, n), transforms=t)],
            max_concurrent_steps=2)(a_gmem, b_gmem, o_gmem)

    call = kernel(body, sds((128, 128), F16), grid=(2, 2), grid_names=("m", "n"))
    same(monkeypatch, call, sds((128, 256), F16), sds((256, 128), F16))


# --- warp specialization ---------------------------------------------------------------

def test_emit_pipeline_warp_specialized_elementwise(monkeypatch):
    num_compute_wgs = 1

    def body(x_gmem, o_gmem):
        wg = lax.axis_index("wg")

        def step(_, x_smem, o_smem):
            o_smem[...] = x_smem[...] + wg.astype(F32)

        plgpu.emit_pipeline_warp_specialized(
            step, grid=(8,), memory_registers=40, max_concurrent_steps=2,
            num_compute_wgs=num_compute_wgs, wg_axis="wg",
            in_specs=[pl.BlockSpec((128, 64), lambda i: (0, i))],
            out_specs=[pl.BlockSpec((128, 64), lambda i: (0, i))])(x_gmem, o_gmem)

    call = kernel(body, sds((128, 512)), num_threads=num_compute_wgs + 1, thread_name="wg")
    same(monkeypatch, call, sds((128, 512)))


@pytest.mark.parametrize("num_compute_wgs", [1, 2])
def test_emit_pipeline_warp_specialized_with_a_carry(monkeypatch, num_compute_wgs):
    """Each compute warpgroup sums its half of every block into a carry."""
    rows = 128 // num_compute_wgs

    def body(x_gmem, o_gmem):
        wg = lax.axis_index("wg")

        def compute(pipeline):
            o_gmem.at[wg][...] = pipeline(jnp.zeros((rows, 64), F32))

        def step(_, x_smem, carry):
            return carry + x_smem.at[pl.ds(wg * rows, rows)][...]

        plgpu.emit_pipeline_warp_specialized(
            step, grid=(4,), memory_registers=40, max_concurrent_steps=2,
            num_compute_wgs=num_compute_wgs, wg_axis="wg", compute_context=compute,
            in_specs=[pl.BlockSpec((128, 64), lambda i: (0, i))])(x_gmem)

    call = kernel(body, sds((num_compute_wgs, rows, 64)), num_threads=num_compute_wgs + 1,
                  thread_name="wg")
    same(monkeypatch, call, sds((128, 256)))


def test_manual_producer_consumer_warpgroups(monkeypatch):
    """Warpgroup 1 loads with TMA; warpgroup 0 computes and stores."""
    def body(x_gmem, o_gmem, x_smem, o_smem, loaded):
        wg = lax.axis_index("wg")

        @pl.when(wg == 1)
        def _producer():
            plgpu.set_max_registers(40, action="decrease")
            plgpu.copy_gmem_to_smem(x_gmem, x_smem, loaded)

        @pl.when(wg == 0)
        def _consumer():
            plgpu.set_max_registers(232, action="increase")
            plgpu.barrier_wait(loaded)
            tma_out(jnp.exp(x_smem[...]), o_smem, o_gmem)

    call = kernel(body, sds((128, 64)), [plgpu.SMEM((128, 64), F32),
                                         plgpu.SMEM((128, 64), F32), plgpu.Barrier()],
                  num_threads=2, thread_name="wg")
    same(monkeypatch, call, sds((128, 64)))


def test_warpgroups_arrive_on_one_barrier(monkeypatch):
    """Two warpgroups write halves of SMEM, arrive; a third waits and stores."""
    def body(o_gmem, smem, written):
        wg = lax.axis_index("wg")

        @pl.when(wg < 2)
        def _():
            smem.at[wg][...] = jnp.full((64, 128), 1.0, F32) * wg.astype(F32)
            plgpu.commit_smem()
            plgpu.barrier_arrive(written)

        @pl.when(wg == 2)
        def _():
            plgpu.barrier_wait(written)
            plgpu.copy_smem_to_gmem(smem, o_gmem)
            plgpu.wait_smem_to_gmem(0)

    call = kernel(body, sds((2, 64, 128)), [plgpu.SMEM((2, 64, 128), F32),
                                            plgpu.Barrier(num_arrivals=2)],
                  num_threads=3, thread_name="wg")
    same(monkeypatch, call)


def test_barrier_ring_in_a_loop(monkeypatch):
    """A producer fills two slots in turn; the consumer frees them with arrivals."""
    def body(x_gmem, o_gmem, slots, o_smem, full, empty):
        wg = lax.axis_index("wg")

        @pl.when(wg == 1)
        def _():
            @pl.loop(0, 4)
            def _(i):
                slot = i % 2

                @pl.when(i >= 2)
                def _():
                    plgpu.barrier_wait(empty.at[slot])

                plgpu.copy_gmem_to_smem(x_gmem.at[i], slots.at[slot], full.at[slot])

        @pl.when(wg == 0)
        def _():
            def step(i, acc):
                slot = i % 2
                plgpu.barrier_wait(full.at[slot])
                acc = acc + slots.at[slot][...]
                plgpu.barrier_arrive(empty.at[slot])
                return acc

            tma_out(lax.fori_loop(0, 4, step, jnp.zeros((64, 64), F32)), o_smem, o_gmem)

    call = kernel(body, sds((64, 64)), [plgpu.SMEM((2, 64, 64), F32), plgpu.SMEM((64, 64), F32),
                                        plgpu.Barrier(num_barriers=2),
                                        plgpu.Barrier(num_barriers=2)],
                  num_threads=2, thread_name="wg")
    same(monkeypatch, call, sds((4, 64, 64)))


@pytest.mark.filterwarnings("ignore:jax.experimental.pallas.core_map is deprecated")
def test_core_map_over_a_mesh(monkeypatch):
    mesh = plgpu.Mesh(grid=(2,), grid_names=("x",), num_threads=2, thread_name="wg")

    def f(x):
        def inner(refs):
            x_ref, o_ref = refs

            @pl.core_map(mesh, compiler_params=WARPGROUP)
            def _():
                i, wg = lax.axis_index("x"), lax.axis_index("wg")

                def scope(x_smem, barrier):
                    tma_in(x_ref.at[i, wg], x_smem.at[wg], barrier.at[wg])
                    o_ref[i, wg] = x_smem.at[wg][...] + 1

                pl.run_scoped(scope, plgpu.SMEM((2, 128), F32), plgpu.Barrier(num_barriers=2),
                              collective_axes="wg")

        _, out = pl.run_state(inner)((x, jnp.empty_like(x)))
        return out

    same(monkeypatch, f, sds((2, 2, 128)))


def test_warp_level_code_in_a_warpgroup_kernel(monkeypatch):
    """One warp issues the TMA load (``core_map`` over a ``WarpMesh``)."""
    def body(x_gmem, o_gmem, x_smem, o_smem, barrier):
        @pl.core_map(plgpu.WarpMesh(axis_name="warp"))
        def _():
            @pl.when(lax.axis_index("warp") == 0)
            def _():
                plgpu.copy_gmem_to_smem(x_gmem, x_smem, barrier)

        plgpu.barrier_wait(barrier)
        tma_out(x_smem[...] * 3, o_smem, o_gmem)

    call = kernel(body, sds((128, 64), F16), [swizzled((128, 64)), swizzled((128, 64)),
                                              plgpu.Barrier()])
    same(monkeypatch, call, sds((128, 64), F16))


# --- scoped allocations, TMA -----------------------------------------------------------

def test_run_scoped_smem_and_barriers(monkeypatch):
    def body(x_gmem, o_gmem):
        def scope(x_smem, o_smem, barriers):
            tma_in(x_gmem, x_smem, barriers.at[0])
            tma_out(x_smem[...] + 1, o_smem, o_gmem)

        pl.run_scoped(scope, plgpu.SMEM((128, 64), F16), swizzled((128, 64)),
                      plgpu.Barrier(num_barriers=2))

    same(monkeypatch, kernel(body, sds((128, 64), F16)), sds((128, 64), F16))


def test_nested_run_scoped(monkeypatch):
    def body(x_gmem, o_gmem, barrier):
        def outer(x_smem):
            tma_in(x_gmem, x_smem, barrier)

            def inner(o_smem):
                tma_out(x_smem[...] * 2, o_smem, o_gmem)

            pl.run_scoped(inner, plgpu.SMEM((64, 128), F32))

        pl.run_scoped(outer, plgpu.SMEM((64, 128), F32))

    same(monkeypatch, kernel(body, sds((64, 128)), [plgpu.Barrier()]), sds((64, 128)))


@pytest.mark.parametrize("dtype", [F16, BF16, F32, I8])
@pytest.mark.parametrize("swizzle", [32, 128])
def test_tma_with_tiling_and_swizzle(monkeypatch, dtype, swizzle):
    shape = (64, 128)
    smem = swizzled(shape, dtype, swizzle)
    fn = (lambda x: x ^ 1) if dtype == I8 else (lambda x: x + x)
    call = mapped(fn, [sds(shape, dtype)], sds(shape, dtype), smem=lambda s, d: smem)
    same(monkeypatch, call, sds(shape, dtype))


def test_tma_of_dynamic_2d_tiles(monkeypatch):
    def body(x_gmem, o_gmem, x_smem, o_smem, barrier):
        i, j = lax.axis_index("i"), lax.axis_index("j")
        tile = (pl.ds(i * 64, 64), pl.ds(j * 64, 64))
        tma_in(x_gmem.at[tile], x_smem, barrier)
        tma_out(x_smem[...] * 2, o_smem, o_gmem.at[tile])

    call = kernel(body, sds((256, 128), F16), [swizzled((64, 64)), swizzled((64, 64)),
                                               plgpu.Barrier()],
                  grid=(4, 2), grid_names=("i", "j"))
    same(monkeypatch, call, sds((256, 128), F16))


def test_tma_groups_and_read_only_waits(monkeypatch):
    def body(x_gmem, o_gmem, x_smem, barrier):
        tma_in(x_gmem, x_smem, barrier)
        for i in range(4):
            plgpu.copy_smem_to_gmem(x_smem.at[i], o_gmem.at[3 - i], commit_group=False)
        plgpu.commit_smem_to_gmem_group()
        plgpu.wait_smem_to_gmem(0, wait_read_only=True)

    call = kernel(body, sds((4, 64, 64), F16), [plgpu.SMEM((4, 64, 64), F16), plgpu.Barrier()])
    same(monkeypatch, call, sds((4, 64, 64), F16))


@pytest.mark.parametrize("reduction, dtype", [("add", F32), ("add", BF16), ("max", F16),
                                              ("min", BF16), ("xor", I32), ("inc", I32)])
def test_tma_store_with_reduction(monkeypatch, reduction, dtype):
    def body(x_gmem, o_gmem, smem, barrier):
        i = lax.axis_index("x")
        tma_in(x_gmem.at[i], smem, barrier)
        plgpu.copy_smem_to_gmem(smem, o_gmem, reduction_op=reduction)
        plgpu.wait_smem_to_gmem(0)

    call = kernel(body, sds((64, 64), dtype), [plgpu.SMEM((64, 64), dtype), plgpu.Barrier()],
                  grid=(4,), grid_names=("x",))
    same(monkeypatch, call, sds((4, 64, 64), dtype))


def test_tma_multicast_in_a_2d_cluster(monkeypatch):
    def body(x_gmem, o_gmem, smem, barrier):
        i = lax.axis_index("cx")
        plgpu.copy_gmem_to_smem(x_gmem.at[i], smem, barrier, collective_axes="cy")
        plgpu.barrier_wait(barrier)
        tma_out(smem[...] + 1, smem, o_gmem.at[i, lax.axis_index("cy")])

    call = kernel(body, sds((2, 2, 64, 64), F16), [swizzled((64, 64)), plgpu.Barrier()],
                  grid=(2, 2), grid_names=("x", "y"), cluster=(2, 2),
                  cluster_names=("cx", "cy"))
    same(monkeypatch, call, sds((2, 64, 64), F16))


def test_cluster_barrier(monkeypatch):
    def body(x_gmem, o_gmem, smem, loaded, synced):
        tma_in(x_gmem, smem, loaded)
        plgpu.barrier_arrive(synced)
        plgpu.barrier_wait(synced)
        tma_out(smem[...] * 2, smem, o_gmem.at[lax.axis_index("c")])

    call = kernel(body, sds((2, 64, 64)), [plgpu.SMEM((64, 64), F32), plgpu.Barrier(),
                                           plgpu.ClusterBarrier(collective_axes=("c",))],
                  cluster=(2,), cluster_names=("c",))
    same(monkeypatch, call, sds((64, 64)))


def test_prefetch_of_slices(monkeypatch):
    def body(x_gmem, o_gmem, smem, barrier):
        i = lax.axis_index("x")
        plgpu.async_prefetch(x_gmem.at[pl.ds(i * 64, 64)])
        tma_in(x_gmem.at[pl.ds(i * 64, 64)], smem, barrier)
        tma_out(smem[...] - 1, smem, o_gmem.at[pl.ds(i * 64, 64)])

    call = kernel(body, sds((256, 64), F16), [swizzled((64, 64)), plgpu.Barrier()],
                  grid=(4,), grid_names=("x",))
    same(monkeypatch, call, sds((256, 64), F16))


def test_multiple_outputs(monkeypatch):
    def body(x_gmem, sum_gmem, prod_gmem, x_smem, s_smem, p_smem, barrier):
        tma_in(x_gmem, x_smem, barrier)
        x = x_smem[...]
        s_smem[...] = x + x
        p_smem[...] = (x * x).astype(F16)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(s_smem, sum_gmem)
        plgpu.copy_smem_to_gmem(p_smem, prod_gmem)
        plgpu.wait_smem_to_gmem(0)

    call = kernel(body, (sds((128, 64)), sds((128, 64), F16)),
                  [plgpu.SMEM((128, 64), F32), plgpu.SMEM((128, 64), F32),
                   plgpu.SMEM((128, 64), F16), plgpu.Barrier()])
    same(monkeypatch, call, sds((128, 64)))


def test_global_semaphores_between_blocks(monkeypatch):
    def body(o_gmem):
        sem = pl.get_global(plgpu.SemaphoreType.REGULAR)
        i = lax.axis_index("x")

        @pl.when(i == 0)
        def _():
            pl.semaphore_signal(sem, 2)

        @pl.when(i == 1)
        def _():
            pl.semaphore_wait(sem, 2)
            o_gmem[...] = jnp.ones((128,), I32)

    same(monkeypatch, kernel(body, sds((128,), I32), grid=(2,), grid_names=("x",)))


def test_inline_mgpu(monkeypatch):
    def body(x_gmem, o_gmem, x_smem, o_smem, barrier):
        tma_in(x_gmem, x_smem, barrier)
        layout = plgpu.Layout.WG_STRIDED((128, 64), vec_size=2)

        @plgpu.inline_mgpu(arg_types=(layout,),
                           return_type=plgpu.ShapeDtypeStruct((128, 64), F32, layout))
        def double(_, x):
            return x + x

        tma_out(double(x_smem[...]), o_smem, o_gmem)

    call = kernel(body, sds((128, 64)), [plgpu.SMEM((128, 64), F32),
                                         plgpu.SMEM((128, 64), F32), plgpu.Barrier()])
    same(monkeypatch, call, sds((128, 64)))


def test_debug_print(monkeypatch):
    def body(x_gmem, o_gmem, x_smem, barrier):
        tma_in(x_gmem, x_smem, barrier)
        pl.debug_print("block {}", lax.axis_index("x"))
        o_gmem[...] = x_smem[...]

    call = kernel(body, sds((128,)), [plgpu.SMEM((128,), F32), plgpu.Barrier()],
                  grid=(2,), grid_names=("x",))
    same(monkeypatch, call, sds((128,)))


def test_griddepcontrol(monkeypatch):
    def body(x_gmem, o_gmem, smem, barrier):
        plgpu.griddepcontrol_wait()
        tma_in(x_gmem, smem, barrier)
        plgpu.griddepcontrol_launch_dependents()
        tma_out(smem[...] + 2, smem, o_gmem)

    call = kernel(body, sds((64, 64)), [plgpu.SMEM((64, 64), F32), plgpu.Barrier()])
    same(monkeypatch, call, sds((64, 64)))


def test_nd_loop_over_tiles(monkeypatch):
    def body(x_gmem, o_gmem, smem, barrier):
        @plgpu.nd_loop((2, 2), collective_axes="x")
        def _(info):
            i, j = info.index
            tile = (pl.ds(i * 64, 64), pl.ds(j * 64, 64))
            tma_in(x_gmem.at[tile], smem, barrier)
            tma_out(smem[...] * 2, smem, o_gmem.at[tile])

    call = kernel(body, sds((128, 128)), [plgpu.SMEM((64, 64), F32), plgpu.Barrier()],
                  grid=(2,), grid_names=("x",))
    same(monkeypatch, call, sds((128, 128)))


# --- WGMMA -----------------------------------------------------------------------------

def _wgmma_kernel(m, k, n, dtype, acc_dtype=F32, *, swizzle=128, transpose_a=False,
                  transpose_b=False, lhs_in_registers=False, out_dtype=None):
    out_dtype = out_dtype or acc_dtype
    a_shape = (k, m) if transpose_a else (m, k)
    b_shape = (n, k) if transpose_b else (k, n)

    def body(a_gmem, b_gmem, o_gmem, a_smem, b_smem, o_smem, barrier):
        tma_in(a_gmem, a_smem, barrier.at[0])
        tma_in(b_gmem, b_smem, barrier.at[1])
        a = a_smem.T if transpose_a else a_smem
        b = b_smem.T if transpose_b else b_smem

        def scope(acc_ref):
            plgpu.wgmma(acc_ref, a[...] if lhs_in_registers else a, b)
            plgpu.wgmma_wait(0)
            return acc_ref[...]

        tma_out(pl.run_scoped(scope, plgpu.ACC((m, n), acc_dtype)).astype(out_dtype), o_smem,
                o_gmem)

    scratch = [swizzled(a_shape, dtype, swizzle), swizzled(b_shape, dtype, swizzle),
               plgpu.SMEM((m, n), out_dtype), plgpu.Barrier(num_barriers=2)]
    return kernel(body, sds((m, n), out_dtype), scratch), (sds(a_shape, dtype),
                                                          sds(b_shape, dtype))


@pytest.mark.parametrize("n", [64, 128, 256])
@pytest.mark.parametrize("swizzle", [32, 64, 128])
def test_wgmma_shapes_and_swizzles(monkeypatch, n, swizzle):
    dtype = BF16 if n == 128 else F16
    call, args = _wgmma_kernel(64, 64, n, dtype, swizzle=swizzle)
    same(monkeypatch, call, *args)


@pytest.mark.parametrize("m", [128, 192])
def test_wgmma_taller_accumulators(monkeypatch, m):
    call, args = _wgmma_kernel(m, 64, 128, F16, out_dtype=F16)
    same(monkeypatch, call, *args)


def test_wgmma_f16_accumulator(monkeypatch):
    call, args = _wgmma_kernel(64, 64, 128, F16, acc_dtype=F16)
    same(monkeypatch, call, *args)


@pytest.mark.parametrize("transpose_a, transpose_b", [(True, False), (True, True)])
def test_wgmma_transposed_operands(monkeypatch, transpose_a, transpose_b):
    call, args = _wgmma_kernel(64, 64, 128, F16, transpose_a=transpose_a,
                               transpose_b=transpose_b)
    same(monkeypatch, call, *args)


def test_wgmma_tf32(monkeypatch):
    call, args = _wgmma_kernel(64, 32, 64, F32, transpose_b=True)
    same(monkeypatch, call, *args)


def test_wgmma_int8(monkeypatch):
    call, args = _wgmma_kernel(64, 128, 128, I8, acc_dtype=I32, transpose_b=True)
    same(monkeypatch, call, *args)


@pytest.mark.parametrize("dtype", [F16, BF16])
def test_wgmma_lhs_in_registers(monkeypatch, dtype):
    call, args = _wgmma_kernel(64, 64, 128, dtype, lhs_in_registers=True)
    same(monkeypatch, call, *args)


def test_wgmma_k_loop_then_add_c(monkeypatch):
    """A loop issues one WGMMA per K step; the epilogue adds C."""
    m, k, n, tk = 64, 256, 128, 64

    def body(a_gmem, b_gmem, c_gmem, o_gmem, a_smem, b_smem, c_smem, barrier):
        tma_in(a_gmem, a_smem, barrier.at[0])
        tma_in(b_gmem, b_smem, barrier.at[1])
        tma_in(c_gmem, c_smem, barrier.at[2])
        def scope(acc_ref):
            @pl.loop(0, k // tk)
            def _(i):
                plgpu.wgmma(acc_ref, a_smem.at[i], b_smem.at[i])
                plgpu.wgmma_wait(1)

            return plgpu.wgmma_accumulator_load(acc_ref)

        acc = pl.run_scoped(scope, plgpu.ACC((m, n), F32))
        tma_out(acc + c_smem[...], c_smem, o_gmem)

    scratch = [swizzled((k // tk, m, tk)), swizzled((k // tk, tk, n)),
               plgpu.SMEM((m, n), F32), plgpu.Barrier(num_barriers=3)]
    call = kernel(body, sds((m, n)), scratch)
    same(monkeypatch, call, sds((k // tk, m, tk), F16), sds((k // tk, tk, n), F16),
         sds((m, n)))


def test_wgmma_two_warpgroups_split_m(monkeypatch):
    """Each of two warpgroups multiplies its own 64-row half of A."""
    def body(a_gmem, b_gmem, o_gmem, a_smem, b_smem, o_smem, barrier):
        wg = lax.axis_index("wg")

        @pl.when(wg == 0)
        def _():
            plgpu.copy_gmem_to_smem(a_gmem, a_smem, barrier.at[0])
            plgpu.copy_gmem_to_smem(b_gmem, b_smem, barrier.at[1])

        plgpu.barrier_wait(barrier.at[0])
        plgpu.barrier_wait(barrier.at[1])

        def scope(acc_ref):
            plgpu.wgmma(acc_ref, a_smem.at[pl.ds(wg * 64, 64)], b_smem)
            return acc_ref[...]

        o_smem.at[pl.ds(wg * 64, 64)][...] = pl.run_scoped(
            scope, plgpu.ACC((64, 128), F32)).astype(F16)
        plgpu.commit_smem()

        @pl.when(wg == 0)
        def _():
            plgpu.copy_smem_to_gmem(o_smem, o_gmem)
            plgpu.wait_smem_to_gmem(0)

    call = kernel(body, sds((128, 128), F16),
                  [swizzled((128, 64)), swizzled((64, 128)), swizzled((128, 128)),
                   plgpu.Barrier(num_barriers=2)], num_threads=2, thread_name="wg")
    same(monkeypatch, call, sds((128, 64), F16), sds((64, 128), F16))


def test_wgmma_epilogue_with_bias_and_relu(monkeypatch):
    def body(a_gmem, b_gmem, bias_gmem, o_gmem, a_smem, b_smem, o_smem, barrier):
        tma_in(a_gmem, a_smem, barrier.at[0])
        tma_in(b_gmem, b_smem, barrier.at[1])

        def scope(acc_ref):
            plgpu.wgmma(acc_ref, a_smem, b_smem)
            return acc_ref[...]

        acc = pl.run_scoped(scope, plgpu.ACC((64, 128), F32))
        bias = plgpu.load(bias_gmem, layout=plgpu.Layout.WGMMA.reduce(0),
                          optimized=False)
        y = jnp.maximum(acc + lax.broadcast_in_dim(bias, (64, 128), (1,)), 0)
        tma_out(y.astype(F16), o_smem, o_gmem)

    call = kernel(body, sds((64, 128), F16),
                  [swizzled((64, 64)), swizzled((64, 128)), swizzled((64, 128)),
                   plgpu.Barrier(num_barriers=2)])
    same(monkeypatch, call, sds((64, 64), F16), sds((64, 128), F16), sds((128,)))


@pytest.mark.parametrize("force_while", [False, True], ids=["for", "while"])
def test_accumulator_initialized_in_run_state_and_carried(monkeypatch, force_while):
    """``ACC.init`` under ``run_state``; a loop re-reads the accumulator."""
    def body(x_gmem, o_gmem, x_smem, o_smem, barrier):
        tma_in(x_gmem, x_smem, barrier)

        def scope(acc_ref):
            lb, ub = (jnp.int32(0), jnp.int32(4)) if force_while else (0, 4)
            return lax.fori_loop(lb, ub, lambda _, v: v + acc_ref[...], acc_ref[...])

        tma_out(pl.run_state(scope)(plgpu.ACC.init(x_smem[...])), o_smem, o_gmem)

    call = kernel(body, sds((64, 64), F16), [swizzled((64, 64)), plgpu.SMEM((64, 64), F16),
                                             plgpu.Barrier()])
    same(monkeypatch, call, sds((64, 64), F16))


@pytest.mark.parametrize("update", [False, True])
def test_wgmma_from_registers_into_an_initialized_accumulator(monkeypatch, update):
    def body(a_gmem, b_gmem, i_gmem, o_gmem, a_smem, b_smem, i_smem, barrier):
        tma_in(a_gmem, a_smem, barrier.at[0])
        tma_in(b_gmem, b_smem, barrier.at[1])
        tma_in(i_gmem, i_smem, barrier.at[2])

        def scope(acc_ref):
            if update:
                acc_ref[...] *= 2
            plgpu.wgmma(acc_ref, a_smem[...], b_smem)

        tma_out(pl.run_state(scope)(plgpu.ACC.init(i_smem[...])), i_smem, o_gmem)

    call = kernel(body, sds((64, 192), F16),
                  [swizzled((64, 128)), swizzled((128, 192)), swizzled((64, 192)),
                   plgpu.Barrier(num_barriers=3)])
    same(monkeypatch, call, sds((64, 128), F16), sds((128, 192), F16), sds((64, 192), F16))


def test_outer_accumulator_updated_inside_run_state(monkeypatch):
    def body(a_gmem, b_gmem, o_gmem, barrier):
        def outer(b_smem, acc):
            tma_in(b_gmem, b_smem, barrier)

            def inner(_):
                a = plgpu.load(a_gmem, layout=plgpu.Layout.WGMMA, optimized=False)
                plgpu.wgmma(acc, a, b_smem)

            pl.run_state(inner)(plgpu.ACC.init(
                plgpu.layout_cast(jnp.zeros((64, 64), F32), plgpu.Layout.WGMMA)))
            o_gmem[...] = acc[...]

        pl.run_scoped(outer, swizzled((128, 192)), plgpu.ACC((64, 192), F32))

    call = kernel(body, sds((64, 192)), [plgpu.Barrier()])
    same(monkeypatch, call, sds((64, 128), F16), sds((128, 192), F16))


def test_wgmma_into_accumulator_slices(monkeypatch):
    def body(a_gmem, b_gmem, o_gmem, a_smem, b_smem, barrier):
        tma_in(a_gmem, a_smem, barrier.at[0])
        tma_in(b_gmem, b_smem, barrier.at[1])

        def scope(acc_ref):
            plgpu.wgmma(acc_ref.at[:, :128], a_smem, b_smem.at[:, 128:])
            plgpu.wgmma(acc_ref.at[:, 128:], a_smem, b_smem.at[:, :128])
            return acc_ref[:, :64], acc_ref[:, 64:]

        left, right = pl.run_scoped(scope, plgpu.ACC((64, 256), F32))
        o_gmem[:, :64] = left
        o_gmem[:, 64:] = right

    call = kernel(body, sds((64, 256)), [swizzled((64, 128)), swizzled((128, 256)),
                                         plgpu.Barrier(num_barriers=2)])
    same(monkeypatch, call, sds((64, 128), F16), sds((128, 256), F16))


def test_two_accumulators_with_staggered_waits(monkeypatch):
    def body(a_gmem, b_gmem, o0, o1, a_smem, b_smem, barrier):
        tma_in(a_gmem, a_smem, barrier.at[0])
        tma_in(b_gmem.at[0], b_smem.at[0], barrier.at[1])
        tma_in(b_gmem.at[1], b_smem.at[1], barrier.at[2])

        def scope(acc0, acc1):
            plgpu.wgmma(acc0, a_smem, b_smem.at[0])
            plgpu.wgmma(acc1, a_smem, b_smem.at[1])
            return (plgpu.wgmma_accumulator_load(acc0, wait_n=1),
                    plgpu.wgmma_accumulator_load(acc1, wait_n=0))

        o0[...], o1[...] = pl.run_scoped(scope, plgpu.ACC((64, 64), F32),
                                         plgpu.ACC((64, 64), F32))

    call = kernel(body, (sds((64, 64)), sds((64, 64))),
                  [swizzled((64, 64)), swizzled((2, 64, 64)), plgpu.Barrier(num_barriers=3)])
    same(monkeypatch, call, sds((64, 64), F16), sds((2, 64, 64), F16))


def test_wgmma_of_a_reshaped_rhs_with_unit_tiling(monkeypatch):
    def body(a_gmem, b_gmem, o_gmem, a_smem, b_smem, barrier):
        plgpu.copy_gmem_to_smem(a_gmem, a_smem, barrier)
        plgpu.copy_gmem_to_smem(b_gmem, b_smem, barrier)
        plgpu.barrier_wait(barrier)

        def scope(acc_ref):
            plgpu.wgmma(acc_ref, a_smem, b_smem.reshape(128, 128))
            return acc_ref[...]

        o_gmem[...] = pl.run_scoped(scope, plgpu.ACC((64, 128), F32))

    b_smem = plgpu.SMEM((128, 2, 64), F16, transforms=(plgpu.TilingTransform((8, 1, 64)),
                                                       plgpu.SwizzleTransform(128)))
    call = kernel(body, sds((64, 128)), [swizzled((64, 128)), b_smem,
                                         plgpu.Barrier(num_arrivals=2)])
    same(monkeypatch, call, sds((64, 128), F16), sds((128, 2, 64), F16))


@pytest.mark.parametrize("source, dim, m", [("smem", 0, 192), ("smem", 1, 192), ("gmem", 0, 64),
                                            ("gmem", 1, 192)])
def test_load_rows_and_columns_in_wgmma_layouts(monkeypatch, source, dim, m):
    layout = plgpu.Layout.WGMMA.reduce(dim)

    def body(x_gmem, o_gmem, x_smem, barrier):
        if source == "smem":
            tma_in(x_gmem, x_smem, barrier)
        src = x_smem if source == "smem" else x_gmem
        for i in range(2):
            o_gmem[i] = plgpu.load(src.at[i], layout=layout, optimized=source == "smem")

    call = kernel(body, sds((2, m)), [plgpu.SMEM((2, m), F32), plgpu.Barrier()])
    same(monkeypatch, call, sds((2, m)))


@pytest.mark.parametrize("dim", [0, 1])
def test_broadcast_row_or_column_as_wgmma_lhs(monkeypatch, dim):
    m, k, n = 64, 128, 192
    length = m if dim == 1 else k

    def body(x_gmem, b_gmem, o_gmem, x_smem, b_smem, barrier):
        tma_in(x_gmem, x_smem, barrier.at[0])
        tma_in(b_gmem, b_smem, barrier.at[1])
        x = plgpu.load(x_smem, layout=plgpu.Layout.WGMMA.reduce(dim))
        lhs = lax.broadcast_in_dim(x, (m, k), [1 - dim])

        def scope(acc_ref):
            plgpu.wgmma(acc_ref, lhs, b_smem)
            return acc_ref[...]

        o_gmem[...] = pl.run_scoped(scope, plgpu.ACC((m, n), F32))

    call = kernel(body, sds((m, n)), [plgpu.SMEM((length,), F16), swizzled((k, n)),
                                      plgpu.Barrier(num_barriers=2)])
    same(monkeypatch, call, sds((length,), F16), sds((k, n), F16))


def test_transposed_smem_in_the_wgmma_transposed_layout(monkeypatch):
    def body(x_gmem, o_gmem, x_smem, barrier):
        tma_in(x_gmem, x_smem, barrier)
        x = plgpu.load(x_smem.T, layout=plgpu.Layout.WGMMA_TRANSPOSED)
        x_smem.T[...] = x + 1
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(x_smem, o_gmem)
        plgpu.wait_smem_to_gmem(0)

    call = kernel(body, sds((8, 64)), [swizzled((8, 64), F32, 64), plgpu.Barrier()])
    same(monkeypatch, call, sds((8, 64)))


@pytest.mark.parametrize("dtype", [I8, jnp.float8_e4m3fn, jnp.float8_e5m2])
def test_wgmma_8bit_lhs_in_registers(monkeypatch, dtype):
    acc_dtype = I32 if dtype == I8 else F32

    def body(a_gmem, b_gmem, o_gmem, a_smem, b_smem, barrier):
        tma_in(a_gmem, a_smem, barrier.at[0])
        tma_in(b_gmem, b_smem, barrier.at[1])

        def scope(acc_ref):
            a = plgpu.load(a_smem, layout=plgpu.Layout.WGMMA_8BIT)
            plgpu.wgmma(acc_ref, a, b_smem.transpose((1, 0)))
            return acc_ref[...]

        o_gmem[...] = pl.run_scoped(scope, plgpu.ACC((64, 192), acc_dtype))

    call = kernel(body, sds((64, 192), acc_dtype),
                  [swizzled((64, 128), dtype, 64), swizzled((192, 128), dtype, 64),
                   plgpu.Barrier(num_barriers=2)])
    same(monkeypatch, call, sds((64, 128), dtype), sds((192, 128), dtype))


@pytest.mark.parametrize("types", [(jnp.float8_e4m3fn, jnp.float8_e5m2), (U8, U8)],
                         ids=["e4m3xe5m2", "u8"])
def test_wgmma_8bit_operands_in_smem(monkeypatch, types):
    a_type, b_type = types
    acc_dtype = I32 if a_type == U8 else F32

    def body(a_gmem, b_gmem, o_gmem, a_smem, b_smem, barrier):
        tma_in(a_gmem, a_smem, barrier.at[0])
        tma_in(b_gmem, b_smem, barrier.at[1])

        def scope(acc_ref):
            plgpu.wgmma(acc_ref, a_smem, b_smem.transpose((1, 0)))
            return acc_ref[...]

        o_gmem[...] = pl.run_scoped(scope, plgpu.ACC((64, 64), acc_dtype))

    call = kernel(body, sds((64, 64), acc_dtype),
                  [swizzled((64, 128), a_type), swizzled((64, 128), b_type),
                   plgpu.Barrier(num_barriers=2)])
    same(monkeypatch, call, sds((64, 128), a_type), sds((64, 128), b_type))


@pytest.mark.parametrize("transpose", [(False, False), (True, False), (False, True)],
                         ids=["nn", "tn", "nt"])
def test_pipelined_matmul_with_delayed_release(monkeypatch, transpose):
    """A 2x2 parallel grid of 128x128 tiles; the K pipeline releases operand
    buffers one step late because WGMMA still reads them."""
    lhs_t, rhs_t = transpose
    tile, tile_k, steps = 128, 64, 3
    t = transforms(F16)

    def body(a_gmem, b_gmem, o_gmem, acc_ref):
        m, n = lax.axis_index("m"), lax.axis_index("n")

        def step(idx, a_smem, b_smem, o_smem):
            k, = idx
            a = a_smem.transpose((1, 0)) if lhs_t else a_smem
            b = b_smem.transpose((1, 0)) if rhs_t else b_smem
            plgpu.wgmma(acc_ref, a, b)

            @pl.when(k == steps - 1)
            def _():
                o_smem[...] = acc_ref[...].astype(F16)

            plgpu.wgmma_wait(1)

        a_spec = (plgpu.BlockSpec((tile_k, tile), lambda k: (k, m), delay_release=1, transforms=t)
                  if lhs_t else
                  plgpu.BlockSpec((tile, tile_k), lambda k: (m, k), delay_release=1, transforms=t))
        b_spec = (plgpu.BlockSpec((tile, tile_k), lambda k: (n, k), delay_release=1, transforms=t)
                  if rhs_t else
                  plgpu.BlockSpec((tile_k, tile), lambda k: (k, n), delay_release=1, transforms=t))
        plgpu.emit_pipeline(
            step, grid=(steps,), in_specs=[a_spec, b_spec],
            out_specs=[plgpu.BlockSpec((tile, tile), lambda k: (m, n), transforms=t)],
            max_concurrent_steps=2)(a_gmem, b_gmem, o_gmem)

    k = steps * tile_k
    a_shape = (k, 2 * tile) if lhs_t else (2 * tile, k)
    b_shape = (2 * tile, k) if rhs_t else (k, 2 * tile)
    call = kernel(body, sds((2 * tile, 2 * tile), F16), [plgpu.ACC((tile, tile), F32)],
                  grid=(2, 2), grid_names=("m", "n"))
    same(monkeypatch, call, sds(a_shape, F16), sds(b_shape, F16))


def test_attention_block_in_one_warpgroup(monkeypatch):
    """S = Q K^T (WGMMA), a masked softmax in the WGMMA layout, O = P V with P
    in registers."""
    q_len, kv_len, d = 64, 128, 64

    def body(q_gmem, k_gmem, v_gmem, o_gmem, q_smem, k_smem, v_smem, o_smem, barrier):
        tma_in(q_gmem, q_smem, barrier.at[0])
        tma_in(k_gmem, k_smem, barrier.at[1])
        tma_in(v_gmem, v_smem, barrier.at[2])

        def qk(acc_ref):
            plgpu.wgmma(acc_ref, q_smem, k_smem.transpose((1, 0)))
            return acc_ref[...]

        s = pl.run_scoped(qk, plgpu.ACC((q_len, kv_len), F32)) * 0.125
        rows = plgpu.broadcasted_iota(I32, (q_len, kv_len), 0, layout=plgpu.Layout.WGMMA)
        cols = plgpu.broadcasted_iota(I32, (q_len, kv_len), 1, layout=plgpu.Layout.WGMMA)
        s = jnp.where(cols <= rows + 64, s, -jnp.inf)
        p = jnp.exp(s - jnp.max(s, axis=1, keepdims=True))
        denom = jnp.sum(p, axis=1)

        def pv(acc_ref):
            plgpu.wgmma(acc_ref, p.astype(F16), v_smem)
            return acc_ref[...]

        o = pl.run_scoped(pv, plgpu.ACC((q_len, d), F32)) / lax.broadcast_in_dim(
            denom, (q_len, d), [0])
        tma_out(o.astype(F16), o_smem, o_gmem)

    call = kernel(body, sds((q_len, d), F16),
                  [swizzled((q_len, d)), swizzled((kv_len, d)), swizzled((kv_len, d)),
                   swizzled((q_len, d)), plgpu.Barrier(num_barriers=3)])
    same(monkeypatch, call, sds((q_len, d), F16), sds((kv_len, d), F16),
         sds((kv_len, d), F16))


def test_online_softmax_carried_through_a_loop(monkeypatch):
    """Running max and sum (row vectors) and the output tile (WGMMA layout) are
    loop carries over KV blocks."""
    q_len, block, d, blocks = 64, 64, 64, 3

    def body(q_gmem, k_gmem, v_gmem, o_gmem, q_smem, k_smem, v_smem, o_smem, barrier):
        tma_in(q_gmem, q_smem, barrier.at[0])

        def step(i, carry):
            m_prev, l_prev, acc = carry
            tma_in(k_gmem.at[i], k_smem, barrier.at[1])
            tma_in(v_gmem.at[i], v_smem, barrier.at[2])

            def qk(acc_ref):
                plgpu.wgmma(acc_ref, q_smem, k_smem.transpose((1, 0)))
                return acc_ref[...]

            s = pl.run_scoped(qk, plgpu.ACC((q_len, block), F32))
            m_new = jnp.maximum(m_prev, jnp.max(s, axis=1))
            alpha = jnp.exp(m_prev - m_new)
            p = jnp.exp(s - lax.broadcast_in_dim(m_new, s.shape, [0]))
            l_new = l_prev * alpha + jnp.sum(p, axis=1)

            def pv(acc_ref):
                plgpu.wgmma(acc_ref, p.astype(F16), v_smem)
                return acc_ref[...]

            acc = acc * lax.broadcast_in_dim(alpha, acc.shape, [0]) + pl.run_scoped(
                pv, plgpu.ACC((q_len, d), F32))
            return m_new, l_new, acc

        row = plgpu.Layout.WGMMA.reduce(1)
        init = (plgpu.layout_cast(jnp.full((q_len,), -jnp.inf, F32), row),
                plgpu.layout_cast(jnp.zeros((q_len,), F32), row),
                plgpu.layout_cast(jnp.zeros((q_len, d), F32), plgpu.Layout.WGMMA))
        _, l_final, acc = lax.fori_loop(0, blocks, step, init)
        tma_out((acc / lax.broadcast_in_dim(l_final, acc.shape, [0])).astype(F16), o_smem, o_gmem)

    call = kernel(body, sds((q_len, d), F16),
                  [swizzled((q_len, d)), swizzled((block, d)), swizzled((block, d)),
                   swizzled((q_len, d)), plgpu.Barrier(num_barriers=3)])
    same(monkeypatch, call, sds((q_len, d), F16), sds((blocks, block, d), F16),
         sds((blocks, block, d), F16))


def test_cond_picking_between_vectors_of_different_origins(monkeypatch):
    """One branch yields a WGMMA result, the other a value loaded from SMEM."""
    def body(a_gmem, b_gmem, o_gmem, a_smem, b_smem, o_smem, barrier):
        tma_in(a_gmem, a_smem, barrier.at[0])
        tma_in(b_gmem, b_smem, barrier.at[1])

        def mma():
            def scope(acc_ref):
                plgpu.wgmma(acc_ref, a_smem, b_smem)
                return acc_ref[...]
            return pl.run_scoped(scope, plgpu.ACC((64, 64), F32)).astype(F16)

        y = lax.cond(lax.axis_index("x") == 0, mma, lambda: a_smem[...] * 2)
        tma_out(y, o_smem, o_gmem.at[lax.axis_index("x")])

    call = kernel(body, sds((2, 64, 64), F16),
                  [swizzled((64, 64)), swizzled((64, 64)), swizzled((64, 64)),
                   plgpu.Barrier(num_barriers=2)], grid=(2,), grid_names=("x",))
    same(monkeypatch, call, sds((64, 64), F16), sds((64, 64), F16))


def test_scalar_reads_and_writes_of_smem(monkeypatch):
    def body(x_gmem, o_gmem, x_smem, o_smem, barrier):
        tma_in(x_gmem, x_smem, barrier)
        total = x_smem[0] + x_smem[5] * x_smem[127]
        o_smem[...] = x_smem[...] * total
        o_smem[3] = total
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(o_smem, o_gmem)
        plgpu.wait_smem_to_gmem(0)

    call = kernel(body, sds((128,)), [plgpu.SMEM((128,), F32), plgpu.SMEM((128,), F32),
                                      plgpu.Barrier()])
    same(monkeypatch, call, sds((128,)))


def test_tma_with_a_predicate_and_oob_fill(monkeypatch):
    def body(x_gmem, o_gmem, smem, barrier):
        i = lax.axis_index("x")
        plgpu.copy_gmem_to_smem(x_gmem.at[pl.ds(i * 64, 64)], smem, barrier,
                                predicate=i < 2)
        plgpu.barrier_wait(barrier)
        tma_out(smem[...] + 1, smem, o_gmem.at[pl.ds(i * 64, 64)])

    call = kernel(body, sds((192, 64), F16), [swizzled((64, 64)), plgpu.Barrier()],
                  grid=(3,), grid_names=("x",))
    same(monkeypatch, call, sds((192, 64), F16))


def test_warp_map_copies_between_warps(monkeypatch):
    """Warp 0 issues a TMA load; warp 1 waits for it and stores it back."""
    def body(x_gmem, o_gmem):
        def scope(smem, barrier):
            @plgpu.warp_map
            def _(warp):
                @pl.when(warp == 0)
                def _():
                    plgpu.copy_gmem_to_smem(x_gmem.at[32:64], smem, barrier)

                @pl.when(warp == 1)
                def _():
                    plgpu.barrier_wait(barrier)
                    plgpu.copy_smem_to_gmem(smem, o_gmem)
                    plgpu.wait_smem_to_gmem(0)

        pl.run_scoped(scope, plgpu.SMEM((32, 32), F32), plgpu.Barrier())

    same(monkeypatch, kernel(body, sds((32, 32))), sds((64, 32)))


@pytest.mark.parametrize("force_while", [False, True], ids=["for", "while"])
def test_warp_map_loop_of_row_stores(monkeypatch, force_while):
    def body(o_gmem):
        def scope(smem):
            for i in range(4):
                smem[i, :] = jnp.full((128,), i, I32)
            plgpu.commit_smem()

            @plgpu.warp_map
            def _(warp):
                @pl.when(warp == 0)
                def _():
                    lb, ub = (jnp.int32(0), jnp.int32(4)) if force_while else (0, 4)

                    def store(i, _):
                        plgpu.copy_smem_to_gmem(smem.at[pl.ds(i, 1)], o_gmem.at[pl.ds(i, 1)])
                    lax.fori_loop(lb, ub, store, None)

            plgpu.wait_smem_to_gmem(0)

        pl.run_scoped(scope, plgpu.SMEM((4, 128), I32))

    same(monkeypatch, kernel(body, sds((4, 128), I32)))


def test_inline_mgpu_in_a_warp(monkeypatch):
    from jax._src.lib.mlir.dialects import memref as memref_dialect

    def body(y_gmem, z_gmem):
        @plgpu.warp_map
        def _(warp):
            @plgpu.inline_mgpu(arg_types=(plgpu.RefType(), plgpu.Layout.WG_SPLAT),
                               return_type=plgpu.ShapeDtypeStruct((), I32,
                                                                  layout=plgpu.Layout.WG_SPLAT))
            def write(_, ref, w):
                memref_dialect.store(w.registers.item(), ref, [])
                return w + w

            @pl.when(warp == 1)
            def _():
                z_gmem[...] = write(y_gmem, warp)

    same(monkeypatch, kernel(body, (sds((), I32), sds((), I32))))


# --- more layouts, conversions and control flow ------------------------------------------

@pytest.mark.parametrize("dst", [BF16, F16, jnp.float8_e4m3fn, jnp.float8_e5m2, I8, I32])
def test_conversions_in_the_wgmma_layout(monkeypatch, dst):
    def fn(x):
        return plgpu.layout_cast(x, plgpu.Layout.WGMMA).astype(dst)

    t = sds((64, 128))
    same(monkeypatch, mapped(fn, [t], sds((64, 128), dst)), t)


@pytest.mark.parametrize("src, dst", [(I8, BF16), (jnp.float8_e4m3fn, F16), (U8, BF16)],
                         ids=["i8", "e4m3", "u8"])
def test_upcasts_from_8bit_layouts(monkeypatch, src, dst):
    def body(x_gmem, o_gmem, x_smem, o_smem, barrier):
        tma_in(x_gmem, x_smem, barrier)
        x = plgpu.load(x_smem, layout=plgpu.Layout.WGMMA_UPCAST_2X)
        tma_out(plgpu.layout_cast(x.astype(dst), plgpu.Layout.WGMMA), o_smem, o_gmem)

    call = kernel(body, sds((64, 128), dst), [swizzled((64, 128), src),
                                              swizzled((64, 128), dst), plgpu.Barrier()])
    same(monkeypatch, call, sds((64, 128), src))


def test_select_n_and_bitcasts_of_halves(monkeypatch):
    def fn(x):
        bits = lax.bitcast_convert_type(x, I16)
        y = lax.select_n((bits & 1) == 1, x * 2, -x)
        return lax.bitcast_convert_type(lax.bitcast_convert_type(y, I16) ^ 1, F16)

    t = sds((128, 64), F16)
    same(monkeypatch, mapped(fn, [t], t), t)


def test_scalar_broadcasts_and_splats(monkeypatch):
    def body(s_gmem, o_gmem, o_smem):
        s = s_gmem[0]
        splat = lax.broadcast_in_dim(s, (128, 64), ())
        tma_out(plgpu.layout_cast(splat, plgpu.Layout.WGMMA) + jnp.full((128, 64), 2.0, F32),
                o_smem, o_gmem)

    same(monkeypatch, kernel(body, sds((128, 64)), [plgpu.SMEM((128, 64), F32)]), sds((1,)))


@pytest.mark.parametrize("axis", [0, 1])
def test_concatenate_and_slice_in_the_wgmma_layout(monkeypatch, axis):
    def fn(x, y):
        x = plgpu.layout_cast(x, plgpu.Layout.WGMMA)
        y = plgpu.layout_cast(y, plgpu.Layout.WGMMA)
        both = jnp.concatenate([x, y], axis=axis)
        return both[64:128] if axis == 0 else both[:, 64:128]

    t = sds((64, 128))
    same(monkeypatch, mapped(fn, [t, t], t if axis == 0 else sds((64, 64))), t, t)


def test_scan_carrying_vectors(monkeypatch):
    def fn(x):
        def step(carry, _):
            a, b = carry
            return (b, a + b * 0.5), None
        (a, b), _ = lax.scan(step, (x, jnp.ones_like(x)), None, length=3)
        return a - b

    t = sds((128, 64))
    same(monkeypatch, mapped(fn, [t], t), t)


def test_while_loop_with_a_vector_carry(monkeypatch):
    def body(x_gmem, n_gmem, o_gmem, x_smem, o_smem, barrier):
        tma_in(x_gmem, x_smem, barrier)
        n = n_gmem[0]

        def cond(carry):
            i, _ = carry
            return i < n

        def step(carry):
            i, v = carry
            return i + 1, jnp.tanh(v) + i.astype(F32)

        _, v = lax.while_loop(cond, step, (jnp.int32(0), x_smem[...]))
        tma_out(v, o_smem, o_gmem)

    call = kernel(body, sds((128, 64)), [plgpu.SMEM((128, 64), F32),
                                         plgpu.SMEM((128, 64), F32), plgpu.Barrier()])
    same(monkeypatch, call, sds((128, 64)), sds((1,), I32))


def test_nested_loops_over_smem_tiles(monkeypatch):
    def body(x_gmem, o_gmem, x_smem, o_smem, barrier):
        tma_in(x_gmem, x_smem, barrier)

        def outer(i, acc):
            def inner(j, acc):
                return acc + x_smem.at[i, j][...] * (i * 2 + j).astype(F32)
            return lax.fori_loop(0, 2, inner, acc)

        tma_out(lax.fori_loop(0, 2, outer, jnp.zeros((64, 64), F32)), o_smem, o_gmem)

    call = kernel(body, sds((64, 64)), [plgpu.SMEM((2, 2, 64, 64), F32),
                                        plgpu.SMEM((64, 64), F32), plgpu.Barrier()])
    same(monkeypatch, call, sds((2, 2, 64, 64)))


def test_cond_with_vector_and_scalar_results(monkeypatch):
    def body(x_gmem, o_gmem, s_gmem, x_smem, o_smem, barrier):
        tma_in(x_gmem, x_smem, barrier)
        x = x_smem[...]
        i = lax.axis_index("x")
        y, s = lax.cond(i % 2 == 0, lambda: (x + 1, i * 2), lambda: (x * x, i + 7))
        s_gmem[i] = s
        tma_out(y, o_smem, o_gmem.at[i])

    call = kernel(body, (sds((4, 256)), sds((4,), I32)),
                  [plgpu.SMEM((256,), F32), plgpu.SMEM((256,), F32), plgpu.Barrier()],
                  grid=(4,), grid_names=("x",))
    same(monkeypatch, call, sds((256,)))


def test_smem_ref_union_and_reshaped_views(monkeypatch):
    def body(x_gmem, o_gmem, union, barrier):
        wide, narrow = union
        tma_in(x_gmem, wide, barrier)
        narrow[...] = wide.reshape(2, 64, 64)[...].astype(F16)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(narrow, o_gmem)
        plgpu.wait_smem_to_gmem(0)

    call = kernel(body, sds((2, 64, 64), F16),
                  [plgpu.RefUnion(plgpu.SMEM((128, 64), F32), plgpu.SMEM((2, 64, 64), F16)),
                   plgpu.Barrier()])
    same(monkeypatch, call, sds((128, 64)))


def test_axis_sizes_and_multiple_of(monkeypatch):
    def body(x_gmem, o_gmem, smem, barrier):
        i = lax.axis_index("x")
        n = lax.axis_size("x")
        start = pl.multiple_of(i * 64, 64)
        tma_in(x_gmem.at[pl.ds(start, 64)], smem, barrier)
        tma_out(smem[...] * (n * 1.5), smem, o_gmem.at[pl.ds(start, 64)])

    call = kernel(body, sds((256, 64)), [plgpu.SMEM((64, 64), F32), plgpu.Barrier()],
                  grid=(4,), grid_names=("x",))
    same(monkeypatch, call, sds((256, 64)))


def test_semaphores_signalled_in_parallel_and_read(monkeypatch):
    def body(o_gmem):
        a = pl.get_global(plgpu.SemaphoreType.REGULAR)
        b = pl.get_global(plgpu.SemaphoreType.REGULAR)
        i = lax.axis_index("x")

        @pl.when(i == 0)
        def _():
            plgpu.semaphore_signal_parallel(plgpu.SemaphoreSignal(a, device_id=None, inc=5),
                                            plgpu.SemaphoreSignal(b, device_id=None, inc=10))

        @pl.when(i == 1)
        def _():
            pl.semaphore_wait(a, value=5, decrement=False)
            pl.semaphore_wait(b, value=10, decrement=False)
            o_gmem[0] = pl.semaphore_read(a)
            o_gmem[1] = pl.semaphore_read(b)

    same(monkeypatch, kernel(body, sds((2,), I32), grid=(4,), grid_names=("x",)))


def test_scoped_semaphores(monkeypatch):
    def body(o_gmem):
        shared = pl.get_global(plgpu.SemaphoreType.REGULAR)

        def scope(local):
            i = lax.axis_index("x")
            pl.semaphore_signal(local)

            @pl.when(i == 0)
            def _():
                pl.semaphore_signal(shared)

            @pl.when(i == 1)
            def _():
                pl.semaphore_wait(shared)
                o_gmem[...] = jnp.ones((128,), F32)

            pl.semaphore_wait(local)

        pl.run_scoped(scope, plgpu.SemaphoreType.REGULAR)

    same(monkeypatch, kernel(body, sds((128,)), grid=(3,), grid_names=("x",)))


def test_wgmma_two_warpgroups_split_n_with_collective_scratch(monkeypatch):
    """Each warpgroup computes half the columns; scratch is shared (collective)."""
    def body(a_gmem, b_gmem, o_gmem):
        wg = lax.axis_index("wg")

        def scope(a_smem, b_smem, o_smem, barrier):
            @pl.when(wg == 0)
            def _():
                plgpu.copy_gmem_to_smem(a_gmem, a_smem, barrier.at[0])
                plgpu.copy_gmem_to_smem(b_gmem, b_smem, barrier.at[1])

            plgpu.barrier_wait(barrier.at[0])
            plgpu.barrier_wait(barrier.at[1])

            def mma(acc_ref):
                plgpu.wgmma(acc_ref, a_smem, b_smem.at[:, pl.ds(wg * 64, 64)])
                return acc_ref[...]

            acc = pl.run_scoped(mma, plgpu.ACC((64, 64), F32))
            o_smem.at[wg][...] = acc.astype(F16)
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(o_smem.at[wg], o_gmem.at[:, pl.ds(wg * 64, 64)])
            plgpu.wait_smem_to_gmem(0)

        pl.run_scoped(scope, swizzled((64, 64)), swizzled((64, 128)), swizzled((2, 64, 64)),
                      plgpu.Barrier(num_barriers=2), collective_axes="wg")

    call = kernel(body, sds((64, 128), F16), num_threads=2, thread_name="wg")
    same(monkeypatch, call, sds((64, 64), F16), sds((64, 128), F16))


def test_print_layout_and_vector_debug_print(monkeypatch):
    def body(x_gmem, o_gmem, x_smem, barrier):
        tma_in(x_gmem, x_smem, barrier)
        x = plgpu.layout_cast(x_smem[...], plgpu.Layout.WGMMA)
        plgpu.print_layout("x: {}", x)
        pl.debug_print("x = {}", x)
        o_gmem[...] = x

    call = kernel(body, sds((64, 64)), [plgpu.SMEM((64, 64), F32), plgpu.Barrier()])
    same(monkeypatch, call, sds((64, 64)))


# --- layouts and transforms left to inference --------------------------------------------

def test_values_built_only_from_constants_and_iotas(monkeypatch):
    def body(o_gmem, p_gmem, o_smem):
        rows = lax.broadcasted_iota(I32, (128, 64), 0)
        cols = lax.broadcasted_iota(I32, (128, 64), 1)
        mask = rows >= cols
        x = jnp.where(mask, jnp.full((128, 64), 1.5, F32), 0.0) + rows.astype(F32)
        p_gmem[...] = (cols * 3 + 1).astype(F16)
        tma_out(x, o_smem, o_gmem)

    call = kernel(body, (sds((128, 64)), sds((128, 64), F16)), [plgpu.SMEM((128, 64), F32)])
    same(monkeypatch, call)


def test_one_value_stored_to_differently_transformed_smem(monkeypatch):
    def body(x_gmem, o1, o2, o3, x_smem, s1, s2, s3, barrier):
        tma_in(x_gmem, x_smem, barrier)
        y = x_smem[...] * 2
        s1[...] = y
        s2[...] = y
        s3[...] = y + 1
        plgpu.commit_smem()
        for s, o in ((s1, o1), (s2, o2), (s3, o3)):
            plgpu.copy_smem_to_gmem(s, o)
        plgpu.wait_smem_to_gmem(0)

    t = sds((64, 64), F16)
    call = kernel(body, (t, t, t), [plgpu.SMEM((64, 64), F16), swizzled((64, 64), F16, 128),
                                    swizzled((64, 64), F16, 32), plgpu.SMEM((64, 64), F16),
                                    plgpu.Barrier()])
    same(monkeypatch, call, t)


@pytest.mark.parametrize("tile_k", [32, 64])
def test_emit_pipeline_wgmma_with_inferred_transforms(monkeypatch, tile_k):
    """No transforms on the block specs: inference picks the SMEM tiling and
    swizzle of the pipeline's buffers from the WGMMA that reads them."""
    def body(a_gmem, b_gmem, o_gmem, acc_ref):
        def step(_, a_smem, b_smem):
            plgpu.wgmma(acc_ref, a_smem, b_smem)
            plgpu.wgmma_wait(0)

        plgpu.emit_pipeline(step, grid=(128 // tile_k,),
                            in_specs=[pl.BlockSpec((64, tile_k), lambda k: (0, k)),
                                      pl.BlockSpec((tile_k, 128), lambda k: (k, 0))],
                            max_concurrent_steps=2)(a_gmem, b_gmem)
        o_gmem[...] = acc_ref[...].astype(F16)

    call = kernel(body, sds((64, 128), F16), [plgpu.ACC((64, 128), F32)])
    same(monkeypatch, call, sds((64, 128), F16), sds((128, 128), F16))


def test_wgmma_operands_in_smem_views_without_transforms(monkeypatch):
    """Slices, reshapes and transposes of untransformed SMEM feed a WGMMA."""
    def body(a_gmem, b_gmem, o_gmem, a_smem, b_smem, barrier):
        tma_in(a_gmem, a_smem, barrier.at[0])
        tma_in(b_gmem, b_smem, barrier.at[1])

        def scope(acc_ref):
            plgpu.wgmma(acc_ref, a_smem.at[1], b_smem.at[0].transpose((1, 0)))
            plgpu.wgmma(acc_ref, a_smem.at[0], b_smem.at[1].transpose((1, 0)))
            return acc_ref[...]

        o_gmem[...] = pl.run_scoped(scope, plgpu.ACC((64, 128), F32))

    call = kernel(body, sds((64, 128)), [plgpu.SMEM((2, 64, 64), F16),
                                         plgpu.SMEM((2, 128, 64), F16),
                                         plgpu.Barrier(num_barriers=2)])
    same(monkeypatch, call, sds((2, 64, 64), F16), sds((2, 128, 64), F16))


def test_loop_carry_starting_from_a_splat_and_updated_by_wgmma(monkeypatch):
    """The carry's initial value is a bare constant; only the loop body says
    it is a WGMMA accumulator."""
    def body(a_gmem, b_gmem, o_gmem, a_smem, b_smem, o_smem, barrier):
        tma_in(a_gmem, a_smem, barrier.at[0])
        tma_in(b_gmem, b_smem, barrier.at[1])

        def step(i, acc):
            def scope(acc_ref):
                plgpu.wgmma(acc_ref, a_smem.at[i], b_smem)
                return acc_ref[...]
            return acc + pl.run_scoped(scope, plgpu.ACC((64, 64), F32))

        acc = lax.fori_loop(0, 2, step, jnp.zeros((64, 64), F32))
        tma_out(jnp.maximum(acc, 0).astype(F16), o_smem, o_gmem)

    call = kernel(body, sds((64, 64), F16),
                  [plgpu.SMEM((2, 64, 64), F16), plgpu.SMEM((64, 64), F16),
                   plgpu.SMEM((64, 64), F16), plgpu.Barrier(num_barriers=2)])
    same(monkeypatch, call, sds((2, 64, 64), F16), sds((64, 64), F16))


def test_row_statistics_of_a_wgmma_result_without_casts(monkeypatch):
    def body(a_gmem, b_gmem, o_gmem, m_gmem, a_smem, b_smem, barrier):
        tma_in(a_gmem, a_smem, barrier.at[0])
        tma_in(b_gmem, b_smem, barrier.at[1])

        def scope(acc_ref):
            plgpu.wgmma(acc_ref, a_smem, b_smem)
            return acc_ref[...]

        s = pl.run_scoped(scope, plgpu.ACC((64, 128), F32))
        row_max = jnp.max(s, axis=1)
        col_sum = jnp.sum(s, axis=0)
        m_gmem[...] = row_max
        o_gmem[...] = s - lax.broadcast_in_dim(col_sum, s.shape, [1]) * 0.5

    call = kernel(body, (sds((64, 128)), sds((64,))),
                  [plgpu.SMEM((64, 64), F16), plgpu.SMEM((64, 128), F16),
                   plgpu.Barrier(num_barriers=2)])
    same(monkeypatch, call, sds((64, 64), F16), sds((64, 128), F16))


def test_where_with_a_scalar_predicate_and_scalar_operands(monkeypatch):
    def fn(x):
        first = lax.axis_index("x") == 0
        return (jnp.where(lax.broadcast_in_dim(first, x.shape, ()), x, 0.0)
                + jnp.where(x > 0, 1.0, -1.0))

    def body(x_gmem, o_gmem, x_smem, o_smem, barrier):
        tma_in(x_gmem, x_smem, barrier)
        tma_out(fn(x_smem[...]), o_smem, o_gmem.at[lax.axis_index("x")])

    call = kernel(body, sds((2, 128, 64)), [plgpu.SMEM((128, 64), F32),
                                            plgpu.SMEM((128, 64), F32), plgpu.Barrier()],
                  grid=(2,), grid_names=("x",))
    same(monkeypatch, call, sds((128, 64)))


def test_gmem_vector_loads_and_stores_of_several_shapes(monkeypatch):
    def body(a_gmem, b_gmem, c_gmem, oa, ob, oc):
        oa[...] = a_gmem[...] + 1
        ob[...] = b_gmem[...] * b_gmem[...]
        oc[...] = c_gmem[...].astype(F32) - 2

    call = kernel(body, (sds((512,)), sds((64, 128), F16), sds((2, 8, 128))))
    same(monkeypatch, call, sds((512,)), sds((64, 128), F16), sds((2, 8, 128), BF16))


@pytest.mark.parametrize("dtype", [F16, BF16])
@pytest.mark.parametrize("op", ["exp", "tanh", "rsqrt", "logistic", "abs", "neg", "round"])
def test_unary_math_on_half_types(monkeypatch, op, dtype):
    t = sds((128, 128), dtype)
    same(monkeypatch, mapped(UNARY[op], [t], t), t)


@pytest.mark.parametrize("shape", [(128,), (64, 256), (4, 8, 128), (2, 2, 64, 64)])
def test_vector_shapes(monkeypatch, shape):
    t = sds(shape)
    same(monkeypatch, mapped(lambda x, y: jnp.maximum(x, y) * 2 - y, [t, t], t), t, t)
