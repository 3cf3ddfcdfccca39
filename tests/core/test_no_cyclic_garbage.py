"""Inference and lowering leave no reference cycles behind.

Its temporaries (sites, variables, constraints, the solver) die by reference
counting when it returns. One cycle among them (an exception kept with its
traceback, a table referring back to a builder) would keep all of them alive
until the next garbage collection, which then walks every one: at 4,000 ops
that is 10-20 ms more than the inference itself.
"""

from __future__ import annotations

import gc

import jax
import jax.numpy as jnp
import pytest

import smalti
from smalti import kernels
from tests.core.test_contexts_released import through_smem
from tests.core.test_shared_layout_path import KERNELS

F32 = jax.ShapeDtypeStruct((128, 128), jnp.float32)


@pytest.mark.parametrize("body", KERNELS, ids=lambda body: body.__name__)
def test_inference_leaves_no_cyclic_garbage(body):
    # Once first: building the default pipeline (plugin discovery, imports)
    # may leave cycles of its own.
    smalti.infer_layouts(kernels.build_kernel(body, [F32], [F32]).module)
    kernel = kernels.build_kernel(body, [F32], [F32])
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    try:
        smalti.infer_layouts(kernel.module)
        smalti.infer_layouts(kernels.build_kernel(body, [F32], [F32]).module, trace=True)
        unreachable = gc.collect()
    finally:
        if enabled:
            gc.enable()
    assert unreachable == 0


def test_lowering_leaves_no_cyclic_garbage():
    def inferred():
        kernel = kernels.build_kernel(through_smem, [F32], [F32], smem_scratch=[F32])
        smalti.infer_layouts(kernel.module)
        return kernel

    warm = inferred()  # once first: the first lowering imports and builds things
    smalti.lower(warm.module, warm.launch_context)
    kernel = inferred()
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    try:
        smalti.lower(kernel.module, kernel.launch_context)
        unreachable = gc.collect()
    finally:
        if enabled:
            gc.enable()
    assert unreachable == 0
