"""Kernels of the kinds jax's own Pallas Mosaic GPU tests lower (Warpgroup
semantics), with ``smalti.vocabulary`` on: the plugin never takes away what
jax lowers. Each kernel lowers with jax alone, gives the same modules with
the plugin installed (jax's rules keep what they lower), and computes
numpy's answer on the emulator.

The kernels are written here after the forms of jax's tests
(``tests/pallas/mosaic_gpu_test.py``: ``test_slice_untiled_dim``,
``test_reshape``, reshapes of tiled loads, dynamic indexing of refs, iotas
in a layout, unary ops), not copied from them.
"""

from __future__ import annotations

import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.experimental.pallas import mosaic_gpu as plgpu

import smalti
import smalti.emulate
import smalti.jax
import smalti.vocabulary
from tests.official import capture_modules

WG = plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup)
F32 = jnp.float32


@pytest.fixture(scope="module")
def pipeline():
    return smalti.build_pipeline(plugins={"smalti.vocabulary": smalti.vocabulary})


def _load(ref, layout):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return plgpu.load(ref, (), layout=layout, optimized=False)


def slice_untiled_dim_loaded():
    """``x[1, 1]`` of a (2, 3, 64, 8) value loaded in the WGMMA layout: a
    slice of the untiled leading dimensions (the vocabulary's own slice rule
    is for 1-D and 2-D values; jax's takes this one)."""
    x = np.arange(2 * 3 * 64 * 8, dtype=np.float32).reshape(2, 3, 64, 8)

    def body(x_ref, o_ref):
        o_ref[...] = _load(x_ref, plgpu.Layout.WGMMA)[1, 1]

    return plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((64, 8), F32),
                        compiler_params=WG), [x], x[1, 1]


def slice_untiled_dim_from_smem():
    """The same slice of a value read from tiled, swizzled SMEM after TMA."""
    x = np.arange(2 * 3 * 64 * 8, dtype=np.float32).reshape(2, 3, 64, 8) - 700

    def body(x_ref, o_ref, smem, barrier):
        plgpu.copy_gmem_to_smem(x_ref, smem, barrier)
        plgpu.barrier_wait(barrier)
        o_ref[...] = smem[...][1, 2]

    transforms = (plgpu.TilingTransform((8, 8)), plgpu.SwizzleTransform(32))
    return plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((64, 8), F32), compiler_params=WG,
                        scratch_types=[plgpu.SMEM(x.shape, F32, transforms=transforms),
                                       plgpu.Barrier()]), [x], x[1, 2]


def reshaped_ref():
    """A ref reshaped from (128,) to (2, 16, 4), then read whole."""
    x = np.arange(128, dtype=np.float32) * 0.5

    def body(x_ref, o_ref):
        o_ref[...] = x_ref.reshape(2, 16, 4)[...]

    return plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((2, 16, 4), F32),
                        compiler_params=WG), [x], x.reshape(2, 16, 4)


def reshaped_tiled_load():
    """A (384, 8) WGMMA-layout load reshaped to (2, 3, 64, 8) (leading
    dimensions split off the untiled rows) into swizzled SMEM, then out."""
    x = np.arange(384 * 8, dtype=np.float32).reshape(384, 8)
    shape = (2, 3, 64, 8)

    def body(x_ref, o_ref, smem):
        smem[...] = _load(x_ref, plgpu.Layout.WGMMA).reshape(shape)
        o_ref[...] = smem[...]

    transforms = (plgpu.TilingTransform((8, 8)), plgpu.SwizzleTransform(32))
    return plgpu.kernel(body, out_type=jax.ShapeDtypeStruct(shape, F32), compiler_params=WG,
                        scratch_types=[plgpu.SMEM(shape, F32, transforms=transforms)]), \
        [x], x.reshape(shape)


def grouped_plain_load():
    """A block loaded plainly from GMEM (strided) reshaped into groups of 32
    columns: jax's own reshape (a view of a tiled block is the plugin's)."""
    x = np.arange(64 * 128, dtype=np.float32).reshape(64, 128) / 7

    def body(x_ref, o_ref):
        o_ref[...] = x_ref[...].reshape(64, 4, 32) * 2

    return plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((64, 4, 32), F32),
                        compiler_params=WG), [x], x.reshape(64, 4, 32) * 2


