"""The warpgroup scheduler (``emulate/sched.py``): tasks switch only where
one waits, run deterministically, and a run the driver abandons unwinds
every task."""

from __future__ import annotations

import threading

import pytest

from smalti.emulate.sched import Scheduler
from smalti.emulate.sync.reports import Deadlock


def run_in_thread(sched: Scheduler, bodies) -> tuple[threading.Thread, list[BaseException]]:
    raised: list[BaseException] = []

    def go() -> None:
        try:
            sched.run(bodies)
        except BaseException as e:  # noqa: BLE001 (what the run raised, for the test)
            raised.append(e)
    thread = threading.Thread(target=go, daemon=True)
    thread.start()
    return thread, raised


def test_tasks_switch_where_they_wait_in_a_fixed_order():
    sched, order, flag = Scheduler(), [], []

    def producer() -> None:
        order.append("producer")
        flag.append(True)

    def consumer() -> None:
        order.append("consumer waits")
        sched.wait_until(lambda: bool(flag), "the flag")
        order.append("consumer goes on")

    sched.run([("consumer", consumer), ("producer", producer)])
    assert order == ["consumer waits", "producer", "consumer goes on"]


def test_tasks_that_wait_for_each_other_are_a_deadlock():
    sched = Scheduler()
    with pytest.raises(Deadlock, match="a waits for never.*b waits for never"):
        sched.run([(name, lambda: sched.wait_until(lambda: False, "never"))
                   for name in ("a", "b")])


def test_a_driver_interrupted_while_a_task_runs_unwinds_it():
    """A test's timeout signal raises out of the driver's wait while a task
    runs; the task then waits -- after the driver already released every
    task. The run must end with the driver's exception, not hang."""
    sched = Scheduler()
    running, released = threading.Event(), threading.Event()

    def slow() -> None:
        running.set()
        released.wait(10)  # the driver gives up meanwhile
        sched.wait_until(lambda: False, "what never comes")

    def interrupted(timeout=None) -> bool:
        running.wait(10)
        raise KeyboardInterrupt  # as a signal handler's exception would

    sched.back.wait = interrupted  # type: ignore[method-assign]
    stop = sched._stop

    def stop_then_release() -> None:
        sched.abort = True
        for t in sched.tasks:
            t.ready.set()
        released.set()
        stop()
    sched._stop = stop_then_release  # type: ignore[method-assign]
    thread, raised = run_in_thread(sched, [("slow", slow), ("other", lambda: None)])
    thread.join(30)
    assert not thread.is_alive(), "the run hung"
    assert len(raised) == 1 and isinstance(raised[0], KeyboardInterrupt)
    assert all(t.done for t in sched.tasks)
