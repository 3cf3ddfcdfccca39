"""``gpu``: the launch (every cluster of the grid, one after another, the
ones the GPU holds at once first (:func:`.device.resident_clusters`), or
shared among processes (:mod:`..workers`); the
blocks of a cluster together, their warpgroups as tasks of one schedule, each
with all its threads in lockstep), thread/block ids, barriers and dynamic SMEM.
``gpu.barrier`` orders nothing in lockstep execution (every earlier step has
already happened in every thread); it must be reached by all threads."""

from __future__ import annotations

from collections import deque

import numpy as np

from .. import device
from ..compiler import REGIONS, Op, Step, rule
from ..deadline import check as check_deadline
from ..errors import EmulationError
from ..machine import Block, Cluster, Frame, uniform
from ..sched import WARP, WARPGROUP, Scheduler, must_block
from ..sync.reports import BarrierDivergence, Deadlock
from ..tmem import check_released
from ..values import MemRef

DIMS = {"x": 0, "y": 1, "z": 2}


def _dim(o: Op) -> int:
    return DIMS[str(o.attr("dimension")).split()[-1].strip(">").split("<")[-1]]


def cluster_order(nclusters: tuple[int, ...], cdim: tuple[int, ...]) -> deque:
    """The id of each cluster's first block, in CUDA's launch order (x fastest)."""
    return deque((kx * cdim[0], ky * cdim[1], kz * cdim[2]) for kz in range(nclusters[2])
                 for ky in range(nclusters[1]) for kx in range(nclusters[0]))


