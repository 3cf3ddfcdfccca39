"""A grid's clusters on several processes (``workers=``): the same outputs,
the same reports and the same errors as one process, or one process's run
where that cannot be promised."""

from __future__ import annotations

import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

import smalti.emulate as emu
from smalti.diagnostics import SmaltiValueError
from smalti.emulate import workers
from smalti.emulate.deadline import DeadlineExceeded, deadline
from smalti.emulate.pool import pack_error, unpack_error
from smalti.emulate.runner import Program
from smalti.emulate.worker import run_job
from tests.emulate.kernels import K, normal

S = jax.ShapeDtypeStruct
BLOCKS = 7  # with 3 processes: clusters 0-2 here, 3-4 and 5-6 in two workers
ROWS = 16


@pytest.fixture(autouse=True)
def always_share(monkeypatch):
    """Shares every grid, however small (the cost model would keep these here)."""
    monkeypatch.setattr(workers.Parallel, "worth", lambda self, t0, rest, k: True)


def grid_kernel(write_to=None, read_from=None, out_of_bounds=None):
    """Block i adds 1 to its rows of x into rows ``write_to[i]`` (default: its
    own) of the output, plus rows ``read_from[i]`` of the output where given;
    block ``out_of_bounds`` reads past the end of x."""
    write_to, read_from = write_to or {}, read_from or {}

    def pick(i, table):
        row = i
        for block, target in table.items():
            row = row + (i == block).astype(jnp.int32) * (target - block)
        return row

    def body(x_gmem, o_gmem):
        i = lax.axis_index("x")
        src = i * ROWS
        if out_of_bounds is not None:
            src = src + (i == out_of_bounds).astype(jnp.int32) * (BLOCKS * ROWS)
        v = x_gmem[pl.ds(src, ROWS)] + 1
        if read_from:
            v = v + o_gmem[pl.ds(pick(i, read_from) * ROWS, ROWS)]
        o_gmem[pl.ds(pick(i, write_to) * ROWS, ROWS)] = v
    return K(body, S((BLOCKS * ROWS, 128), jnp.float32), grid=(BLOCKS,), grid_names=("x",))


X = normal((BLOCKS * ROWS, 128))


