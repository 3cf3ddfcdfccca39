"""A deadline on emulation, for callers that must bound a run.

A test runner's per-test timeout cannot rely on a signal: under
:func:`smalti.emulate.on_cpu` the emulator runs inside an XLA host callback,
on a thread XLA owns, while the main thread waits in C++ where no Python
signal handler runs. So the emulator itself looks at the clock where a run
can go on for long -- each cluster of blocks launched, each loop iteration,
each switch between warpgroups -- and stops with :class:`DeadlineExceeded`
once the deadline has passed. The deadline is process-wide (the thread that
sets it is not the one that emulates); looking costs a global read when none
is set.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

from .errors import EmulationError

_deadline: float | None = None  # time.monotonic() value, or None


class DeadlineExceeded(EmulationError):
    """The emulation ran past the deadline its caller set (:func:`deadline`)."""


@contextlib.contextmanager
def deadline(seconds: float | None) -> Iterator[None]:
    """Inside, emulation stops with :class:`DeadlineExceeded` once ``seconds``
    have passed (``None``: no deadline). Nested deadlines: the inner one holds
    until it ends."""
    global _deadline
    if seconds is not None and not seconds > 0:
        raise ValueError(f"deadline(seconds={seconds!r}): the seconds must be positive")
    saved = _deadline
    _deadline = None if seconds is None else time.monotonic() + seconds
    try:
        yield
    finally:
        _deadline = saved


def remaining() -> float | None:
    """Seconds left before the deadline (``None``: none set) -- what a worker
    process (:mod:`.workers`) is given as its own."""
    return None if _deadline is None else max(_deadline - time.monotonic(), 1e-3)


def check(where: str) -> None:
    """Raises :class:`DeadlineExceeded` if the deadline has passed; ``where``
    names the point (an op and its location) for the message."""
    if _deadline is not None and time.monotonic() > _deadline:
        raise DeadlineExceeded(f"the emulation ran past its deadline (at {where}); fix: give "
                               "the run more time, or emulate a smaller problem")