@rule("gpu.launch", accumulators=REGIONS)
def launch(o: Op) -> Step:
    seg = o.segments()
    grid_s, block_s = [s[0] for s in seg[1:4]], [s[0] for s in seg[4:7]]
    cluster_s = [s[0] for s in seg[7:10]] if len(seg) > 10 and all(seg[7:10]) else None
    if len(seg) > 10 and any(seg[7:10]) and cluster_s is None:
        raise o.unsupported("gpu.launch with a partial cluster size")
    smem_seg = seg[10] if len(seg) > 10 else (seg[7] if len(seg) == 8 else [])
    smem_s = smem_seg[0] if smem_seg else None
    body = o.region_block()
    args = body.args
    outs = o.outs
    loc = o.loc

    def run_group(block: Block, r: list, fr: Frame) -> None:
        bf = Frame(list(r), fr.launch, block)
        br = bf.regs
        for d in range(3):
            br[args[d]] = np.asarray(block.block_id[d], np.int64)
            br[args[3 + d]] = block.tid[d]
            br[args[6 + d]] = np.asarray(block.grid[d], np.int64)
            br[args[9 + d]] = np.asarray(block.block_dim[d], np.int64)
            if len(args) >= 18:  # cluster ids and sizes
                br[args[12 + d]] = np.asarray(block.cluster.cluster_id[d], np.int64)
                br[args[15 + d]] = np.asarray(block.cluster.dims[d], np.int64)
        body.run(bf)

    def groups(block: Block) -> list[Block]:
        """The block's tasks: its warpgroups, and the warps of those whose
        warps must run apart (``Launch.warp_split``, see ..sched)."""
        # (first thread, threads) of each warpgroup; a block of another size is one
        if block.T % WARPGROUP or block.T == WARPGROUP:
            parts = [(0, block.T)]
        else:
            parts = [(first, WARPGROUP) for first in range(0, block.T, WARPGROUP)]
        split = block.launch.warp_split
        if len(parts) == 1 and 0 not in split:
            return [block]
        tasks = []
        for first, size in parts:
            name = block.name if len(parts) == 1 else f"{block.name} warpgroup {first // WARPGROUP}"
            if first // WARPGROUP in split:
                tasks += [block.group(first + WARP * w, WARP, f"{name} warp {w}")
                          for w in range(size // WARP)]
            else:
                tasks.append(block.group(first, size, name))
        return tasks

    def run_cluster(blocks: list[Block], r: list, fr: Frame) -> None:
        if fr.launch.sync is not None:
            fr.launch.sync.begin_cluster(blocks)
        tasks = [g for b in blocks for g in groups(b)]
        if len(tasks) == 1:
            run_group(tasks[0], r, fr)
            return
        sched = Scheduler()
        for b in blocks:
            b.sched = sched
        for g in tasks:
            g.sched = sched
        sched.run([(g.name, lambda g=g: run_group(g, r, fr)) for g in tasks])

    def step(fr: Frame) -> None:
        r = fr.regs
        grid = tuple(int(uniform(r[s], fr, "grid size", loc)) for s in grid_s)
        bdim = tuple(int(uniform(r[s], fr, "block size", loc)) for s in block_s)
        cdim = (1, 1, 1) if cluster_s is None else tuple(
            int(uniform(r[s], fr, "cluster size", loc)) for s in cluster_s)
        if any(g % c for g, c in zip(grid, cdim)):
            raise EmulationError(f"a grid of {grid} blocks in clusters of {cdim} at {loc}")
        ncl = tuple(g // c for g, c in zip(grid, cdim))
        smem = int(uniform(r[smem_s], fr, "dynamic SMEM size", loc)) if smem_s is not None else 0
        # The clusters by the id of their first block, in CUDA's order: one
        # after another here, or shared among processes (..workers).
        unlaunched = fr.launch.unlaunched = cluster_order(ncl, cdim)

        def run_one(first: tuple[int, int, int]) -> None:
            kx, ky, kz = (f // c for f, c in zip(first, cdim))
            cl = Cluster((kx, ky, kz), cdim, ncl)
            blocks = []
            for rank in range(cl.size):
                px, py, pz = cl.position(rank)
                bid = (kx * cdim[0] + px, ky * cdim[1] + py, kz * cdim[2] + pz)
                blocks.append(Block(fr.launch, bid, grid, bdim, smem, cl, rank))
            try:
                run_cluster(blocks, r, fr)
                check_released(cl)  # TMEM freed before the blocks exit
            finally:
                for b in blocks:
                    b.finish()

        where = f"gpu.launch at {loc}"
        share, parallel = fr.launch.share, fr.launch.parallel
        if share is not None:  # a worker process's part of the grid (..workers)
            for index, first in share.clusters:
                share.begin(index, fr.launch.sync)
                check_deadline(where)
                run_one(first)
        elif parallel is not None:
            parallel.run(list(unlaunched), run_one, fr.launch, where)
        else:
            # As many as the GPU holds start at once (`launched`, run here one
            # after another); the rest wait for a free SM, and only those can
            # cluster launch control (.clc) cancel. Each finished cluster lets
            # the next start.
            fit = device.resident_clusters(int(np.prod(cdim)), int(np.prod(bdim)), smem)
            launched = deque(unlaunched.popleft() for _ in range(min(fit, len(unlaunched))))
            while launched:
                check_deadline(where)
                run_one(launched.popleft())
                if unlaunched:
                    launched.append(unlaunched.popleft())
        for out in outs:
            r[out] = None
    return step


def _block_value(o: Op, get) -> Step:
    (out,) = o.outs
    d = _dim(o)
    loc = o.loc

    def step(fr: Frame) -> None:
        fr.regs[out] = get(fr.need_block(o.name, loc), d)
    return step


rule("gpu.thread_id")(lambda o: _block_value(o, lambda b, d: b.tid[d]))
rule("gpu.block_id")(lambda o: _block_value(o, lambda b, d: np.asarray(b.block_id[d], np.int64)))
rule("gpu.block_dim")(lambda o: _block_value(o, lambda b, d: np.asarray(b.block_dim[d], np.int64)))
rule("gpu.grid_dim")(lambda o: _block_value(o, lambda b, d: np.asarray(b.grid[d], np.int64)))
# gpu.cluster_id: the cluster's index in the grid; gpu.cluster_block_id: the
# block's position in its cluster; gpu.cluster_dim: clusters in the grid;
# gpu.cluster_dim_blocks: blocks in a cluster
rule("gpu.cluster_id")(lambda o: _block_value(
    o, lambda b, d: np.asarray(b.cluster.cluster_id[d], np.int64)))
rule("gpu.cluster_block_id")(lambda o: _block_value(
    o, lambda b, d: np.asarray(b.cluster_pos[d], np.int64)))
rule("gpu.cluster_dim")(lambda o: _block_value(
    o, lambda b, d: np.asarray(b.cluster.nclusters[d], np.int64)))
rule("gpu.cluster_dim_blocks")(lambda o: _block_value(
    o, lambda b, d: np.asarray(b.cluster.dims[d], np.int64)))


@rule("gpu.lane_id")
def lane_id(o: Op) -> Step:
    (out,) = o.outs
    return lambda fr: fr.regs.__setitem__(out, fr.need_block(o.name, "").lane)


def full_block_barrier(fr: Frame, what: str, where: str) -> None:
    """Every thread of the block must arrive; other warpgroups run meanwhile.
    The checker joins the clocks of every warp of the block."""
    if fr.mask is not None and not fr.mask.all():
        raise BarrierDivergence(
            f"{what} at {where} reached by {int(fr.mask.sum())} of the {fr.T} threads of "
            f"{fr.block.name if fr.block else 'the kernel'}: a block barrier must be reached by "
            "every thread (bar.sync is .aligned); fix: move it out of the divergent branch")
    b = fr.block
    if b is None:
        return
    rows = None if fr.sync is None else fr.sync.rows(fr)
    b.named_barrier(0, b.block_T).arrive(b.T, b.sched, f"{what} at {where}", fr.sync, rows)


def named_barrier(fr: Frame, ident: int, count: int, what: str, where: str) -> None:
    """``bar.sync ident, count``: ``count`` threads (whole warps) must arrive."""
    b = fr.block
    if b is None:
        return
    m = np.ones(b.T, bool) if fr.mask is None else fr.mask
    warps = m.reshape(-1, 32).any(1)
    threads = 32 * int(warps.sum())
    pending = b.named_barrier(ident, count)
    if pending.arrived + threads < pending.expected:
        # it will wait, perhaps for warps of this group masked off here (..sched);
        # if none can arrive, the warps' tasks deadlock, naming it
        must_block(fr, f"{what} at {where}")
    rows = None if fr.sync is None else fr.sync.rows(fr)
    pending.arrive(threads, b.sched, f"{what} at {where}", fr.sync, rows)


def cluster_arrive(fr: Frame, what: str, where: str) -> None:
    """``barrier.cluster.arrive``: this warpgroup's threads arrive at the
    cluster barrier (every thread of every block of the cluster completes it).
    Unless ``.relaxed``, the arrival releases the warps' earlier accesses."""
    if fr.mask is not None and not fr.mask.all():
        raise BarrierDivergence(f"{what} at {where} reached by only some threads of "
                                f"{fr.block.name}; fix: every thread of the cluster must arrive")
    g = fr.need_block(what, where)
    cl = g.cluster
    if g.cluster_gen >= 0:
        raise EmulationError(f"{what} twice without barrier.cluster.wait at {where}")
    g.cluster_gen = cl.generation
    if fr.sync is not None and ".relaxed" not in what:
        fr.sync.release(fr.sync.rows(fr), cl.point)
    cl.arrived += g.T
    if cl.arrived >= cl.threads:
        cl.arrived = 0
        cl.point.complete(cl.generation)
        cl.generation += 1


def cluster_wait(fr: Frame, what: str, where: str) -> None:
    """``barrier.cluster.wait``: blocks until every thread of the cluster has
    arrived in the generation this warpgroup arrived in; acquires what the
    arrivals released."""
    if fr.mask is not None and not fr.mask.all():
        raise BarrierDivergence(f"{what} at {where} reached by only some threads of "
                                f"{fr.block.name}; fix: every thread of the cluster must wait")
    g = fr.need_block(what, where)
    cl, gen = g.cluster, g.cluster_gen
    if gen < 0:
        raise Deadlock(f"{what} at {where} without barrier.cluster.arrive: it would hang; fix: "
                       "arrive before waiting")
    g.cluster_gen = -1
    if cl.generation <= gen:
        if g.sched is None:
            raise Deadlock(f"{what} at {where} that {cl.threads - cl.arrived} threads have not "
                           "reached, which nothing else can reach")
        g.sched.wait_until(lambda: cl.generation > gen, f"{what} at {where}")
    if fr.sync is not None:
        fr.sync.acquire(fr.sync.rows(fr), cl.point.generations.get(gen))


@rule("gpu.barrier")
def barrier(o: Op) -> Step:
    loc = o.loc
    return lambda fr: full_block_barrier(fr, "gpu.barrier", loc)


@rule("gpu.dynamic_shared_memory")
def dynamic_shared_memory(o: Op) -> Step:
    (out,) = o.outs
    loc = o.loc

    def step(fr: Frame) -> None:
        b = fr.need_block(o.name, loc)
        base = b.smem_region.base
        fr.regs[out] = MemRef("shared", np.dtype(np.int8), base, base, 0,
                              (b.smem_region.data.size,), (1,))
    return step
