"""The checker of one launch: clocks, shadow memory, reports.

The op rules call it beside every memory access and synchronization step
(``fr.launch.sync``; ``None`` when the checker is off). Thread accesses are
checked and recorded per warp; an asynchronous unit's accesses are checked
against what its issuer knows when it issues them and recorded under the
unit's component, so everything later is ordered after them only once it
waits for their completion."""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Callable

import numpy as np

from ..memory import CLUSTER_SHIFT, Region, Space, _full_mask
from ..recurring import Kept, recurs
from .clocks import ALL_SPACES, Clocks, SyncPoint, latest_fence
from .memory_order import GlobalClock, MemoryOrder
from .reports import (
    Access,
    Race,
    RaceError,
    RaceWarning,
    UninitializedRead,
    UninitializedReadWarning,
)
from .shadow import OpSite, Shadow, Sites

MAX_REPORTS = 64  # distinct races (or uninitialized reads) kept per run

# component kinds: what a race's fix talks about
WARP, TMA_LOAD, STORE_READ, STORE_WRITE, WGMMA, ST_ASYNC = (
    "warp", "TMA load", "TMA store (read)", "TMA store (write)", "WGMMA", "st.async")
EARLIER = "an earlier cluster run's component"  # a column learned through memory
TMEM_LOAD, TMEM_STORE, TCGEN05 = "tcgen05.ld", "tcgen05.st", "tcgen05.mma"
CP_ASYNC = "cp.async"


def space_kind(space) -> str:
    return {"global": "gmem", "tmem": "tmem"}.get(space.name, "smem")


def _as_run(cells: np.ndarray) -> np.ndarray | slice:
    """``cells`` as the slice of the shadow they cover where they are every
    cell of one run (in any order, each at least once), else themselves."""
    lo, hi = int(cells.min()), int(cells.max()) + 1
    if cells.size < hi - lo:
        return cells
    covered = np.zeros(hi - lo, bool)
    covered[cells - lo] = True
    return slice(lo, hi) if covered.all() else cells


def _selector(off: np.ndarray | slice) -> Callable[[np.ndarray], np.ndarray]:
    """The cells of ``off`` (an array of them, or a run) that a mask over
    them selects."""
    if isinstance(off, slice):
        return lambda mask: np.arange(off.start, off.stop)[mask]
    return lambda mask: off[mask]


#: op site -> a write pattern (which warp writes each cell, the cells relative
#: to the first) seen without two warps on one cell: a property of the
#: pattern alone, so kept from launch to launch (a kept program's sites
#: recur); at most NO_OVERLAP_KEPT sites
NO_OVERLAP: dict[OpSite, tuple] = {}
NO_OVERLAP_KEPT = 4096

#: the shadow cells a unit's recurring address array covers (see
#: _unit_cells): (the shadow's cell size, the cells, how many), which depend
#: only on the addresses, the buffer's base and the cell size
UNIT_CELLS = Kept(limit=4096)


class Warps:
    """Which warp made each shadow cell of a thread access: ``rows`` (its
    clock row) per cell, or -- for the usual unmasked access, whose cells
    come warp by warp -- ``urows`` with each warp owning an equal run of
    ``per`` cells, the per-cell rows built only when a check needs them."""

    __slots__ = ("urows", "per", "_rows", "overlap")

    def __init__(self, urows: np.ndarray, per: int = 0, rows: np.ndarray | None = None) -> None:
        self.urows = urows  # the distinct warps
        self.per = per  # cells of each warp, when they come warp by warp
        self._rows = rows
        self.overlap = False  # a write two of the warps made to one cell

    @property
    def runs(self) -> bool:
        return self._rows is None

    def rows(self) -> np.ndarray:
        if self._rows is None:
            self._rows = np.repeat(self.urows, self.per)
        return self._rows

    def parts(self) -> list[tuple[int, slice]]:
        """(warp row, its run of cells) per warp, for an access made in runs."""
        return [(int(r), slice(k * self.per, (k + 1) * self.per))
                for k, r in enumerate(self.urows)]


