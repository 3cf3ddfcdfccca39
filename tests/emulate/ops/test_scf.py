"""``scf`` rules: loops against Python loops (empty ranges, carried values),
``scf.if`` uniform and divergent (each thread gets its own branch's values;
stores honour the mask), ``scf.while``, ``scf.execute_region`` and
``scf.index_switch``; bounds that differ between threads are refused."""

from __future__ import annotations

import numpy as np
import pytest

from smalti.emulate.errors import Unsupported

from .harness import assert_same_bits, covers, run

T = 32


@pytest.mark.parametrize("lo,hi,step", [(0, 10, 1), (3, 20, 4), (5, 5, 1), (7, 2, 1),
                                        (-6, 3, 2)])
@covers("scf.for")
def test_for_carries_values_like_a_python_loop(lo, hi, step):
    got = run("""
      %r:2 = scf.for %i = %lo to %hi step %st iter_args(%s = %z, %p = %one) -> (i32, i32) : i32 {
        %s2 = arith.addi %s, %i : i32
        %p2 = arith.muli %p, %i : i32
        scf.yield %s2, %p2 : i32, i32
      }
      %sum = arith.addi %r#0, %r#1 : i32""",
              {"lo": ("i32", lo), "hi": ("i32", hi), "st": ("i32", step), "z": ("i32", 0),
               "one": ("i32", 1)}, {"sum": "i32"})
    s, p = 0, 1
    for i in range(lo, hi, step):
        s, p = s + i, p * i
    assert got["sum"] == s + p


@covers("scf.for")
def test_for_steps_that_differ_between_threads_are_unsupported():
    # (bounds that differ run per thread: tests/emulate/test_divergence_and_views.py)
    with pytest.raises(Unsupported, match="step"):
        run("""
          %t = nvvm.read.ptx.sreg.tid.x : i32
          %c0 = arith.constant 0 : i32
          %c1 = arith.constant 1 : i32
          %s = arith.addi %t, %c1 : i32
          scf.for %i = %c0 to %c1 step %s : i32 {
          }""")


@covers("scf.if", "memref.store")
def test_divergent_if_merges_per_thread_and_masks_stores():
    """Odd threads take the then branch: each gets its branch's value, and
    only the threads of a branch store from it."""
    got = run("""
      %t = gpu.thread_id x
      %c1 = arith.constant 1 : index
      %c2 = arith.constant 2 : index
      %m = arith.remui %t, %c2 : index
      %odd = arith.cmpi eq, %m, %c1 : index
      %r = scf.if %odd -> (index) {
        %a = arith.muli %t, %c2 : index
        memref.store %a, %out[%t] : memref<32xindex>
        scf.yield %a : index
      } else {
        %b = arith.addi %t, %c1 : index
        scf.yield %b : index
      }""", {"out": ("memref<32xindex>", np.full(32, -1, np.int64))}, {"r": "index"})
    t = np.arange(T)
    assert_same_bits(got["r"], np.where(t % 2 == 1, 2 * t, t + 1))
    assert_same_bits(got["out"], np.where(t % 2 == 1, 2 * t, -1))


@pytest.mark.parametrize("cond", [True, False])
@covers("scf.if")
def test_uniform_if_runs_one_branch(cond):
    got = run("""
      %r = scf.if %c -> (vector<2xf32>) {
        scf.yield %a : vector<2xf32>
      } else {
        %n = arith.negf %a : vector<2xf32>
        scf.yield %n : vector<2xf32>
      }
      scf.if %c {
        memref.store %x, %out[] : memref<f32>
      }""", {"c": ("i1", cond), "a": ("vector<2xf32>", [1.0, -0.0]), "x": ("f32", 9.0),
             "out": ("memref<f32>", np.float32(0))}, {"r": "vector<2xf32>"})
    a = np.array([1.0, -0.0], np.float32)
    assert_same_bits(got["r"], a if cond else -a)
    assert got["out"] == (9.0 if cond else 0.0)


@covers("scf.while")
def test_while_counts_collatz_steps():
    n = 27
    got = run("""
      %c1 = arith.constant 1 : i32
      %c2 = arith.constant 2 : i32
      %c3 = arith.constant 3 : i32
      %r:2 = scf.while (%x = %n, %k = %z) : (i32, i32) -> (i32, i32) {
        %go = arith.cmpi ne, %x, %c1 : i32
        scf.condition(%go) %x, %k : i32, i32
      } do {
      ^bb0(%y: i32, %j: i32):
        %odd = arith.andi %y, %c1 : i32
        %isodd = arith.cmpi eq, %odd, %c1 : i32
        %up = arith.muli %y, %c3 : i32
        %up1 = arith.addi %up, %c1 : i32
        %down = arith.divsi %y, %c2 : i32
        %next = arith.select %isodd, %up1, %down : i32
        %j1 = arith.addi %j, %c1 : i32
        scf.yield %next, %j1 : i32, i32
      }
      %steps = arith.addi %r#1, %z : i32""", {"n": ("i32", n), "z": ("i32", 0)},
              {"steps": "i32"})
    x, k = n, 0
    while x != 1:
        x, k = (3 * x + 1 if x % 2 else x // 2), k + 1
    assert got["steps"] == k



@covers("scf.execute_region", "scf.index_switch")
def test_execute_region_and_index_switch():
    for sel, want in [(0, 10), (5, 50), (3, -1), (-1, -1)]:
        got = run("""
          %r = scf.execute_region -> i32 {
            %v = scf.index_switch %s -> i32
            case 0 {
              %a = arith.constant 10 : i32
              scf.yield %a : i32
            }
            case 5 {
              %b = arith.constant 50 : i32
              scf.yield %b : i32
            }
            default {
              %c = arith.constant -1 : i32
              scf.yield %c : i32
            }
            scf.yield %v : i32
          }""", {"s": ("index", sel)}, {"r": "i32"})
        assert got["r"] == want, sel
