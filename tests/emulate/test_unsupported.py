"""What the emulator does not model raises Unsupported, naming it and where."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

import smalti.emulate as emu
from smalti.emulate import memory, tma
from tests.emulate.kernels import WG, S, cases, normal


def test_a_wgmma_operand_not_modelled_is_unsupported_and_named():
    """WGMMA of f32 inputs (.tf32) with a subnormal operand: the PTX ISA leaves
    subnormal inputs unspecified, so the emulator refuses it rather than guess
    (its normal twin runs: tests/emulate/test_wgmma_forms.py)."""
    from tests.emulate.test_wgmma_forms import _matmul

    x = normal((64, 64), np.float32)
    x[5, 7] = 2.0 ** -130  # subnormal, and kept by the truncation to tf32
    with pytest.raises(emu.Unsupported, match=r"subnormal \.tf32 WGMMA operand.* at loc\("):
        emu.run(_matmul(jnp.float32, jnp.float32, False, 64, 64), x, x)


@pytest.mark.parametrize("name,output", [("tma_smem_swizzle128", 1), ("tma_gather4_swizzle128", 1),
                                         ("tma_scatter4_swizzle128", 0)])
def test_a_wrong_swizzle_would_be_noticed(monkeypatch, name, output):
    """The TMA swizzle and jax's register-side swizzled addressing must agree:
    with TMA's swizzle switched off the round trip no longer matches."""
    case = next(c for c in cases() if c.name == name)
    want = case.ref(*case.args)
    want = want if isinstance(want, tuple) else (want,)
    good = emu.run(case.fn, *case.args)
    np.testing.assert_array_equal(good[output], want[output])
    monkeypatch.setattr(tma, "swizzle", lambda addr, _: addr)
    tma._dense_smem.cache_clear()  # SMEM addresses are kept: not the patched ones
    try:
        bad = emu.run(case.fn, *case.args, workers=1)  # the patch is this process's
    finally:
        tma._dense_smem.cache_clear()
    assert not np.array_equal(bad[output], want[output])
    assert memory.swizzle is not tma.swizzle


def test_unknown_inline_ptx_is_unsupported():
    from smalti.emulate.ops.inline_asm import _parse

    assert _parse("@$1 prefetch.tensormap [$0];") == ("1", False, "prefetch.tensormap", ["[$0]"])
    assert _parse("{ .reg .b32 r; mov.b32 r, $1; }")[2] == ""  # multi-instruction: not parsed


def test_warpgroups_that_wait_for_each_other_are_a_named_deadlock():
    """Each warpgroup waits on a barrier only the other would arrive on, after
    its own wait: on the GPU the kernel hangs; the emulator says where each waits."""
    from jax import lax

    def body(o_gmem, a, b):
        wg = lax.axis_index("wg")

        @pl.when(wg == 0)
        def _():
            plgpu.barrier_wait(a)
            plgpu.barrier_arrive(b)

        @pl.when(wg == 1)
        def _():
            plgpu.barrier_wait(b)
            plgpu.barrier_arrive(a)
        o_gmem[...] = jnp.zeros((128,), jnp.float32)

    call = plgpu.kernel(body, out_type=S((128,), jnp.float32), compiler_params=WG,
                        scratch_types=[plgpu.Barrier(), plgpu.Barrier()],
                        num_threads=2, thread_name="wg")
    with pytest.raises(emu.Deadlock, match=r"warpgroup 0 waits for mbarrier .* phase parity 0"
                       r" at loc\(.*warpgroup 1 waits for mbarrier"):
        emu.run(call)


def test_a_wait_nothing_can_complete_in_one_warpgroup_is_a_deadlock():
    def body(o_gmem, a):
        plgpu.barrier_wait(a)
        o_gmem[...] = jnp.zeros((128,), jnp.float32)

    call = plgpu.kernel(body, out_type=S((128,), jnp.float32), compiler_params=WG,
                        scratch_types=[plgpu.Barrier()])
    with pytest.raises(emu.Deadlock,
                       match="phase that has not completed .* nothing else in this block"):
        emu.run(call)
