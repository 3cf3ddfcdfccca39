"""Runs of vector accesses fused into one (:mod:`smalti.emulate.fusion`):
which runs fuse, and that a fused kernel computes and reports exactly what
it did access by access."""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

import smalti.emulate as emu
from smalti.emulate.fusion import Entry, VectorAccess, fuse
from smalti.emulate.stacks import Splits
from smalti.emulate.sync.checker import Checker
from smalti.emulate.sync.shadow import OpSite

WG = plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup)
S = jax.ShapeDtypeStruct
SITE = OpSite("vector.load", "k.py:1")


def _access(is_store: bool = False, ref: int = 0, value: int = 10, site: OpSite = SITE,
            idx: tuple = (1,)):
    """An access step (it must not run by itself once fused) and the entry's
    operands and results, as the compiler gives them."""
    def step(fr):
        raise AssertionError("an access of a fused run ran by itself")
    step.fusable = VectorAccess(is_store, ref, idx, (2,), value, site, site.location, None, None)
    ins = [value, ref, *idx] if is_store else [ref, *idx]
    return ("vector.store" if is_store else "vector.load"), ins, ([] if is_store else [value]), step


def _op(name: str, ins: list[int], outs: list[int]):
    def step(fr):
        pass
    return name, ins, outs, step


def _fused(entries) -> tuple[list[int], list]:
    """Which entries a fused step (or nothing) replaced, and the steps."""
    entries = [Entry(*e) for e in entries]
    steps = [e.step for e in entries]
    fuse(entries, steps, Splits())
    return [k for k, (e, s) in enumerate(zip(entries, steps)) if s is not e.step], steps


def test_loads_with_index_arithmetic_between_fuse_into_the_last():
    entries = [_access(value=10, idx=(1,)), _op("arith.addi", [1, 2], [3]),
               _op("arith.constant", [], [4]), _access(value=11, idx=(3,)),
               _access(value=12, idx=(4,))]
    replaced, steps = _fused(entries)
    assert replaced == [0, 3, 4]
    assert steps[0].__name__ == "nothing" and steps[3].__name__ == "nothing"
    assert steps[4].__name__ not in ("nothing", entries[4][3].__name__)  # the run's one access
    assert steps[1] is entries[1][3] and steps[2] is entries[2][3]  # the arithmetic stays


@pytest.mark.parametrize("between,why", [
    (_access(is_store=True, value=9), "a store"),
    (_op("nvvm.barrier0", [], []), "a barrier"),
    (_access(ref=1, value=13), "another memref"),
    (_access(value=13, site=OpSite("vector.load", "k.py:2")), "another line"),
])
def test_a_run_ends_at_anything_but_pure_ops_and_its_own_accesses(between, why):
    entries = [_access(value=10), between, _access(value=11)]
    assert _fused(entries)[0] == [], why


def test_an_op_the_rules_refused_ends_a_run():
    """Its Unsupported must come before the later loads run (one may be out of bounds)."""
    refused = _op("arith.addf", [10, 10], [20])
    refused[3].refused = emu.Unsupported("arith.addf of f4E2M1FN")
    assert _fused([_access(value=10), refused, _access(value=11)])[0] == []


def test_ops_using_a_loaded_value_run_after_the_fused_access_in_their_order():
    """An extractvalue of the first load's registers, and an op using that:
    both wait for the run's one access; the index arithmetic stays where it
    was, and the op after the run runs after it."""
    order: list[str] = []

    @dataclass(frozen=True)
    class Load:
        value: int
        fusion_key = "a load"

        def fused(self, run, alone, splits):
            def step(fr):
                order.append(f"loads {[a.value for a in run]}")
            return step

    def load(value, ins):
        def step(fr):
            raise AssertionError("an access of a fused run ran by itself")
        step.fusable = Load(value)
        return "llvm.load", ins, [value], step

    def logged(name, ins, outs):
        def step(fr):
            order.append(name)
        return name, ins, outs, step

    entries = [load(10, [1]), logged("llvm.extractvalue", [10], [20]),
               logged("arith.addi", [1], [2]), logged("vector.bitcast", [20], [21]),
               load(11, [2]), logged("arith.addf", [21, 11], [22])]
    replaced, steps = _fused(entries)
    assert replaced == [0, 1, 3, 4]
    for step in steps:
        step(None)
    assert order == ["arith.addi", "loads [10, 11]", "llvm.extractvalue", "vector.bitcast",
                     "arith.addf"]


