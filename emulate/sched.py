"""Warpgroups of one block as coroutines that switch where they wait.

A block of more than one warpgroup runs each warpgroup as its own task: the
threads of a warpgroup still execute in lockstep (vectorized), but each
warpgroup has its own program counter, as on the GPU, so a producer
warpgroup and a consumer warpgroup can each wait for the other on
mbarriers (warp-specialized kernels, ``plgpu.emit_pipeline_warp_specialized``).

Exactly one task runs at a time and tasks switch only where one must wait
(an mbarrier phase that has not completed, a barrier not all threads have
reached, an mbarrier poll that failed), so a run is deterministic: task 0
runs until it waits, then the next task that can go on (round robin), and so
on. Memory effects are immediate, and an asynchronous copy completes when it
is issued, so nothing but another task can ever satisfy a wait: when every
unfinished task waits for something no other task can do, the kernel would
hang, and :class:`.sync.reports.Deadlock` names what each task waits for.

Tasks are Python threads passing one baton (the standard library has no
coroutines that can switch inside nested calls); only the baton holder runs.

**Warps as tasks.** A warpgroup runs its warps in lockstep, and control flow
that differs between them (``plgpu.warp_map``, ``pl.when(warp_id == ...)``:
a TMA warp and an MMA warp of one warpgroup) runs one branch after the other
under a mask. That is a valid order of the GPU's as long as no warp waits for
another warp of its own warpgroup that lockstep has not run yet. Where a wait
cannot complete while some warps of the running group are masked off
(:func:`must_block`), blocking the whole group could stall the very warps
that would complete it (a false deadlock), so the run raises
:class:`WarpSplit` instead; :meth:`smalti.emulate.runner.Program.run` runs
the kernel again from its inputs with that warpgroup's four warps as four
tasks (``Launch.warp_split``), and keeps doing so in later runs of the same
program. Other warpgroups keep their lockstep (and its speed).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from .deadline import check as check_deadline
from .sync.clocks import SyncPoint
from .sync.reports import Deadlock

if TYPE_CHECKING:
    from .machine import Frame

MAX_POLLS = 10_000


class WarpSplit(Exception):
    """A wait that cannot complete inside control flow that differs between
    the warps of a warpgroup (see the module's docstring): the run starts
    again with that warpgroup's warps as tasks. Internal: never reaches the
    caller of a run."""

    def __init__(self, warpgroup: int, what: str) -> None:
        super().__init__(warpgroup, what)  # (picklable: a worker process sends it back)
        self.warpgroup, self.what = warpgroup, what

    def __str__(self) -> str:
        return (f"warpgroup {self.warpgroup} waits for {self.what} with some of its warps "
                "masked off: its warps must run as tasks")


WARP = 32
WARPGROUP = 128


def must_block(fr: Frame, what: str) -> None:
    """Called where the running group is about to wait for something that
    has not happened: raises :class:`WarpSplit` when some of its warps have
    no active thread here (they may be the ones to make it happen)."""
    b = fr.block
    if b is None or fr.mask is None or b.T <= WARP or b.T % WARP:
        return
    if not fr.mask.reshape(-1, WARP).any(axis=1).all():
        raise WarpSplit(int(b.flat[0]) // WARPGROUP, what)


class _Abort(BaseException):
    """Unwinds a task's thread when the run is abandoned."""


class Task:
    __slots__ = ("name", "ready", "waiting_for", "cond", "done", "error", "thread")

    def __init__(self, name: str) -> None:
        self.name = name
        self.ready = threading.Event()  # set: this task holds the baton
        self.cond: Callable[[], bool] | None = None  # what it waits for (None: runnable)
        self.waiting_for = ""
        self.done = False
        self.error: BaseException | None = None
        self.thread: threading.Thread | None = None


class Scheduler:
    """Runs callables as tasks that switch at :meth:`wait_until`."""

    def __init__(self) -> None:
        self.tasks: list[Task] = []
        self.current: Task | None = None
        self.back = threading.Event()  # set: the running task gave the baton back
        self.abort = False
        self.switches = 0
        self.polls = 0  # failed polls since a task last blocked or finished

    # --- called by a task ------------------------------------------------------------------

    def wait_until(self, cond: Callable[[], bool], what: str) -> None:
        """Blocks the running task until ``cond()`` holds, letting others run."""
        if cond():
            return
        task = self.current
        assert task is not None
        self.polls = 0
        task.cond, task.waiting_for = cond, what
        self._give_back(task)

    def poll(self, what: str) -> None:
        """A failed poll (``mbarrier.try_wait`` returned false): lets every
        other task that can go on run first. Raises if none can: the poll would
        spin forever."""
        task = self.current
        assert task is not None
        others = [t for t in self.tasks if t is not task and not t.done
                  and (t.cond is None or t.cond())]
        if not others:
            raise self.deadlock(extra=[(task, what)])
        self.polls += 1
        if self.polls > MAX_POLLS:  # tasks polling each other, none progressing
            raise self.deadlock(extra=[(task, what)])
        task.cond, task.waiting_for = (lambda: True), what
        self._give_back(task)

    def _give_back(self, task: Task) -> None:
        task.ready.clear()
        # The driver may have given up while this task ran (an exception out of
        # its wait: a test's timeout signal), setting ``abort`` and then every
        # task's ``ready`` -- perhaps before the clear above: look again.
        if self.abort:
            raise _Abort()
        self.back.set()
        task.ready.wait()
        if self.abort:
            raise _Abort()
        task.cond = None

    # --- the driver ------------------------------------------------------------------------

    def run(self, bodies: Sequence[tuple[str, Callable[[], None]]]) -> None:
        """Runs every body as a task until all finish; re-raises the first
        error a task raised (the others are abandoned)."""
        for name, body in bodies:
            task = Task(name)
            task.thread = threading.Thread(target=self._main, args=(task, body), daemon=True,
                                           name=f"emulated {name}")
            self.tasks.append(task)
        for t in self.tasks:
            t.thread.start()
        try:
            k = 0
            while True:
                task = self._next(k)
                if task is None:
                    break
                check_deadline(f"a switch to {task.name}")
                k = self.tasks.index(task)
                self.current = task
                self.switches += 1
                self.back.clear()
                task.ready.set()
                self.back.wait()
                if task.error is not None:
                    raise task.error
                k += 1
        finally:
            self._stop()

    def _next(self, start: int) -> Task | None:
        n = len(self.tasks)
        live = [t for t in self.tasks if not t.done]
        if not live:
            return None
        for i in range(n):
            t = self.tasks[(start + i) % n]
            if not t.done and (t.cond is None or t.cond()):
                return t
        raise self.deadlock()

    def deadlock(self, extra=()) -> Deadlock:
        waits = [(t, t.waiting_for) for t in self.tasks if not t.done and t.cond is not None]
        waits += list(extra)
        what = "; ".join(f"{t.name} waits for {w}" for t, w in waits)
        done = [t.name for t in self.tasks if t.done]
        gone = f" ({', '.join(done)} finished)" if done else ""
        return Deadlock(f"warpgroups of a block (or cluster) that all wait for each other "
                        f"({what}){gone}: the kernel would hang; fix: make sure every arrival "
                        "a wait counts on is made (and every barrier reached) on every path")

    def _main(self, task: Task, body: Callable[[], None]) -> None:
        task.ready.wait()
        try:
            if not self.abort:
                with np.errstate(all="ignore"):
                    body()
        except _Abort:
            pass
        except BaseException as e:  # noqa: BLE001 (handed to the driver)
            task.error = e
        task.done = True
        self.polls = 0
        self.back.set()

    def _stop(self) -> None:
        self.abort = True
        for t in self.tasks:
            if not t.done:
                t.ready.set()
        for t in self.tasks:
            t.thread.join()


class NamedBarrier:
    """``bar.sync``/``barrier.sync`` (and ``gpu.barrier``): released when
    ``expected`` threads have arrived, then reset. For the synchronization
    checker, the arriving warps (``rows``) release their clocks into the
    generation's and acquire the join once it completes."""

    __slots__ = ("expected", "arrived", "generation", "point")

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.arrived = 0
        self.generation = 0
        self.point = SyncPoint()

    def arrive(self, threads: int, sched: Scheduler | None, what: str, sync=None,
               rows=None) -> None:
        gen = self.generation
        if sync is not None:
            sync.release(rows, self.point)
        self.arrived += threads
        if self.arrived >= self.expected:
            self.arrived = 0
            self.generation += 1
            self.point.complete(gen)
        elif sched is None:
            raise Deadlock(f"{what} for {self.expected} threads reached by {self.arrived} "
                           "(the others cannot arrive in this block): it would hang")
        else:
            sched.wait_until(lambda: self.generation != gen, what)
        if sync is not None:
            sync.acquire(rows, self.point.generations.get(gen))
