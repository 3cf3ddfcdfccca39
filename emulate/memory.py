"""Address spaces as byte arrays.

Spaces: ``global`` (kernel arguments, the TMA descriptor parameter block,
host-side scratch, per-thread ``alloca``s: the global window of generic
addresses, whose shared window :mod:`.generic` maps), ``shared`` (one
block's SMEM, dynamic shared memory at address 1024: every block has its own
space at the same addresses) and, in a cluster of several blocks, ``cluster``
(``shared::cluster``: every block's SMEM, by CTA rank, :class:`ClusterSpace`).
Each space holds regions (numpy ``uint8`` arrays) at distinct, widely spaced
base addresses; an access
must lie within one region and be aligned to its element size, or
:class:`EmulationError` is raised -- as the GPU would fault."""

from __future__ import annotations

import bisect

import numpy as np

from .errors import EmulationError, Unsupported
from .recurring import Kept, recurs
from .sync.reports import OutOfBounds

GLOBAL_BASE = 1 << 32
GAP = 1 << 16
SMEM_BASE = 1024


class Region:
    """One buffer. ``tracked`` ones (kernel arguments, SMEM) have their
    accesses checked by the synchronization checker, in ``shadow``."""

    __slots__ = ("base", "data", "name", "views", "size", "tracked", "shadow")

    def __init__(self, base: int, size: int, name: str) -> None:
        self.base = base
        self.size = size
        self.data = np.zeros(-(-max(size, 1) // 16) * 16, np.uint8)
        self.name = name
        self.views: dict = {}
        self.tracked = False
        self.shadow = None

    @property
    def end(self) -> int:
        return self.base + self.size

    def view(self, dtype: np.dtype) -> np.ndarray:
        v = self.views.get(dtype)
        if v is None:
            v = self.views[dtype] = self.data.view(dtype)
        return v


def _full_mask(mask: np.ndarray, shape) -> np.ndarray:
    """A per-thread mask (or one per element) broadcast to ``shape``."""
    if mask.shape == tuple(shape):
        return mask
    return np.broadcast_to(mask.reshape(mask.shape + (1,) * (len(shape) - 1)), shape)


def per_thread(addrs, values, dtype: np.dtype):
    """A store's addresses and values, the addresses broadcast to the values
    where the pointer is the same in every thread but the value is not: each
    active thread stores, and where several store to one element the highest
    thread's value stays (as among per-thread addresses that coincide); the
    synchronization checker sees the other warps' stores as racing writes."""
    a, v = np.asarray(addrs, np.int64), np.asarray(values, dtype)
    if v.ndim > a.ndim:
        a = np.broadcast_to(a, v.shape)
    return a, v


#: where a recurring address array (see .recurring) points: each element's
#: index in its buffer, which depends only on the addresses and the base
LOCATED = Kept(limit=4096)


class Space:
    def __init__(self, name: str, base: int) -> None:
        self.name = name
        self.base = base
        self.next = base
        self.bases: list[int] = []
        self.regions: list[Region] = []

    def alloc(self, size: int, name: str, align: int = 1024) -> Region:
        base = -(-self.next // align) * align
        region = Region(base, size, name)
        self.next = region.end + GAP
        i = bisect.bisect(self.bases, base)
        self.bases.insert(i, base)
        self.regions.insert(i, region)
        return region

    def free(self, region: Region) -> None:
        i = self.regions.index(region)
        del self.regions[i], self.bases[i]
        if not self.regions:  # e.g. each block's SMEM starts at the same address
            self.next = self.base

    def find(self, lo: int, hi: int, where: str) -> Region:
        i = bisect.bisect(self.bases, lo) - 1
        if i >= 0:
            r = self.regions[i]
            if hi <= r.end:
                return r
            raise OutOfBounds(
                f"{self.name} memory access [{lo:#x}, {hi:#x}) runs past the end of "
                f"{r.name} [{r.base:#x}, {r.end:#x}) (by {hi - r.end} bytes) at {where}")
        raise OutOfBounds(
            f"{self.name} memory access at {lo:#x} is outside every buffer at {where}")

    def _locate(self, addrs: np.ndarray, itemsize: int, mask, where: str):
        kept = mask is None and recurs(addrs)
        if kept:
            hit = LOCATED.get(addrs, itemsize, self, where)
            if hit is not None:
                return hit[0], hit[1], None
        located = self._locate_now(addrs, itemsize, mask, where)
        region, idx, _ = located
        if kept and region is not None:
            idx.setflags(write=False)
            a = np.asarray(addrs)
            LOCATED.put(addrs, itemsize, int(a.min()), int(a.max()) + itemsize, region, idx)
        return located

    def _locate_now(self, addrs: np.ndarray, itemsize: int, mask, where: str):
        a = np.asarray(addrs, np.int64)
        if mask is not None and a.ndim:
            m = _full_mask(mask, a.shape)
            active = a[m]
            if active.size == 0:
                return None, None, None
        else:
            m, active = None, a
        if active.size == 0:  # nothing to touch: no buffer to find, wherever it points
            return None, None, None
        lo, hi = int(active.min()), int(active.max()) + itemsize
        region = self.find(lo, hi, where)
        if itemsize > 1 and misaligned(active, itemsize):
            raise EmulationError(f"misaligned {itemsize}-byte {self.name} access at {where}")
        idx = (a - region.base) // itemsize
        if m is not None:
            idx = np.where(m, idx, (lo - region.base) // itemsize)
        return region, idx, m

    def load(self, addrs, dtype: np.dtype, mask=None, where: str = "") -> np.ndarray:
        region, idx, _ = self._locate(addrs, dtype.itemsize, mask, where)
        if region is None:
            return np.zeros(np.shape(addrs), dtype)
        return region.view(dtype)[idx]

    def store(self, addrs, values, dtype: np.dtype, mask=None, where: str = "",
              keep_old: bool = False) -> np.ndarray | None:
        """Stores ``values`` at ``addrs``; with ``keep_old``, returns what the
        elements held before (as :meth:`load` would have, for the checker)."""
        addrs, values = per_thread(addrs, values, dtype)
        region, idx, m = self._locate(addrs, dtype.itemsize, mask, where)
        if region is None:
            return np.zeros(np.shape(addrs), dtype) if keep_old else None
        vals = np.broadcast_to(values, np.shape(idx))
        view = region.view(dtype)
        old = view[idx] if keep_old else None
        if m is None:
            view[idx] = vals
        else:
            view[idx[m]] = vals[m]
        return old

    def read_bytes(self, addr: int, n: int, where: str = "") -> np.ndarray:
        r = self.find(addr, addr + n, where)
        return r.data[addr - r.base: addr - r.base + n]

    def write_bytes(self, addr: int, data: np.ndarray, where: str = "") -> None:
        r = self.find(addr, addr + data.size, where)
        r.data[addr - r.base: addr - r.base + data.size] = data


# shared::cluster addresses (``mapa``'s results, ``!llvm.ptr<7>``): the CTA
# rank in the cluster, plus one, above bit 40, over the CTA's own SMEM address
CLUSTER_SHIFT = 40


def cluster_address(rank, addr):
    return ((np.asarray(rank, np.int64) + 1) << CLUSTER_SHIFT) | np.asarray(addr, np.int64)


def split_cluster_address(addr, n: int, where: str):
    """(CTA rank, CTA-relative SMEM address) of shared::cluster addresses."""
    a = np.asarray(addr, np.int64)
    rank = (a >> CLUSTER_SHIFT) - 1
    if np.any((rank < 0) | (rank >= n)):
        bad = int(a.flat[int(np.argmax(((rank < 0) | (rank >= n)).reshape(-1)))])
        raise EmulationError(f"shared::cluster address {bad:#x} names no block of this cluster of "
                             f"{n} (only mapa's and cvta's results are modelled) at {where}")
    return rank, a & ((1 << CLUSTER_SHIFT) - 1)


class ClusterSpace:
    """``shared::cluster``: every block's SMEM of one cluster, addressed by
    :func:`cluster_address` (each block's own SMEM space at the same base)."""

    name = "shared::cluster"

    def __init__(self, spaces: list) -> None:
        self.spaces = spaces  # by CTA rank

    def _each(self, addrs, mask, where):
        """(the block's space, CTA-relative addresses, which elements) per rank."""
        a = np.asarray(addrs, np.int64)
        m = None if mask is None or a.ndim == 0 else _full_mask(mask, a.shape)
        act = a if m is None else a[m]
        if act.size == 0:
            return
        ranks, _ = split_cluster_address(act, len(self.spaces), where)
        rank, local = (a >> CLUSTER_SHIFT) - 1, a & ((1 << CLUSTER_SHIFT) - 1)
        for r in np.unique(ranks):
            sel = rank == r
            if m is not None:
                sel = sel & m
            yield self.spaces[int(r)], local, (None if sel.ndim == 0 else sel)

    def load(self, addrs, dtype: np.dtype, mask=None, where: str = "") -> np.ndarray:
        out = np.zeros(np.shape(addrs), dtype)
        for space, local, sel in self._each(addrs, mask, where):
            v = space.load(local, dtype, sel, where)
            out = v if sel is None else np.where(sel, v, out)
        return out

    def store(self, addrs, values, dtype: np.dtype, mask=None, where: str = "",
              keep_old: bool = False) -> np.ndarray | None:
        addrs, values = per_thread(addrs, values, dtype)
        old = self.load(addrs, dtype, mask, where) if keep_old else None
        for space, local, sel in self._each(addrs, mask, where):
            space.store(local, values, dtype, sel, where)
        return old

    def read_bytes(self, addr: int, n: int, where: str = "") -> np.ndarray:
        rank, local = split_cluster_address(addr, len(self.spaces), where)
        return self.spaces[int(rank)].read_bytes(int(local), n, where)

    def write_bytes(self, addr: int, data: np.ndarray, where: str = "") -> None:
        rank, local = split_cluster_address(addr, len(self.spaces), where)
        self.spaces[int(rank)].write_bytes(int(local), data, where)


class Memory:
    def __init__(self) -> None:
        self.spaces = {"global": Space("global", GLOBAL_BASE), "shared": Space("shared", SMEM_BASE)}

    def for_block(self, shared: Space, cluster: ClusterSpace | None) -> Memory:
        """This memory's global space with one block's SMEM (and its cluster's)."""
        m = Memory.__new__(Memory)
        m.spaces = {"global": self.spaces["global"], "shared": shared}
        if cluster is not None:
            m.spaces["cluster"] = cluster
        return m

    def __getitem__(self, name: str) -> Space:
        try:
            return self.spaces[name]
        except KeyError:
            raise Unsupported(f"memory space {name}") from None


def misaligned(addrs: np.ndarray, itemsize: int) -> bool:
    """Whether any address is not a multiple of ``itemsize`` (for a power of
    two, by its low bits: a fraction of a remainder's time)."""
    if itemsize & (itemsize - 1) == 0:
        return bool(np.bitwise_and(addrs, itemsize - 1).any())
    return bool(np.any(addrs % itemsize))


def swizzle(addr: np.ndarray, swizzle_bytes: int) -> np.ndarray:
    """The byte address the hardware uses for ``addr`` under a 32/64/128-byte
    swizzle: the 16-byte chunk index (address bits 4..) is XORed with the
    128-byte row index (bits 7..), modulo swizzle_bytes / 16."""
    if swizzle_bytes in (0, 16):
        return addr
    if swizzle_bytes not in (32, 64, 128):
        raise Unsupported(f"TMA swizzle of {swizzle_bytes} bytes")
    mask = swizzle_bytes // 16 - 1
    return addr ^ (((addr >> 7) & mask) << 4)
