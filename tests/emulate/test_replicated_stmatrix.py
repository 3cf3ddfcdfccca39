"""Warps storing a replicated layout with ``stmatrix`` (issue 36).

jax stores a replicated register layout (``WGMMA_COL_LAYOUT``: every warp
holds the whole vector) from every warp; for 16-bit elements in SMEM it does
so with ``stmatrix``. Warps writing equal values to the same bytes in one
step are one group write (docs/emulator.md, "Shadow memory"), as for
``llvm.store``/``vector.store``: a read is ordered after the group once it is
ordered after one member -- its own warp's. Before the fix ``stmatrix`` passed
no values to the checker, so jax's ``test_wgmma_col_load_store_with_layout``
(f16) was reported as a write-after-write between warps 0 and 3. A twin whose
warps store different values is still a race, with both lines."""

from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import smalti.emulate as emu

S = jax.ShapeDtypeStruct
X = np.arange(128).astype(np.float16)


def _line(marker: str) -> int:
    """The line of this file holding ``# marker``."""
    lines, first = inspect.getsourcelines(replicated_store_kernel)
    return first + next(i for i, text in enumerate(lines) if f"# {marker}" in text)


def replicated_store_kernel(per_warp_values: bool):
    """Every warp stores the column vector ``x`` (+ its warp index, when
    ``per_warp_values``) to SMEM with ``stmatrix``; every warp then reads it
    back with ``ldmatrix``, with no barrier between, and stores it out."""
    from jax._src.interpreters import mlir
    from jax._src.lib.mlir import ir
    from jax._src.lib.mlir.dialects import arith
    from jax.experimental.mosaic import gpu as mgpu
    from jax.experimental.mosaic.gpu import utils as mgpu_utils

    store_line, load_line = _line("replicated store"), _line("read back")

    def kernel(ctx, x_ref, o_ref, smem):
        t = mgpu.FragmentedArray.load_untiled(x_ref, layout=mgpu.WGMMA_COL_LAYOUT,
                                              optimized=False)
        if per_warp_values:
            i32 = ir.IntegerType.get_signless(32)
            warp = arith.divui(mgpu_utils.thread_idx(), mgpu_utils.c(32, i32))
            t = t + mgpu.FragmentedArray.splat(arith.uitofp(ir.F16Type.get(), warp), t.shape)
        with ir.Location.file(__file__, store_line, 0):
            t.store_untiled(smem, swizzle=16)  # replicated store
        with ir.Location.file(__file__, load_line, 0):
            back = mgpu.FragmentedArray.load_untiled(  # read back
                smem, layout=mgpu.WGMMA_COL_LAYOUT, optimized=False, swizzle=16)
        back.store_untiled(o_ref, optimized=False)

    vec = S((128,), jnp.float16)
    with mlir.make_ir_context(), ir.Location.unknown():
        return mgpu.as_gpu_kernel(kernel, (1, 1, 1), (128, 1, 1), (vec,), vec, vec)


def test_warps_storing_a_replicated_layout_with_stmatrix_are_one_write():
    (got,) = emu.run(replicated_store_kernel(False), X, on_race="raise")
    np.testing.assert_array_equal(got, X)


def test_warps_storing_different_values_with_stmatrix_still_race():
    with pytest.raises(emu.RaceError) as err:
        emu.run(replicated_store_kernel(True), X)
    races = {r.kind: r for r in err.value.races}
    store = f"test_replicated_stmatrix.py:{_line('replicated store')}"
    load = f"test_replicated_stmatrix.py:{_line('read back')}"
    waw = races["write-after-write"]
    assert waw.space == "smem" and waw.first.op == waw.second.op == "nvvm.stmatrix"
    assert waw.first.location.endswith(store) and waw.second.location.endswith(store)
    assert waw.first.agent != waw.second.agent
    raw = races["read-after-write"]
    assert raw.first.op == "nvvm.stmatrix" and raw.first.location.endswith(store)
    assert raw.second.op == "nvvm.ldmatrix" and raw.second.location.endswith(load)
