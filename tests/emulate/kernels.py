"""Validation kernels: what jax 0.11.2 itself lowers, with numpy's answer.

Each case is (function, inputs, reference, tolerance in ulp of the output
dtype; 0 means bit-exact)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

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
    arch: tuple[int, int] = (9, 0)


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


def _clz32(x):
    """Leading zeros of 32-bit integers, by Python's bit_length."""
    return np.vectorize(lambda v: 32 - int(v).bit_length(), otypes=[np.int32])(
        np.asarray(x).view(np.uint32).astype(np.int64))


def _with_edges(x):
    x.flat[:4] = [0, -1, 1, np.iinfo(np.int32).min]
    return x


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


def _tma_gather(direction, swizzle):
    """jax's 2-D TMA gather (``tile::gather4``) or scatter of 64 rows chosen by
    an index vector, the SMEM side swizzled or not; indices hit rows in any
    order, and a scatter leaves the rows it does not name untouched (zero).
    The gathered SMEM is also read by registers and the scattered SMEM written
    by them, so the TMA's swizzle must agree with jax's addressing."""
    dtype = np.float16
    smem_t = ((plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(swizzle))
              if swizzle else ())
    smem = plgpu.SMEM((64, 64), dtype, transforms=smem_t)
    idx = RNG.permutation(128)[:64].astype(np.int32)

    if direction == "gather":
        def gather(x_gmem, idx_gmem, o_gmem, direct_gmem, smem_ref, bar):
            i = plgpu.load(idx_gmem, layout=plgpu.Layout.TMA_INDICES, optimized=False)
            plgpu.copy_gmem_to_smem(x_gmem.at[i], smem_ref, bar)
            plgpu.barrier_wait(bar)
            direct_gmem[...] = smem_ref[...]
            plgpu.copy_smem_to_gmem(smem_ref, o_gmem)
            plgpu.wait_smem_to_gmem(0)
        fn = K(gather, (S((64, 64), dtype), S((64, 64), dtype)), [smem, plgpu.Barrier()])
        return Case(f"tma_gather4_swizzle{swizzle}", fn, [normal((128, 64), dtype), idx],
                    lambda x, i: (x[i], x[i]))

    def scatter(x_gmem, idx_gmem, o_gmem, smem_ref):
        i = plgpu.load(idx_gmem, layout=plgpu.Layout.TMA_INDICES, optimized=False)
        smem_ref[...] = plgpu.load(x_gmem, layout=plgpu.Layout.WGMMA, optimized=False)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(smem_ref, o_gmem.at[i])
        plgpu.wait_smem_to_gmem(0)

    def scattered(x, i):
        out = np.zeros((128, 64), dtype)
        out[i] = x
        return out
    fn = K(scatter, S((128, 64), dtype), [smem])
    return Case(f"tma_scatter4_swizzle{swizzle}", fn, [normal((64, 64), dtype), idx], scattered)


# --- layout casts, transposed SMEM views, pipelines, while loops -------------------------


def _cast_case(name, chain, dtype=np.float32, arch=(9, 0), op=lambda v, k: v * 2 + k):
    """Load in ``chain[0]``, then cast through every later layout, an op
    between each cast (so no cast folds away), and store in the last: the
    relayouts jax supports (WGMMA <-> WGMMA_TRANSPOSED, TCGEN05 <->
    TCGEN05_TRANSPOSED, the upcast layouts to WGMMA) move registers between
    threads through shuffles or SMEM."""
    def body(x_ref, o_ref):
        v = plgpu.load(x_ref, layout=chain[0], optimized=False)
        for k, layout in enumerate(chain[1:]):
            v = plgpu.layout_cast(op(v, k), layout)
        o_ref[...] = v

    def ref(x):
        for k in range(len(chain) - 1):
            x = np.asarray(op(x, dtype(k))).astype(dtype)
        return x
    x = (RNG.standard_normal((128, 128)) * 20).astype(dtype)
    return Case(f"layout_cast_{name}", K(body, S((128, 128), dtype)), [x], ref, arch=arch)


def _cast_splat(name, layout):
    """A splat constant cast to a tiled or strided layout (and doubled there),
    added to a value in that layout."""
    L = plgpu.Layout

    def body(x_ref, o_ref):
        s = plgpu.layout_cast(jnp.full((128, 128), 1.5, jnp.float32), layout) * 2
        if layout == L.WGMMA_TRANSPOSED:  # loads and stores cannot use it: cast there and back
            v = plgpu.layout_cast(plgpu.load(x_ref, layout=L.WGMMA, optimized=False), layout)
            o_ref[...] = plgpu.layout_cast(v + s, L.WGMMA)
        else:
            o_ref[...] = plgpu.load(x_ref, layout=layout, optimized=False) + s
    return Case(f"layout_cast_splat_to_{name}", K(body, S((128, 128), jnp.float32)),
                [normal((128, 128))], lambda x: x + np.float32(3))


