"""Synchronization through memory (:mod:`smalti.emulate.sync.memory_order`):
data handed from one block or warpgroup to another through a semaphore is
ordered by the signal's release and the wait's acquire, and only by them.

Every clean kernel here computes numpy's answer with no race reported; each
racy twin differs by one rule of the PTX memory model and is reported with
its kind and both source lines:

* Pallas' semaphores (``pl.semaphore_signal``/``pl.semaphore_wait``) across
  the blocks of a grid and across the warpgroups of a block; without them,
  or with the signal before the write, the hand-off races;
* Mosaic GPU kernels spelling each pattern out: a ``red.release`` after a
  warpgroup barrier, or ``fence.release`` then a relaxed ``red``; a wait
  polling with ``ld.acquire``, or with ``ld.relaxed`` then ``fence.acquire``,
  then a warpgroup barrier. Leaving out the barrier on either side, either
  fence, or using ``.cta`` scope between two blocks (not morally strong) is
  a race.
"""

from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

import smalti.emulate as emu
from smalti.emulate.sync.memory_order import Agent, includes, semantics_and_scope

S = jax.ShapeDtypeStruct
X = np.arange(128, dtype=np.float32)


def _line(fn, marker: str) -> int:
    """The line of ``fn``'s source holding ``# marker``."""
    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, text in enumerate(lines) if f"# {marker}" in text)


def _assert_race(err: pytest.ExceptionInfo, kind: str, first_line: int, second_line: int):
    """Among the races reported, one of ``kind`` between the two lines."""
    found = [(r.kind, r.first.location.rsplit(":", 1)[-1], r.second.location.rsplit(":", 1)[-1])
             for r in err.value.races]
    assert (kind, str(first_line), str(second_line)) in found, found


# --- Pallas' semaphores -----------------------------------------------------------------------


def block_handoff(signal: str = "after"):
    """Block 0 writes ``o = 2x`` and signals (``signal``: "after" the write,
    "before" it, or "none"); block 1 waits for the signal, then ``o += 1``."""
    def body(x_gmem, o_gmem):
        sem = pl.get_global(plgpu.SemaphoreType.REGULAR)
        i = lax.axis_index("x")

        @pl.when(i == 0)
        def _():
            if signal == "before":
                pl.semaphore_signal(sem, 1)
            o_gmem[...] = x_gmem[...] * 2  # block 0 writes
            if signal == "after":
                pl.semaphore_signal(sem, 1)

        @pl.when(i == 1)
        def _():
            if signal != "none":
                pl.semaphore_wait(sem, 1)
            o_gmem[...] = o_gmem[...] + 1  # block 1 reads

    return plgpu.kernel(body, out_type=S((128,), jnp.float32), grid=(2,), grid_names=("x",))


def test_a_semaphore_orders_a_later_block_after_an_earlier_one():
    (out,) = emu.run(block_handoff("after"), X, on_race="raise")
    np.testing.assert_array_equal(out, X * 2 + 1)


@pytest.mark.parametrize("signal", ["none", "before"])
def test_without_the_signal_after_the_write_the_blocks_race(signal):
    with pytest.raises(emu.RaceError) as err:
        emu.run(block_handoff(signal), X)
    body = block_handoff.__code__  # the kernel's lines are block_handoff's
    del body
    _assert_race(err, "read-after-write", _line(block_handoff, "block 0 writes"),
                 _line(block_handoff, "block 1 reads"))
    assert "semaphore" in err.value.races[0].fix


def warpgroup_handoff(synchronized: bool):
    """Warpgroup 1 writes ``o = 2x`` and signals; warpgroup 0 waits, then
    ``o += 1``."""
    def body(x_gmem, o_gmem, sem):
        wg = lax.axis_index("wg")

        @pl.when(wg == 1)
        def _():
            o_gmem[...] = x_gmem[...] * 2  # warpgroup 1 writes
            if synchronized:
                pl.semaphore_signal(sem, 1)

        @pl.when(wg == 0)
        def _():
            if synchronized:
                pl.semaphore_wait(sem, 1)
            o_gmem[...] = o_gmem[...] + 1  # warpgroup 0 reads

    return plgpu.kernel(body, out_type=S((128,), jnp.float32), num_threads=2, thread_name="wg",
                        scratch_types=[plgpu.SemaphoreType.REGULAR])


def test_a_semaphore_orders_one_warpgroup_after_another():
    (out,) = emu.run(warpgroup_handoff(True), X, on_race="raise")
    np.testing.assert_array_equal(out, X * 2 + 1)


def test_warpgroups_without_the_semaphore_race():
    with pytest.raises(emu.RaceError) as err:
        emu.run(warpgroup_handoff(False), X)
    kinds = {r.kind for r in err.value.races}
    assert kinds & {"read-after-write", "write-after-read", "write-after-write"}
    lines = {r.first.location.rsplit(":", 1)[1] for r in err.value.races} | \
        {r.second.location.rsplit(":", 1)[1] for r in err.value.races}
    assert {str(_line(warpgroup_handoff, "warpgroup 1 writes")),
            str(_line(warpgroup_handoff, "warpgroup 0 reads"))} <= lines


