"""Warps of one warpgroup that wait for each other (``plgpu.warp_map``: a TMA
warp feeding a consumer warp through mbarriers) run as tasks of their own
(``emulate/sched.py``, "Warps as tasks"): right answers, races still found
with both warps and lines named, deadlocks among warps named, and the same
on several processes."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

import smalti.emulate as emu
from smalti.emulate import workers
from smalti.emulate.pool import pack_error, unpack_error
from smalti.emulate.runner import Program
from smalti.emulate.sched import WarpSplit

S = jax.ShapeDtypeStruct
F32 = jnp.float32
STEPS, SLOTS = 6, 2  # more steps than slots: the TMA warp waits for the consumer


def pipeline(blocks: int = 1, racy: bool = False, plain_before: int = 0):
    """Block b copies its (STEPS, 128) rows of x to the output through two SMEM
    slots: warp 0 loads each row by TMA (waiting for the slot to be consumed),
    warp 1 waits for it, stores it by TMA and, once the store has read it,
    frees the slot. ``racy``: the slot is freed before the store has read it.
    Blocks below ``plain_before`` copy through registers instead."""

    def body(x_gmem, o_gmem):
        b = lax.axis_index("b")

        def scoped(smem, full, consumed):
            @plgpu.warp_map
            def _(warp_id):
                @pl.when(warp_id == 0)
                def _producer():
                    def step(i, _):
                        slot = lax.rem(i, SLOTS)

                        @pl.when(i >= SLOTS)
                        def _():
                            plgpu.barrier_wait(consumed.at[slot])
                        plgpu.copy_gmem_to_smem(x_gmem.at[b, i], smem.at[slot], full.at[slot])
                    lax.fori_loop(0, STEPS, step, None)

                @pl.when(warp_id == 1)
                def _consumer():
                    def step(i, _):
                        slot = lax.rem(i, SLOTS)
                        plgpu.barrier_wait(full.at[slot])
                        plgpu.copy_smem_to_gmem(smem.at[slot], o_gmem.at[b, i])
                        if racy:
                            plgpu.barrier_arrive(consumed.at[slot])
                        plgpu.wait_smem_to_gmem(0, wait_read_only=True)
                        if not racy:
                            plgpu.barrier_arrive(consumed.at[slot])
                    lax.fori_loop(0, STEPS, step, None)
            plgpu.wait_smem_to_gmem(0)

        @pl.when(b >= plain_before)
        def _():
            pl.run_scoped(scoped, plgpu.SMEM((SLOTS, 128), F32),
                          plgpu.Barrier(num_barriers=SLOTS), plgpu.Barrier(num_barriers=SLOTS))

        @pl.when(b < plain_before)
        def _():
            o_gmem[b] = x_gmem[b]

    return plgpu.kernel(body, out_type=S((blocks, STEPS, 128), F32), grid=(blocks,),
                        grid_names=("b",))


def rows(blocks: int = 1) -> np.ndarray:
    return np.arange(blocks * STEPS * 128, dtype=np.float32).reshape(blocks, STEPS, 128)


def test_a_tma_warp_and_a_consumer_warp_of_one_warpgroup_wait_for_each_other():
    x = rows()
    (out,) = emu.run(pipeline(), x)  # lockstep alone: a false deadlock (or Unsupported)
    np.testing.assert_array_equal(out, x)


def test_the_split_is_found_by_the_first_run_and_kept_for_the_next():
    x = rows()
    module, _ = emu.lower(pipeline(), x)
    program = Program(module)
    assert program.warp_split == frozenset()
    (first,) = program.run([x], workers=1)
    assert program.warp_split == {0}  # warpgroup 0's warps run as tasks now
    (second,) = program.run([x], workers=1)
    np.testing.assert_array_equal(first, x)
    np.testing.assert_array_equal(second, x)


def test_a_slot_freed_before_the_store_read_it_is_a_race_between_the_warps():
    with pytest.raises(emu.RaceError) as raised:
        emu.run(pipeline(racy=True), rows())
    report = str(raised.value)
    assert "write-after-read" in report
    assert "warpgroup" not in report or "warp 0" in report
    # the producer's load (jax 0.11.2's nvvm op, named "cp.async.bulk.tensor (TMA
    # load)"; 0.12's inline PTX, by its instruction)...
    assert "TMA load issued by block (0, 0, 0) warpgroup 0 warp 0: cp.async.bulk.tensor" in report
    assert "warp 1: cp.async.bulk" in report  # ...against the consumer's store
    assert "test_warp_tasks.py" in report


def test_a_profile_counts_the_run_that_finished_only():
    profile = emu.profile(pipeline(), rows())
    np.testing.assert_array_equal(profile.outputs[0], rows())
    assert profile.counters["smalti__tma_bytes_load"] == STEPS * 128 * 4
    assert profile.counters["smalti__tma_bytes_store"] == STEPS * 128 * 4


def test_warps_that_wait_for_a_warp_that_never_arrives_are_a_deadlock_naming_them():
    def body(o_gmem, bar):
        @plgpu.warp_map
        def _(warp_id):
            @pl.when(warp_id == 0)
            def _():
                plgpu.barrier_wait(bar)  # nobody arrives

        o_gmem[...] = jnp.zeros((128,), F32)

    call = plgpu.kernel(body, out_type=S((128,), F32), scratch_types=[plgpu.Barrier()])
    with pytest.raises(emu.Deadlock, match=r"block \(0, 0, 0\) warp 0 waits for mbarrier"):
        emu.run(call)


def test_a_warp_polling_a_semaphore_another_warp_of_its_warpgroup_signals():
    """The poll (atom.cas) that sees memory unchanged with warps masked off
    makes the warps tasks, as a wait on an mbarrier does."""
    def body(x_gmem, o_gmem, sem):
        @plgpu.warp_map
        def _(warp_id):
            @pl.when(warp_id == 0)
            def _():
                pl.semaphore_wait(sem, 1)

            @pl.when(warp_id == 1)
            def _():
                pl.semaphore_signal(sem, 1)

        o_gmem[...] = x_gmem[...] + 1

    call = plgpu.kernel(body, out_type=S((128,), F32),
                        scratch_types=[plgpu.SemaphoreType.REGULAR])
    x = np.arange(128, dtype=np.float32)
    module, _ = emu.lower(call, x)
    program = Program(module)
    with pytest.raises(emu.EmulationError, match=r"fix: pass outputs="):
        program.run([x], workers=1)  # the GMEM scratch's buffer has no type to go by
    (out,) = program.run([x], [((128,), np.dtype(np.float32))], workers=1)
    assert program.warp_split == {0}
    np.testing.assert_array_equal(out, x + 1)


def test_the_split_error_crosses_processes_with_its_warpgroup():
    back = unpack_error(pack_error(WarpSplit(1, "a barrier")))
    assert isinstance(back, WarpSplit) and back.warpgroup == 1
    assert "warpgroup 1 waits for a barrier" in str(back)


@pytest.fixture
def always_share(monkeypatch):
    """Shares every grid, however small (the cost model would keep these here)."""
    monkeypatch.setattr(workers.Parallel, "worth", lambda self, t0, rest, k: True)


def test_a_split_found_in_a_worker_runs_the_grid_again_with_it(always_share):
    """Blocks 0 and 1 (run here) copy through registers; blocks 2 and 3, which
    the worker runs, are the pipeline: the worker finds the split, and the
    whole grid runs again with it."""
    x = rows(4)
    module, _ = emu.lower(pipeline(blocks=4, plain_before=2), x)
    program = Program(module)
    (out,) = program.run([x], workers=2)
    assert workers.last_run["workers"] == 2
    assert program.warp_split == {0}
    np.testing.assert_array_equal(out, x)
