"""Random Warpgroup-semantics kernels, for fuzzing smalti against jax.

A kernel is determined by its seed: :func:`well_formed` returns a recipe whose
body draws from ``random.Random(seed)`` every time it is traced, so the same
kernel can be built twice (once for jax, once for smalti). Each op gets a
``kernel.py:LINE`` location so that errors can be checked to name one.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax._src.lib import mosaic_gpu_dialect as mgpu
from jax._src.lib.mlir import ir
from jax._src.lib.mlir.dialects import arith, scf, vector
from jax._src.lib.mlir.dialects import math as mlir_math
from jax.experimental.mosaic.gpu import fragmented_array as fa
from jax.experimental.mosaic.gpu import layouts as mgpu_layouts

from smalti import kernels

SHAPES_2D = [(64, 64), (64, 128), (128, 64), (128, 128), (128, 256)]
SHAPES_1D = [(128,), (256,), (1024,)]
DTYPES = [jnp.float32, jnp.float16]


@dataclass
class Recipe:
    """How to build one random kernel (any number of times)."""

    seed: int
    body: Callable[..., None]
    in_shapes: list[jax.ShapeDtypeStruct]
    out_shapes: list[jax.ShapeDtypeStruct]
    smem_scratch: tuple[jax.ShapeDtypeStruct, ...] = ()

    def build(self, context: ir.Context | None = None) -> kernels.Kernel:
        return kernels.build_kernel(self.body, self.in_shapes, self.out_shapes,
                                    smem_scratch=self.smem_scratch, context=context)


def _element_type(dtype: Any) -> ir.Type:
    return ir.F32Type.get() if dtype == jnp.float32 else ir.F16Type.get()


def _layouts_for(shape: tuple[int, ...], rnd: random.Random) -> fa.FragmentedLayout:
    """A layout to cast to: usually one that fits the shape, sometimes not."""
    options: list[fa.FragmentedLayout] = []  # the dialect refuses casts to splat
    if len(shape) == 2:
        options += [fa.WGMMA_LAYOUT, fa.WGMMA_LAYOUT_UPCAST_2X, fa.WGMMA_TRANSPOSED_LAYOUT,
                    fa.TCGEN05_LAYOUT]
    else:
        options += [fa.WGMMA_ROW_LAYOUT, fa.WGMMA_COL_LAYOUT]
    for vec in (1, 2, 4):
        if np.prod(shape) % (128 * vec) == 0:
            options.append(fa.WGStridedFragLayout(shape, vec))
    return rnd.choice(options)


class _Builder:
    """Draws one op after another while the kernel body is traced."""

    def __init__(self, rnd: random.Random, shape: tuple[int, ...], dtype: Any) -> None:
        self.rnd = rnd
        self.shape = shape
        self.dtype = dtype
        self.element = _element_type(dtype)
        self.line = 0

    def loc(self) -> ir.Location:
        self.line += 1
        return ir.Location.file("kernel.py", self.line, 1)

    def vtype(self, shape: tuple[int, ...] | None = None) -> ir.VectorType:
        return ir.VectorType.get(shape or self.shape, self.element)

    def constant(self, shape: tuple[int, ...] | None = None) -> ir.Value:
        ty = self.vtype(shape)
        with self.loc():
            if self.rnd.random() < 0.6:
                value = ir.FloatAttr.get(self.element, float(self.rnd.randint(-3, 3)))
                return arith.constant(ty, ir.DenseElementsAttr.get_splat(ty, value))
            data = np.arange(np.prod(ty.shape), dtype=np.float32).reshape(ty.shape)
            return arith.constant(ty, ir.DenseElementsAttr.get(
                data.astype(np.dtype(self.dtype)), type=ty))

    def unary(self, x: ir.Value) -> ir.Value:
        with self.loc():
            return self.rnd.choice([arith.negf, mlir_math.exp, mlir_math.absf])(x)

    def binary(self, x: ir.Value, y: ir.Value) -> ir.Value:
        with self.loc():
            return self.rnd.choice([arith.addf, arith.mulf, arith.subf, arith.maximumf])(x, y)

    def cast(self, x: ir.Value) -> ir.Value:
        layout = _layouts_for(tuple(ir.VectorType(x.type).shape), self.rnd)
        with self.loc():
            return mgpu.layout_cast(x, mgpu_layouts.to_layout_attr(layout))

    def reduce_and_broadcast(self, x: ir.Value) -> ir.Value:
        shape = tuple(ir.VectorType(x.type).shape)
        if len(shape) != 2:
            return self.unary(x)
        dim = self.rnd.choice([0, 1, 1])
        kept = shape[1 - dim]
        acc = self.constant((kept,))
        kind = self.rnd.choice([vector.CombiningKind.ADD, vector.CombiningKind.MAXIMUMF])
        with self.loc():
            reduced = vector.MultiDimReductionOp(kind, x, acc, [dim]).result
        if self.rnd.random() < 0.3:
            reduced = self.unary(reduced)
        with self.loc():
            if dim == 0 and self.rnd.random() < 0.5:
                return vector.BroadcastOp(x.type, reduced).result
            return mgpu.broadcast_in_dim(x.type, reduced, [1 - dim])

    def loop(self, x: ir.Value, depth: int) -> ir.Value:
        index = ir.IndexType.get()
        with self.loc():
            lower, upper, step = (arith.constant(index, ir.IntegerAttr.get(index, v))
                                  for v in (0, self.rnd.randint(1, 4), 1))
            carried = [x] + ([self.constant()] if self.rnd.random() < 0.4 else [])
            loop = scf.ForOp(lower, upper, step, carried)
        with ir.InsertionPoint(loop.body):
            values = list(loop.inner_iter_args)
            for _ in range(self.rnd.randint(1, 3)):
                values[0] = self.step(values, depth + 1)
            with self.loc():
                scf.YieldOp(values)
        return loop.results[0]

    def step(self, pool: list[ir.Value], depth: int = 0) -> ir.Value:
        """One random op on values of ``pool`` (all of the kernel's shape)."""
        roll = self.rnd.random()
        x = self.rnd.choice(pool)
        if roll < 0.25:
            return self.binary(x, self.rnd.choice(pool))
        if roll < 0.40:
            return self.unary(x)
        if roll < 0.60:
            return self.cast(x)
        if roll < 0.72:
            return self.binary(x, self.constant())
        if roll < 0.85:
            return self.reduce_and_broadcast(x)
        if roll < 0.95 and depth < 2:
            return self.loop(x, depth)
        return self.unary(x)


def well_formed(seed: int) -> Recipe:
    """A random well-formed kernel: elementwise graphs with splat and dense
    constants, layout casts, reductions with broadcasts, scf.for loops
    carrying vectors and a round trip through SMEM."""
    rnd = random.Random(seed)
    shape = rnd.choice(SHAPES_2D + SHAPES_1D)
    dtype = rnd.choice(DTYPES)
    inputs = rnd.randint(1, 2)
    steps = rnd.randint(1, 8)
    through_smem = rnd.random() < 0.3
    sds = jax.ShapeDtypeStruct(shape, dtype)

    def body(ctx, *refs):
        *gmem, smem = refs
        b = _Builder(random.Random(seed), shape, dtype)
        with b.loc():
            pool = [mgpu.vector_load(ref) for ref in gmem[:inputs]]
        for _ in range(steps):
            pool.append(b.step(pool))
        result = pool[-1]
        if through_smem:
            [scratch] = smem
            with b.loc():
                mgpu.vector_store(result, scratch)
                result = b.binary(mgpu.vector_load(scratch), result)
        with b.loc():
            mgpu.vector_store(result, gmem[-1])

    return Recipe(seed, body, [sds] * inputs, [sds], (sds,) if through_smem else ())