class Checker:
    """The synchronization state of one launch and what it found; the
    policies say what :meth:`finish` (races) and an uninitialized read do."""

    def __init__(self, on_race: str, on_uninitialized: str) -> None:
        self.on_race = on_race
        self.on_uninitialized = on_uninitialized
        self.sites = Sites()
        self.cluster = -1
        self.first_site = 1
        self.clocks = Clocks([])  # the running cluster's (begin_cluster)
        self.kinds: list[str] = []  # per component of the current cluster
        self.races: dict[tuple, Race] = {}
        self.uninitialized: dict[tuple, UninitializedRead] = {}
        self._site_ids: dict[tuple, int] = {}
        self._tables: dict[tuple, tuple] = {}  # (site, write, warps) -> (clock version, ids)
        self._stamps = 0  # numbers each multi-warp write (see _overlapping)
        self._bulk: dict[tuple[int, int], tuple[int, int]] = {}  # (rank, thread) -> comps
        self._bulk_committed: dict[int, np.ndarray] = {}  # rank -> per thread
        self._wgmma: dict[tuple[int, int], list[int]] = {}  # (rank, wg) -> [comp, committed]
        self._units: dict[tuple, list[int]] = {}  # tcgen05 units (see unit) -> [comp, count]
        self._cp_async: dict[tuple[int, int], list[int]] = {}  # (rank, warp row) -> [comp, seq]
        self._cp_groups: dict[tuple[int, int], list[int]] = {}  # (rank, thread) -> group ends
        self.memory_order = MemoryOrder(self)  # release/acquire through atomics
        # earlier cluster runs' components the running one learned of (through
        # memory_order): their columns in its clocks, and back
        self.past: dict[tuple[int, int], int] = {}
        self._origin: dict[int, tuple[int, int]] = {}
        # (run, warp) -> its fences (time, state spaces)
        self._past_fences: dict[tuple[int, int], list[tuple[int, frozenset[str]]]] = {}

    # --- cluster runs -----------------------------------------------------------------------

    def begin_cluster(self, blocks) -> None:
        """Numbers the warps of a cluster's blocks: clock rows and components."""
        for row, times in enumerate(self.clocks.fences[:self.clocks.warps]):
            if times:  # an earlier run's generic writes may reach a later run's TMA
                self._past_fences[(self.cluster, row)] = times
        self.cluster += 1
        self.first_site = self.sites.n  # sites are numbered in order: older ones are earlier runs'
        self.past, self._origin = {}, {}
        self.memory_order.new_run()
        names = []
        for b in blocks:
            b.warp_row0 = len(names)
            b.warp_rows = b.warp_row0 + b.flat // 32
            for w in range(-(-b.T // 32)):
                names.append(f"block {b.block_id} warpgroup {w // 4} warp {w}")
        self.clocks = Clocks(names)
        self.kinds = [WARP] * len(names)
        self._site_ids.clear()
        self._tables.clear()
        self._bulk.clear()
        self._bulk_committed.clear()
        self._wgmma.clear()
        self._units.clear()
        self._cp_async.clear()
        self._cp_groups.clear()

    def component(self, kind: str, name: str) -> int:
        self.kinds.append(kind)
        return self.clocks.component(name)

    # --- clocks across cluster runs (see .memory_order) ---------------------------------------

    def global_clock(self, row: int) -> GlobalClock:
        """Warp ``row``'s clock keyed by (cluster run, component)."""
        clock = self.clocks.matrix[row]
        return {self._origin.get(c, (self.cluster, c)): int(clock[c])
                for c in np.flatnonzero(clock).tolist()}

    def learn_global(self, row: int, clock: GlobalClock) -> None:
        """Warp ``row`` learns ``clock``: this run's components directly, an
        earlier run's through a column of its own (made on first use)."""
        for (run, comp), t in clock.items():
            if run == self.cluster:
                col = comp
            else:
                col = self.past.get((run, comp))
                if col is None:
                    col = self.component(EARLIER, f"component {comp} of cluster run {run}")
                    self.past[(run, comp)] = col
                    self._origin[col] = (run, comp)
            self.clocks.learn(row, col, t)

    def _ordered_earlier(self, sites: np.ndarray, rows: np.ndarray | None,
                         view: np.ndarray | None) -> np.ndarray:
        """Whether each site of an earlier cluster run happens before the
        accessor (per site ``rows``, or the one clock ``view``): only what
        the run learned through memory (``past``) orders them."""
        if not self.past:
            return np.zeros(sites.size, bool)
        S = self.sites
        uniq, inv = np.unique(sites, return_inverse=True)
        cols = np.array([self.past.get((int(S.cluster[s]), int(S.component[s])), -1)
                         for s in uniq.tolist()], np.int64)[inv]
        has = cols >= 0
        known = np.zeros(sites.size, np.int64)
        if view is not None:
            v = self._full_width(view)
            known[has] = v[cols[has]]
        else:
            assert rows is not None  # (a thread access passes its rows)
            known[has] = self.clocks.matrix[rows[has], cols[has]]
        return has & (known >= S.time[sites])

    # --- who -------------------------------------------------------------------------------

    @staticmethod
    def rows(fr) -> np.ndarray:
        """The clock rows of the warps with an active thread."""
        rows = fr.block.warp_rows
        return np.unique(rows if fr.mask is None else rows[fr.mask])

    def _site(self, site: OpSite, component: int, time: int, agent: str, is_write: bool,
              generic: bool) -> int:
        key = (id(site), component, time, is_write)
        k = self._site_ids.get(key)
        if k is None:
            k = self._site_ids[key] = self.sites.add(self.cluster, component, time, generic,
                                                     (site, agent, is_write))
        return k

    # --- accesses --------------------------------------------------------------------------

    def thread_access(self, fr, space_name: str, addrs, vrank: int, itemsize: int,
                      is_write: bool, site: OpSite, mask=None, by_warp: bool = False,
                      values=None, atomic: bool = False, overwritten=None) -> None:
        """Threads of ``fr`` (those active, or in ``mask``) access the elements
        at ``addrs`` (per thread, or the same in each: ``vrank`` trailing dims;
        ``by_warp``: a leading axis of warps, for warp collectives). A write
        passes the ``values`` written (of the element dtype): warps writing
        equal values to a byte in one step are not a race (replicated layouts,
        which jax stores from every warp). A write that also passes the values
        it ``overwritten`` (read before the store, shaped as ``values``) is
        not a race with an unordered earlier write whose bytes it leaves as
        they were: no order of the two changes what any read can see.
        ``atomic``: an atomic access (``red``/``atom``, a strong ``ld``), which
        races with no other atomic one."""
        a = np.asarray(addrs, np.int64)
        lead = fr.block.warp_rows[::32] if by_warp else fr.block.warp_rows
        if a.ndim == vrank:
            a = np.broadcast_to(a, (lead.size,) + a.shape)
        m = fr.mask if mask is None else mask
        if m is None and space_name != "cluster" and (by_warp or lead.size % 32 == 0):
            # thread (or warp) major: each warp's elements are one run
            urows = lead[::1 if by_warp else 32]
            shape = a.shape
            a = a.reshape(-1)

            def flat(x):
                return None if x is None else (lambda: np.broadcast_to(x, shape).reshape(-1))
            if a.size:
                self._thread_cells(fr.mem[space_name], a, Warps(urows, a.size // urows.size),
                                   itemsize, is_write, site, flat(values), atomic,
                                   flat(overwritten))
            return
        v = None if values is None else np.broadcast_to(values, a.shape)
        o = None if overwritten is None else np.broadcast_to(overwritten, a.shape)
        rows = np.broadcast_to(lead.reshape((lead.size,) + (1,) * (a.ndim - 1)), a.shape)
        if m is not None:
            full = _full_mask(np.asarray(m), a.shape)
            a, rows = a[full], rows[full]
            v = None if v is None else v[full]
            o = None if o is None else o[full]
        else:
            a, rows = a.reshape(-1), rows.reshape(-1)
            v = None if v is None else v.reshape(-1)
            o = None if o is None else o.reshape(-1)

        def part(x, sel):
            return None if x is None else (lambda: x if sel is None else x[sel])
        for space, local, sel in self.spaces(fr, space_name, a):
            r = rows if sel is None else rows[sel]
            if r.size:
                self._thread_cells(space, local, Warps(np.unique(r), rows=r), itemsize, is_write,
                                   site, part(v, sel), atomic, part(o, sel))

    def spaces(self, fr, space_name: str, a: np.ndarray):
        """(space, addresses in it, which of ``a``) of addresses in ``space_name``;
        shared::cluster ones split by the block they name."""
        space = fr.mem[space_name]
        if space_name != "cluster":
            yield space, a, None
            return
        rank = (a >> CLUSTER_SHIFT) - 1
        local = a & ((1 << CLUSTER_SHIFT) - 1)
        if rank.size and (rank == rank[0]).all():  # the usual: one block's
            yield space.spaces[int(rank[0])], local, None
            return
        for k in np.unique(rank):
            sel = rank == k
            yield space.spaces[int(k)], local[sel], sel

    def _thread_cells(self, space: Space, a: np.ndarray, who: Warps, itemsize: int,
                      is_write: bool, site: OpSite,
                      values: Callable[[], np.ndarray] | None = None,
                      atomic: bool = False,
                      overwritten: Callable[[], np.ndarray] | None = None) -> None:
        """A thread access of elements ``a`` of ``space``; a write's ``values``
        and the ``overwritten`` ones (flat, made on demand: they matter only
        where warps overlap or an earlier write is unordered)."""
        # the memory op found every element in one buffer: the first one's
        region = space.find(int(a[0]), int(a[0]) + itemsize, site.location)
        if not region.tracked:
            return
        sh = self._shadow(region, itemsize)
        off = sh.cells(a - region.base, itemsize)  # cells, from here on
        k = off.size // a.size
        if k > 1:
            if who.runs:
                who.per *= k
            else:
                who = Warps(who.urows, rows=np.repeat(who.rows(), k))
        table = self._site_table(site, who.urows, is_write)
        sites = np.repeat(table[who.urows], who.per) if who.runs else table[who.rows()]
        if atomic:  # several warps' atomics on one cell in a step: each applied, no race
            self.sites.atomic[sites] = True
        who.overlap = is_write and not atomic and self._overlapping(site, region, off, who)
        def cell_bytes(x: Callable[[], np.ndarray]) -> np.ndarray:
            return np.ascontiguousarray(x()).view(np.uint8).reshape(off.size, -1)
        written = None
        if who.overlap and values is not None:  # the bytes each cell's writer wrote
            written = cell_bytes(values)
        unchanged = None
        if values is not None and overwritten is not None:
            def unchanged(cells: np.ndarray) -> np.ndarray:
                new = written if written is not None else cell_bytes(values)
                return (new[cells] == cell_bytes(overwritten)[cells]).all(1)
        self._check(region, space_kind(space), off, sites, who, None, is_write, False, written,
                    atomic, unchanged)

    def _site_table(self, site: OpSite, urows: np.ndarray, is_write: bool) -> np.ndarray:
        """Site ids of ``site`` executed by each warp of ``urows`` now, by
        row: the same ids until a warp's time advances."""
        clocks = self.clocks
        key = (id(site), is_write, urows.tobytes())
        cached = self._tables.get(key)
        if cached is not None and cached[0] == clocks.version:
            return cached[1]
        rows = urows.tolist()
        first = self.sites.add_many(self.cluster, urows, clocks.matrix[urows, urows], True,
                                    [(site, clocks.names[r], is_write) for r in rows])
        table = np.zeros(clocks.warps, np.int32)
        table[urows] = np.arange(first, first + len(rows))
        self._tables[key] = (clocks.version, table, site)  # site: keeps id(site) unique
        return table

    def async_access(self, view: np.ndarray, space, addrs, itemsize: int, is_write: bool,
                     site: OpSite, component: int, stamp: int, agent: str,
                     proxy_read: bool = True, atomic: bool = False) -> None:
        """An asynchronous unit (TMA, WGMMA, st.async) accesses the elements at
        ``addrs``: checked against ``view`` (what its issuer knew when issuing
        it), recorded as ``(component, stamp)``. ``proxy_read``: a read
        through the async proxy, which sees a thread's writes only after that
        thread's ``fence.proxy.async``."""
        located = self._unit_cells(space, addrs, itemsize, site)
        if located is None:
            return
        region, off, n = located
        s = self._site(site, component, stamp, agent, is_write, generic=False)
        if atomic:
            self.sites.atomic[s] = True
        sites = np.full(n, s, np.int32)
        self._check(region, space_kind(space), off, sites, None, view, is_write,
                    proxy_read and not is_write, atomic=atomic)

    def _unit_cells(self, space, addrs, itemsize: int, site: OpSite
                    ) -> tuple[Region, np.ndarray | slice, int] | None:
        """(region, cells, how many) of a unit's access to ``addrs``; None
        where it touches nothing tracked. A unit's access is one site, so
        only the set of its cells matters: a whole run of them (a TMA box's
        or a WGMMA operand's SMEM tile) is a slice, checked through views of
        the shadow instead of gathers. Read-only address arrays (a WGMMA
        descriptor's operand, made once per descriptor) recur: their cells
        are kept, from launch to launch (:data:`UNIT_CELLS`)."""
        kept = recurs(addrs)
        if kept:
            hit = UNIT_CELLS.get(addrs, itemsize, space, site.location)
            if hit is not None and hit[0].tracked:
                region, (gran, cells_kept, n) = hit
                if self._shadow(region, itemsize).gran == gran:  # (not refined since)
                    return region, cells_kept, n
        a = np.asarray(addrs, np.int64).reshape(-1)
        if a.size == 0:
            return None
        lo, hi = int(a.min()), int(a.max()) + itemsize
        region = space.find(lo, hi, site.location)
        if not region.tracked:
            return None
        sh = self._shadow(region, itemsize)
        cells = sh.cells(a - region.base, itemsize)
        off: np.ndarray | slice = _as_run(cells)
        n = cells.size if isinstance(off, np.ndarray) else off.stop - off.start
        if kept:
            if isinstance(off, np.ndarray):
                off.setflags(write=False)
            UNIT_CELLS.put(addrs, itemsize, lo, hi, region, (sh.gran, off, n))
        return region, off, n

    # --- the check --------------------------------------------------------------------------

    def _ordered(self, earlier: np.ndarray, rows: np.ndarray | None,
                 view: np.ndarray | None, need_all: bool = True) -> np.ndarray:
        """Whether each access ``earlier`` (site ids) happens before the
        accessor (per cell clock ``rows``, or the one clock ``view``). A group
        write is ordered before a read once one of its warps' writes is (they
        wrote equal values), before a write only once all are."""
        S = self.sites
        comp = S.component[earlier]
        plain = comp >= 0
        if self.cluster == 0:  # one cluster run so far: every site is of this one
            same = True
            c = comp if plain.all() else np.where(plain, comp, 0)
        else:
            same = earlier >= self.first_site
            c = np.where(same & plain, comp, 0)
        if rows is not None:
            known = self.clocks.matrix[rows, c]
        else:
            view = self._full_width(view)
            known = view[c]
        ok = same & plain & (known >= S.time[earlier])
        if self.past and not np.all(same):
            old = plain & ~same
            ok[old] = self._ordered_earlier(earlier[old], None if rows is None else rows[old],
                                            view)
        if not plain.all():
            for g in np.unique(earlier[~plain]):
                members = S.members[int(g)]
                at = earlier == g
                accessors = [None] if rows is None else np.unique(rows[at])
                for r in accessors:
                    mine = at if r is None else at & (rows == r)
                    m_ok = self._ordered(members, None if r is None else
                                         np.full(members.size, r), view)
                    ok[mine] = m_ok.all() if need_all else m_ok.any()
        return ok

    def _ordered_cells(self, prior: np.ndarray, who: Warps | None, view: np.ndarray | None,
                       need_all: bool = True) -> np.ndarray | None:
        """Per cell: whether its earlier access (site id ``prior``; 0: none)
        happens before this access's cell (made by ``who``, or seen from
        ``view``); None when every cell's does (the usual answer). Cells of
        one warp usually share their earlier access: that case is decided once."""
        first = int(prior[0])
        if first == 0 and not prior.any():  # no earlier access (the usual first touch)
            return None
        if (prior == first).all():  # one earlier access for every cell: decide per warp
            if who is None:
                return None if self._ordered_one(first, None, view, need_all) else \
                    np.zeros(prior.shape, bool)
            oks = [self._ordered_one(first, r, None, need_all) for r in who.urows.tolist()]
            if all(oks):
                return None
            if who.runs:
                return np.repeat(oks, who.per)
            by_row = np.zeros(self.clocks.warps, bool)
            by_row[who.urows] = oks
            return by_row[who.rows()]
        if who is None:
            ok = np.broadcast_to(self._ordered_run(prior, None, view, need_all), prior.shape)
        elif who.runs:
            ok = np.empty(prior.size, bool)
            for row, run in who.parts():
                ok[run] = self._ordered_run(prior[run], row, None, need_all)
        else:
            ok = np.ones(prior.size, bool)
            i = np.flatnonzero(prior)
            ok[i] = self._ordered(prior[i], who.rows()[i], None, need_all)
        return None if ok.all() else ok

    def _ordered_run(self, prior: np.ndarray, row: int | None, view: np.ndarray | None,
                     need_all: bool):
        """:meth:`_ordered_cells` for cells one warp (``row``) or one unit
        (``view``) made; a bool when they all share their earlier access."""
        first = int(prior[0])
        if (prior == first).all():
            return first == 0 or self._ordered_one(first, row, view, need_all)
        ok = np.ones(prior.size, bool)
        i = np.flatnonzero(prior)
        earlier = prior[i]
        lo, hi = int(earlier.min()), int(earlier.max()) + 1
        if hi - lo < earlier.size // 4:
            # a few recent sites over many cells (a TMA slot's reads by a few
            # WGMMAs): each site decided once, the cells look their verdict up
            verdict = self._ordered(np.arange(lo, hi, dtype=earlier.dtype),
                                    None if row is None else np.full(hi - lo, row), view,
                                    need_all)
            ok[i] = verdict[earlier - lo]
            return ok
        ok[i] = self._ordered(earlier, None if row is None else np.full(i.size, row), view,
                              need_all)
        return ok

    def _ordered_one(self, site: int, row: int | None, view: np.ndarray | None,
                     need_all: bool) -> bool:
        """:meth:`_ordered` of one site, without arrays."""
        S = self.sites
        comp = int(S.component[site])
        if comp < 0:
            return bool(self._ordered(np.array([site]), None if row is None else np.array([row]),
                                      view, need_all)[0])
        if site < self.first_site:
            return bool(self._ordered_earlier(np.array([site]), None if row is None else
                                              np.array([row]), view)[0])
        if view is not None:  # a unit's clock (else the warp's: ``row``)
            known = int(view[comp]) if comp < view.size else 0
        else:
            known = int(self.clocks.matrix[row, comp])
        return known >= int(S.time[site])

    def _full_width(self, view: np.ndarray) -> np.ndarray:
        width = self.clocks.matrix.shape[1]
        if view.size < width:
            view = np.concatenate([view, np.zeros(width - view.size, view.dtype)])
        return view

    def _unfenced(self, writes: np.ndarray, view: np.ndarray, space: str) -> np.ndarray:
        """Which generic writes (site ids, ordered before ``view``) to memory
        of ``space`` no proxy fence of that space by their warp, ordered
        before ``view``, follows."""
        S = self.sites
        view = self._full_width(view)
        fenced = self.clocks.last_fences(view, space)
        comp = S.component[writes]
        here = (comp >= 0) & (writes >= self.first_site)
        bad = np.ones(writes.size, bool)
        bad[here] = S.time[writes[here]] > fenced[comp[here]]
        for k in np.flatnonzero(~here):
            w = int(writes[k])
            if comp[k] >= 0:  # an earlier run's write, ordered through memory
                bad[k] = S.time[w] > self._past_fence(w, view, space)
                continue
            members = S.members[w]
            members = members[members >= self.first_site]  # an earlier run's: judged by order alone
            bad[k] = bool((S.time[members] > fenced[S.component[members]]).any())
        return bad

    def _past_fence(self, site: int, view: np.ndarray, space: str) -> int:
        """The time of the latest proxy fence of ``space`` by the warp that
        made ``site`` (of an earlier cluster run) that ``view`` is ordered
        after; -1: none."""
        key = (int(self.sites.cluster[site]), int(self.sites.component[site]))
        col = self.past.get(key)
        known = int(view[col]) if col is not None and col < view.size else 0
        return latest_fence(self._past_fences.get(key, []), known, space)

    @staticmethod
    def _shadow(region: Region, itemsize: int) -> Shadow:
        """``region``'s shadow, made on its first access at the granularity
        that access needs (a buffer first touched by 2-byte elements starts
        in 2-byte cells rather than being refined from 4-byte ones at once:
        the same shadow, without copying every cell of a large buffer)."""
        if region.shadow is None:
            region.shadow = Shadow(region.data.size, gran=math.gcd(4, itemsize))
        return region.shadow

    def _check(self, region: Region, space: str, off: np.ndarray | slice, sites: np.ndarray,
               who: Warps | None, view: np.ndarray | None, is_write: bool,
               proxy_read: bool, written: np.ndarray | None = None,
               atomic: bool = False,
               unchanged: Callable[[np.ndarray], np.ndarray] | None = None) -> None:
        """Checks an access of cells ``off`` of ``region``'s shadow (each by site
        ``sites``) against the shadow, reports conflicts, records it. A
        thread access says ``who`` made each cell (their clock rows, which
        are also their components); an asynchronous unit's is seen from
        ``view``, its issuer's clock. ``unchanged`` (a write's): which of
        the cells selected it leaves holding the bytes they held."""
        sh = region.shadow
        S = self.sites
        w = sh.write[off]
        if isinstance(off, slice):  # a unit's run of cells (see async_access)
            w = w.copy()  # not a view, which would see this access's own record
        at = _selector(off)  # the cells a mask of them selects, for reports
        if not is_write and space == "smem" and not (w[0] != 0 and (w == w[0]).all()):
            fresh = w == 0
            if fresh.any():
                self._uninitialized(region, space, at(fresh), sites[fresh])
        ok = self._ordered_cells(w, who, view, need_all=is_write)
        if ok is not None and atomic:  # atomics never race with each other
            ok = ok | S.atomic[w]
        benign = None
        if ok is not None and not ok.all():
            bad = ~ok
            if is_write and unchanged is not None:
                # an unordered write of the bytes already there: whichever
                # lands last, memory holds the same: no read can tell
                same = np.zeros(bad.shape, bool)
                same[bad] = unchanged(bad)
                if same.any():
                    benign, bad = same, bad & ~same
            if bad.any():
                self._race(region, space, w[bad], sites[bad], at(bad))
        if proxy_read:
            gen = w != 0
            if ok is not None:
                gen &= ok
            gen[gen] = S.generic[w[gen]]
            if gen.any():
                g = w[gen]
                unfenced = self._unfenced(g, view, space)
                if unfenced.any():
                    self._race(region, space, g[unfenced], sites[gen][unfenced],
                               at(gen)[unfenced], unfenced=True)
        if is_write:
            used = len(sh.columns)
            seen = sh.read[:used, off] if used else None
            cols = [] if seen is None or not seen.any() else list(seen)
            if sh.earlier is not None:
                cols.append(sh.earlier[off])
            for r in cols:
                ok = self._ordered_cells(r, who, view)
                if ok is not None and atomic:
                    ok = ok | S.atomic[r]
                if ok is not None and not ok.all():
                    bad = ~ok
                    self._race(region, space, r[bad], sites[bad], at(bad))
            sh.write[off] = sites
            if who is not None and who.overlap:
                assert isinstance(off, np.ndarray)  # (thread accesses pass their cells)
                self._same_op_writes(sh, region, space, off, sites, who.rows(), written)
            if benign is not None:
                self._equal_writes(sh, at(benign), w[benign], sh.write[at(benign)])
            return
        # each component's reads go in its column
        if who is None:  # an asynchronous unit: one component, one site
            col = sh.column(int(S.component[sites[0]]))  # (may grow sh.read)
            column = sh.read[col]
            if self.cluster > 0:  # reads of an earlier cluster run are kept apart
                self._keep_stale(sh, column[off], at)
            column[off] = sites[0]
            return
        assert isinstance(off, np.ndarray)  # (thread accesses pass their cells)
        if who.runs:  # each warp's run of cells into its column: 1-D scatters, not one 2-D
            for row, run in who.parts():
                col = sh.column(row)  # (may grow sh.read: look it up after)
                column, cells = sh.read[col], off[run]
                if self.cluster > 0:
                    self._keep_stale(sh, column[cells], _selector(cells))
                column[cells] = sites[run]
            return
        by_row = np.zeros(self.clocks.warps, np.int64)
        by_row[who.urows] = [sh.column(int(r)) for r in who.urows]
        col = by_row[who.rows()]
        if self.cluster > 0:
            self._keep_stale(sh, sh.read[col, off], at)
        sh.read[col, off] = sites

    def _keep_stale(self, sh: Shadow, old: np.ndarray,
                    at: Callable[[np.ndarray], np.ndarray]) -> None:
        """Keeps apart (``sh.earlier``) the reads of an earlier cluster run
        among ``old``, the reads about to be replaced in the cells ``at``
        selects."""
        stale = (old != 0) & (old < self.first_site)
        if stale.any():
            sh.keep_earlier(at(stale), old[stale])

    def _overlapping(self, site: OpSite, region: Region, off: np.ndarray, who: Warps) -> bool:
        """Whether two warps of this write touch one cell. An op writes the
        same pattern of cells (relative to its first) step after step: a
        pattern seen without overlap is not tested again."""
        if who.urows.size < 2:
            return False
        rel = off - off[0]
        owners = (who.per, who.urows.size) if who.runs else who.rows().tobytes()
        seen = NO_OVERLAP.get(site)
        if seen is not None and seen[0] == owners and np.array_equal(seen[1], rel):
            return False
        if self._stamped(region.shadow, off, who):
            return True
        if len(NO_OVERLAP) >= NO_OVERLAP_KEPT:
            NO_OVERLAP.clear()
        NO_OVERLAP[site] = (owners, rel)
        return False

    def _stamped(self, sh: Shadow, off: np.ndarray, who: Warps) -> bool:
        """Each warp marks its cells with a stamp unique to this access and
        looks again: a cell with another's mark has two writers."""
        self._stamps += 1
        mark = (self._stamps << 16) + who.rows()
        stamp = sh.stamps()
        stamp[off] = mark
        return bool((stamp[off] != mark).any())

    def _same_op_writes(self, sh: Shadow, region: Region, space: str, off: np.ndarray,
                        sites: np.ndarray, rows: np.ndarray, written: np.ndarray | None) -> None:
        """Several warps writing one byte in the same step: a race, unless
        they all wrote the value the byte now holds -- then the byte's last
        write is the group of them (replicated layouts are stored so)."""
        lo = int(off.min())  # a scratch over the bytes touched, not the whole buffer
        scratch = np.zeros(int(off.max()) - lo + 1, np.int32)
        scratch[off - lo] = sites
        back = scratch[off - lo]
        clash = back != sites
        if not clash.any():
            return
        g = sh.gran
        equal = np.zeros(clash.shape, bool) if written is None else \
            (written == region.data[(off * g)[:, None] + np.arange(g)]).all(1)
        bad = clash & ~equal
        if bad.any():
            self._race(region, space, back[bad], sites[bad], off[bad])
        shared = np.unique(off[clash & equal])
        if shared.size == 0:
            return
        sel = np.isin(off, shared)
        nrows = self.clocks.warps
        pairs = np.unique(off[sel].astype(np.int64) * nrows + rows[sel])
        byte, row = pairs // nrows, pairs % nrows
        starts = np.flatnonzero(np.r_[True, byte[1:] != byte[:-1]])
        groups: dict[tuple, list] = {}
        for k, lo in enumerate(starts):
            hi = starts[k + 1] if k + 1 < starts.size else byte.size
            groups.setdefault(tuple(row[lo:hi].tolist()), []).append(int(byte[lo]))
        table = np.zeros(nrows, np.int32)
        table[rows] = sites
        for members, at in groups.items():
            first = self.sites.info[int(table[members[0]])]
            agent = (f"{first[1].rsplit(' warp ', 1)[0]} warps "
                     f"{', '.join(str(self.clocks.names[r].rsplit(' ', 1)[1]) for r in members)}")
            g = self.sites.add_group(table[list(members)], (first[0], agent, True))
            sh.write[np.asarray(at)] = g

    def _equal_writes(self, sh: Shadow, off: np.ndarray, earlier: np.ndarray,
                      later: np.ndarray) -> None:
        """Cells ``off`` written again, unordered, with the bytes they held:
        their last write becomes the group of both writers, which (like a
        replicated store's group) orders before a read once one of its
        writes does and before a write only once all of them do."""
        S = self.sites
        keys = earlier.astype(np.int64) << 32 | later.astype(np.int64)
        uniq, inv = np.unique(keys, return_inverse=True)
        for k, key in enumerate(uniq):
            pair = [int(key >> 32), int(key & 0xFFFFFFFF)]
            members = np.concatenate([S.members.get(p, np.array([p], np.int32))
                                      for p in pair]).astype(np.int32)
            # reported as the earliest write: the one a later writer of the
            # block that made the last is not ordered after
            site, agent, _ = S.info[int(members[0])]
            n = members.size - 1
            info = (site, f"{agent} (and {n} unordered write{'s' * (n > 1)} of the same "
                          "bytes)", True)
            sh.write[off[inv == k]] = S.add_group(members, info)

    # --- reports ---------------------------------------------------------------------------

    def _access(self, site_id: int, region: Region, cells: np.ndarray) -> Access:
        """The report of site ``site_id``'s access to ``cells`` of ``region``
        (as the byte range they span)."""
        site, agent, is_write = self.sites.info[site_id]
        g = region.shadow.gran
        lo, hi = int(cells.min()) * g, min((int(cells.max()) + 1) * g, region.size)
        return Access(op=site.op, location=site.location, agent=agent, is_write=is_write,
                      allocation=region.name, start=lo, stop=hi, primitive=site.primitive)

    def _race(self, region: Region, space: str, first: np.ndarray, second: np.ndarray,
              off: np.ndarray, unfenced: bool = False) -> None:
        keys = first.astype(np.int64) << 32 | second.astype(np.int64)
        uniq, inv = np.unique(keys, return_inverse=True)
        for k, key in enumerate(uniq[:MAX_REPORTS]):
            f, s = int(key >> 32), int(key & 0xFFFFFFFF)
            sel = off[inv == k]
            a, b = self._access(f, region, sel), self._access(s, region, sel)
            kind = ("write-after-write" if a.is_write and b.is_write else
                    "read-after-write" if a.is_write else "write-after-read")
            self._keep((kind, space, a.op, a.location, b.op, b.location, unfenced),
                       lambda: Race(kind, space, a, b, self._fix(f, s, a, b, unfenced, space)))  # noqa: B023 -- called within _keep

    def _keep(self, key: tuple, race: Callable[[], Race]) -> None:
        """One report per pair of ops and lines (``count``: how often hit)."""
        old = self.races.get(key)
        if old is not None:
            self.races[key] = dataclasses.replace(old, count=old.count + 1)
        elif len(self.races) < MAX_REPORTS:
            self.races[key] = race()

    def absorb_race(self, key: tuple, race: Race) -> None:
        """A race another process's checker found (:mod:`..workers`), taken in
        as :meth:`_keep` would have kept it: counts add up."""
        old = self.races.get(key)
        if old is not None:
            self.races[key] = dataclasses.replace(old, count=old.count + race.count)
        elif len(self.races) < MAX_REPORTS:
            self.races[key] = race

    def absorb_uninitialized(self, key: tuple, report: UninitializedRead) -> None:
        """An uninitialized read another process found, warned about here."""
        if key in self.uninitialized or len(self.uninitialized) >= MAX_REPORTS:
            return
        self.uninitialized[key] = report
        if self.on_uninitialized == "warn":
            warnings.warn(UninitializedReadWarning(report), stacklevel=2)

    def _fix(self, f: int, s: int, a: Access, b: Access, unfenced: bool,
             space: str = "smem") -> str:
        S = self.sites
        same_cluster = S.cluster[f] == S.cluster[s]
        if not same_cluster:
            return ("order the blocks' accesses through a semaphore (pl.semaphore_signal after "
                    "the first, pl.semaphore_wait before the second: a release and an "
                    "acquire), or make them access disjoint bytes (or put them in one "
                    "cluster and synchronize)")
        kf = self.kinds[S.component[f]] if S.component[f] >= 0 else WARP
        ks = self.kinds[S.component[s]] if S.component[s] >= 0 else WARP
        if unfenced:
            target = "the wgmma" if ks == WGMMA else "the copy"
            if space == "gmem":  # commit_smem's fence.proxy.async.shared::cta covers SMEM only
                return (f"fence the global writes for the async proxy after them and before "
                        f"{target}: fence.proxy.async.global or fence.proxy.async "
                        "(plgpu.commit_smem() fences SMEM only)")
            return f"call plgpu.commit_smem() after the writes and before {target}"
        if kf == STORE_READ:
            return ("wait until the copy has read its source (plgpu.wait_smem_to_gmem(n, "
                    "wait_read_only=True), counting the copies still allowed in flight) "
                    "before overwriting it")
        if kf == STORE_WRITE:
            return ("wait for the copy to finish (plgpu.wait_smem_to_gmem(n) with n counting "
                    "only later copies) before touching its destination")
        if kf == TMA_LOAD:
            return "wait on the copy's barrier (plgpu.barrier_wait) before touching its destination"
        if kf == ST_ASYNC:
            return "wait on the barrier the remote store completes before touching its bytes"
        if kf == CP_ASYNC:
            return ("wait for the copy's group (cp.async.wait_group / wait_all: "
                    "ctx.await_cp_async_copy(n)) -- and, for other threads, a barrier after "
                    "it -- before touching its destination")
        if ks == CP_ASYNC:
            return ("order the earlier access before the cp.async: a barrier (or the "
                    "issuing thread's own earlier access) before issuing the copy")
        if kf == WGMMA:
            return "wait for the WGMMA (plgpu.wgmma_wait) before overwriting its operands"
        if kf == TMEM_STORE:
            return ("wait for the TMEM store (tcgen05.wait::st: plgpu.commit_tmem()) and "
                    "synchronize before touching the same TMEM")
        if kf == TMEM_LOAD:
            return ("wait for the TMEM load (tcgen05.wait::ld: plgpu.wait_load_tmem()) before "
                    "releasing the TMEM to its next writer")
        if kf == TCGEN05:
            return ("wait on the mbarrier the MMA's tcgen05.commit arrives on "
                    "(plgpu.tcgen05_commit_arrive, then plgpu.barrier_wait) before touching "
                    "its operands or accumulator")
        if ks == TCGEN05:
            return ("order the earlier access before the MMA: finish it (commit_tmem / "
                    "wait_load_tmem, or wait for the copy), then synchronize with the issuing "
                    "thread (a barrier, or an mbarrier it waits on) before issuing")
        if ks in (TMA_LOAD, ST_ASYNC):
            return ("start the copy only after the buffer's readers and writers are done: "
                    "have them arrive on an mbarrier the issuing thread waits on (or a barrier)")
        if ks in (STORE_READ, STORE_WRITE, WGMMA):
            return ("order the earlier access before the asynchronous operation: a barrier "
                    "(and plgpu.commit_smem() for writes) before issuing it")
        blocks = {a.agent.split(" warpgroup")[0], b.agent.split(" warpgroup")[0]}
        if len(blocks) > 1:
            return ("order the two blocks' accesses: the cluster barrier, or an mbarrier "
                    "arrival on the peer (plgpu.ClusterBarrier) that the reader waits on")
        return ("order the two accesses: a barrier between them (a warpgroup or block barrier, "
                "or an mbarrier the second waits on after the first arrives)")

    def _uninitialized(self, region: Region, space: str, off: np.ndarray,
                       sites: np.ndarray) -> None:
        if self.on_uninitialized == "ignore":
            return
        for s in np.unique(sites):
            a = self._access(int(s), region, off[sites == s])
            key = (a.op, a.location, region.name)
            if key not in self.uninitialized and len(self.uninitialized) < MAX_REPORTS:
                report = UninitializedRead(a, space)
                self.uninitialized[key] = report
                if self.on_uninitialized == "raise":
                    raise report
                warnings.warn(UninitializedReadWarning(report), stacklevel=2)

    def finish(self) -> None:
        """Applies the race policy at the end of a run."""
        races = list(self.races.values())
        if not races or self.on_race == "ignore":
            return
        if self.on_race == "warn":
            for r in races:
                warnings.warn(RaceWarning(r), stacklevel=3)
            return
        raise RaceError(races)

    # --- synchronization -------------------------------------------------------------------

    def release(self, rows, point: SyncPoint) -> None:
        self.clocks.release(rows, point)

    def acquire(self, rows, clock) -> None:
        self.clocks.acquire(rows, clock)

    def fence(self, rows, spaces: frozenset[str] = ALL_SPACES) -> None:
        self.clocks.fence(rows, spaces)

    def barrier_component(self, bar, block) -> int:
        """The component of the transfers that complete on mbarrier ``bar``."""
        if bar.component < 0:  # a block's mbarriers live for one cluster run
            bar.component = self.component(TMA_LOAD, f"transfers completing on an mbarrier "
                                                     f"of block {block.block_id}")
        return bar.component

    def remote_async_writes(self, fr, m: np.ndarray, elems: np.ndarray, bars: np.ndarray,
                            itemsize: int, site: OpSite, where: str, agent: str,
                            atomic: bool = False) -> None:
        """Writes by the threads ``m`` that complete on an mbarrier at a
        shared::cluster address (``st.async``, ``red.async``; usually a peer
        block's): each warp's writes, checked against what it knows, recorded
        under the transfers completing on the target's phase in progress --
        visible to whoever waits for that phase. ``elems``: the element
        addresses, a row per thread of ``m``; ``bars``: the barrier of each;
        ``atomic``: atomic writes, which race with no other atomic access."""
        b = fr.block
        issuing = b.warp_rows[m]
        for a in np.unique(bars):  # (usually one barrier for every thread)
            on_it = bars == a
            target = b.remote_barrier(int(a), where)
            comp = self.barrier_component(target, b)
            stamp = target.phase + 1
            target.point.stamp(comp, stamp)
            rows, addrs = issuing[on_it], elems[on_it]
            for row in np.unique(rows):
                row = int(row)
                who = f"{agent} issued by {self.clocks.names[row]}"
                for space, local, _ in self.spaces(fr, "cluster", addrs[rows == row].reshape(-1)):
                    self.async_access(self.clocks.matrix[row].copy(), space, local, itemsize,
                                      True, site, comp, stamp, who, proxy_read=False,
                                      atomic=atomic)

    # bulk async-groups (TMA stores, bulk copies) of each issuing thread

    def bulk_issue(self, block, thread: int) -> tuple[int, int, int]:
        """(read component, write component, stamp) of a bulk op thread
        ``thread`` (of ``block``, by flat id) issues now."""
        key = (block.rank, int(thread))
        comps = self._bulk.get(key)
        if comps is None:
            name = f"bulk copies of thread {int(thread)} of block {block.block_id}"
            comps = self._bulk[key] = (self.component(STORE_READ, name + " (reads)"),
                                       self.component(STORE_WRITE, name + " (writes)"))
        committed = self._committed(block)
        return comps[0], comps[1], int(committed[int(thread)]) + 1

    def _committed(self, block) -> np.ndarray:
        c = self._bulk_committed.get(block.rank)
        if c is None:
            c = self._bulk_committed[block.rank] = np.zeros(block.block_T, np.int64)
        return c

    def bulk_commit(self, fr, threads: np.ndarray) -> None:
        self._committed(fr.block)[fr.block.flat[threads]] += 1

    def bulk_wait(self, fr, threads: np.ndarray, pending: int, read_only: bool) -> None:
        """``cp.async.bulk.wait_group[.read] pending`` by ``threads``."""
        committed = self._committed(fr.block)
        for t in threads:
            flat = int(fr.block.flat[t])
            comps = self._bulk.get((fr.block.rank, flat))
            if comps is None:
                continue
            row = int(fr.block.warp_rows[t])
            done = int(committed[flat]) - pending
            self.clocks.learn(row, comps[0], done)
            if not read_only:
                self.clocks.learn(row, comps[1], done)

    # Ampere cp.async: each warp's copies, numbered in issue order

    def cp_async_issue(self, block, row: int) -> tuple[int, int]:
        """(component, stamp) of a cp.async the warp of clock row ``row``
        issues now: its copies form one component, stamped in issue order."""
        key = (block.rank, row)
        st = self._cp_async.get(key)
        if st is None:
            st = self._cp_async[key] = [self.component(
                CP_ASYNC, f"cp.async copies of {self.clocks.names[row]}"), 0]
        st[1] += 1
        return st[0], st[1]

    def cp_async_issued(self, block, row: int) -> tuple[int, int] | None:
        """(component, newest stamp) of the warp's copies so far; None if none."""
        st = self._cp_async.get((block.rank, row))
        return None if st is None else (st[0], st[1])

    def cp_async_commit(self, fr, threads: np.ndarray) -> None:
        """``cp.async.commit_group``: each thread's uncommitted copies (all its
        warp's copies issued so far) become its newest group."""
        b = fr.block
        for t in threads:
            st = self._cp_async.get((b.rank, int(b.warp_rows[t])))
            self._cp_groups.setdefault((b.rank, int(b.flat[t])), []).append(
                0 if st is None else st[1])

    def cp_async_wait(self, fr, threads: np.ndarray, pending: int | None) -> None:
        """``cp.async.wait_group pending`` (``None``: ``wait_all``, which also
        waits for copies not committed yet): each warp learns its copies up
        to the newest group all its waiting threads know complete."""
        b = fr.block
        done: dict[int, int] = {}
        for t in threads:
            row = int(b.warp_rows[t])
            st = self._cp_async.get((b.rank, row))
            if st is None:
                continue
            if pending is None:
                upto = st[1]
            else:
                ends = self._cp_groups.get((b.rank, int(b.flat[t])), [])
                upto = ends[len(ends) - pending - 1] if len(ends) > pending else 0
            done[row] = min(done.get(row, upto), upto)
        for row, upto in done.items():
            self.clocks.learn(row, self._cp_async[(b.rank, row)][0], upto)

    # tcgen05 units: a warp's TMEM loads, its TMEM stores, a thread's MMAs

    def unit(self, key: tuple, kind: str, name: str) -> list[int]:
        """[component, count] of the asynchronous unit ``key`` of this cluster
        run (made on first use): ``count`` numbers its issues (loads and
        stores: each ``tcgen05.wait`` learns them all) or its commits (MMAs)."""
        st = self._units.get(key)
        if st is None:
            st = self._units[key] = [self.component(kind, name), 0]
        return st

    # WGMMA groups of each warpgroup

    def _wgmma_state(self, fr) -> list[int]:
        key = (fr.block.rank, int(fr.block.flat[0]) // 128)
        st = self._wgmma.get(key)
        if st is None:
            st = self._wgmma[key] = [self.component(
                WGMMA, f"WGMMAs of block {fr.block.block_id} warpgroup {key[1]}"), 0]
        return st

    def wgmma_issue(self, fr) -> tuple[int, int, str]:
        comp, committed = self._wgmma_state(fr)
        wg = int(fr.block.flat[0]) // 128
        return comp, committed + 1, f"WGMMA (block {fr.block.block_id} warpgroup {wg})"

    def wgmma_commit(self, fr) -> None:
        self._wgmma_state(fr)[1] += 1

    def wgmma_wait(self, fr, pending: int) -> None:
        comp, committed = self._wgmma_state(fr)
        done = committed - pending
        self.clocks.learn(self.rows(fr), comp, done)
        for slot, (c, stamp, *_) in list(fr.pending.items()):
            if c == comp and stamp <= done:
                del fr.pending[slot]

    def accumulator_read(self, fr, pending: tuple, site: OpSite) -> None:
        """An op read a WGMMA's accumulator registers before the
        ``wgmma.wait_group`` covering it: a race on registers."""
        comp, stamp, wgmma_site, agent = pending
        rows = self.rows(fr)
        warps = f"{self.clocks.names[int(rows[0])]}" + (
            f" (and {rows.size - 1} more warps)" if rows.size > 1 else "")
        first = Access(op=wgmma_site.op, location=wgmma_site.location, agent=agent,
                       is_write=True, allocation="WGMMA accumulator registers", start=0, stop=0,
                       primitive=wgmma_site.primitive)
        second = Access(op=site.op, location=site.location, agent=warps, is_write=False,
                        allocation="WGMMA accumulator registers", start=0, stop=0,
                        primitive=site.primitive)
        self._keep(("read-after-write", "registers", first.op, first.location, second.op,
                    second.location, False),
                   lambda: Race("read-after-write", "registers", first, second,
                                "wait for the WGMMA (plgpu.wgmma_wait, wgmma.wait_group) "
                                "before reading its accumulator"))