def dynamic_row_of_a_ref():
    """``x_ref[i]`` with ``i`` a sum computed in the kernel."""
    x = np.arange(4 * 128, dtype=np.float32).reshape(4, 128)
    y = np.zeros(128, np.int32)
    y[:3] = 1

    def body(x_ref, y_ref, o_ref):
        o_ref[...] = x_ref[jnp.sum(y_ref[...], dtype=jnp.int32)]

    return plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((128,), F32),
                        compiler_params=WG), [x, y], x[3]


def iota_in_a_layout():
    def body(o_ref):
        o_ref[...] = plgpu.broadcasted_iota(jnp.int32, (128, 128), 1, layout=plgpu.Layout.WGMMA)

    want = np.broadcast_to(np.arange(128, dtype=np.int32), (128, 128))
    return plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((128, 128), jnp.int32),
                        compiler_params=WG), [], want


def unary_ops():
    """neg, exp, x ** 2, x ** 5, tanh, sign and abs of a 1-D block."""
    x = (np.arange(256, dtype=np.float32) - 128) / 32

    def body(x_ref, o_ref):
        v = x_ref[...]
        o_ref[...] = -v + jnp.exp(v) + v ** 2 + v ** 5 + jnp.tanh(v) + jnp.sign(v) + jnp.abs(v)

    want = -x + np.exp(x) + x ** 2 + x ** 5 + np.tanh(x) + np.sign(x) + np.abs(x)
    return plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((256,), F32),
                        compiler_params=WG), [x], want


def integer_sign_and_shifts():
    x = np.arange(256, dtype=np.int32) - 128

    def body(x_ref, o_ref):
        v = x_ref[...]
        o_ref[...] = lax.sign(v) + lax.shift_left(v, 2) + lax.shift_right_arithmetic(v, 1)

    want = np.sign(x) + (x << 2) + (x >> 1)
    return plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((256,), jnp.int32),
                        compiler_params=WG), [x], want


KERNELS = [slice_untiled_dim_loaded, slice_untiled_dim_from_smem, reshaped_ref,
           reshaped_tiled_load, grouped_plain_load, dynamic_row_of_a_ref, iota_in_a_layout,
           unary_ops, integer_sign_and_shifts]


@pytest.mark.parametrize("make", KERNELS, ids=lambda f: f.__name__)
def test_jax_lowers_it_and_the_plugin_keeps_its_modules(pipeline, make):
    call, args, _ = make()
    structs = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in args]
    by_jax = capture_modules(call, *structs)
    blocked = smalti.build_pipeline(plugins={"smalti.vocabulary": smalti.vocabulary},
                                    block=["smalti.vocabulary"])
    with smalti.jax.installed(blocked):
        without = capture_modules(call, *structs)
    with smalti.jax.installed(pipeline):
        with_plugin = capture_modules(call, *structs)
    assert len(by_jax) == len(with_plugin) == 1
    if make in RESERVING:
        with_plugin, without = map(_without_smem_size, (with_plugin, without))
    assert with_plugin == without


#: Kernels whose only difference with the plugin is SMEM the plugin's
#: estimator reserves and the kernel leaves unused: Pallas estimates before
#: lowering, from shapes alone, and a (64, 128) -> (64, 4, 32) reshape is the
#: plugin's unless the block was loaded plainly (which only lowering sees).
RESERVING = {grouped_plain_load}


def _without_smem_size(modules: list[str]) -> list[str]:
    text = [re.sub(r"dynamic_shared_memory_size %c\d+_i32", "dynamic_shared_memory_size N", m)
            for m in modules]
    return [re.sub(r" *%c\d+_i32 = arith.constant \d+ : i32\n", "", m) for m in text]


@pytest.mark.parametrize("make", KERNELS, ids=lambda f: f.__name__)
def test_it_computes_numpy_s_answer_with_the_plugin(pipeline, make):
    call, args, want = make()
    with smalti.jax.installed(pipeline):
        (got,) = smalti.emulate.run(call, *args)
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6)
