"""``gpu.printf``: what each thread prints, formatted as C's printf, in a
deterministic order (blocks in turn, threads by index)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

import smalti.emulate as emu
from tests.emulate.test_wrong_answers import lane_kernel


def test_every_thread_prints_its_own_values_in_thread_order(capsys):
    from jax._src.lib.mlir import ir
    from jax._src.lib.mlir.dialects import arith, gpu, memref
    from jax.experimental.mosaic.gpu import utils as mgpu_utils

    def kernel(ctx, x_ref, o_ref, _):
        tid = mgpu_utils.thread_idx()
        v = memref.load(x_ref, [arith.index_cast(ir.IndexType.get(), tid)])
        neg = arith.subi(mgpu_utils.c(0, tid.type), tid)
        gpu.printf("t=%d x=%.3f neg=%u hex=%08x|%5d%%\n", tid, arith.extf(ir.F64Type.get(), v),
                   neg, tid, tid)
        memref.store(v, o_ref, [arith.index_cast(ir.IndexType.get(), tid)])

    sds = jax.ShapeDtypeStruct((128,), jnp.float32)
    x = np.random.default_rng(0).standard_normal(128).astype(np.float32)
    emu.run(lane_kernel(kernel, [sds], [sds]), x)
    want = "".join(f"t={t} x={float(x[t]):.3f} neg={(-t) % 2**32} hex={t:08x}|{t:5d}%\n"
                   for t in range(128))
    assert capsys.readouterr().out == want


def test_pallas_debug_print_prints_once_per_block_in_block_order(capsys):
    def body(o_gmem):
        i = lax.axis_index("x")
        pl.debug_print("block {} of {}", i, 3)
        o_gmem[i] = jnp.zeros((128,), jnp.float32)

    k = plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((3, 128), jnp.float32), grid=(3,),
                     grid_names=("x",))
    emu.run(k)
    assert capsys.readouterr().out == "".join(f"block {b} of 3\n" for b in range(3))


def test_a_conversion_it_cannot_print_is_unsupported():
    from jax._src.lib.mlir.dialects import gpu
    from jax.experimental.mosaic.gpu import utils as mgpu_utils

    def kernel(ctx, o_ref, _):
        gpu.printf("%s\n", mgpu_utils.thread_idx())

    with pytest.raises(emu.Unsupported, match="printf conversion '%s'"):
        emu.run(lane_kernel(kernel, [], [jax.ShapeDtypeStruct((128,), jnp.float32)]))