def test_a_load_whose_index_a_fused_load_gave_is_not_fused():
    entries = [_access(value=10), _access(value=11, idx=(10,))]
    assert _fused(entries)[0] == []


def test_a_load_whose_index_comes_from_a_loaded_value_through_ops_is_not_fused():
    entries = [_access(value=10), _op("arith.index_cast", [10], [20]),
               _op("arith.addi", [20, 1], [21]), _access(value=11, idx=(21,))]
    assert _fused(entries)[0] == []


class _Frame:
    def __init__(self, regs, T=4, mask=None):
        self.regs, self.T, self.mask = regs, T, mask


def _uniform_loads(calls: list, place_differs: bool = False) -> VectorAccess:
    """Loads of one element at indices in slots 1 and 2 into slots 10 and 11:
    memory is ``100 + address``."""
    def addresses(fr, indices, uniform=False):
        calls.append(("addresses", uniform, [np.shape(i) for i in indices]))
        if uniform and place_differs:
            return None
        return indices[0] * 4

    def run(fr, addrs, values):
        calls.append(("access", np.shape(addrs)))
        return 100 + addrs
    return [VectorAccess(False, "m", (slot,), (), value, SITE, "k.py:1", run, addresses)
            for slot, value in ((1, 10), (2, 11))]


def test_loads_at_one_place_in_every_thread_give_one_value_each():
    calls: list = []
    regs = [None] * 12
    regs[1], regs[2] = np.asarray(3), np.asarray(5)
    a, b = _uniform_loads(calls)
    a.fused([a, b], [], Splits())(_Frame(regs))
    assert calls == [("addresses", True, [(2,)]), ("access", (2,))]
    assert regs[10].shape == () and int(regs[10]) == 112 and int(regs[11]) == 120


@pytest.mark.parametrize("masked,place_differs", [(True, False), (False, True)])
def test_uniform_loads_under_a_mask_or_of_a_threads_own_view_run_one_by_one(masked,
                                                                          place_differs):
    calls: list = []
    regs = [None] * 12
    regs[1], regs[2] = np.asarray(3), np.asarray(5)
    a, b = _uniform_loads(calls, place_differs)
    alone = [lambda fr: calls.append("load 10"), lambda fr: calls.append("load 11")]
    mask = np.array([1, 0, 1, 1], bool) if masked else None
    a.fused([a, b], alone, Splits())(_Frame(regs, mask=mask))
    assert calls[-2:] == ["load 10", "load 11"]
    assert not any(c[0] == "access" for c in calls if isinstance(c, tuple))


def test_per_thread_indices_are_stacked_thread_major():
    calls: list = []
    regs = [None] * 12
    regs[1], regs[2] = np.arange(4), np.asarray(7)  # one per thread, one the same in each
    a, b = _uniform_loads(calls)
    a.fused([a, b], [], Splits())(_Frame(regs))
    assert calls == [("addresses", False, [(4, 2)]), ("access", (4, 2))]
    np.testing.assert_array_equal(regs[10], 100 + np.arange(4) * 4)
    np.testing.assert_array_equal(regs[11], np.full(4, 128))


def test_stores_fuse_with_stores():
    store = OpSite("vector.store", "k.py:3")
    entries = [_access(is_store=True, value=5, site=store), _op("arith.addi", [1], [2]),
               _access(is_store=True, value=6, site=store, idx=(2,))]
    assert _fused(entries)[0] == [0, 2]


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


SWIZZLED = (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))


