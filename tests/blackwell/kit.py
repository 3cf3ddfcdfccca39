"""Direct Mosaic GPU kernels with TMEM, for the Blackwell tests."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax._src.lib import mosaic_gpu_dialect as mgpu
from jax._src.lib.mlir import ir
from jax.experimental.mosaic.gpu import utils as mgpu_utils

from smalti import kernels

BLACKWELL = (10, 0)
F32_128 = jax.ShapeDtypeStruct((128, 128), jnp.float32)
#: The SMEM word tmem_alloc writes the TMEM address to.
ADDRESS = jax.ShapeDtypeStruct((), jnp.int32)


def tmem_type(shape=(128, 128), element=None) -> ir.MemRefType:
    return ir.MemRefType.get(list(shape), element or ir.F32Type.get(),
                             memory_space=mgpu_utils.tmem())


def alloc(address: ir.Value, shape=(128, 128), *, collective: bool = False) -> ir.Value:
    return mgpu.TmemAllocOp(tmem_type(shape), address, collective=collective, packing=1).result


def build(body: Callable, in_shapes=(F32_128,), out_shapes=(F32_128,), scratch=ADDRESS,
          **kw) -> kernels.Kernel:
    """``body(x_ref, ..., o_ref, ..., scratch)`` traced into a kernel (no launch ctx arg)."""
    return kernels.build_kernel(lambda ctx, *refs: body(*refs), list(in_shapes),
                                list(out_shapes), smem_scratch=scratch, **kw)

