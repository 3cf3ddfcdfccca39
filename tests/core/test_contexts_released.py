"""Compiling a kernel keeps nothing of it alive afterwards.

smalti memoizes functions of MLIR types and attributes (memory spaces, SMEM
transforms, MMA tilings). A type keeps its context alive, and a context
everything uniqued in it (about a megabyte for a large kernel), so caches
keyed by types must not outlive the kernel they were filled for: a
long-lived process compiling many kernels would grow without bound.
"""

from __future__ import annotations

import gc
import weakref

import jax
import jax.numpy as jnp
from jax._src.lib import mosaic_gpu_dialect as mgpu
from jax._src.lib.mlir import ir
from jax._src.lib.mlir.dialects import arith

import smalti
from smalti import kernels
from smalti.caching import per_context

F32 = jax.ShapeDtypeStruct((128, 128), jnp.float32)


def through_smem(ctx, x_ref, out_ref, smem):
    """A vector stored to and loaded from SMEM (refs with transforms), then
    added to itself."""
    [scratch] = smem
    mgpu.vector_store(mgpu.vector_load(x_ref), scratch)
    y = mgpu.vector_load(scratch)
    mgpu.vector_store(arith.addf(y, y), out_ref)


def compile_one() -> weakref.ref:
    """Infers and lowers a fresh kernel (in its own context); returns a weak
    reference to that context."""
    kernel = kernels.build_kernel(through_smem, [F32], [F32], smem_scratch=[F32])
    smalti.infer_layouts(kernel.module)
    smalti.lower(kernel.module, kernel.launch_context)
    return weakref.ref(kernel.context)


def test_a_compiled_kernels_context_is_released():
    first = compile_one()
    compile_one()  # the caches move on to the next kernel's context
    gc.collect()
    assert first() is None


def test_per_context_cache_keeps_one_context():
    calls = []

    @per_context
    def width(ty, scale):
        calls.append((str(ty), scale))
        return ir.IntegerType(ty).width * scale

    def fresh_context_width() -> weakref.ref:
        context = ir.Context()
        with context:
            i8 = ir.IntegerType.get_signless(8)
            assert width(i8, 2) == width(i8, 2) == 16  # the second call is cached
            assert width(i8, 3) == 24  # other arguments, another entry
        return weakref.ref(context)

    first = fresh_context_width()
    assert calls == [("i8", 2), ("i8", 3)]
    second = fresh_context_width()  # a new context: computed again
    assert calls[2:] == [("i8", 2), ("i8", 3)]
    gc.collect()
    assert first() is None and second() is not None  # only the latest is kept
    width.cache_clear()
    gc.collect()
    assert second() is None
