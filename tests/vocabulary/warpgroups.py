"""Kernels of several Pallas warpgroups for the vocabulary's tests: each
warpgroup brings its own blocks into 128-byte-swizzled SMEM by TMA (as
``benchmarks.vocabulary.kernel`` does for one), applies the function, and
stores its result from registers."""

from __future__ import annotations

from collections.abc import Callable

import jax
import numpy as np
from jax import lax
from jax.experimental.pallas import mosaic_gpu as plgpu

from benchmarks.vocabulary import WG
from benchmarks.vocabulary import _transforms as tma_transforms


def per_warpgroup_kernel(fn: Callable[..., jax.Array], args: list[np.ndarray]) -> Callable:
    """``out[w] = fn(*(a[w] for a in args))`` computed by warpgroup ``w``, one
    per leading index of ``args``."""
    n = args[0].shape[0]
    blocks = [jax.ShapeDtypeStruct(a.shape[1:], a.dtype) for a in args]
    out = jax.eval_shape(fn, *blocks)
    k = len(args)

    def body(*refs):
        gins, gout, sins, bars = refs[:k], refs[k], refs[k + 1:2 * k + 1], refs[-1]
        wg = lax.axis_index("wg")
        for g, s in zip(gins, sins):
            plgpu.copy_gmem_to_smem(g.at[wg], s.at[wg], bars.at[wg])
        plgpu.barrier_wait(bars.at[wg])
        gout[wg] = fn(*(s[wg] for s in sins))

    scratch = [plgpu.SMEM(a.shape, a.dtype, transforms=tma_transforms(a.dtype)) for a in args]
    scratch.append(plgpu.Barrier(num_arrivals=k, num_barriers=n))
    return plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((n,) + out.shape, out.dtype),
                        scratch_types=scratch, num_threads=n, thread_name="wg",
                        compiler_params=WG)
