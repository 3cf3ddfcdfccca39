"""``run_module`` keeps the program it compiled for a module's text
(:func:`smalti.emulate.runner.compiled`): a kernel lowered again runs the
same program; a module changed since, or printed with other locations,
compiles anew; at most ``KEEP_COMPILED`` are kept."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import mosaic_gpu as plgpu

import smalti.emulate as emu
from smalti.emulate import runner

X = np.arange(128, dtype=np.float32)


def _kernel(scale: float):
    def body(x_ref, o_ref):
        o_ref[...] = x_ref[...] * scale
    return plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((128,), jnp.float32))


@pytest.fixture(autouse=True)
def _fresh():
    runner.forget_compiled()
    yield
    runner.forget_compiled()


def test_a_kernel_lowered_again_runs_the_program_compiled_for_the_first():
    first, _ = emu.lower(_kernel(2.0), X)
    again, _ = emu.lower(_kernel(2.0), X)
    assert first is not again
    assert runner.compiled(first) is runner.compiled(again)
    (out,) = emu.run_module(again, [X], [((128,), np.dtype(np.float32))])
    np.testing.assert_array_equal(out, X * 2)


def test_another_module_or_other_flags_compile_anew():
    two, _ = emu.lower(_kernel(2.0), X)
    three, _ = emu.lower(_kernel(3.0), X)
    assert runner.compiled(two) is not runner.compiled(three)
    assert runner.compiled(two) is not runner.compiled(two, sanitize=False)
    (out,) = emu.run_module(three, [X], [((128,), np.dtype(np.float32))])
    np.testing.assert_array_equal(out, X * 3)


def test_a_module_changed_after_it_ran_compiles_anew():
    """The text is the key, not the object: erasing an op makes another program."""
    from tests.differential import ops_named

    module, _ = emu.lower(_kernel(2.0), X)
    before = runner.compiled(module)
    (mul, *_) = ops_named(module, "arith.mulf")
    mul.result.replace_all_uses_with(mul.operands[0])  # o = x now
    mul.erase()
    assert runner.compiled(module) is not before
    (out,) = emu.run_module(module, [X], [((128,), np.dtype(np.float32))])
    np.testing.assert_array_equal(out, X)


def test_at_most_keep_compiled_programs_are_kept(monkeypatch):
    monkeypatch.setattr(runner, "KEEP_COMPILED", 2)
    modules = [emu.lower(_kernel(float(k)), X)[0] for k in range(3)]
    programs = [runner.compiled(m) for m in modules]
    assert len(runner._COMPILED) == 2
    assert runner.compiled(modules[2]) is programs[2]  # the newest are kept
    assert runner.compiled(modules[0]) is not programs[0]  # the oldest was dropped
