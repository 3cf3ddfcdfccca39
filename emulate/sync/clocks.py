"""Vector clocks of one cluster's run.

A *component* is a counter one agent advances: every warp has one (its own
program order), and so has every asynchronous unit whose completions a
thread can wait for in order -- an mbarrier's TMA transfers (one per
completed phase), a thread's bulk async-groups (reads and writes apart), a
warpgroup's WGMMA groups. Warps hold a clock (one row of ``Clocks.matrix``,
a column per component); an access stamped ``(component c, value v)`` is
ordered before everything whose clock has ``clock[c] >= v``.

Synchronization objects (barriers, mbarrier phases, the cluster barrier)
are :class:`SyncPoint`s: arrivals *release* the arriving warp's clock into
the point, completion publishes the join, waiters *acquire* it."""

from __future__ import annotations

import numpy as np

#: the state spaces a fence.proxy.async without one covers (PTX: all of them)
ALL_SPACES = frozenset({"smem", "gmem", "tmem"})


def join(a: np.ndarray | None, b: np.ndarray | None) -> np.ndarray | None:
    """The elementwise max of two clocks of possibly different widths."""
    if a is None:
        return None if b is None else b.copy()
    if b is None:
        return a
    if a.size < b.size:
        a, b = b.copy(), a
    a[:b.size] = np.maximum(a[:b.size], b)
    return a


class Clocks:
    """The clock of every warp of a cluster and the names of all components."""

    def __init__(self, warp_names: list[str]) -> None:
        n = len(warp_names)
        self.names: list[str] = list(warp_names)
        self.matrix = np.zeros((n, max(2 * n, 8)), np.int32)
        self.matrix[np.arange(n), np.arange(n)] = 1  # every warp starts at time 1
        # per warp: (time, state spaces) of each fence.proxy.async
        self.fences: list[list[tuple[int, frozenset[str]]]] = [[] for _ in range(n)]
        self.version = 0  # advances whenever a warp's own time does

    @property
    def warps(self) -> int:
        return self.matrix.shape[0]

    def component(self, name: str) -> int:
        """A new component (an asynchronous unit), its id."""
        k = len(self.names)
        self.names.append(name)
        if k >= self.matrix.shape[1]:
            grown = np.zeros((self.warps, 2 * self.matrix.shape[1]), np.int32)
            grown[:, :self.matrix.shape[1]] = self.matrix
            self.matrix = grown
        return k

    def view(self, rows) -> np.ndarray:
        """What the warps ``rows`` together know (one clock)."""
        rows = np.atleast_1d(rows)
        return self.matrix[rows].max(0) if rows.size > 1 else self.matrix[int(rows[0])].copy()

    def release(self, rows, point: SyncPoint) -> None:
        """The warps' arrivals at ``point``: their clocks join its pending one,
        then each warp's own time advances (later accesses are after it)."""
        rows = np.atleast_1d(rows)
        if rows.size == 0:
            return
        point.pending = join(point.pending, self.view(rows))
        self.tick(rows)

    def tick(self, rows) -> None:
        """The warps' own times advance: what they do next is after what they
        just published."""
        rows = np.atleast_1d(rows)
        self.matrix[rows, rows] += 1
        self.version += 1

    def acquire(self, rows, clock: np.ndarray | None) -> None:
        """The warps learn ``clock`` (a completed point's)."""
        if clock is None:
            return
        rows = np.atleast_1d(rows)
        w = min(clock.size, self.matrix.shape[1])
        self.matrix[np.ix_(rows, np.arange(w))] = np.maximum(self.matrix[rows, :w], clock[:w])

    def learn(self, rows, component: int, value: int) -> None:
        """The warps learn that ``component`` reached ``value`` (a wait on
        async-groups, which complete in order)."""
        rows = np.atleast_1d(rows)
        self.matrix[rows, component] = np.maximum(self.matrix[rows, component], value)

    def fence(self, rows, spaces: frozenset[str] = ALL_SPACES) -> None:
        """``fence.proxy.async``: the warps' earlier generic writes to
        ``spaces`` (``"smem"``, ``"gmem"``) become visible to the async proxy
        once the fence is ordered before it."""
        rows = np.atleast_1d(rows)
        for r in rows.tolist():
            self.fences[r].append((int(self.matrix[r, r]), spaces))
        self.tick(rows)

    def last_fences(self, view: np.ndarray, space: str) -> np.ndarray:
        """Per warp: the time of its latest proxy fence of ``space`` that
        ``view`` is ordered after (-1: none)."""
        out = np.full(self.warps, -1, np.int64)
        for r, fences in enumerate(self.fences):
            out[r] = latest_fence(fences, int(view[r]), space)
        return out


def latest_fence(fences: list[tuple[int, frozenset[str]]], known: int, space: str) -> int:
    """The time of the latest of a warp's ``fences`` of ``space`` at or before
    ``known``; -1: none."""
    for t, spaces in reversed(fences):
        if t <= known and space in spaces:
            return t
    return -1


class SyncPoint:
    """A barrier's (or mbarrier phase's) clock: arrivals accumulate in
    ``pending``; completion moves it to ``released``, which waiters acquire.
    Completed generations are kept by number for barriers whose waiters may
    resume after the next generation began."""

    __slots__ = ("pending", "released", "generations")

    def __init__(self) -> None:
        self.pending: np.ndarray | None = None
        self.released: np.ndarray | None = None
        self.generations: dict[int, np.ndarray | None] = {}

    def stamp(self, component: int, value: int) -> None:
        """An asynchronous unit's completion contributes to the pending clock."""
        need = component + 1
        if self.pending is None:
            self.pending = np.zeros(max(need, 8), np.int32)
        elif self.pending.size < need:
            grown = np.zeros(2 * need, np.int32)
            grown[:self.pending.size] = self.pending
            self.pending = grown
        self.pending[component] = max(int(self.pending[component]), value)

    def complete(self, generation: int | None = None) -> None:
        self.released, self.pending = self.pending, None
        if generation is not None:
            self.generations[generation] = self.released
            self.generations.pop(generation - 4, None)
