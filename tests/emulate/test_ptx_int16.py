"""``max/min.{s16,u16}[x2]`` -- what jax emits for ``jnp.maximum``/``jnp.minimum``
of 16-bit integers (``FragmentedArray.max/min``; found by the PTX inventory) --
run in kernels under jax's and smalti's pipelines and equal numpy, over the
whole range of each type, and the one-half (i16 register) form."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from smalti.emulate.ops.inline_asm import _value_fn
from smalti.emulate.testing import emulate_pipeline

RNG = np.random.default_rng(16)


def _kernel(fn, dt):
    from jax.experimental.pallas import mosaic_gpu as plgpu
    wg = plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup)

    def body(x, y, o):
        o[...] = fn(x[...], y[...])
    return plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((128, 128), dt), compiler_params=wg)


@pytest.mark.parametrize("pipeline", ["jax", "smalti"])
@pytest.mark.parametrize("fn", [jnp.maximum, jnp.minimum])
@pytest.mark.parametrize("dt", [np.int16, np.uint16])
def test_int16_max_min_in_a_kernel_equal_numpy(dt, fn, pipeline):
    info = np.iinfo(dt)
    x = RNG.integers(info.min, info.max, (128, 128), endpoint=True).astype(dt)
    y = RNG.integers(info.min, info.max, (128, 128), endpoint=True).astype(dt)
    x[0, :4], y[0, :4] = [info.min, info.max, 0, -1 % (info.max + 1)], [info.max, info.min, 0, 1]
    (got,) = emulate_pipeline(_kernel(fn, dt), x, y, jax_pipeline=pipeline == "jax")
    np.testing.assert_array_equal(got, fn(x, y))


@pytest.mark.parametrize("opcode,ref", [("max.s16", np.maximum), ("min.u16", np.minimum)])
def test_the_one_half_form_works_on_i16_registers(opcode, ref):
    a = RNG.integers(-2 ** 15, 2 ** 15, 1000).astype(np.int16)
    b = RNG.integers(-2 ** 15, 2 ** 15, 1000).astype(np.int16)
    half = np.int16 if ".s" in opcode else np.uint16
    got = _value_fn(opcode, 2)(a, b)
    np.testing.assert_array_equal(got.view(half), ref(a.view(half), b.view(half)))