def _casts():
    L = plgpu.Layout

    def xor(v, k):
        return v ^ (k + 3)  # 8-bit values allow bitwise ops only

    return [
        _cast_case("wgmma_transposed_f32", [L.WGMMA, L.WGMMA_TRANSPOSED, L.WGMMA]),
        _cast_case("wgmma_transposed_f16", [L.WGMMA, L.WGMMA_TRANSPOSED, L.WGMMA], np.float16),
        _cast_case("tcgen05_transposed", [L.TCGEN05, L.TCGEN05_TRANSPOSED, L.TCGEN05],
                   arch=(10, 0)),
        _cast_case("upcast_2x_to_wgmma_f16", [L.WGMMA_UPCAST_2X, L.WGMMA], np.float16),
        _cast_case("upcast_2x_to_wgmma_i8", [L.WGMMA_UPCAST_2X, L.WGMMA], np.int8, op=xor),
        _cast_splat("wgmma", L.WGMMA), _cast_splat("strided", L.WG_STRIDED((128, 128), vec_size=2)),
        _cast_splat("wgmma_transposed", L.WGMMA_TRANSPOSED),
    ]


def _transposed_smem():
    """A transposed view of swizzled SMEM, read and written in the
    WGMMA_TRANSPOSED layout, then stored by TMA (untransposed)."""
    t = (plgpu.TilingTransform((8, 16)), plgpu.SwizzleTransform(64))

    def body(x_gmem, o_gmem, x_smem, bar):
        plgpu.copy_gmem_to_smem(x_gmem, x_smem, bar)
        plgpu.barrier_wait(bar)
        x = plgpu.load(x_smem.T, layout=plgpu.Layout.WGMMA_TRANSPOSED)
        x_smem.T[...] = x * 2 + 1
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(x_smem, o_gmem)
        plgpu.wait_smem_to_gmem(0)
    fn = K(body, S((16, 64), jnp.float32), [plgpu.SMEM((16, 64), jnp.float32, transforms=t),
                                            plgpu.Barrier()])
    return Case("transposed_smem_view", fn, [normal((16, 64))],
                lambda x: x * np.float32(2) + np.float32(1))


def _pipeline():
    """``plgpu.emit_pipeline`` over a 2-D grid of (64, 64) blocks, 2 in flight."""
    def body(x_gmem, y_gmem, o_gmem):
        def step(_, x_smem, y_smem, o_smem):
            o_smem[...] = x_smem[...] * y_smem[...] + 1

        spec = pl.BlockSpec((64, 64), lambda i, j: (i, j))
        plgpu.emit_pipeline(step, grid=(2, 3), in_specs=[spec, spec], out_specs=[spec],
                            max_concurrent_steps=2)(x_gmem, y_gmem, o_gmem)
    fn = K(body, S((128, 192), jnp.float32))
    return Case("emit_pipeline_2d", fn, [normal((128, 192)), normal((128, 192))],
                lambda x, y: x * y + np.float32(1))


def _while():
    """``lax.while_loop`` with a trip count read at run time (``scf.while``)."""
    def body(x_gmem, n_gmem, o_gmem):
        n = n_gmem[0]

        def cond(carry):
            return carry[0] < n

        def step(carry):
            i, v = carry
            return i + 1, v * 0.5 + i.astype(jnp.float32)

        _, v = lax.while_loop(cond, step, (jnp.int32(0), x_gmem[...]))
        o_gmem[...] = v

    def ref(x, n):
        for i in range(int(n[0])):
            x = x * np.float32(0.5) + np.float32(i)
        return x
    return Case("scf_while", K(body, S((128, 64), jnp.float32)),
                [normal((128, 64)), np.array([5], np.int32)], ref)


# --- warp specialization: warpgroups that wait for each other ---------------------------


def _tma_out(v, o_smem, o_gmem):
    o_smem[...] = v
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(o_smem, o_gmem)
    plgpu.wait_smem_to_gmem(0)


