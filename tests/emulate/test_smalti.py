"""smalti's lowerings that emit code jax does not, run on the emulator and
compared with numpy."""

from __future__ import annotations

import jax.numpy as jnp
import pytest
from jax.experimental.pallas import mosaic_gpu as plgpu

import smalti.emulate as emu
import smalti.jax
from smalti.emulate.testing import assert_close_ulp
from tests.emulate.kernels import WG, S, normal

fma_mod = pytest.importorskip("smalti_example_plugin")


def test_without_smalti_the_example_op_does_not_lower():
    def body(a, o):
        o[...] = fma_mod.fma(a[...], a[...], a[...])
    call = plgpu.kernel(body, out_type=S((128, 128), jnp.float32), compiler_params=WG)
    with pytest.raises(NotImplementedError):
        emu.run(call, normal((128, 128)))


def test_smalti_and_jax_pipelines_agree_on_a_shared_kernel():
    def body(x, o):
        o[...] = jnp.exp(x[...]) - x[...] * 2
    call = plgpu.kernel(body, out_type=S((128, 128), jnp.float32), compiler_params=WG)
    x = normal((128, 128))
    (theirs,) = emu.run(call, x)
    with smalti.jax.installed():
        (ours,) = emu.run(call, x)
    assert_close_ulp(ours, theirs, 0)