def swizzled_round_trip():
    """x -> swizzled SMEM by TMA, then ``smem[...] = smem[...] * 2 + 1`` (jax
    loads and stores the tile with 16 ``ldmatrix`` and 16 ``stmatrix``, four
    matrices each), then SMEM -> o by TMA."""
    def body(x_gmem, o_gmem, smem, bar):
        plgpu.copy_gmem_to_smem(x_gmem, smem, bar)
        plgpu.barrier_wait(bar)
        smem[...] = smem[...] * 2 + 1
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(smem, o_gmem)
        plgpu.wait_smem_to_gmem(0)
    return plgpu.kernel(body, out_type=S((128, 128), jnp.float16), compiler_params=WG,
                        scratch_types=[plgpu.SMEM((128, 128), jnp.float16, transforms=SWIZZLED),
                                       plgpu.Barrier()])


def both_warpgroups_rewrite_the_tile():
    """Warpgroup 0 copies x into swizzled SMEM; then each warpgroup rewrites
    the whole tile (``smem[...] * 2 + wg``) with nothing ordering the two."""
    from jax import lax

    def body(x_gmem, o_gmem, smem, bar):
        wg = lax.axis_index("wg")

        @pl.when(wg == 0)
        def _():
            plgpu.copy_gmem_to_smem(x_gmem, smem, bar)
        plgpu.barrier_wait(bar)
        smem[...] = smem[...] * 2 + wg.astype(jnp.float16)  # the tile's stores
        o_gmem[...] = jnp.zeros((128,), jnp.float32)
    return plgpu.kernel(body, out_type=S((128,), jnp.float32), compiler_params=WG,
                        scratch_types=[plgpu.SMEM((128, 128), jnp.float16, transforms=SWIZZLED),
                                       plgpu.Barrier()], num_threads=2, thread_name="wg")


def test_ldmatrix_and_stmatrix_runs_are_one_access_each(monkeypatch):
    """The 16 ldmatrix and 16 stmatrix of the tile: one access of 64 matrices
    per warp each, and the tile equals numpy's."""
    calls = _checked_shapes(monkeypatch)
    x = np.random.default_rng(2).standard_normal((128, 128)).astype(np.float16)
    (out,) = emu.run(swizzled_round_trip(), x)
    np.testing.assert_array_equal(out, x * np.float16(2) + np.float16(1))
    matrices = [s for s in calls if len(s) == 4]  # (warps, matrices, 8 rows, 8 columns)
    assert matrices == [(4, 64, 8, 8), (4, 64, 8, 8)], calls


def test_a_profiled_kernel_counts_each_ldmatrix_and_stmatrix():
    x = np.ones((128, 128), np.float16)
    p = emu.profile(swizzled_round_trip(), x)
    np.testing.assert_array_equal(p.outputs[0], x * 3)
    assert p.counters["smsp__inst_executed_op_ldsm"] == 16 * 4  # one a warp
    assert p.counters["smalti__inst_executed_op_stsm"] == 16 * 4


def test_a_fused_stmatrix_run_that_races_is_reported_with_its_kind_and_lines():
    """A write-after-write between the two warpgroups' stmatrix runs, and a
    write-after-read with the other's ldmatrix run, at the rewrite's line."""
    import inspect

    lines, first = inspect.getsourcelines(both_warpgroups_rewrite_the_tile)
    line = str(first + next(i for i, t in enumerate(lines) if "# the tile's stores" in t))
    with pytest.raises(emu.RaceError) as err:
        emu.run(both_warpgroups_rewrite_the_tile(), np.ones((128, 128), np.float16))
    found = {(r.kind, r.first.op, r.second.op, r.first.location.rsplit(":", 1)[1],
              r.second.location.rsplit(":", 1)[1]) for r in err.value.races}
    assert ("write-after-write", "nvvm.stmatrix", "nvvm.stmatrix", line, line) in found, found
    assert ("write-after-read", "nvvm.ldmatrix", "nvvm.stmatrix", line, line) in found, found