def _producer_consumer():
    """Warpgroup 1 loads with TMA; warpgroup 0 waits, computes and stores --
    the consumer's code comes first, so lockstep execution would deadlock."""
    def body(x_gmem, o_gmem, x_smem, o_smem, loaded):
        wg = lax.axis_index("wg")

        @pl.when(wg == 0)
        def _consumer():
            plgpu.set_max_registers(232, action="increase")
            plgpu.barrier_wait(loaded)
            _tma_out(x_smem[...] * 3 - 1, o_smem, o_gmem)

        @pl.when(wg == 1)
        def _producer():
            plgpu.set_max_registers(40, action="decrease")
            plgpu.copy_gmem_to_smem(x_gmem, x_smem, loaded)

    fn = K(body, S((128, 64), jnp.float32), [plgpu.SMEM((128, 64), jnp.float32),
                                             plgpu.SMEM((128, 64), jnp.float32), plgpu.Barrier()],
           num_threads=2, thread_name="wg")
    return Case("ws_producer_consumer", fn, [normal((128, 64))],
                lambda x: (x * np.float32(3)) - np.float32(1))


def _barrier_ring():
    """A producer fills two slots in turn, waiting for the consumer to free
    each (``empty``) before refilling it; the consumer accumulates."""
    def body(x_gmem, o_gmem, slots, o_smem, full, empty):
        wg = lax.axis_index("wg")

        @pl.when(wg == 1)
        def _():
            @pl.loop(0, 6)
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
                acc = acc * 0.5 + slots.at[slot][...]
                plgpu.barrier_arrive(empty.at[slot])
                return acc

            _tma_out(lax.fori_loop(0, 6, step, jnp.zeros((64, 64), jnp.float32)), o_smem, o_gmem)

    fn = K(body, S((64, 64), jnp.float32),
           [plgpu.SMEM((2, 64, 64), jnp.float32), plgpu.SMEM((64, 64), jnp.float32),
            plgpu.Barrier(num_barriers=2), plgpu.Barrier(num_barriers=2)],
           num_threads=2, thread_name="wg")

    def ref(x):
        acc = np.zeros((64, 64), np.float32)
        for i in range(6):
            acc = acc * np.float32(0.5) + x[i]
        return acc
    return Case("ws_barrier_ring", fn, [normal((6, 64, 64))], ref)


def _three_warpgroups():
    """Two warpgroups each write half of SMEM and arrive on one barrier of
    two arrivals; the third waits for both and stores."""
    def body(o_gmem, smem, written):
        wg = lax.axis_index("wg")

        @pl.when(wg == 2)
        def _():
            plgpu.barrier_wait(written)
            plgpu.copy_smem_to_gmem(smem, o_gmem)
            plgpu.wait_smem_to_gmem(0)

        @pl.when(wg < 2)
        def _():
            smem.at[wg][...] = jnp.full((64, 128), 1.0, jnp.float32) * (wg + 2).astype(jnp.float32)
            plgpu.commit_smem()
            plgpu.barrier_arrive(written)

    fn = K(body, S((2, 64, 128), jnp.float32), [plgpu.SMEM((2, 64, 128), jnp.float32),
                                                plgpu.Barrier(num_arrivals=2)],
           num_threads=3, thread_name="wg")
    return Case("ws_two_writers_one_reader", fn, [],
                lambda: np.stack([np.full((64, 128), 2, np.float32),
                                  np.full((64, 128), 3, np.float32)]))


def _ws_pipeline():
    """``emit_pipeline_warp_specialized``: a memory warpgroup streams blocks
    into a 2-deep ring, the compute warpgroup transforms each into an output
    block the pipeline stores."""
    def body(x_gmem, o_gmem):
        wg = lax.axis_index("wg")

        def step(_, x_smem, o_smem):
            o_smem[...] = x_smem[...] * 2 + wg.astype(jnp.float32) + 1

        plgpu.emit_pipeline_warp_specialized(
            step, grid=(8,), memory_registers=40, max_concurrent_steps=2,
            num_compute_wgs=1, wg_axis="wg",
            in_specs=[pl.BlockSpec((128, 64), lambda i: (0, i))],
            out_specs=[pl.BlockSpec((128, 64), lambda i: (0, i))])(x_gmem, o_gmem)

    fn = K(body, S((128, 512), jnp.float32), num_threads=2, thread_name="wg")
    return Case("ws_emit_pipeline", fn, [normal((128, 512))],
                lambda x: x * np.float32(2) + np.float32(1))


