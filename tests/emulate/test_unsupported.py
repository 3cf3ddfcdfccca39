"""What the emulator does not model raises Unsupported, naming it and where."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import mosaic_gpu as plgpu

import smalti.emulate as emu
from smalti.emulate import memory, tma
from tests.emulate.kernels import WG, S, cases, normal


def test_wgmma_is_unsupported_and_named():
    def body(a_gmem, b_gmem, o_gmem, a, b, acc, bar):
        plgpu.copy_gmem_to_smem(a_gmem, a, bar)
        plgpu.barrier_wait(bar)
        plgpu.copy_gmem_to_smem(b_gmem, b, bar)
        plgpu.barrier_wait(bar)
        plgpu.wgmma(acc, a, b)
        plgpu.wgmma_wait(0)
        o_gmem[...] = acc[...]
    t = (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))
    call = plgpu.kernel(body, out_type=S((64, 64), jnp.float32), compiler_params=WG,
                        scratch_types=[plgpu.SMEM((64, 64), jnp.float16, transforms=t),
                                       plgpu.SMEM((64, 64), jnp.float16, transforms=t),
                                       plgpu.ACC((64, 64), jnp.float32), plgpu.Barrier()])
    x = normal((64, 64), np.float16)
    with pytest.raises(emu.Unsupported, match=r"wgmma.*not modelled.* at loc\("):
        emu.run(call, x, x)


def test_a_wrong_swizzle_would_be_noticed(monkeypatch):
    """The TMA swizzle and jax's register-side swizzled addressing must agree:
    with TMA's swizzle switched off the round trip no longer matches."""
    case = next(c for c in cases() if c.name == "tma_smem_swizzle128")
    good = emu.run(case.fn, *case.args)
    np.testing.assert_array_equal(good[1], case.ref(*case.args)[1])
    monkeypatch.setattr(tma, "swizzle", lambda addr, _: addr)
    bad = emu.run(case.fn, *case.args)
    assert not np.array_equal(bad[1], case.ref(*case.args)[1])
    assert memory.swizzle is not tma.swizzle


def test_unknown_inline_ptx_is_unsupported():
    from smalti.emulate.ops.inline_asm import _parse

    assert _parse("@$1 prefetch.tensormap [$0];") == ("1", False, "prefetch.tensormap", ["[$0]"])
    assert _parse("{ .reg .b32 r; mov.b32 r, $1; }")[2] == ""  # multi-instruction: not parsed
