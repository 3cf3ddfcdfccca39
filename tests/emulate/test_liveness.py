"""Dead ops (``emulate.liveness``): pure ops whose results no live op reads
are left out of the compiled program, as a GPU compiler removes them; the
outputs do not change and the profiler counts only what runs."""

from __future__ import annotations

import numpy as np
from jax._src.interpreters import mlir
from jax._src.lib.mlir import ir

import smalti.emulate
from benchmarks import h200_counters
from smalti.emulate import runner
from smalti.emulate.liveness import dead_ops, is_pure
from smalti.emulate.profiling import INST

MODULE = """
func.func @f(%ref: memref<4xf32>, %n: i32) {
  %one = arith.constant 1 : i32
  %a = arith.addi %n, %one : i32
  %b = arith.muli %a, %a : i32
  %c = arith.subi %n, %one : i32
  %p = arith.cmpi slt, %n, %one : i32
  scf.if %p {
    %i = arith.index_cast %c : i32 to index
    %v = memref.load %ref[%i] : memref<4xf32>
  }
  return
}
"""


def test_dead_ops_are_pure_and_unread_through_chains_and_regions():
    """A chain nothing reads is dead as a whole; a value read inside a
    region of a live op, and any load (memory is never pure), are kept."""
    with mlir.make_ir_context(), ir.Location.unknown():
        module = ir.Module.parse(MODULE)
        dead = {op.name: op for op in dead_ops(module)}
        # %a and %b; not %c, read only inside the scf.if, nor the unread load
        assert sorted(dead) == ["arith.addi", "arith.muli"]


def test_what_is_pure():
    assert is_pure("arith.addi") and is_pure("math.exp") and is_pure("llvm.getelementptr")
    assert not any(is_pure(n) for n in ("memref.load", "vector.store", "llvm.inline_asm",
                                        "nvvm.barrier0", "scf.if", "gpu.barrier"))


def test_a_kernel_computes_the_same_and_counts_only_what_runs(monkeypatch):
    """jax's swizzled transfers leave unused address arithmetic: the
    outputs are the same bits with and without it, and the instructions
    counted are fewer without."""
    k = h200_counters.tma_transpose()
    live = smalti.emulate.profile(k.fn, *k.args)
    monkeypatch.setattr(runner, "dead_ops", lambda func: frozenset())
    runner.forget_compiled()  # (the same module, compiled again without the pruning)
    everything = smalti.emulate.profile(k.fn, *k.args)
    np.testing.assert_array_equal(live.outputs[0], k.want(*k.args))
    np.testing.assert_array_equal(everything.outputs[0], live.outputs[0])
    assert live[INST] < everything[INST]