# --- each pattern spelled out (Mosaic GPU) ------------------------------------------------------

RELEASES = {
    "red.release": ["red.release.gpu.global.add.u32 [$0], $1;"],
    "fence.release, red.relaxed": ["fence.release.gpu;",
                                   "red.relaxed.gpu.global.add.u32 [$0], $1;"],
    "red.relaxed": ["red.relaxed.gpu.global.add.u32 [$0], $1;"],
    "red.release.cta": ["red.release.cta.global.add.u32 [$0], $1;"],
    "red.release.sys": ["red.release.sys.global.add.u32 [$0], $1;"],
    "red.relaxed, fence.release": ["red.relaxed.gpu.global.add.u32 [$0], $1;",
                                   "fence.release.gpu;"],
}
ACQUIRES = {  # (a fence before the poll, the poll's read, a fence after it)
    "ld.acquire": (None, "ld.acquire.gpu.global.b32 $0, [$1];", None),
    "ld.relaxed, fence.acquire": (None, "ld.relaxed.gpu.global.b32 $0, [$1];",
                                  "fence.acquire.gpu;"),
    "ld.relaxed": (None, "ld.relaxed.gpu.global.b32 $0, [$1];", None),
    "atom.acquire": (None, "atom.acquire.gpu.global.add.u32 $0, [$1], $2;", None),  # adds 0
    "fence.acquire, ld.relaxed": ("fence.acquire.gpu;", "ld.relaxed.gpu.global.b32 $0, [$1];",
                                  None),
}


def spelled_handoff(release: str, acquire: str, barrier_before_release: bool = True,
                    barrier_after_acquire: bool = True, cluster: int = 1, scope: str = "gpu"):
    """Block 0: every warp writes its part of ``o = 2x``, a warpgroup barrier
    (if ``barrier_before_release``), then one thread runs ``release`` (a
    list of PTX) on the semaphore. Block 1: one thread polls the semaphore
    with ``acquire``'s read until it is 1, then its fence; a warpgroup
    barrier (if ``barrier_after_acquire``); then every warp adds 1 to ``o``.
    ``cluster``: blocks per cluster; ``scope``: the acquire's and a ``.gpu``
    release's scope instead."""
    from jax._src.interpreters import mlir
    from jax._src.lib.mlir import ir
    from jax._src.lib.mlir.dialects import arith, gpu, scf
    from jax.experimental.mosaic import gpu as mgpu
    from jax.experimental.mosaic.gpu import utils as mgpu_utils

    write_line, read_line = (_line(spelled_handoff, "every warp writes"),
                             _line(spelled_handoff, "every warp reads"))
    fence_before, read_ptx, fence_ptx = (
        None if text is None else text.replace(".gpu", f".{scope}") for text in ACQUIRES[acquire])
    releases = [text.replace(".gpu", f".{scope}") for text in RELEASES[release]]

    def kernel(ctx, x_ref, sem_ref, o_ref, _):
        i32, index = ir.IntegerType.get_signless(32), ir.IndexType.get()
        ptr = mgpu_utils.memref_ptr(sem_ref)
        first = arith.cmpi(arith.CmpIPredicate.eq, gpu.block_id(gpu.Dimension.x),
                           mgpu_utils.c(0, index))
        branch = scf.IfOp(first, has_else=True)
        with ir.InsertionPoint(branch.then_block):
            with ir.Location.file(__file__, write_line, 0):
                doubled = mgpu.FragmentedArray.load_strided(x_ref) * 2
                doubled.store_untiled(o_ref)  # every warp writes
            if barrier_before_release:
                mgpu_utils.warpgroup_barrier()
            one = mgpu_utils.single_thread_predicate(mgpu_utils.ThreadSubset.WARPGROUP)
            for text in releases:
                operands = (ptr, mgpu_utils.c(1, i32)) if "$0" in text else ()
                mgpu_utils.inline_ptx(text, *operands, predicate=one, has_side_effects=True)
            scf.yield_([])
        with ir.InsertionPoint(branch.else_block):
            with mgpu_utils.single_thread(mgpu_utils.ThreadSubset.WARPGROUP):
                if fence_before:
                    mgpu_utils.inline_ptx(fence_before, has_side_effects=True)
                poll = scf.WhileOp([], [])
                with ir.InsertionPoint(poll.before.blocks.append()):
                    operands = (ptr, mgpu_utils.c(0, i32)) if "$2" in read_ptx else (ptr,)
                    seen = mgpu_utils.inline_ptx(read_ptx, *operands, result_types=i32,
                                                 has_side_effects=True)
                    scf.condition(arith.cmpi(arith.CmpIPredicate.ult, seen,
                                             mgpu_utils.c(1, i32)), [])
                with ir.InsertionPoint(poll.after.blocks.append()):
                    scf.yield_([])
                if fence_ptx:
                    mgpu_utils.inline_ptx(fence_ptx, has_side_effects=True)
            if barrier_after_acquire:
                mgpu_utils.warpgroup_barrier()
            with ir.Location.file(__file__, read_line, 0):
                seen = mgpu.FragmentedArray.load_strided(o_ref)  # every warp reads
                (seen + 1).store_untiled(o_ref)
            scf.yield_([])

    vec = S((128,), jnp.float32)
    with mlir.make_ir_context(), ir.Location.unknown():
        return mgpu.as_gpu_kernel(kernel, (2, 1, 1), (128, 1, 1),
                                  (vec, S((1,), jnp.uint32)), vec, (), cluster=(cluster, 1, 1))


