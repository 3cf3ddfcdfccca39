"""Execution state: the launch (memory, TMA descriptors), one block (thread
ids, SMEM, mbarriers) and the frame the compiled steps run in (registers and
the mask of active threads)."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import EmulationError, Unsupported
from .memory import SMEM_BASE, ClusterSpace, Memory, Region, Space
from .sync.clocks import SyncPoint
from .sync.reports import MBarrierOverArrival

if TYPE_CHECKING:
    from .sync.checker import Checker


@dataclass
class TmaDescriptor:
    """What ``mosaic_gpu_init_tma_desc`` was told: a tiled tensor map."""

    base: int  # global byte address of element (0, ..., 0)
    dtype: np.dtype
    sizes: tuple[int, ...]  # outermost first
    strides: tuple[int, ...]  # in elements, outermost first
    swizzle: int  # bytes; 16 means none
    window: tuple[int, ...]  # the box, outermost first
    # sub-byte elements (Mosaic's codes 0 and 8: 4 and 2 bits) per byte: the map
    # is kept in bytes, and the innermost coordinate of a copy divided by this
    per_byte: int = 1
    code: int = -1  # Mosaic's element type code (TMA reductions read its signedness)


@dataclass
class MBarrier:
    count: int
    pending: int
    tx: int = 0
    phase: int = 0  # phases completed so far
    # the synchronization checker's: the clock of the phase in progress and of
    # the last completed one; the component of transfers completing on it
    point: SyncPoint = field(default_factory=SyncPoint)
    component: int = -1

    def arrive(self, n: int, where: str) -> None:
        self.pending -= n
        if self.pending < 0:
            raise MBarrierOverArrival(
                f"mbarrier arrived at {self.count - self.pending} times in phase {self.phase} "
                f"but initialized with a count of {self.count} at {where}; fix: arrive exactly "
                "as often as the count given to mbarrier.init (plgpu.Barrier(num_arrivals=...)) "
                "per phase")
        self._maybe_complete()

    def expect_tx(self, n: int) -> None:
        self.tx += n

    def complete_tx(self, n: int) -> None:
        self.tx -= n
        self._maybe_complete()

    def _maybe_complete(self) -> None:
        if self.pending == 0 and self.tx == 0:
            self.phase += 1
            self.pending = self.count
            self.point.complete()


class Launch:
    """Everything that outlives one block."""

    def __init__(self) -> None:
        self.memory = Memory()
        self.tma: dict[int, TmaDescriptor] = {}
        self.params: dict[int, Region] = {}  # kernel parameter blocks by identity
        self.sync: Checker | None = None  # the synchronization checker, if on
        self.prof = None  # the profiler (.profiling.Profiler), if profiling
        # several processes (.workers): the parent's plan, or a worker's share of the grid
        self.parallel: Any = None
        self.share: Any = None
        # warpgroups (by index in their block) whose warps run as tasks (..sched)
        self.warp_split: frozenset[int] = frozenset()


TMA_MAGIC = 0x5A4D5441  # "TMAZ": marks an emulated descriptor's 128 bytes


class Cluster:
    """The blocks of one cluster, run together: their SMEM spaces (by CTA
    rank) make up ``shared::cluster``; ``barrier.cluster`` counts every thread."""

    def __init__(self, cluster_id: tuple[int, int, int], dims: tuple[int, int, int],
                 nclusters: tuple[int, int, int]) -> None:
        self.cluster_id = cluster_id
        self.dims = dims
        self.nclusters = nclusters
        self.size = dims[0] * dims[1] * dims[2]
        self.spaces = [Space("shared", SMEM_BASE) for _ in range(self.size)]
        self.space = ClusterSpace(self.spaces)
        self.blocks: list[Block] = []  # by CTA rank
        self.threads = 0  # in every block together
        self.arrived = 0  # threads that arrived at barrier.cluster in this generation
        self.generation = 0
        self.point = SyncPoint()  # the checker's clock of barrier.cluster

    def position(self, rank: int) -> tuple[int, int, int]:
        cx, cy, _ = self.dims
        return (rank % cx, (rank // cx) % cy, rank // (cx * cy))


class Block:
    """One thread block: its thread ids, SMEM and mbarriers."""

    def __init__(self, launch: Launch, block_id: tuple[int, int, int],
                 grid: tuple[int, int, int], block_dim: tuple[int, int, int],
                 smem_bytes: int, cluster: Cluster | None = None, rank: int = 0) -> None:
        self.launch = launch
        self.block_id = block_id
        self.grid = grid
        self.block_dim = block_dim
        bx, by, bz = block_dim
        self.T = T = bx * by * bz
        flat = np.arange(T, dtype=np.int64)
        self.tid = (flat % bx, (flat // bx) % by, flat // (bx * by))
        self.flat = flat
        self.lane = flat % 32
        # what thread-place values depend on (.compiler.per_group)
        self.group_key = (tuple(block_dim), 0, T)
        if cluster is None:  # a cluster of one: this block alone
            cluster = Cluster(block_id, (1, 1, 1), grid)
        self.cluster, self.rank = cluster, rank
        self.cluster_pos = cluster.position(rank)
        cluster.blocks.append(self)
        cluster.threads += T
        self.smem = cluster.spaces[rank]
        self.memory = launch.memory.for_block(self.smem,
                                              cluster.space if cluster.size > 1 else None)
        self.smem_region = self.smem.alloc(max(smem_bytes, 16), f"block {block_id} SMEM")
        self.smem_region.tracked = True
        self.warp_row0 = 0  # the checker's clock row of this block's first warp
        self.warp_rows = flat // 32  # each thread's warp's clock row
        self.cluster_gen = -1  # the generation of barrier.cluster this group arrived at
        self.barriers: dict[int, MBarrier] = {}
        self.scratch: list[Region] = []
        # warpgroups as tasks (see .sched); shared by every group of the block
        self.block_T = T
        self.sched = None
        self.named: dict[int, object] = {}
        self.name = f"block {block_id}"

    def group(self, first: int, n: int, name: str) -> Block:
        """The view of threads [first, first + n) of this block: their own ids,
        the block's SMEM, mbarriers and scheduler."""
        g = copy.copy(self)
        bx, by, _ = self.block_dim
        flat = np.arange(first, first + n, dtype=np.int64)
        g.T, g.flat, g.lane, g.name = n, flat, flat % 32, name
        g.group_key = (tuple(self.block_dim), first, n)
        g.tid = (flat % bx, (flat // bx) % by, flat // (bx * by))
        g.warp_rows = self.warp_row0 + flat // 32
        return g

    def named_barrier(self, ident: int, expected: int):
        from .sched import NamedBarrier

        b = self.named.get(ident)
        if b is None or b.expected != expected:
            if b is not None and b.arrived:
                raise EmulationError(f"barrier {ident} used with {expected} and {b.expected} "
                                     "threads at once")
            b = self.named[ident] = NamedBarrier(expected)
        return b

    def finish(self) -> None:
        for r in self.scratch:
            self.launch.memory["global"].free(r)

    def peer(self, rank: int, where: str) -> Block:
        """The block of CTA rank ``rank`` in this block's cluster."""
        if not 0 <= int(rank) < self.cluster.size:
            raise EmulationError(
                f"CTA rank {int(rank)} in a cluster of {self.cluster.size} at {where}")
        return self.cluster.blocks[int(rank)]

    def remote_barrier(self, addr: int, where: str) -> MBarrier:
        """The mbarrier at a shared::cluster address (any block of the cluster)."""
        from .memory import split_cluster_address

        rank, local = split_cluster_address(int(addr), self.cluster.size, where)
        return self.peer(int(rank), where).barrier(int(local), where)

    def barrier(self, addr: int, where: str) -> MBarrier:
        try:
            return self.barriers[int(addr)]
        except KeyError:
            raise EmulationError(f"mbarrier at SMEM {int(addr):#x} used before mbarrier.init "
                                 f"at {where}") from None


class Frame:
    """Registers plus the active mask (``None``: every thread active)."""

    __slots__ = ("regs", "mask", "block", "T", "launch", "mem", "sync", "pending", "prof")

    def __init__(self, regs: list, launch: Launch, block: Block | None = None) -> None:
        self.regs = regs
        self.mask: np.ndarray | None = None
        self.block = block
        self.launch = launch
        self.sync = launch.sync if block is not None else None  # host code is not checked
        self.prof = launch.prof if block is not None else None  # nor counted
        # register slots holding WGMMA accumulators not yet waited for (the checker's)
        self.pending: dict[int, tuple] = {}
        self.mem = launch.memory if block is None else block.memory
        self.T = block.T if block is not None else 1

    def active(self) -> np.ndarray:
        """Indices of the active threads."""
        if self.mask is None:
            return np.arange(self.T)
        return np.flatnonzero(self.mask)

    def need_block(self, what: str, where: str) -> Block:
        if self.block is None:
            raise Unsupported(f"{what} outside gpu.launch", where)
        return self.block


def uniform(x, fr: Frame, what: str, where: str):
    """The one value ``x`` has in every active thread, or Unsupported."""
    a = np.asarray(x)
    if a.ndim == 0:
        return a[()]
    if fr.mask is not None:
        a = a[fr.mask]
    if a.size == 0:
        return None
    first = a.flat[0]
    if np.any(a != first):
        raise Unsupported(f"{what} that differs between threads (divergent control flow "
                          f"of this kind is not modelled)", where)
    return first
