"""The checker of one launch: clocks, shadow memory, reports.

The op rules call it beside every memory access and synchronization step
(``fr.launch.sync``; ``None`` when the checker is off). Thread accesses are
checked and recorded per warp; an asynchronous unit's accesses are checked
against what its issuer knows when it issues them and recorded under the
unit's component, so everything later is ordered after them only once it
waits for their completion."""

from __future__ import annotations

import warnings

import numpy as np

from ..memory import CLUSTER_SHIFT, Region, Space, _full_mask
from .clocks import Clocks, SyncPoint
from .reports import (Access, Race, RaceError, RaceWarning, UninitializedRead,
                      UninitializedReadWarning)
from .shadow import OpSite, Shadow, Sites

MAX_REPORTS = 64  # distinct races (or uninitialized reads) kept per run

# component kinds: what a race's fix talks about
WARP, TMA_LOAD, STORE_READ, STORE_WRITE, WGMMA, ST_ASYNC = (
    "warp", "TMA load", "TMA store (read)", "TMA store (write)", "WGMMA", "st.async")


def space_kind(space) -> str:
    return "gmem" if space.name == "global" else "smem"


class Checker:
    def __init__(self, on_race: str, on_uninitialized: str) -> None:
        self.on_race = on_race
        self.on_uninitialized = on_uninitialized
        self.sites = Sites()
        self.cluster = -1
        self.clocks: Clocks | None = None
        self.kinds: list[str] = []  # per component of the current cluster
        self.races: dict[tuple, Race] = {}
        self.uninitialized: dict[tuple, UninitializedRead] = {}
        self._site_ids: dict[tuple, int] = {}
        self._bulk: dict[tuple[int, int], tuple[int, int]] = {}  # (rank, thread) -> comps
        self._bulk_committed: dict[int, np.ndarray] = {}  # rank -> per thread
        self._wgmma: dict[tuple[int, int], list[int]] = {}  # (rank, wg) -> [comp, committed]

    # --- cluster runs -----------------------------------------------------------------------

    def begin_cluster(self, blocks) -> None:
        """Numbers the warps of a cluster's blocks: clock rows and components."""
        self.cluster += 1
        names = []
        for b in blocks:
            b.warp_row0 = len(names)
            b.warp_rows = b.warp_row0 + b.flat // 32
            for w in range(-(-b.T // 32)):
                names.append(f"block {b.block_id} warpgroup {w // 4} warp {w}")
        self.clocks = Clocks(names)
        self.kinds = [WARP] * len(names)
        self._site_ids.clear()
        self._bulk.clear()
        self._bulk_committed.clear()
        self._wgmma.clear()

    def component(self, kind: str, name: str) -> int:
        self.kinds.append(kind)
        return self.clocks.component(name)

    # --- who -------------------------------------------------------------------------------

    @staticmethod
    def rows(fr, mask: np.ndarray | None = None) -> np.ndarray:
        """The clock rows of the warps with an active thread."""
        m = fr.mask if mask is None else mask
        rows = fr.block.warp_rows
        return np.unique(rows if m is None else rows[m])

    def _site(self, site: OpSite, component: int, time: int, agent: str, is_write: bool,
              generic: bool) -> int:
        key = (site, component, time, is_write)
        k = self._site_ids.get(key)
        if k is None:
            k = self._site_ids[key] = self.sites.add(self.cluster, component, time, generic,
                                                     (site, agent, is_write))
        return k

    # --- accesses --------------------------------------------------------------------------

    def thread_access(self, fr, space_name: str, addrs, vrank: int, itemsize: int,
                      is_write: bool, site: OpSite, mask=None, by_warp: bool = False,
                      values=None) -> None:
        """Threads of ``fr`` (those active, or in ``mask``) access the elements
        at ``addrs`` (per thread, or the same in each: ``vrank`` trailing dims;
        ``by_warp``: a leading axis of warps, for warp collectives). A write
        passes the ``values`` written (of the element dtype): warps writing
        equal values to a byte in one step are not a race (replicated layouts,
        which jax stores from every warp)."""
        a = np.asarray(addrs, np.int64)
        lead = fr.block.warp_rows[::32] if by_warp else fr.block.warp_rows
        if a.ndim == vrank:
            a = np.broadcast_to(a, (lead.size,) + a.shape)
        rows = lead.reshape((lead.size,) + (1,) * (a.ndim - 1))
        rows = np.broadcast_to(rows, a.shape)
        v = None if values is None else np.broadcast_to(values, a.shape)
        m = fr.mask if mask is None else mask
        if m is not None:
            full = _full_mask(np.asarray(m), a.shape)
            a, rows = a[full], rows[full]
            v = None if v is None else v[full]
        else:
            a, rows = a.reshape(-1), rows.reshape(-1)
            v = None if v is None else v.reshape(-1)
        if a.size == 0:
            return
        for space, local, sel in self.spaces(fr, space_name, a):
            r = rows if sel is None else rows[sel]
            vs = v if v is None or sel is None else v[sel]
            self._thread_bytes(space, local, r, itemsize, is_write, site, vs)

    def spaces(self, fr, space_name: str, a: np.ndarray):
        """(space, addresses in it, which of ``a``) of addresses in ``space_name``;
        shared::cluster ones split by the block they name."""
        space = fr.mem[space_name]
        if space_name != "cluster":
            yield space, a, None
            return
        rank = (a >> CLUSTER_SHIFT) - 1
        local = a & ((1 << CLUSTER_SHIFT) - 1)
        for k in np.unique(rank):
            sel = rank == k
            yield space.spaces[int(k)], local[sel], sel

    def _thread_bytes(self, space: Space, a: np.ndarray, rows: np.ndarray, itemsize: int,
                      is_write: bool, site: OpSite, values: np.ndarray | None = None) -> None:
        region = space.find(int(a.min()), int(a.max()) + itemsize, site.location)
        if not region.tracked:
            return
        off = a - region.base
        if itemsize > 1:
            off = (off[:, None] + np.arange(itemsize)).reshape(-1)
            rows = np.repeat(rows, itemsize)
        clocks = self.clocks
        urows = np.unique(rows)
        table = np.zeros(clocks.warps, np.int32)
        for r in urows:
            r = int(r)
            table[r] = self._site(site, r, int(clocks.matrix[r, r]), clocks.names[r], is_write,
                                  generic=True)
        written = None
        if values is not None:
            written = np.ascontiguousarray(values).view(np.uint8).reshape(-1)
        self._check(region, space_kind(space), off, table[rows], rows, None, is_write, False,
                    written)

    def async_access(self, view: np.ndarray, space, addrs, itemsize: int, is_write: bool,
                     site: OpSite, component: int, stamp: int, agent: str,
                     proxy_read: bool = True) -> None:
        """An asynchronous unit (TMA, WGMMA, st.async) accesses the elements at
        ``addrs``: checked against ``view`` (what its issuer knew when issuing
        it), recorded as ``(component, stamp)``. ``proxy_read``: a read
        through the async proxy, which sees a thread's writes only after that
        thread's ``fence.proxy.async``."""
        a = np.asarray(addrs, np.int64).reshape(-1)
        if a.size == 0:
            return
        region = space.find(int(a.min()), int(a.max()) + itemsize, site.location)
        if not region.tracked:
            return
        off = a - region.base
        if itemsize > 1:
            off = (off[:, None] + np.arange(itemsize)).reshape(-1)
        s = self._site(site, component, stamp, agent, is_write, generic=False)
        sites = np.full(off.size, s, np.int32)
        self._check(region, space_kind(space), off, sites, None, view, is_write,
                    proxy_read and not is_write)

    # --- the check --------------------------------------------------------------------------

    def _ordered(self, earlier: np.ndarray, rows: np.ndarray | None,
                 view: np.ndarray | None, need_all: bool = True) -> np.ndarray:
        """Whether each access ``earlier`` (site ids) happens before the
        accessor (per byte clock ``rows``, or the one clock ``view``). A group
        write is ordered before a read once one of its warps' writes is (they
        wrote equal values), before a write only once all are."""
        S = self.sites
        comp = S.component[earlier]
        same = S.cluster[earlier] == self.cluster
        plain = comp >= 0
        c = np.where(same & plain, comp, 0)
        if rows is not None:
            known = self.clocks.matrix[rows, c]
        else:
            view = self._full_width(view)
            known = view[c]
        ok = same & plain & (known >= S.time[earlier])
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

    def _full_width(self, view: np.ndarray) -> np.ndarray:
        width = self.clocks.matrix.shape[1]
        if view.size < width:
            view = np.concatenate([view, np.zeros(width - view.size, view.dtype)])
        return view

    def _unfenced(self, writes: np.ndarray, view: np.ndarray) -> np.ndarray:
        """Which generic writes (site ids, ordered before ``view``) no proxy
        fence of their warp ordered before ``view`` follows."""
        S = self.sites
        fenced = self.clocks.last_fences(self._full_width(view))
        comp = S.component[writes]
        bad = S.time[writes] > fenced[np.maximum(comp, 0)]
        for k in np.flatnonzero(comp < 0):
            members = S.members[int(writes[k])]
            bad[k] = bool((S.time[members] > fenced[S.component[members]]).any())
        return bad

    def _check(self, region: Region, space: str, off: np.ndarray, sites: np.ndarray,
               rows: np.ndarray | None, view: np.ndarray | None, is_write: bool,
               proxy_read: bool, written: np.ndarray | None = None) -> None:
        sh = region.shadow
        if sh is None:
            sh = region.shadow = Shadow(region.data.size)
        S = self.sites
        w = sh.write[off]
        has = w != 0
        if not is_write and space == "smem" and not has.all():
            self._uninitialized(region, space, off[~has], sites[~has])
        if has.any():
            i = np.flatnonzero(has)
            prior = w[i]
            ok = self._ordered(prior, None if rows is None else rows[i], view, need_all=is_write)
            if not ok.all():
                self._race(region, space, prior[~ok], sites[i][~ok], off[i][~ok])
            if proxy_read:
                gen = ok & S.generic[prior]
                if gen.any():
                    g = prior[gen]
                    bad = self._unfenced(g, view)
                    if bad.any():
                        self._race(region, space, g[bad], sites[i][gen][bad], off[i][gen][bad],
                                   unfenced=True)
        if is_write:
            for col in list(sh.reads.values()) + ([sh.earlier] if sh.earlier is not None else []):
                r = col[off]
                nz = r != 0
                if nz.any():
                    i = np.flatnonzero(nz)
                    ok = self._ordered(r[i], None if rows is None else rows[i], view)
                    if not ok.all():
                        self._race(region, space, r[i][~ok], sites[i][~ok], off[i][~ok])
            sh.write[off] = sites
            if rows is not None and rows.size and (rows != rows[0]).any():
                self._same_op_writes(sh, region, space, off, sites, rows, written)
            return
        comps = S.component[sites]
        for c in (np.unique(comps) if comps.size and (comps != comps[0]).any() else comps[:1]):
            sel = None if comps.size and (comps == c).all() else comps == c
            o = off if sel is None else off[sel]
            col = sh.read_column(int(c))
            old = col[o]
            stale = (old != 0) & (S.cluster[old] != self.cluster)
            if stale.any():
                sh.keep_earlier(o[stale], old[stale])
            col[o] = sites if sel is None else sites[sel]

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
        equal = np.zeros(clash.shape, bool) if written is None else \
            written == region.data[off]
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

    # --- reports ---------------------------------------------------------------------------

    def _access(self, site_id: int, region: Region, lo: int, hi: int) -> Access:
        site, agent, is_write = self.sites.info[site_id]
        return Access(op=site.op, location=site.location, agent=agent, is_write=is_write,
                      allocation=region.name, start=lo, stop=hi, primitive=site.primitive)

    def _race(self, region: Region, space: str, first: np.ndarray, second: np.ndarray,
              off: np.ndarray, unfenced: bool = False) -> None:
        keys = first.astype(np.int64) << 32 | second.astype(np.int64)
        uniq, inv = np.unique(keys, return_inverse=True)
        for k, key in enumerate(uniq[:MAX_REPORTS]):
            f, s = int(key >> 32), int(key & 0xFFFFFFFF)
            sel = off[inv == k]
            a = self._access(f, region, int(sel.min()), int(sel.max()) + 1)
            b = self._access(s, region, int(sel.min()), int(sel.max()) + 1)
            kind = ("write-after-write" if a.is_write and b.is_write else
                    "read-after-write" if a.is_write else "write-after-read")
            dedup = (kind, space, a.op, a.location, b.op, b.location, unfenced)
            if dedup in self.races:
                old = self.races[dedup]
                self.races[dedup] = Race(old.kind, old.space, old.first, old.second, old.fix,
                                         old.count + 1)
                continue
            if len(self.races) >= MAX_REPORTS:
                return
            fix = self._fix(f, s, a, b, unfenced)
            self.races[dedup] = Race(kind, space, a, b, fix)

    def _fix(self, f: int, s: int, a: Access, b: Access, unfenced: bool) -> str:
        S = self.sites
        same_cluster = S.cluster[f] == S.cluster[s]
        if not same_cluster:
            return ("blocks of different clusters are never ordered: make them access "
                    "disjoint bytes (or put them in one cluster and synchronize)")
        kf = self.kinds[S.component[f]] if S.component[f] >= 0 else WARP
        ks = self.kinds[S.component[s]] if S.component[s] >= 0 else WARP
        if unfenced:
            target = "the wgmma" if ks == WGMMA else "the copy"
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
        if kf == WGMMA:
            return "wait for the WGMMA (plgpu.wgmma_wait) before overwriting its operands"
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
            sel = off[sites == s]
            a = self._access(int(s), region, int(sel.min()), int(sel.max()) + 1)
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

    def fence(self, rows) -> None:
        self.clocks.fence(rows)

    def barrier_component(self, bar, block) -> int:
        """The component of the transfers that complete on mbarrier ``bar``."""
        if bar.component < 0 or bar.cluster_run != self.cluster:
            bar.component = self.component(TMA_LOAD, f"transfers completing on an mbarrier "
                                                     f"of block {block.block_id}")
            bar.cluster_run = self.cluster
        return bar.component

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
        self.clocks.learn(self.rows(fr), comp, committed - pending)
