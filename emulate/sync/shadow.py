"""Shadow memory: for every byte of a tracked buffer, the last write and the
last read by each component, as *site* ids.

A site is one access event: an op executed by one component at one time
(:class:`Sites` holds, per id, the cluster run, the component, its time,
whether it was a generic-proxy write, and what to report). Reads keep one
column per component: an agent's reads come in program order and an
asynchronous unit's complete in order, so a later writer ordered after the
latest read of a component is ordered after all its earlier ones. Reads a
component of an earlier cluster run made are kept apart (``earlier``):
components are numbered per cluster run (a later run knows an earlier
one's only through memory: :mod:`.memory_order`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class OpSite:
    """What to report about one op: its name (or PTX instruction) and source."""

    op: str
    location: str  # file:line
    primitive: str = ""


class Sites:
    """Growable columns describing every access event of a launch."""

    def __init__(self) -> None:
        self.n = 1  # id 0: no access (the host's initial contents)
        cap = 1024
        self.cluster = np.full(cap, -1, np.int32)
        self.component = np.zeros(cap, np.int32)
        self.time = np.zeros(cap, np.int32)
        self.generic = np.zeros(cap, bool)  # a generic-proxy (thread) write
        # an atomic access (red/atom, strong ld, TMA reduction): never a race with another
        self.atomic = np.zeros(cap, bool)
        self.info: list = [None]  # (OpSite, agent name, is_write)
        # a *group* site (component -1): several warps writing the same bytes
        # with equal values in one step; its member sites, one per warp
        self.members: dict[int, np.ndarray] = {}

    def add(self, cluster: int, component: int, time: int, generic: bool, info) -> int:
        """One site; its id."""
        return self.add_many(cluster, [component], [time], generic, [info])

    def add_many(self, cluster: int, components, times, generic: bool, infos: list) -> int:
        """Several sites at once (one op by several warps); the first's id."""
        k, n = self.n, len(components)
        while k + n > self.cluster.size:
            for name in ("cluster", "component", "time", "generic", "atomic"):
                old = getattr(self, name)
                new = np.zeros(2 * old.size, old.dtype)
                new[:old.size] = old
                setattr(self, name, new)
        self.cluster[k:k + n] = cluster
        self.component[k:k + n] = components
        self.time[k:k + n] = times
        self.generic[k:k + n] = generic
        self.atomic[k:k + n] = False
        self.info.extend(infos)
        self.n += n
        return k

    def add_group(self, members: np.ndarray, info) -> int:
        k = self.add(int(self.cluster[members[0]]), -1, 0, bool(self.generic[members].all()), info)
        self.members[k] = members
        return k


class Shadow:
    """The shadow of one buffer (:class:`..memory.Region`), in *cells* of
    ``gran`` bytes: at most 4, as the first access's elements need (the
    checker makes it then), refined (to 2 or 1) the first time an access of
    smaller elements, or of bytes, touches the buffer -- so an f32 buffer is
    checked per element, and a byte is never shared by two cells' records."""

    __slots__ = ("gran", "write", "read", "columns", "earlier", "_stamps")

    def __init__(self, nbytes: int, gran: int = 4) -> None:
        self.gran = gran
        n = -(-nbytes // gran)
        self.write = np.zeros(n, np.int32)
        # a row per reading component (its *column* of the shadow): one
        # component's reads of a run of cells are then a run of memory, and
        # a large buffer's pages are touched only where it reads
        self.read = np.zeros((0, n), np.int32)
        self.columns: dict[int, int] = {}  # component -> its column of ``read``
        self.earlier: np.ndarray | None = None
        self._stamps: np.ndarray | None = None

    def cells(self, offsets: np.ndarray, itemsize: int) -> np.ndarray:
        """The cells elements of ``itemsize`` bytes at byte ``offsets`` cover
        (each element's cells in a row), refining the shadow first if need be.
        Elements are aligned to their size (the memory ops check it), so to
        cells of a size dividing theirs."""
        if itemsize % self.gran:
            self._refine(math.gcd(self.gran, itemsize))
        k = itemsize // self.gran
        first = offsets // self.gran
        return first if k == 1 else (first[:, None] + np.arange(k)).reshape(-1)

    def _refine(self, gran: int) -> None:
        factor = self.gran // gran
        self.gran = gran
        self.write = np.repeat(self.write, factor)
        self.read = np.repeat(self.read, factor, axis=1)
        if self.earlier is not None:
            self.earlier = np.repeat(self.earlier, factor)
        self._stamps = None

    def column(self, component: int) -> int:
        """The column (the row of ``read``) holding ``component``'s reads
        (made on first use)."""
        k = self.columns.get(component)
        if k is None:
            k = self.columns[component] = len(self.columns)
            if k >= self.read.shape[0]:
                grown = np.zeros((max(4, 2 * self.read.shape[0]), self.write.size), np.int32)
                grown[:self.read.shape[0]] = self.read
                self.read = grown
        return k

    def stamps(self) -> np.ndarray:
        """Scratch marks of the checker's overlap test, one per cell."""
        if self._stamps is None:
            self._stamps = np.zeros(self.write.size, np.int64)
        return self._stamps

    def keep_earlier(self, cells: np.ndarray, sites: np.ndarray) -> None:
        """Reads of an earlier cluster run about to be replaced in a column."""
        if self.earlier is None:
            self.earlier = np.zeros(self.write.size, np.int32)
        self.earlier[cells] = sites
