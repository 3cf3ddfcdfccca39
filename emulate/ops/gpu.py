"""``gpu``: the launch (every block of the grid, one after another, each with
all its threads in lockstep), thread/block ids, barriers and dynamic SMEM.
``gpu.barrier`` orders nothing in lockstep execution (every earlier step has
already happened in every thread); it must be reached by all threads."""

from __future__ import annotations

import numpy as np

from ..compiler import Op, Step, rule
from ..errors import Unsupported
from ..machine import Block, Frame, uniform
from ..sched import Scheduler
from ..values import MemRef

DIMS = {"x": 0, "y": 1, "z": 2}


def _dim(o: Op) -> int:
    return DIMS[str(o.attr("dimension")).split()[-1].strip(">").split("<")[-1]]


@rule("gpu.launch")
def launch(o: Op) -> Step:
    seg = o.segments()
    if any(seg[7:10]):
        raise o.unsupported("gpu.launch with a cluster (cluster launches are not modelled)")
    grid_s, block_s = [s[0] for s in seg[1:4]], [s[0] for s in seg[4:7]]
    smem_s = seg[10][0] if len(seg) > 10 and seg[10] else None
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
        body.run(bf)

    def run_block(block: Block, r: list, fr: Frame) -> None:
        n = block.T // WARPGROUP
        if block.T % WARPGROUP or n == 1:
            run_group(block, r, fr)
            return
        block.sched = Scheduler()
        groups = [block.group(k * WARPGROUP, WARPGROUP, f"warpgroup {k}") for k in range(n)]
        block.sched.run([(g.name, lambda g=g: run_group(g, r, fr)) for g in groups])

    def step(fr: Frame) -> None:
        r = fr.regs
        grid = tuple(int(uniform(r[s], fr, "grid size", loc)) for s in grid_s)
        bdim = tuple(int(uniform(r[s], fr, "block size", loc)) for s in block_s)
        smem = int(uniform(r[smem_s], fr, "dynamic SMEM size", loc)) if smem_s is not None else 0
        for bz in range(grid[2]):
            for by in range(grid[1]):
                for bx in range(grid[0]):
                    block = Block(fr.launch, (bx, by, bz), grid, bdim, smem)
                    try:
                        run_block(block, r, fr)
                    finally:
                        block.finish()
        for out in outs:
            r[out] = None
    return step


WARPGROUP = 128  # threads per task of a multi-warpgroup block (see ..sched)


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
rule("gpu.cluster_id", "gpu.cluster_block_id")(
    lambda o: _block_value(o, lambda b, d: np.asarray(b.block_id[d] if o.name == "gpu.cluster_id" else 0, np.int64)))
rule("gpu.cluster_dim", "gpu.cluster_dim_blocks")(
    lambda o: _block_value(o, lambda b, d: np.asarray(b.grid[d] if o.name == "gpu.cluster_dim" else 1, np.int64)))


@rule("gpu.lane_id")
def lane_id(o: Op) -> Step:
    (out,) = o.outs
    return lambda fr: fr.regs.__setitem__(out, fr.need_block(o.name, "").lane)


def full_block_barrier(fr: Frame, what: str, where: str) -> None:
    """Every thread of the block must arrive; other warpgroups run meanwhile."""
    if fr.mask is not None and not fr.mask.all():
        raise Unsupported(f"{what} reached by only some threads of a warpgroup (a barrier "
                          "inside divergent code cannot be ordered in lockstep)", where)
    b = fr.block
    if b is not None and b.sched is not None:
        b.named_barrier(0, b.block_T).arrive(b.T, b.sched, f"{what} at {where}")


def named_barrier(fr: Frame, ident: int, count: int, what: str, where: str) -> None:
    """``bar.sync ident, count``: ``count`` threads (whole warps) must arrive."""
    b = fr.block
    if b is None or b.sched is None:
        return  # one warpgroup in lockstep: every earlier step already happened
    m = np.ones(b.T, bool) if fr.mask is None else fr.mask
    warps = m.reshape(-1, 32).any(1)
    b.named_barrier(ident, count).arrive(32 * int(warps.sum()), b.sched, f"{what} at {where}")


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
