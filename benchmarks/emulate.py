"""How fast the emulator runs lowered kernels: prints one line per kernel
(lowered ops, lowering seconds, emulation seconds with compilation): kernels
jax lowers (elementwise, TMA + swizzle, reductions, grids, WGMMA, a
warp-specialized pipeline, a TMA gather, clusters of 2 and 4 blocks) and
kernels only smalti lowers.

    .venv/bin/python -m benchmarks.emulate
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

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

    t16 = (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))

    def mm(a_gmem, b_gmem, o_gmem, a_smem, b_smem, bar):
        plgpu.copy_gmem_to_smem(a_gmem, a_smem, bar.at[0])
        plgpu.copy_gmem_to_smem(b_gmem, b_smem, bar.at[1])
        plgpu.barrier_wait(bar.at[0])
        plgpu.barrier_wait(bar.at[1])

        def scope(acc_ref):
            plgpu.wgmma(acc_ref, a_smem, b_smem)
            plgpu.wgmma_wait(0)
            return acc_ref[...]
        o_gmem[...] = pl.run_scoped(scope, plgpu.ACC((64, 128), jnp.float32))
    a16 = x[:64].astype(np.float16)
    yield "WGMMA (64, 128) x (128, 128) f16", plgpu.kernel(
        mm, out_type=S((64, 128), jnp.float32), compiler_params=WG,
        scratch_types=[plgpu.SMEM((64, 128), jnp.float16, transforms=t16),
                       plgpu.SMEM((128, 128), jnp.float16, transforms=t16),
                       plgpu.Barrier(num_barriers=2)]), [a16, x.astype(np.float16)]

    def ws(x_gmem, o_gmem):
        def step(_, x_smem, o_smem):
            o_smem[...] = x_smem[...] * 2 + 1
        plgpu.emit_pipeline_warp_specialized(
            step, grid=(8,), memory_registers=40, max_concurrent_steps=2, num_compute_wgs=1,
            wg_axis="wg", in_specs=[pl.BlockSpec((128, 64), lambda i: (0, i))],
            out_specs=[pl.BlockSpec((128, 64), lambda i: (0, i))])(x_gmem, o_gmem)
    wide = np.random.default_rng(2).standard_normal((128, 512)).astype(np.float32)
    yield "warp-specialized pipeline, 8 x (128, 64)", plgpu.kernel(
        ws, out_type=S((128, 512), jnp.float32), compiler_params=WG, num_threads=2,
        thread_name="wg"), [wide]

    def gather(x_gmem, idx_gmem, o_gmem, smem, bar):
        idx = plgpu.load(idx_gmem, layout=plgpu.Layout.TMA_INDICES, optimized=False)
        plgpu.copy_gmem_to_smem(x_gmem.at[idx], smem, bar)
        plgpu.barrier_wait(bar)
        plgpu.copy_smem_to_gmem(smem, o_gmem)
        plgpu.wait_smem_to_gmem(0)
    yield "TMA gather4 of 64 rows, f16", plgpu.kernel(
        gather, out_type=S((64, 128), jnp.float16), compiler_params=WG,
        scratch_types=[plgpu.SMEM((64, 128), jnp.float16), plgpu.Barrier()]), \
        [x.astype(np.float16), np.arange(64, dtype=np.int32)[::-1] * 2]

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' kernel builders
    from tests.emulate import test_cluster as tc

    x4 = np.random.default_rng(4).standard_normal((3, 2, 64, 64)).astype(np.float16)
    yield "3 clusters of 2: st.async exchange (64, 64)", tc.exchange_kernel(), [x4]
    yield "cluster of 4: multicast TMA (64, 64) f16", tc.multicast_kernel(4), [x4[0, 0]]


def smalti_kernels():
    """Kernels only smalti lowers (jax refuses them), built at the dialect level."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' kernel builders
    from smalti import kernels as smalti_kernels_
    from tests.plugins import test_vector_ops as tv

    x = np.random.default_rng(3).standard_normal((256, 128)).astype(np.float32)
    yield ("smalti: rank-3 softmax (2, 128, 128)", tv.softmax_rows(tv.TILED[0], rank3=True),
           [tv.sds((256, 128))], [tv.sds((256, 128))], (), [x])
    yield ("smalti: keep_dims mean (128, 128)",
           tv.mean_centered(tv.TILED[0], (128, 128), 1, keep_dims=True),
           [tv.sds((128, 128))], [tv.sds((128, 128))], tv.SCRATCH, [x[:128]])
    del smalti_kernels_


def main() -> None:
    import smalti
    from smalti import kernels as smalti_kernels_

    print(f"{'kernel':44s} {'ops':>6s} {'lower s':>8s} {'emulate s':>10s}")
    for name, fn, args in kernels():
        t0 = time.perf_counter()
        module, avals = lower(fn, *args)
        t1 = time.perf_counter()
        outs = [(tuple(a.shape), np.dtype(a.dtype)) for a in avals]
        run_module(module, args, outs)
        t2 = time.perf_counter()
        print(f"{name:44s} {count_ops(module):6d} {t1 - t0:8.3f} {t2 - t1:10.3f}")
    for name, body, ins, outs, scratch, args in smalti_kernels():
        t0 = time.perf_counter()
        k = smalti_kernels_.build_kernel(body, ins, outs, smem_scratch=scratch)
        smalti.infer_layouts(k.module)
        smalti.lower(k.module, k.launch_context)
        t1 = time.perf_counter()
        run_module(k.module, args, [(tuple(o.shape), np.dtype(o.dtype)) for o in outs])
        t2 = time.perf_counter()
        print(f"{name:44s} {count_ops(k.module):6d} {t1 - t0:8.3f} {t2 - t1:10.3f}")


if __name__ == "__main__":
    main()
