"""Synchronization through memory: release and acquire on atomics.

Pallas' semaphores (``pl.semaphore_signal``/``pl.semaphore_wait``) and
Mosaic GPU's ``SemaphoreRef`` hand data from one warpgroup or block to
another with no barrier between them: the signaller's ``red.release``
(after a warpgroup barrier) and the waiter's ``atom.cas`` poll followed by
``fence.acquire`` (then a warpgroup barrier). The PTX memory model orders
them by *synchronizes-with*:

* a **release pattern** on a location: an atomic write or read-modify-write
  with ``.release`` (or ``.acq_rel``), or a strong write after the same
  thread's ``fence.release``/``fence.acq_rel``;
* an **acquire pattern**: an atomic read with ``.acquire`` (``ld.acquire``,
  ``atom.acquire``), or a strong read (``ld.relaxed``, a relaxed ``atom``)
  followed by the thread's ``fence.acquire``/``fence.acq_rel``;
* the acquire **reads a value** written by the release or by a later
  read-modify-write of the location (its *release sequence*), and the two
  are **morally strong**: each one's scope (``.cta``, ``.cluster``,
  ``.gpu``, ``.sys``; ``.gpu`` where the instruction names none) includes
  the other's thread.

The emulator runs one schedule, in which every read sees the latest value,
so each location keeps the join of the clocks its release patterns
published (per releasing block and scope, for the scope test); a
read-modify-write continues the sequences before it. Published clocks are
*global* -- keyed by (cluster run, component) -- so a block of a later
cluster can acquire what an earlier one released: the checker gives the
earlier run's components columns of their own in the acquiring run's
clocks (:meth:`.checker.Checker.learn_global`), which barriers then pass on
like any other.

Not modelled: a plain (weak) store to a location does not end the release
sequences before it (a plain store that is not ordered with the atomics is
a race the checker reports anyway); a release by one thread of a warp
publishes what the whole warp knows (threads of a warp are one agent)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from .checker import Checker

GlobalClock = dict[tuple[int, int], int]  # (cluster run, component) -> time

SEMANTICS = ("relaxed", "acquire", "release", "acq_rel")
SCOPES = ("cta", "cluster", "gpu", "sys")


def semantics_and_scope(opcode: str) -> tuple[str, str]:
    """An atomic's or fence's ordering and scope as its opcode names them
    (``relaxed`` and ``gpu`` where it names none, as the PTX ISA defaults; a
    ``fence.sc`` orders as ``acq_rel`` does, and more, which one schedule
    cannot tell)."""
    parts = set(re.split(r"\.", opcode))
    if "sc" in parts:
        parts.add("acq_rel")
    sem = next((s for s in SEMANTICS if s in parts), "relaxed")
    scope = next((s for s in SCOPES if s in parts), "gpu")
    return sem, scope


@dataclass(frozen=True)
class Agent:
    """Where an atomic's thread is: its cluster run and its block's rank."""

    run: int
    rank: int


def includes(scope: str, a: Agent, b: Agent) -> bool:
    """Whether ``scope``, taken by a thread of ``a``, includes a thread of ``b``."""
    if scope in ("gpu", "sys"):
        return True
    if scope == "cluster":
        return a.run == b.run
    return a == b


def join(a: GlobalClock | None, b: GlobalClock) -> GlobalClock:
    out = dict(a) if a else {}
    for k, t in b.items():
        if t > out.get(k, 0):
            out[k] = t
    return out


class MemoryOrder:
    """The release sequences of a launch's atomic locations, and per warp
    (clock row) of the running cluster what its fences hold."""

    def __init__(self, checker: Checker) -> None:
        self.checker = checker
        # location -> {(scope, releasing agent): what its release patterns published}
        self.locations: dict[tuple, dict[tuple[str, Agent], GlobalClock]] = {}
        self.fenced: dict[int, GlobalClock] = {}  # row -> its clock at its latest fence.release
        self.observed: dict[int, GlobalClock] = {}  # row -> what its strong reads saw released

    def new_run(self) -> None:
        """Rows are renumbered per cluster run."""
        self.fenced.clear()
        self.observed.clear()

    def write(self, row: int, agent: Agent, locations: list[tuple], sem: str,
              scope: str) -> None:
        """Atomic writes (or read-modify-writes) by warp ``row`` to
        ``locations``: a release publishes the warp's clock; a relaxed write
        after the warp's ``fence.release`` publishes the clock the fence took;
        any other continues the release sequences already there."""
        if sem in ("release", "acq_rel"):
            clock = self.checker.global_clock(row)
            self.checker.clocks.tick(row)  # its later accesses come after the release
        elif row in self.fenced:
            clock = self.fenced[row]
        else:
            return
        for loc in locations:
            entries = self.locations.setdefault(loc, {})
            entries[(scope, agent)] = join(entries.get((scope, agent)), clock)

    def read(self, row: int, agent: Agent, locations: list[tuple], sem: str,
             scope: str) -> None:
        """Atomic (strong) reads of ``locations`` by warp ``row``: an acquire
        learns what the locations' morally strong release sequences
        published; a relaxed read keeps it for the warp's next
        ``fence.acquire``."""
        seen: GlobalClock = {}
        for loc in locations:
            for (their_scope, them), clock in self.locations.get(loc, {}).items():
                if includes(their_scope, them, agent) and includes(scope, agent, them):
                    seen = join(seen, clock)
        if not seen:
            return
        if sem in ("acquire", "acq_rel"):
            self.checker.learn_global(row, seen)
        else:
            self.observed[row] = join(self.observed.get(row), seen)

    def fence(self, rows: np.ndarray, sem: str) -> None:
        """``fence.{acquire,release,acq_rel}`` by the warps ``rows``."""
        for row in np.unique(rows).tolist():
            if sem in ("acquire", "acq_rel") and row in self.observed:
                self.checker.learn_global(row, self.observed[row])
            if sem in ("release", "acq_rel"):
                self.fenced[row] = self.checker.global_clock(row)
                self.checker.clocks.tick(row)
