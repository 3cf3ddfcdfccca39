"""The profiler's validation kernels, to run on a GPU under Nsight Compute.

Each kernel's counts are known by construction (``tests/emulate/test_profile.py``
derives them and holds the emulator's profile to them); this script runs the
same kernels on a real GPU so that ``ncu`` can measure them:

    ncu --metrics "$(python benchmarks/h200_counters.py --ncu-metrics)" \\
        -k regex:smalti_ python benchmarks/h200_counters.py

(``--ncu-metrics`` prints the emulator's counters that have ncu names, as
``NAME.sum``, and ``dram__bytes_read.sum``/``dram__bytes_write.sum`` to set
beside the TMA and global byte counts; should this ncu not know one of them,
it refuses the whole list: drop that one.)

    python benchmarks/h200_counters.py --emulate   # the emulator's counts, no GPU

Kernels (each name starts with ``smalti_``, for ``ncu -k regex:smalti_``):

- ``smalti_copy_conflict_free``: Pallas (Warpgroup semantics); a (128, 128)
  f32 block in by TMA, SMEM -> registers -> SMEM in a strided layout of
  16-byte vectors (each quarter-warp reads 128 consecutive bytes), out by TMA.
- ``smalti_transpose_unswizzled``: Mosaic GPU (Lane semantics); each warp
  writes a 32 x 32 f32 tile into SMEM row by row (lane = column), then reads
  it column by column: the 32 lanes read words 32 apart, all in one bank --
  the 32-way conflicting column read.
- ``smalti_transpose_swizzled``: the same with element (r, c) of a tile at
  word ``32 r + (c xor r)``: both passes conflict-free.
- ``smalti_tma_transpose_f16``: Pallas; a (128, 64) f16 block in by TMA
  into 128-byte-swizzled SMEM, loaded in the WGMMA layout (``ldmatrix``) and
  stored into the transposed view of a swizzled (64, 128) buffer
  (``stmatrix``), out by TMA: jax's own swizzled transpose.
- ``smalti_wgmma_tile``: Pallas; A (64, 64) and B (64, 128) bf16 in by TMA
  into 128-byte-swizzled SMEM, one ``plgpu.wgmma`` into an f32 accumulator,
  stored to global memory from registers.

Imports only jax, numpy and smalti (for ``--emulate``): run it with the
repository's virtual environment or any jax 0.11.2 with a GPU.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

WG = plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup)
COPY_SHAPE = (128, 128)  # f32
VEC = 4  # f32 elements per thread per access in the copy: 16 bytes
WARPS = 4  # the transposes: one 32 x 32 f32 tile per warp, one warpgroup
WGMMA_M, WGMMA_K, WGMMA_N = 64, 64, 128
TMA_TRANSPOSE_SHAPE = (128, 64)  # f16: 128-byte rows, the swizzle's width


@dataclass
class Kernel:
    name: str
    fn: Callable[..., Any]
    args: list[np.ndarray]
    want: Callable[..., np.ndarray]  # numpy's answer


def copy_conflict_free() -> Kernel:
    shape = COPY_SHAPE
    layout = plgpu.Layout.WG_STRIDED(shape, vec_size=VEC)

    def smalti_copy_conflict_free(x_gmem, o_gmem, x_smem, o_smem, bar):
        plgpu.copy_gmem_to_smem(x_gmem, x_smem, bar)
        plgpu.barrier_wait(bar)
        o_smem[...] = plgpu.load(x_smem, layout=layout)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(o_smem, o_gmem)
        plgpu.wait_smem_to_gmem(0)

    fn = plgpu.kernel(smalti_copy_conflict_free,
                      out_type=jax.ShapeDtypeStruct(shape, jnp.float32),
                      scratch_types=[plgpu.SMEM(shape, jnp.float32),
                                     plgpu.SMEM(shape, jnp.float32), plgpu.Barrier()],
                      compiler_params=WG)
    x = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    return Kernel("smalti_copy_conflict_free", fn, [x], lambda x: x)


def transpose(swizzled: bool) -> Kernel:
    """Each warp transposes its own 32 x 32 f32 tile through SMEM: pass 1 lane
    ``l`` stores row ``r``'s element ``l`` (r = 0..31), pass 2 lane ``l`` loads
    column ``c``'s element ``l`` (c = 0..31) and stores it to row ``c`` of the
    output. Element (r, c) of a tile lives at word ``32 r + c`` (or, swizzled,
    ``32 r + (c xor r)``)."""
    from jax._src.interpreters import mlir
    from jax._src.lib.mlir import ir
    from jax._src.lib.mlir.dialects import arith, gpu, memref
    from jax.experimental.mosaic import gpu as mgpu

    rows = 32 * WARPS
    name = f"smalti_transpose_{'swizzled' if swizzled else 'unswizzled'}"

    def here():  # this file's line as the ops' location, so by_line names it
        return ir.Location.file(__file__, sys._getframe(1).f_lineno, 1)

    def body(ctx, x_ref, o_ref, smem):
        index = ir.IndexType.get()

        def c(v):
            return arith.constant(index, v)
        tid = gpu.thread_id(gpu.Dimension.x)
        lane = arith.remui(tid, c(32))
        tile = arith.muli(arith.divui(tid, c(32)), c(32))  # the warp's first row

        def word(r, col):  # of element (r, col) of this warp's tile
            if swizzled:
                col = arith.xori(col, r)
            return arith.addi(arith.muli(arith.addi(tile, r), c(32)), col)
        for r in range(32):
            with here():  # pass 1: rows in
                v = memref.load(x_ref, [arith.addi(tile, c(r)), lane])
                memref.store(v, smem, [word(c(r), lane)])
        with here():  # between the passes
            gpu.barrier()
        for col in range(32):
            with here():  # pass 2: columns out
                v = memref.load(smem, [word(lane, c(col))])
                memref.store(v, o_ref, [arith.addi(tile, c(col)), lane])

    sds = jax.ShapeDtypeStruct((rows, 32), jnp.float32)
    with mlir.make_ir_context(), ir.Location.unknown():
        fn = mgpu.as_gpu_kernel(body, (1, 1, 1), (32 * WARPS, 1, 1), (sds,), sds,
                                jax.ShapeDtypeStruct((rows * 32,), jnp.float32),
                                kernel_name=name)
    x = np.arange(rows * 32, dtype=np.float32).reshape(rows, 32)
    return Kernel(name, fn, [x],
                  lambda x: x.reshape(WARPS, 32, 32).transpose(0, 2, 1).reshape(rows, 32))


def _swizzled_f16():
    return (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))  # 64 f16 = 128 bytes


def tma_transpose() -> Kernel:
    shape = TMA_TRANSPOSE_SHAPE
    t = _swizzled_f16()

    def smalti_tma_transpose_f16(x_gmem, o_gmem, x_smem, o_smem, bar):
        plgpu.copy_gmem_to_smem(x_gmem, x_smem, bar)
        plgpu.barrier_wait(bar)
        o_smem.T[...] = plgpu.load(x_smem, layout=plgpu.Layout.WGMMA)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(o_smem, o_gmem)
        plgpu.wait_smem_to_gmem(0)

    fn = plgpu.kernel(smalti_tma_transpose_f16,
                      out_type=jax.ShapeDtypeStruct(shape[::-1], jnp.float16),
                      scratch_types=[plgpu.SMEM(shape, jnp.float16, transforms=t),
                                     plgpu.SMEM(shape[::-1], jnp.float16, transforms=t),
                                     plgpu.Barrier()],
                      compiler_params=WG)
    x = np.arange(np.prod(shape)).reshape(shape).astype(np.float16)
    return Kernel("smalti_tma_transpose_f16", fn, [x], lambda x: x.T)


def wgmma_tile() -> Kernel:
    m, k, n = WGMMA_M, WGMMA_K, WGMMA_N
    t = _swizzled_f16()  # 64 bf16 = 128 bytes too

    def smalti_wgmma_tile(a_gmem, b_gmem, o_gmem, a_smem, b_smem, bar):
        plgpu.copy_gmem_to_smem(a_gmem, a_smem, bar.at[0])
        plgpu.copy_gmem_to_smem(b_gmem, b_smem, bar.at[1])
        plgpu.barrier_wait(bar.at[0])
        plgpu.barrier_wait(bar.at[1])

        def scope(acc_ref):
            plgpu.wgmma(acc_ref, a_smem, b_smem)
            plgpu.wgmma_wait(0)
            return acc_ref[...]
        o_gmem[...] = pl.run_scoped(scope, plgpu.ACC((m, n), jnp.float32))

    fn = plgpu.kernel(smalti_wgmma_tile, out_type=jax.ShapeDtypeStruct((m, n), jnp.float32),
                      scratch_types=[plgpu.SMEM((m, k), jnp.bfloat16, transforms=t),
                                     plgpu.SMEM((k, n), jnp.bfloat16, transforms=t),
                                     plgpu.Barrier(num_barriers=2)],
                      compiler_params=WG)
    rng = np.random.default_rng(37)
    # small integers: every product and sum is exact in f32, whatever the order
    a = rng.integers(-4, 5, (m, k)).astype(jnp.bfloat16)
    b = rng.integers(-4, 5, (k, n)).astype(jnp.bfloat16)
    return Kernel("smalti_wgmma_tile", fn, [a, b],
                  lambda a, b: a.astype(np.float32) @ b.astype(np.float32))


def kernels() -> list[Kernel]:
    return [copy_conflict_free(), transpose(False), transpose(True), tma_transpose(),
            wgmma_tile()]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--emulate", action="store_true",
                        help="print the emulator's profile of each kernel (no GPU needed)")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each kernel on the GPU")
    parser.add_argument("--ncu-metrics", action="store_true",
                        help="print the metrics for ncu --metrics and exit")
    args = parser.parse_args(argv)
    if args.ncu_metrics:
        from smalti.emulate.profiling import COUNTERS

        names = [f"{k}.sum" for k in COUNTERS if not k.startswith("smalti__")]
        print(",".join(names + ["dram__bytes_read.sum", "dram__bytes_write.sum"]))
        return 0
    for kern in kernels():
        print(f"== {kern.name}", flush=True)
        if args.emulate:
            import smalti.emulate

            prof = smalti.emulate.profile(kern.fn, *kern.args)
            ok = np.array_equal(prof.outputs[0], kern.want(*kern.args))
            print(prof)
            print(f"output equal to numpy's: {ok}", flush=True)
            continue
        f = jax.jit(kern.fn)
        for _ in range(args.repeat):
            out = jax.block_until_ready(f(*kern.args))
        got = np.asarray(out[0] if isinstance(out, (tuple, list)) else out)
        print(f"ran {args.repeat} times; output equal to numpy's: "
              f"{np.array_equal(got, kern.want(*kern.args))}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
