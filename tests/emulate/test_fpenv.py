"""The host's floating-point environment while the emulator computes
(``emulate/fpenv.py``): a kernel run as a host callback of XLA:CPU, whose
threads flush subnormals, still computes them as the GPU does."""

from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import mosaic_gpu as plgpu

import smalti.emulate as emu
from smalti.emulate import fpenv
from tests.emulate.kernels import WG, S

F32 = jnp.float32
#: subnormal results and operands of a halving: 2**-126 -> 2**-127, and
#: the smallest subnormals, which DAZ would read as zero
X = np.array([2.0 ** -126, 2.0 ** -149 * 6, -(2.0 ** -140), 1.5] * 32, np.float32)


def halve():
    def body(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 0.5
    return plgpu.kernel(body, out_type=S(X.shape, F32), compiler_params=WG)


def _in_callback(fn):
    """``fn()`` on the thread XLA:CPU runs a host callback on."""
    out = []

    def callback(x):
        out.append(fn())
        return x
    jax.jit(lambda x: jax.pure_callback(callback, jax.ShapeDtypeStruct((), F32), x))(
        np.float32(0)).block_until_ready()
    return out[0]


def test_subnormals_survive_a_kernel_run_inside_an_xla_program():
    """Halving 2**-126 gives 2**-127, and subnormal operands are read as
    themselves, bit for bit numpy's on this (IEEE) thread."""
    with emu.on_cpu((9, 0)):
        got = np.asarray(jax.jit(halve())(X))
    np.testing.assert_array_equal(got.view(np.uint32), (X * np.float32(0.5)).view(np.uint32))


def test_a_run_from_a_thread_that_flushes_keeps_them_too():
    """``run_module`` called on such a thread (a user's own callback, say):
    the same bits, and the thread's setting back afterwards."""
    module, avals = emu.lower(halve(), X)
    outputs = [(tuple(a.shape), np.dtype(a.dtype)) for a in avals]

    def run_there():
        before = fpenv.flushes_subnormals()
        (got,) = emu.run_module(module, [X], outputs)
        return got, before, fpenv.flushes_subnormals()

    got, before, after = _in_callback(run_there)
    np.testing.assert_array_equal(got.view(np.uint32), (X * np.float32(0.5)).view(np.uint32))
    assert after == before


def test_without_it_the_callback_s_thread_would_flush_them(monkeypatch):
    """The twin: where XLA's thread flushes subnormals (FTZ and DAZ), the
    same kernel with the environment left alone computes zeros."""
    if not _in_callback(fpenv.flushes_subnormals):
        pytest.skip("this XLA's callback threads keep subnormals")
    monkeypatch.setattr(fpenv, "ieee_subnormals", contextlib.nullcontext)
    with emu.on_cpu((9, 0)):
        got = np.asarray(jax.jit(halve())(X))
    assert (got[:3] == 0).all() and got[3] == 0.75


def test_the_environment_is_the_caller_s_again_afterwards():
    """Inside, subnormals are kept; after, the callback thread's own setting
    is back, whatever it was."""
    def inside_and_after():
        before = fpenv.flushes_subnormals()
        with fpenv.ieee_subnormals():
            inside = fpenv.flushes_subnormals()
        return before, inside, fpenv.flushes_subnormals()

    before, inside, after = _in_callback(inside_and_after)
    assert not inside and after == before
    assert not fpenv.flushes_subnormals()  # this (main) thread: IEEE throughout


def test_where_it_cannot_be_turned_off_the_emulator_refuses(monkeypatch):
    """No C library to call: a flushing thread raises EmulationError (never a
    silent wrong answer); a thread that keeps subnormals needs none."""
    monkeypatch.setattr(fpenv, "_libm", lambda: None)
    with fpenv.ieee_subnormals():  # this thread keeps them: nothing to do
        pass
    if not _in_callback(fpenv.flushes_subnormals):
        pytest.skip("this XLA's callback threads keep subnormals")

    def attempt():
        try:
            with fpenv.ieee_subnormals():
                return None
        except emu.EmulationError as e:
            return str(e)

    message = _in_callback(attempt)
    assert message is not None and "flushes subnormal numbers" in message
