"""How fast the emulator runs lowered kernels: prints one line per kernel
(lowered ops, threads per block, blocks, lowering seconds, emulation seconds).

    .venv/bin/python benchmarks/emulate.py
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from smalti.emulate import lower, run_module

WG = plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup)
S = jax.ShapeDtypeStruct


def count_ops(module) -> int:
    n = 0

    def walk(op) -> None:
        nonlocal n
        for region in op.regions:
            for block in region.blocks:
                for o in block.operations:
                    n += 1
                    walk(o.operation)
    walk(module.operation)
    return n


def kernels():
    x = np.random.default_rng(0).standard_normal((128, 128)).astype(np.float32)

    def ew(x_ref, o_ref):
        v = x_ref[...]
        o_ref[...] = jnp.exp(v) * 2 + jnp.tanh(v) - v * v
    yield "elementwise f32 (128, 128)", plgpu.kernel(ew, out_type=S((128, 128), jnp.float32),
                                                     compiler_params=WG), [x]

    def tma(x_gmem, o_gmem, smem, bar):
        plgpu.copy_gmem_to_smem(x_gmem, smem, bar)
        plgpu.barrier_wait(bar)
        smem[...] = smem[...] * 2 + 1
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(smem, o_gmem)
        plgpu.wait_smem_to_gmem(0)
    t = (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))
    yield "TMA + swizzled SMEM f16 (128, 128)", plgpu.kernel(
        tma, out_type=S((128, 128), jnp.float16), compiler_params=WG,
        scratch_types=[plgpu.SMEM((128, 128), jnp.float16, transforms=t), plgpu.Barrier()]), \
        [x.astype(np.float16)]

    def red(x_ref, o_ref):
        o_ref[...] = jnp.sum(plgpu.load(x_ref, layout=plgpu.Layout.WGMMA, optimized=False), axis=1)
    yield "row reduction f32 (128, 128)", plgpu.kernel(red, out_type=S((128,), jnp.float32),
                                                       compiler_params=WG), [x]

    def grid(x_ref, o_ref):
        i = jax.lax.axis_index("i")
        o_ref[pl.ds(i * 128, 128)] = x_ref[pl.ds(i * 128, 128)] * 3 + 1
    big = np.random.default_rng(1).standard_normal((1024, 128)).astype(np.float32)
    yield "8 blocks of (128, 128), f32", plgpu.kernel(
        grid, out_type=S((1024, 128), jnp.float32), compiler_params=WG, grid=(8,),
        grid_names=("i",)), [big]


def main() -> None:
    print(f"{'kernel':40s} {'ops':>6s} {'lower s':>8s} {'emulate s':>10s}")
    for name, fn, args in kernels():
        t0 = time.perf_counter()
        module, avals = lower(fn, *args)
        t1 = time.perf_counter()
        outs = [(tuple(a.shape), np.dtype(a.dtype)) for a in avals]
        run_module(module, args, outs)
        t2 = time.perf_counter()
        print(f"{name:40s} {count_ops(module):6d} {t1 - t0:8.3f} {t2 - t1:10.3f}")


if __name__ == "__main__":
    main()