def _run_spelled(*args, **kwargs):
    return emu.run(spelled_handoff(*args, **kwargs), X, np.zeros(1, np.uint32),
                   on_race="raise")


@pytest.mark.parametrize("release", ["red.release", "fence.release, red.relaxed",
                                     "red.release.sys"])
@pytest.mark.parametrize("acquire", ["ld.acquire", "ld.relaxed, fence.acquire", "atom.acquire"])
def test_each_release_and_acquire_pattern_orders_the_hand_off(release, acquire):
    (out,) = _run_spelled(release, acquire)
    np.testing.assert_array_equal(out, X * 2 + 1)


@pytest.mark.parametrize("release,acquire,before,after", [
    ("red.relaxed", "ld.acquire", True, True),  # a relaxed signal publishes nothing
    ("red.relaxed, fence.release", "ld.acquire", True, True),  # the fence comes too late
    ("red.release", "fence.acquire, ld.relaxed", True, True),  # the fence comes too early
    ("red.release", "ld.relaxed", True, True),  # a read without fence.acquire learns nothing
    ("red.release.cta", "ld.acquire", True, True),  # .cta does not reach the other block
    ("red.release", "ld.acquire", False, True),  # warps 1-3's writes are not released
    ("red.release", "ld.acquire", True, False),  # warps 1-3 of the waiter did not acquire
])
def test_leaving_out_a_part_of_the_pattern_is_a_race(release, acquire, before, after):
    with pytest.raises(emu.RaceError) as err:
        _run_spelled(release, acquire, before, after)
    _assert_race(err, "read-after-write", _line(spelled_handoff, "every warp writes"),
                 _line(spelled_handoff, "every warp reads"))


@pytest.mark.parametrize("acquire", ["ld.acquire", "ld.relaxed, fence.acquire"])
def test_cluster_scope_orders_two_blocks_of_one_cluster(acquire):
    """The two blocks run together as a cluster of 2; the release and the
    acquire at ``.cluster`` scope reach each other."""
    (out,) = _run_spelled("red.release", acquire, cluster=2, scope="cluster")
    np.testing.assert_array_equal(out, X * 2 + 1)


def test_cluster_scope_does_not_reach_another_cluster():
    """The same kernel with clusters of 1: the blocks are in different
    clusters, which ``.cluster`` does not reach."""
    with pytest.raises(emu.RaceError) as err:
        _run_spelled("red.release", "ld.acquire", cluster=1, scope="cluster")
    _assert_race(err, "read-after-write", _line(spelled_handoff, "every warp writes"),
                 _line(spelled_handoff, "every warp reads"))


def test_only_the_warps_the_barriers_leave_out_race():
    """Without the waiter's barrier only its warps 1-3 race: warp 0 polled."""
    with pytest.raises(emu.RaceError) as err:
        _run_spelled("red.release", "ld.acquire", True, False)
    readers = {r.second.agent for r in err.value.races}
    assert readers and all("warp 0" not in a for a in readers), readers


# --- the rules, on edge values ------------------------------------------------------------------


@pytest.mark.parametrize("opcode,want", [
    ("red.release.gpu.global.add.u32", ("release", "gpu")),
    ("atom.global.add.u32", ("relaxed", "gpu")),  # PTX's defaults
    ("atom.acq_rel.sys.global.cas.b32", ("acq_rel", "sys")),
    ("ld.acquire.cta.shared::cta.b32", ("acquire", "cta")),
    ("fence.acquire.cluster", ("acquire", "cluster")),
])
def test_an_opcode_names_its_ordering_and_scope(opcode, want):
    assert semantics_and_scope(opcode) == want


def test_scopes_reach_their_block_cluster_or_everything():
    a, same_cluster, other = Agent(0, 0), Agent(0, 1), Agent(1, 0)
    assert includes("cta", a, a) and not includes("cta", a, same_cluster)
    assert includes("cluster", a, same_cluster) and not includes("cluster", a, other)
    assert includes("gpu", a, other) and includes("sys", a, other)
