"""Runs of vector accesses fused into one (:mod:`smalti.emulate.fusion`):
which runs fuse, and that a fused kernel computes and reports exactly what
it did access by access."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import mosaic_gpu as plgpu

import smalti.emulate as emu
from smalti.emulate.fusion import VectorAccess, fuse
from smalti.emulate.sync.checker import Checker
from smalti.emulate.sync.shadow import OpSite

WG = plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup)
S = jax.ShapeDtypeStruct
SITE = OpSite("vector.load", "k.py:1")


def _access(is_store: bool = False, ref: int = 0, value: int = 10, site: OpSite = SITE,
            idx: tuple = (1,)):
    def step(fr):
        raise AssertionError("an access of a fused run ran by itself")
    step.vector_access = VectorAccess(is_store, ref, idx, (2,), value, site, site.location,
                                      None, None)
    return step


def _pure(name: str = "arith.addi"):
    def step(fr):
        pass
    return name, step


def _fused_members(entries) -> list[int]:
    """Which entries a fused step (or nothing) replaced."""
    steps = [e[2] for e in entries]
    fuse(entries, steps)
    return [k for k, (e, s) in enumerate(zip(entries, steps)) if s is not e[2]]


def test_loads_with_index_arithmetic_between_fuse_into_the_last():
    entries = [("vector.load", [0, 1], _access(value=10)), ("arith.addi", [1, 2], _pure()[1]),
               ("arith.constant", [], _pure()[1]), ("vector.load", [0, 3], _access(value=11)),
               ("vector.load", [0, 4], _access(value=12))]
    steps = [e[2] for e in entries]
    fuse(entries, steps)
    assert steps[0].__name__ == "_nothing" and steps[3].__name__ == "_nothing"
    assert steps[4].__name__ == "step" and steps[4] is not entries[4][2]
    assert steps[1] is entries[1][2] and steps[2] is entries[2][2]  # the arithmetic stays


@pytest.mark.parametrize("between,why", [
    (("vector.store", [9, 0, 1], _access(is_store=True, value=9)), "a store"),
    (("nvvm.barrier0", [], _pure("nvvm.barrier0")[1]), "a barrier"),
    (("arith.addf", [10, 10], _pure("arith.addf")[1]), "a use of a loaded value"),
    (("vector.load", [1, 1], _access(ref=1, value=13)), "another memref"),
    (("vector.load", [0, 1], _access(value=13, site=OpSite("vector.load", "k.py:2"))),
     "another line"),
])
def test_a_run_ends_at_anything_but_pure_arithmetic_and_its_own_accesses(between, why):
    entries = [("vector.load", [0, 1], _access(value=10)), between,
               ("vector.load", [0, 2], _access(value=11))]
    assert _fused_members(entries) == [], why


def test_a_load_whose_index_a_fused_load_gave_is_not_fused():
    entries = [("vector.load", [0, 1], _access(value=10)),
               ("vector.load", [0, 10], _access(value=11, idx=(10,)))]
    assert _fused_members(entries) == []


def test_stores_fuse_with_stores():
    store = OpSite("vector.store", "k.py:3")
    entries = [("vector.store", [5, 0, 1], _access(is_store=True, value=5, site=store)),
               ("arith.addi", [1], _pure()[1]),
               ("vector.store", [6, 0, 2], _access(is_store=True, value=6, site=store))]
    assert _fused_members(entries) == [0, 2]


def elementwise():
    """x * 2 + 1 on a (128, 128) block: 64 loads and then 64 stores of
    vector<2xf32>, each a run."""
    def body(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 2 + 1
    return plgpu.kernel(body, out_type=S((128, 128), jnp.float32), compiler_params=WG)


def _checked_shapes(monkeypatch) -> list[tuple]:
    """The shapes of the addresses of every thread access the checker sees
    from now on."""
    calls: list[tuple] = []
    original = Checker.thread_access

    def counting(self, fr, space, addrs, *args, **kwargs):
        calls.append(np.shape(addrs))
        return original(self, fr, space, addrs, *args, **kwargs)
    monkeypatch.setattr(Checker, "thread_access", counting)
    return calls


def test_a_fused_kernel_checks_each_run_as_one_access(monkeypatch):
    calls = _checked_shapes(monkeypatch)
    x = np.random.default_rng(0).standard_normal((128, 128)).astype(np.float32)
    (out,) = emu.run(elementwise(), x)
    np.testing.assert_array_equal(out, x * 2 + 1)
    big = [s for s in calls if len(s) == 3]  # (threads, run, vector)
    assert sorted(big) == [(128, 64, 2), (128, 64, 2)], calls


def test_a_profiled_kernel_is_not_fused_and_counts_each_access():
    """The profiler counts instructions: each of the 64 loads and stores."""
    x = np.ones((128, 128), np.float32)
    p = emu.profile(elementwise(), x)
    np.testing.assert_array_equal(p.outputs[0], x * 2 + 1)
    assert p.counters["smsp__inst_executed_op_global_ld"] == 64 * 4  # one a warp
    assert p.counters["smsp__inst_executed_op_global_st"] == 64 * 4


def test_a_fused_run_that_races_is_reported_with_its_kind_and_lines():
    """Two warpgroups store the whole block (each store a fused run): a
    write-after-write between the two, at the store's line."""
    import inspect

    from jax import lax

    def body(x_ref, o_ref):
        wg = lax.axis_index("wg")
        o_ref[...] = x_ref[...] + wg.astype(jnp.float32)  # both store

    k = plgpu.kernel(body, out_type=S((128, 128), jnp.float32), compiler_params=WG,
                     num_threads=2, thread_name="wg")
    lines, first = inspect.getsourcelines(body)
    line = first + next(i for i, t in enumerate(lines) if "# both store" in t)
    with pytest.raises(emu.RaceError) as err:
        emu.run(k, np.zeros((128, 128), np.float32))
    kinds = {(r.kind, r.first.location.rsplit(":", 1)[1], r.second.location.rsplit(":", 1)[1])
             for r in err.value.races}
    assert ("write-after-write", str(line), str(line)) in kinds, kinds


def test_loads_through_pointers_fuse_too(monkeypatch):
    """``plgpu.load(..., optimized=False)`` loads each register with an
    ``llvm.load`` through a pointer computed by ``llvm.getelementptr``: the
    64 loads of the block are one access, and the row sums are numpy's."""
    calls = _checked_shapes(monkeypatch)

    def body(x_ref, o_ref):
        o_ref[...] = jnp.sum(plgpu.load(x_ref, layout=plgpu.Layout.WGMMA, optimized=False),
                             axis=1)
    k = plgpu.kernel(body, out_type=S((128,), jnp.float32), compiler_params=WG)
    x = np.random.default_rng(1).integers(-8, 8, (128, 128)).astype(np.float32)
    (out,) = emu.run(k, x)
    np.testing.assert_array_equal(out, x.sum(1))  # (small integers: any order is exact)
    assert (128, 64, 2) in calls, calls
