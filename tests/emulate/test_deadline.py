"""``smalti.emulate.deadline``: a run bounded by its caller stops at the
deadline -- directly and inside a jax program's host callback, where no
signal reaches it -- and a run within it is not disturbed."""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import smalti.emulate as emu
from smalti.emulate.deadline import DeadlineExceeded, deadline
from tests.emulate.kernels import K, S

#: far more iterations than a test could wait for (each is tens of microseconds)
FOREVER = 10**8


def counting(trips: int):
    """A Pallas kernel adding 1 to a (128,) row ``trips`` times."""
    def body(x, o):
        o[...] = lax.fori_loop(0, trips, lambda i, acc: acc + 1.0, x[...])
    return K(body, S((128,), jnp.float32))


X = np.zeros(128, np.float32)


def test_a_long_loop_stops_at_the_deadline_and_names_it():
    start = time.monotonic()
    with deadline(0.5), pytest.raises(DeadlineExceeded, match=r"scf\.for at .*fix: give"):
        emu.run(counting(FOREVER), X)
    assert time.monotonic() - start < 60
    assert issubclass(DeadlineExceeded, emu.EmulationError)


def test_a_kernel_in_a_host_callback_stops_at_the_deadline():
    with emu.on_cpu(), deadline(0.5), pytest.raises(jax.errors.JaxRuntimeError,
                                                    match="DeadlineExceeded"):
        np.asarray(jax.jit(counting(FOREVER))(X))


def test_a_run_within_the_deadline_and_one_after_it_ended_are_untouched():
    with deadline(600):
        (out,) = emu.run(counting(3), X)
    np.testing.assert_array_equal(out, X + 3)
    with deadline(0.001):
        time.sleep(0.01)  # passed, but nothing emulates inside
    (out,) = emu.run(counting(2), X)  # the deadline ended with its block
    np.testing.assert_array_equal(out, X + 2)


def test_the_inner_deadline_holds_and_the_outer_returns():
    with deadline(600):
        with deadline(0.001):
            time.sleep(0.01)
            with pytest.raises(DeadlineExceeded):
                emu.run(counting(2), X)
        (out,) = emu.run(counting(1), X)
    np.testing.assert_array_equal(out, X + 1)


@pytest.mark.parametrize("seconds", [0, -1.0, float("nan")])
def test_a_deadline_must_be_positive(seconds):
    with pytest.raises(ValueError, match="must be positive"):
        with deadline(seconds):
            pass
