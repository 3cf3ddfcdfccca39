"""What the Pallas kernels of the differential tests are made of: Warpgroup
semantics, swizzled SMEM, TMA in and out."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental.pallas import mosaic_gpu as plgpu

WARPGROUP = plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup)


def transforms(dtype, swizzle=128):
    """The tiling and swizzle of an SMEM ref whose rows are ``swizzle`` bytes."""
    width = swizzle * 8 // jax.dtypes.itemsize_bits(dtype)
    return (plgpu.TilingTransform((8, width)), plgpu.SwizzleTransform(swizzle))


def swizzled(shape, dtype=jnp.float16, swizzle=128):
    return plgpu.SMEM(shape, dtype, transforms=transforms(dtype, swizzle))


def kernel(body, out, scratch=(), params=WARPGROUP, **kw):
    """``plgpu.kernel`` with Warpgroup semantics."""
    return plgpu.kernel(body, out_type=out, scratch_types=scratch, compiler_params=params,
                        **kw)


def tma_in(gmem, smem, barrier):
    """Copies ``gmem`` to ``smem`` with TMA and waits for it."""
    plgpu.copy_gmem_to_smem(gmem, smem, barrier)
    plgpu.barrier_wait(barrier)


def tma_out(value, smem, gmem):
    """Stores ``value`` to ``smem``, then copies it to ``gmem`` with TMA and waits."""
    smem[...] = value
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(smem, gmem)
    plgpu.wait_smem_to_gmem(0)