def outcome(fn, *args, workers_, **kw):
    """(outputs or the error, the races reported, the warnings), run once."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            result = emu.run(fn, *args, workers=workers_, **kw)
        except Exception as e:  # compared below, class and message
            result = e
    return result, [str(w.message) for w in caught]


def same(fn, *args, **kw):
    """Runs with 1 and 3 processes; asserts the same results; returns them
    and how the parallel run went."""
    seq, seq_warned = outcome(fn, *args, workers_=1, **kw)
    par, par_warned = outcome(fn, *args, workers_=3, **kw)
    mode = workers.last_run.get("mode")
    if isinstance(seq, Exception):
        assert type(par) is type(seq) and str(par) == str(seq)
        assert getattr(par, "__notes__", None) == getattr(seq, "__notes__", None)
        if isinstance(seq, emu.RaceError):
            assert [(r, r.count) for r in par.races] == [(r, r.count) for r in seq.races]
    else:
        assert len(par) == len(seq)
        for a, b in zip(par, seq):
            assert a.dtype == b.dtype and a.tobytes() == b.tobytes()  # bit for bit
    assert par_warned == seq_warned
    return seq, seq_warned, mode


def test_a_clean_grid_gives_the_same_bits_in_parallel():
    out, warned, mode = same(grid_kernel(), X)
    assert mode == "parallel" and workers.last_run["shares"] == [2, 2, 2]
    np.testing.assert_array_equal(out[0], X + 1)
    assert warned == []


def test_official_style_multi_block_kernel_with_tma_in_parallel():
    def body(x_gmem, o_gmem, smem, bar):
        i = lax.axis_index("x")
        plgpu.copy_gmem_to_smem(x_gmem.at[pl.ds(i * 64, 64)], smem, bar)
        plgpu.barrier_wait(bar)
        smem[...] = smem[...] * 2
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(smem, o_gmem.at[pl.ds(i * 64, 64)])
        plgpu.wait_smem_to_gmem(0)
    fn = K(body, S((5 * 64, 64), jnp.float32), [plgpu.SMEM((64, 64), jnp.float32),
                                                   plgpu.Barrier()], grid=(5,), grid_names=("x",))
    x = normal((5 * 64, 64))
    out, _, mode = same(fn, x)
    assert mode == "parallel"
    np.testing.assert_array_equal(out[0], x * 2)


@pytest.mark.parametrize("policy", ["raise", "warn"])
def test_a_write_write_race_between_workers_falls_back_to_the_sequential_run(policy):
    # block 2 (this process) and block 3 (a worker) write the same rows
    out, warned, mode = same(grid_kernel(write_to={3: 2}), X, on_race=policy)
    assert mode == "fallback: a GMEM conflict between processes"
    if policy == "raise":
        assert isinstance(out, emu.RaceError)
        (race,) = out.races
        assert (race.kind, race.space) == ("write-after-write", "gmem")
    else:
        assert len(warned) == 1 and "write-after-write" in warned[0]


@pytest.mark.parametrize("policy", ["raise", "warn"])
def test_a_read_write_race_between_workers_falls_back(policy):
    # block 5 (a worker) reads the rows block 1 (this process) wrote
    out, warned, mode = same(grid_kernel(read_from={5: 1}), X, on_race=policy)
    assert mode == "fallback: a GMEM conflict between processes"
    races = out.races if policy == "raise" else warned
    assert len(races) == 1 and "read-after-write" in str(races[0])


@pytest.mark.parametrize("policy", ["raise", "warn"])
def test_races_within_one_worker_are_merged_as_found(policy):
    # blocks 3 and 4 (one worker) write the same rows (which 3 read first:
    # every block reads output rows); block 6 reads what 5 wrote (the other
    # worker); block 1 reads what 0 wrote (this process)
    fn = grid_kernel(write_to={4: 3}, read_from={6: 5, 1: 0})
    out, warned, mode = same(fn, X, on_race=policy)
    assert mode == "parallel"
    found = out.races if policy == "raise" else warned
    kinds = sorted(str(r).split("(")[1].split(",")[0] for r in found)
    # one report per pair of lines: 1/0, 6/5 are the same read and write lines
    assert kinds == ["read-after-write", "write-after-read", "write-after-write"]
    if policy == "warn":
        np.testing.assert_array_equal(out[0][3 * ROWS:4 * ROWS], X[4 * ROWS:5 * ROWS] + 1)


def test_an_error_in_a_worker_is_raised_with_its_class_and_message():
    err, _, mode = same(grid_kernel(out_of_bounds=5), X)
    assert mode == "parallel" and isinstance(err, emu.OutOfBounds)


def test_an_error_after_a_race_carries_the_races_found_before_it():
    # blocks 3, 4 race (a worker's); block 5 (the other worker) faults
    err, _, _ = same(grid_kernel(write_to={4: 3}, out_of_bounds=5), X)
    assert isinstance(err, emu.OutOfBounds)
    assert "before this, the checker found 1 data race(s)" in err.__notes__[0]


def test_an_uninitialized_read_in_a_worker_is_raised_or_warned_as_in_one_process():
    def body(x_gmem, o_gmem, smem):
        i = lax.axis_index("x")

        @pl.when(i == 4)
        def _():
            o_gmem[pl.ds(i * ROWS, ROWS)] = smem[...]  # nothing wrote smem

        @pl.when(i != 4)
        def _():
            o_gmem[pl.ds(i * ROWS, ROWS)] = x_gmem[pl.ds(i * ROWS, ROWS)]
    fn = K(body, S((BLOCKS * ROWS, 128), jnp.float32), [plgpu.SMEM((ROWS, 128), jnp.float32)],
           grid=(BLOCKS,), grid_names=("x",))
    err, _, mode = same(fn, X, on_uninitialized="raise")
    assert mode == "parallel" and isinstance(err, emu.UninitializedRead)
    assert not err.access.is_write and err.access.allocation == "block (4, 0, 0) SMEM"
    _, warned, _ = same(fn, X, on_uninitialized="warn")
    assert len(warned) == 1 and "uninitialized read" in warned[0]


def test_atomics_between_blocks_keep_the_grid_in_one_process():
    def body(x_gmem, o_gmem):
        plgpu.atomic_add(o_gmem, x_gmem[lax.axis_index("x")])
    fn = plgpu.kernel(body, out_type=S((128,), jnp.float32), grid=(BLOCKS,), grid_names=("x",))
    x = normal((BLOCKS, 128))
    out, _, mode = same(fn, x)
    assert mode.startswith("sequential: the order of the blocks is observable: llvm.inline_asm")
    assert "red." in mode


def test_printing_keeps_the_grid_in_one_process(capsys):
    def body(x_gmem, o_gmem):
        i = lax.axis_index("x")
        pl.debug_print("block {}", i)
        o_gmem[pl.ds(i * ROWS, ROWS)] = x_gmem[pl.ds(i * ROWS, ROWS)]
    fn = K(body, S((BLOCKS * ROWS, 128), jnp.float32), grid=(BLOCKS,), grid_names=("x",))
    _, _, mode = same(fn, X)
    assert mode.startswith("sequential: the order of the blocks is observable: gpu.printf")
    printed = capsys.readouterr().out.splitlines()
    assert printed == [f"block {i}" for i in range(BLOCKS)] * 2


def test_without_the_checker_the_grid_stays_in_one_process():
    out, _, mode = same(grid_kernel(), X, sanitize=False)
    assert mode == "sequential: no checker (sanitize=False)"
    np.testing.assert_array_equal(out[0], X + 1)


def test_the_cost_model_keeps_small_grids_here(monkeypatch):
    monkeypatch.undo()  # the real decision
    (out,) = emu.run(grid_kernel(), X, workers=2)
    assert workers.last_run["mode"] == "sequential: too little work to share"
    np.testing.assert_array_equal(out, X + 1)


def test_on_cpu_runs_kernels_with_workers():
    fn = jax.jit(grid_kernel())
    with emu.on_cpu(workers=3):
        out = np.asarray(fn(X))
    assert workers.last_run["mode"] == "parallel"
    np.testing.assert_array_equal(out, X + 1)


def test_a_module_with_one_launch_and_plain_accesses_may_be_shared():
    module, _ = emu.lower(grid_kernel(), X)
    assert Program(module).sequential_reason is None


@pytest.mark.parametrize("bad", [0, -2, 1.5, True, "many", ""])
def test_a_bad_worker_count_is_refused_with_a_code(bad):
    with pytest.raises(SmaltiValueError, match=r"\[SM303\].*workers=") as info:
        emu.run(grid_kernel(), X, workers=bad)
    assert "fix:" in str(info.value)


def test_the_environment_sets_the_default(monkeypatch):
    monkeypatch.setenv(workers.ENV, "nope")
    with pytest.raises(SmaltiValueError, match=r"\[SM303\] SMALTI_EMULATE_WORKERS='nope'"):
        emu.run(grid_kernel(), X)
    monkeypatch.setenv(workers.ENV, "1")
    emu.run(grid_kernel(), X)
    assert workers.last_run == {"mode": "sequential: workers=1"}
    monkeypatch.setenv(workers.ENV, "auto")
    assert workers.resolve(None) == workers.cores()
    monkeypatch.setenv(workers.ENV, " 3 ")
    assert workers.resolve(None) == 3
    assert workers.resolve(2) == 2 and workers.resolve("auto") == workers.cores()


def slow_grid_kernel(steps: int):
    def body(x_gmem, o_gmem):
        i = lax.axis_index("x")
        v = lax.fori_loop(0, steps, lambda k, v: v * 1.5, x_gmem[pl.ds(i * ROWS, ROWS)])
        o_gmem[pl.ds(i * ROWS, ROWS)] = v
    return K(body, S((BLOCKS * ROWS, 128), jnp.float32), grid=(BLOCKS,), grid_names=("x",))


def test_the_deadline_holds_while_workers_run():
    module, _ = emu.lower(slow_grid_kernel(400), X)
    prog = Program(module)
    start = time.monotonic()
    prog.run([X], workers=1)
    per = (time.monotonic() - start) / BLOCKS  # a cluster's time
    start = time.monotonic()
    # cluster 0 fits; this process's share of 2 more does not
    with pytest.raises(DeadlineExceeded), deadline(2.5 * per):
        prog.run([X], workers=3)
    assert workers.last_run["workers"] == 3 and time.monotonic() - start < 10 * per + 5
    (out,) = emu.run(grid_kernel(), X, workers=3)  # the pool recovers
    assert workers.last_run["mode"] == "parallel"
    np.testing.assert_array_equal(out, X + 1)


def test_a_worker_stops_at_its_own_deadline():
    module, avals = emu.lower(slow_grid_kernel(400), X)
    prog = Program(module)
    job = workers.Job(prog.text, [X], [(tuple(a.shape), np.dtype(a.dtype)) for a in avals],
                      None, "warn", [(5, (5, 0, 0)), (6, (6, 0, 0))], 1e-6)
    reply = run_job(job, {})
    index, packed = reply.error
    err = unpack_error(packed)
    assert index == 5 and isinstance(err, DeadlineExceeded) and "deadline" in str(err)


def test_clusters_of_two_blocks_are_shared_whole():
    from tests.emulate.test_cluster import exchange_kernel

    x = np.random.default_rng(3).standard_normal((5, 2, 64, 64)).astype(np.float16)
    out, _, mode = same(exchange_kernel(5), x)
    assert mode == "parallel" and workers.last_run["clusters"] == 5
    np.testing.assert_array_equal(out[0], x[:, ::-1])


class Odd(Exception):
    pass


def test_an_error_whose_attributes_do_not_pickle_comes_back_plain():
    from smalti.emulate.worker import _plain

    e = Odd("what went wrong")
    e.handle = lambda: None  # no pickle for a lambda
    reply = workers.Reply([], [], [], (4, pack_error(e)), 0.0)
    index, packed = _plain(reply).error
    err = unpack_error(packed)
    assert index == 4 and type(err) is Odd and str(err) == "what went wrong"
    assert not hasattr(err, "handle")