def _ws_pipeline_carry(num_compute_wgs):
    """Each compute warpgroup sums its rows of every block into a carry."""
    rows = 128 // num_compute_wgs

    def body(x_gmem, o_gmem):
        wg = lax.axis_index("wg")

        def compute(pipeline):
            o_gmem.at[wg][...] = pipeline(jnp.zeros((rows, 64), jnp.float32))

        def step(_, x_smem, carry):
            return carry + x_smem.at[pl.ds(wg * rows, rows)][...]

        plgpu.emit_pipeline_warp_specialized(
            step, grid=(4,), memory_registers=40, max_concurrent_steps=2,
            num_compute_wgs=num_compute_wgs, wg_axis="wg", compute_context=compute,
            in_specs=[pl.BlockSpec((128, 64), lambda i: (0, i))])(x_gmem)

    fn = K(body, S((num_compute_wgs, rows, 64), jnp.float32), num_threads=num_compute_wgs + 1,
           thread_name="wg")

    def ref(x):
        acc = np.zeros((128, 64), np.float32)
        for i in range(4):
            acc = acc + x[:, i * 64:(i + 1) * 64]
        return acc.reshape(num_compute_wgs, rows, 64)
    return Case(f"ws_emit_pipeline_carry_{num_compute_wgs}wg", fn, [normal((128, 256))], ref)


# --- WGMMA ----------------------------------------------------------------------------------


def _swizzled(shape, dtype, swizzle=128):
    cols = swizzle // np.dtype(dtype).itemsize
    return plgpu.SMEM(shape, dtype, transforms=(plgpu.TilingTransform((8, cols)),
                                                plgpu.SwizzleTransform(swizzle)))


def mma_bound(a, b):
    """|emulated - exact| per output of a (M, K) @ (K, N) product: any order of
    summing K products exactly formed, rounded to f32 at most K + 1 times."""
    k = a.shape[1]
    return (k + 1) * np.finfo(np.float32).eps * (np.abs(f64(a)) @ np.abs(f64(b)))


def _wgmma(m, k, n, dtype, *, swizzle=128, ta=False, tb=False, regs=False):
    """acc (M, N) = A @ B with A and B TMA-loaded into swizzled SMEM (or A
    moved into registers); ``ta``/``tb`` pass transposed SMEM views, so the
    instruction reads MN-major (or K-major) operands."""
    acc_dtype = jnp.int32 if np.dtype(dtype) == np.int8 else jnp.float32
    a_shape = (k, m) if ta else (m, k)
    b_shape = (n, k) if tb else (k, n)

    def body(a_gmem, b_gmem, o_gmem, a_smem, b_smem, bar):
        plgpu.copy_gmem_to_smem(a_gmem, a_smem, bar.at[0])
        plgpu.copy_gmem_to_smem(b_gmem, b_smem, bar.at[1])
        plgpu.barrier_wait(bar.at[0])
        plgpu.barrier_wait(bar.at[1])
        a = a_smem.T if ta else a_smem
        b = b_smem.T if tb else b_smem

        def scope(acc_ref):
            plgpu.wgmma(acc_ref, a[...] if regs else a, b)
            plgpu.wgmma_wait(0)
            return acc_ref[...]
        o_gmem[...] = pl.run_scoped(scope, plgpu.ACC((m, n), acc_dtype))

    fn = K(body, S((m, n), acc_dtype), [_swizzled(a_shape, dtype, swizzle),
                                        _swizzled(b_shape, dtype, swizzle),
                                        plgpu.Barrier(num_barriers=2)])
    if np.dtype(dtype) == np.int8:
        args = [RNG.integers(-128, 128, a_shape).astype(np.int8),
                RNG.integers(-128, 128, b_shape).astype(np.int8)]
    else:
        args = [normal(a_shape, dtype), normal(b_shape, dtype)]
    op_a = (lambda a: a.T) if ta else (lambda a: a)
    op_b = (lambda b: b.T) if tb else (lambda b: b)
    name = (f"wgmma_{np.dtype(dtype).name}_{m}x{k}x{n}_swizzle{swizzle}"
            + "_ta" * ta + "_tb" * tb + "_a_in_registers" * regs)
    if np.dtype(dtype) == np.int8:  # s8 x s8 -> s32: exact
        return Case(name, fn, args, lambda a, b: (op_a(a).astype(np.int64)
                                                  @ op_b(b).astype(np.int64)).astype(np.int32))
    return Case(name, fn, args, lambda a, b: (f64(op_a(a)) @ f64(op_b(b))).astype(np.float32),
                abs_bound=lambda a, b: mma_bound(op_a(a), op_b(b)))


