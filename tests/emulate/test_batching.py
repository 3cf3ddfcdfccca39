"""Runs of one elementwise op run as one numpy call (:mod:`smalti.emulate.batching`),
and runs take the stacks an earlier run split (:mod:`smalti.emulate.stacks`):
which runs batch, and that a batched kernel computes the same bits."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import mosaic_gpu as plgpu

import smalti.emulate as emu
from smalti.emulate.batching import Elementwise, batch
from smalti.emulate.fusion import Entry, nothing
from smalti.emulate.stacks import Split, Splits

WG = plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup)
S = jax.ShapeDtypeStruct


class _Frame:
    def __init__(self, regs, T=4):
        self.regs, self.T, self.mask = regs, T, None


def _op(name, ins, out, fn=np.add, shapes=((2,), (2,))):
    """An elementwise op on vector<2x...> operands (``shapes``), as a rule makes it."""
    def step(fr):
        fr.regs[out] = fn(*(fr.regs[s] for s in ins))
    step.elementwise = Elementwise((name, fn), fn, shapes)
    return Entry(name, ins, [out], step)


def _pure(name, ins, outs):
    def step(fr):
        pass
    return Entry(name, ins, outs, step)


def _batched(entries):
    steps = [e.step for e in entries]
    batch(entries, steps, Splits())
    return [k for k, (e, s) in enumerate(zip(entries, steps)) if s is not e.step], steps


def test_a_run_with_independent_arithmetic_between_batches_into_its_last_op():
    entries = [_op("arith.addf", [1, 2], 10), _pure("arith.constant", [], [20]),
               _op("arith.addf", [3, 2], 11), _op("arith.addf", [4, 2], 12)]
    replaced, steps = _batched(entries)
    assert replaced == [0, 2, 3] and steps[0] is nothing and steps[2] is nothing
    assert steps[1] is entries[1].step


@pytest.mark.parametrize("between,why", [
    (_pure("arith.negf", [10], [30]), "an op using a result of the run"),
    (_pure("nvvm.barrier0", [], []), "an op that is not pure"),
    (_op("arith.addf", [10, 2], 13), "an op of the run using another's result"),
])
def test_a_run_ends_at(between, why):
    entries = [_op("arith.addf", [1, 2], 10), between, _op("arith.addf", [4, 2], 12)]
    assert 0 not in _batched(entries)[0], why


def test_another_elementwise_op_between_stays_in_place():
    entries = [_op("arith.addf", [1, 2], 10), _op("arith.mulf", [3, 2], 13, fn=np.multiply),
               _op("arith.addf", [4, 2], 12)]
    replaced, steps = _batched(entries)
    assert replaced == [0, 2] and steps[1] is entries[1].step


def test_an_op_the_rules_refused_ends_a_run():
    refused = _pure("arith.addi", [5, 6], [30])
    refused.step.refused = emu.Unsupported("arith.addi of i4")
    assert _batched([_op("arith.addf", [1, 2], 10), refused, _op("arith.addf", [4, 2], 12)])[0] \
        == []


def test_a_step_fusion_replaced_ends_a_run():
    entries = [_op("arith.addf", [1, 2], 10), _op("arith.addf", [3, 2], 11)]
    steps = [e.step for e in entries]
    steps[1] = nothing  # (absorbed into a fused access's step)
    batch(entries, steps, Splits())
    assert steps[0] is entries[0].step


def test_the_batched_call_gives_each_op_its_own_result():
    """Per-thread and uniform operands mixed, a shared operand passed once."""
    regs = [None] * 20
    regs[1] = np.arange(8.0).reshape(4, 2)  # per thread
    regs[3] = np.array([10.0, 20.0])  # the same in every thread
    regs[2] = np.array([0.5, 0.25])  # shared by both ops
    entries = [_op("arith.addf", [1, 2], 10), _op("arith.addf", [3, 2], 11)]
    _, steps = _batched(entries)
    for step in steps:
        step(_Frame(regs))
    np.testing.assert_array_equal(regs[10], np.arange(8.0).reshape(4, 2) + [0.5, 0.25])
    np.testing.assert_array_equal(regs[11], np.broadcast_to([10.5, 20.25], (4, 2)))


def test_ops_of_the_same_values_give_each_the_one_result():
    regs = [None] * 20
    regs[1], regs[2] = np.array([1.0, 2.0]), np.array([3.0, 4.0])
    _, steps = _batched([_op("arith.addf", [1, 2], 10), _op("arith.addf", [1, 2], 11)])
    for step in steps:
        step(_Frame(regs))
    np.testing.assert_array_equal(regs[10], [4.0, 6.0])
    np.testing.assert_array_equal(regs[11], [4.0, 6.0])


def test_a_run_takes_the_stack_the_run_before_split():
    """exp of two registers, then mul of the results: the mul's call gets the
    exp call's stack itself, not a new one."""
    seen = []

    def mul(a, b):
        seen.append(a)
        return a * b
    entries = [_op("math.exp", [1], 10, fn=np.exp, shapes=((2,),)),
               _op("math.exp", [2], 11, fn=np.exp, shapes=((2,),)),
               _op("arith.mulf", [10, 3], 12, fn=mul), _op("arith.mulf", [11, 3], 13, fn=mul)]
    steps = [e.step for e in entries]
    splits = Splits()
    batch(entries, steps, splits)
    regs = [None] * 20
    regs[1], regs[2], regs[3] = np.zeros((4, 2)), np.ones((4, 2)), np.full(2, 2.0)
    for step in steps:
        step(_Frame(regs))
    assert seen[0] is splits.stacked(regs, (10, 11))
    np.testing.assert_array_equal(regs[13], np.full((4, 2), 2 * np.e))


def test_a_kept_stack_is_taken_only_while_its_slots_hold_its_values():
    split, regs = Split(), [None] * 4
    stack = np.arange(6.0).reshape(2, 3)
    regs[1], regs[2] = stack
    split.keep(stack, [regs[1], regs[2]])
    assert split.stacked(regs, (1, 2)) is stack
    regs[2] = regs[2].copy()  # the same numbers, another value (a loop's next iteration)
    assert split.stacked(regs, (1, 2)) is None


def test_a_batched_kernel_computes_the_bits_it_computed_op_by_op():
    """exp(v) * 2 + tanh(v) - v * v on a (128, 128) block: 64 registers of
    each op, batched; the profiler runs the module op by op."""
    def body(x_ref, o_ref):
        v = x_ref[...]
        o_ref[...] = jnp.exp(v) * 2 + jnp.tanh(v) - v * v
    k = plgpu.kernel(body, out_type=S((128, 128), jnp.float32), compiler_params=WG)
    x = np.random.default_rng(7).standard_normal((128, 128)).astype(np.float32)
    (batched,) = emu.run(k, x)
    one_by_one = emu.profile(k, x).outputs[0]
    np.testing.assert_array_equal(batched.view(np.uint32), one_by_one.view(np.uint32))
    np.testing.assert_allclose(batched, np.exp(x) * 2 + np.tanh(x) - x * x, rtol=1e-6, atol=1e-5)