def wgmma_two_warpgroups_kernel(block_sync: bool = True):
    """Two warpgroups each multiply their 64-row half of A (one loads both
    operands, both wait) into their half of ``o_smem``; warpgroup 0 copies
    it out once both have arrived on ``written``. Without that
    (``block_sync=False``, the kernel of the lowering test
    ``test_wgmma_two_warpgroups_split_m``), warpgroup 0's copy races
    warpgroup 1's SMEM writes: ``commit_smem`` synchronizes one warpgroup."""
    def body(a_gmem, b_gmem, o_gmem, a_smem, b_smem, o_smem, barrier, written):
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

        o_smem.at[pl.ds(wg * 64, 64)][...] = pl.run_scoped(  # wgmma result store
            scope, plgpu.ACC((64, 128), jnp.float32)).astype(jnp.float16)
        plgpu.commit_smem()
        if block_sync:
            plgpu.barrier_arrive(written)

        @pl.when(wg == 0)
        def _():
            if block_sync:
                plgpu.barrier_wait(written)
            plgpu.copy_smem_to_gmem(o_smem, o_gmem)  # copy out
            plgpu.wait_smem_to_gmem(0)

    f16 = jnp.float16
    return K(body, S((128, 128), f16), [_swizzled((128, 64), f16), _swizzled((64, 128), f16),
                                        _swizzled((128, 128), f16), plgpu.Barrier(num_barriers=2),
                                        plgpu.Barrier(num_arrivals=2)],
             num_threads=2, thread_name="wg")


def _wgmma_two_warpgroups():
    f16 = jnp.float16
    fn = wgmma_two_warpgroups_kernel()
    # the f32 accumulator within mma_bound, then rounded once to f16, compared
    # with the exact product rounded to f16: two f16 roundings apart at most
    return Case("wgmma_two_warpgroups_f16_out", fn,
                [normal((128, 64), f16), normal((64, 128), f16)],
                lambda a, b: (f64(a) @ f64(b)).astype(np.float16),
                abs_bound=lambda a, b: mma_bound(a, b) * 1.01 + np.abs(f64(a) @ f64(b))
                * 2.0 ** -10 * 1.01 + 2.0 ** -24)


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

    def exp_tanh(x, y):
        return r32(r32(r32(np.exp(x)) * 2) + r32(np.tanh(y)))

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
                     lambda x, y: (x.astype(jnp.float32) * 3
                                   + y.astype(jnp.float32)).astype(jnp.bfloat16),
                     lambda x, y: (x * 3).astype(np.float32).astype(np.float64) + y, 0),
        _elementwise("i32_arith", np.int32,
                     lambda x, y: (x * 7 - y) // 3 + x % 5 + (x & y) ^ (x >> 2),
                     lambda x, y: i32_ref(x, y), 0, gen=lambda s, d: ints(s)),
        _elementwise("i32_max_select", np.int32,
                     lambda x, y: jnp.where(x > y, x - y, jnp.maximum(x, -y)),
                     lambda x, y: np.where(x > y, x - y, np.maximum(x, -y)), 0,
                     gen=lambda s, d: ints(s)),
        # abs.f32 (inline PTX) and math.ctlz, with zeros and all-ones among the inputs
        _elementwise("f32_abs", np.float32, lambda x, y: jnp.abs(x) - y,
                     lambda x, y: np.abs(x) - y, 0),
        _elementwise("i32_clz", np.int32, lambda x, y: lax.clz(x) + lax.clz(y),
                     lambda x, y: _clz32(x) + _clz32(y), 0,
                     gen=lambda s, d: _with_edges(RNG.integers(-2**31, 2**31, s, np.int64)
                                                  .astype(np.int32))),
        _swizzled_copy(32), _swizzled_copy(64), _swizzled_copy(128),
        _swizzled_copy(128, np.float32),
        _tma_oob(), _tma_gather("gather", 0), _tma_gather("gather", 128),
        _tma_gather("scatter", 0), _tma_gather("scatter", 128), _rowsum(), _colmax(),
        _broadcast(), _loop(), _grid_when(),
        _lane_divergent_if(), _lane_fragmented(),
        _producer_consumer(), _barrier_ring(), _three_warpgroups(), _ws_pipeline(),
        _ws_pipeline_carry(1), _ws_pipeline_carry(2),
        *_casts(), _transposed_smem(), _pipeline(), _while(),
        _wgmma(64, 128, 128, np.float16), _wgmma(64, 128, 128, BF16, swizzle=64, tb=True),
        _wgmma(64, 64, 128, np.float16, swizzle=32, ta=True, tb=True),
        _wgmma(128, 64, 256, BF16, regs=True), _wgmma(64, 128, 64, np.int8, tb=True),
        _wgmma_two_warpgroups(),
    ]


def i32_ref(x, y):
    x, y = x.astype(np.int64), y.astype(np.int64)
    q = (x * 7 - y)
    q = np.floor_divide(q, 3)  # jnp's // floors
    r = np.remainder(x, 5)  # jnp's % takes the divisor's sign
    return (q + r + (x & y) ^ (x >> 2)).astype(np.int32)
