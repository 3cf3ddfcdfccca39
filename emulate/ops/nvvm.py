"""``nvvm``: warp collectives (``elect.sync``, ``shfl.sync``, ``redux.sync``, ``ldmatrix``,
``stmatrix``), mbarriers, TMA bulk tensor copies and fences.

Ordering model: the threads of a warpgroup execute each op together, and an
asynchronous copy is complete the moment it is issued (it completes its
mbarrier's transaction bytes at once). Fences (``fence.proxy``),
``cp.async.bulk.commit_group``/``wait_group`` and the WGMMA group ops change
no value; they feed the synchronization checker (:mod:`..sync`), which knows
what they order. An ``mbarrier.try_wait.parity`` whose phase has not completed blocks
the warpgroup, and the block's other warpgroups run (:mod:`..sched`); where
some warps of the waiting warpgroup are masked off (warp specialization
inside a warpgroup), its warps run as tasks instead (``sched.WarpSplit``); a
wait that nothing else in the block (or cluster) can complete is a
:class:`~..sync.reports.Deadlock`."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from .. import tma
from ..compiler import Op, Step, rule
from ..errors import EmulationError, Unsupported
from ..machine import Frame, MBarrier, uniform
from ..sched import must_block
from ..stacks import Splits
from ..sync.clocks import ALL_SPACES
from ..sync.reports import Deadlock
from ..sync.shadow import OpSite
from . import arith
from ._util import thread_axis
from .memref import plus_offsets


def operands(o: Op, name: str) -> list[int]:
    """Slots of the operand group ``name`` (by the op class's accessor)."""
    v = getattr(o.op.opview, name)
    if v is None:
        return []
    if hasattr(v, "__len__") and not hasattr(v, "type"):
        return [o.comp.slot(x) for x in v]
    return [o.comp.slot(v)]


def effective(fr: Frame, pred_slots: list[int]) -> np.ndarray:
    """The per-thread mask of threads that execute a (predicated) op."""
    m = np.ones(fr.T, bool) if fr.mask is None else fr.mask
    for p in pred_slots:
        m = m & np.broadcast_to(np.asarray(fr.regs[p], bool), (fr.T,))
    return m


def per_thread(x, T: int) -> np.ndarray:
    x = np.asarray(x)
    return x if x.ndim and x.shape[0] == T else np.broadcast_to(x, (T,) + x.shape)


def _warps(fr: Frame, where: str) -> int:
    if fr.T % 32:
        raise Unsupported(f"warp collective in a block of {fr.T} threads", where)
    return fr.T // 32


def _check_full_warps(fr: Frame, what: str, where: str) -> None:
    if fr.mask is None:
        return
    w = fr.mask.reshape(-1, 32)
    if np.any(w.any(1) & ~w.all(1)):
        raise Unsupported(f"{what} executed by part of a warp", where)


def _by_warp(fr: Frame, value, dtype, what: str, where: str) -> np.ndarray:
    """``value`` per thread as a (warps, 32) array, for a collective of whole
    warps (``what``: its name in errors)."""
    _warps(fr, where)
    _check_full_warps(fr, what, where)
    return per_thread(fr.regs[value], fr.T).astype(dtype).reshape(-1, 32)


@rule("nvvm.elect.sync")
def elect_sync(o: Op) -> Step:
    (out,) = o.outs
    loc = o.loc
    if o.ins:
        raise o.unsupported("nvvm.elect.sync with a member mask")

    def step(fr: Frame) -> None:
        _warps(fr, loc)
        if fr.mask is None:
            fr.regs[out] = _first_lanes(fr.T)
            return
        m = fr.mask.reshape(-1, 32)
        first = np.zeros_like(m)
        any_ = m.any(1)
        first[np.flatnonzero(any_), m.argmax(1)[any_]] = True
        fr.regs[out] = first.reshape(-1)
    return step


@functools.lru_cache(maxsize=64)
def _first_lanes(T: int) -> np.ndarray:
    """elect.sync's answer where every thread is active: each warp's lane 0
    (read-only: every unmasked elect of a kernel hands it out)."""
    first = np.zeros(T, bool)
    first[::32] = True
    first.setflags(write=False)
    return first


@rule("nvvm.shfl.sync")
def shfl_sync(o: Op) -> Step:
    kind = str(o.attr("kind")).split("<")[-1].rstrip(">")
    _, val, off, clamp_s = o.ins
    outs = o.outs
    pair = _flag(o, "return_value_and_is_valid")
    loc = o.loc

    if kind not in ("idx", "up", "down", "bfly"):
        raise o.unsupported(f"nvvm.shfl.sync kind {kind}")

    def step(fr: Frame) -> None:
        r = fr.regs
        T = fr.T
        _warps(fr, loc)
        v = per_thread(r[val], T)
        lane = fr.block.lane
        if np.ndim(r[off]) == 0 and np.ndim(r[clamp_s]) == 0:  # the usual: kept per form
            src, ok = _uniform_shuffle(kind, T, int(lane[0]), int(r[off]), int(r[clamp_s]))
        else:
            src, ok = _shuffle(kind, lane, per_thread(r[off], T).astype(np.int64),
                               per_thread(r[clamp_s], T).astype(np.int64))
        if fr.mask is not None and np.any(fr.mask & ~fr.mask[src]):
            raise EmulationError(f"shfl.sync reads a lane that is not active at {loc}")
        res = v[src]
        if pair:
            from ..values import insert
            r[outs[0]] = insert(insert(None, (0,), res), (1,), ok)
        else:
            r[outs[0]] = res
    return step


def _shuffle(kind: str, lane: np.ndarray, b: np.ndarray, c: np.ndarray
             ) -> tuple[np.ndarray, np.ndarray]:
    """(the thread each thread reads, whether its source lane is in range)
    of a shuffle of ``kind`` with lane operand ``b`` and clamp/segment
    operand ``c``, per the PTX ISA's shfl.sync."""
    seg = (c >> 8) & 0x1F
    clamp = c & 0x1F
    max_lane = (lane & seg) | (clamp & ~seg)
    min_lane = lane & seg
    if kind == "idx":
        j = min_lane | (b & ~seg & 0x1F)
        ok = j <= max_lane
    elif kind == "up":
        j = lane - b
        ok = j >= max_lane
    elif kind == "down":
        j = lane + b
        ok = j <= max_lane
    else:  # bfly
        j = lane ^ b
        ok = j <= max_lane
    j = np.where(ok, j, lane)
    return np.arange(lane.size) - lane + j, ok  # within this warpgroup's threads


@functools.lru_cache(maxsize=256)
def _uniform_shuffle(kind: str, T: int, lane0: int, b: int, c: int
                     ) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_shuffle` with the same operands in every thread, for ``T``
    threads whose first is lane ``lane0`` (kept: a kernel's shuffles recur
    with a few forms; read-only)."""
    lane = (lane0 + np.arange(T, dtype=np.int64)) % 32
    src, ok = _shuffle(kind, lane, np.int64(b), np.int64(c))
    src.setflags(write=False)
    ok.setflags(write=False)
    return src, ok


# --- mbarriers ---------------------------------------------------------------

def _addrs(fr: Frame, slot: int, m: np.ndarray) -> np.ndarray:
    return per_thread(fr.regs[slot], fr.T).astype(np.int64)[m]


def mbarrier_init(fr: Frame, addr_slot: int, count_slot: int, m: np.ndarray, where: str) -> None:
    b = fr.need_block("mbarrier.init", where)
    addrs = _addrs(fr, addr_slot, m)
    counts = per_thread(fr.regs[count_slot], fr.T)[m]
    for a, n in zip(addrs, counts):
        b.smem.find(int(a), int(a) + 8, where)
        b.barriers[int(a)] = MBarrier(int(n), int(n))


def mbarrier_arrive(fr: Frame, addr_slot: int, m: np.ndarray, where: str,
                    tx_slot: int | None = None, count_slot: int | None = None,
                    count_const: int | None = None, remote: bool = False,
                    release: bool = True) -> None:
    """Arrivals (and expected transaction bytes) of the threads in ``m``; with
    ``remote``, the addresses are shared::cluster ones (any block's barrier).
    ``release=False``: an arrival made for the thread by an asynchronous unit
    (``cp.async.mbarrier.arrive.noinc``), which orders none of its accesses."""
    b = fr.need_block("mbarrier.arrive", where)
    addrs = _addrs(fr, addr_slot, m)
    tx = per_thread(fr.regs[tx_slot], fr.T)[m].astype(np.int64) if tx_slot is not None else None
    cnt = (per_thread(fr.regs[count_slot], fr.T)[m].astype(np.int64)
           if count_slot is not None else None)
    if count_const is not None:
        cnt = np.full(int(m.sum()), count_const, np.int64)
    sync = fr.sync if release else None
    for a in np.unique(addrs):
        sel = addrs == a
        bar = b.remote_barrier(a, where) if remote else b.barrier(a, where)
        if sync is not None:  # an arrival releases the arriving warps' accesses
            sync.release(np.unique(b.warp_rows[m][sel]), bar.point)
        if tx is not None:
            bar.expect_tx(int(tx[sel].sum()))
        bar.arrive(int(sel.sum()) if cnt is None else int(cnt[sel].sum()), where)


def _never_completes(bar: MBarrier, p: int, what: str, where: str) -> Deadlock:
    return Deadlock(
        f"{what} at {where} on a phase that has not completed (parity {p}, {bar.pending} "
        f"arrivals and {bar.tx} transaction bytes outstanding), which nothing else in this "
        "block (one task: every warp of it waits here) can complete: the kernel would hang; "
        "fix: make sure every arrival and transaction the phase counts is made before the "
        "wait, or by warps that do not wait for it")


def mbarrier_wait(fr: Frame, addr_slot: int, parity_slot: int, where: str) -> None:
    """Blocks until the phase of parity ``p`` has completed, i.e. the barrier's
    current phase parity is no longer ``p``; other warpgroups run meanwhile."""
    b = fr.need_block("mbarrier.try_wait", where)
    m = effective(fr, [])
    addrs = _addrs(fr, addr_slot, m)
    par = per_thread(fr.regs[parity_slot], fr.T)[m].astype(np.int64) & 1
    for a, p in sorted(set(zip(addrs.tolist(), par.tolist()))):
        bar = b.barrier(a, where)
        if (bar.phase & 1) == p:
            must_block(fr, f"mbarrier {a:#x} phase parity {p} at {where}")
            if b.sched is None:
                raise _never_completes(bar, p, "mbarrier.try_wait.parity", where)
            b.sched.wait_until(lambda bar=bar, p=p: (bar.phase & 1) != p,
                               f"mbarrier {a:#x} phase parity {p} at {where}")
        if fr.sync is not None:  # the completed phase is acquired
            sel = (addrs == a) & (par == p)
            fr.sync.acquire(np.unique(b.warp_rows[m][sel]), bar.point.released)


def mbarrier_test(fr: Frame, addr_slot: int, parity_slot: int, where: str) -> np.ndarray:
    """``try_wait`` with a result: whether the phase completed. A failed poll
    lets the other warpgroups run first (the caller spins on it)."""
    b = fr.need_block("mbarrier.try_wait", where)
    addrs = per_thread(fr.regs[addr_slot], fr.T).astype(np.int64)
    par = per_thread(fr.regs[parity_slot], fr.T).astype(np.int64) & 1
    m = effective(fr, [])

    def test() -> np.ndarray:
        out = np.zeros(fr.T, bool)
        for t in np.flatnonzero(m):
            out[t] = (b.barrier(addrs[t], where).phase & 1) != par[t]
        return out

    out = test()
    if not out[m].all():
        must_block(fr, f"a poll of mbarrier {int(addrs[np.flatnonzero(m)[0]]):#x} at {where}")
        if b.sched is None:
            t = np.flatnonzero(m & ~out)[0]
            raise _never_completes(b.barrier(addrs[t], where), int(par[t]), "polling an mbarrier",
                                where)
        b.sched.poll(f"a poll of mbarrier {int(addrs[np.flatnonzero(m)[0]]):#x} at {where}")
        out = test()
    if fr.sync is not None:  # threads that saw the phase complete acquire it
        seen = m & out
        for a in np.unique(addrs[seen]):
            at = seen & (addrs == a)
            fr.sync.acquire(np.unique(b.warp_rows[at]), b.barrier(a, where).point.released)
    return out


@rule("nvvm.mbarrier.init.shared", "nvvm.mbarrier.init")
def init(o: Op) -> Step:
    addr, count = operands(o, "addr")[0], operands(o, "count")[0]
    pred = operands(o, "predicate")
    loc = o.loc
    return lambda fr: mbarrier_init(fr, addr, count, effective(fr, pred), loc)


@rule("nvvm.mbarrier.arrive.expect_tx", "nvvm.mbarrier.arrive.expect_tx.shared")
def arrive_expect_tx(o: Op) -> Step:
    addr, tx = operands(o, "addr")[0], operands(o, "txcount")[0]
    pred = operands(o, "predicate")
    # scope = cluster orders the arrival for the whole cluster: with every op
    # complete when issued, it is the arrival itself; a shared::cluster
    # address (ptr<7>, from mapa) may name another block's barrier
    remote = o.in_types[0].space == "cluster"
    if o.in_types[0].space not in ("shared", "cluster"):
        raise o.unsupported(f"{o.name} on a {o.in_types[0].text}")
    outs = o.outs
    loc = o.loc

    def step(fr: Frame) -> None:
        mbarrier_arrive(fr, addr, effective(fr, pred), loc, tx_slot=tx, remote=remote)
        _no_state(fr, outs)
    return step


@rule("nvvm.mbarrier.arrive", "nvvm.mbarrier.arrive.shared")
def arrive(o: Op) -> Step:
    addr = operands(o, "addr")[0]
    outs = o.outs
    loc = o.loc
    if "count" in dir(o.op.opview) and operands(o, "count"):
        raise o.unsupported(f"{o.name} with a count")
    remote = o.in_types[0].space == "cluster"

    def step(fr: Frame) -> None:
        mbarrier_arrive(fr, addr, effective(fr, []), loc, remote=remote)
        _no_state(fr, outs)
    return step


@rule("nvvm.mbarrier.arrive.nocomplete", "nvvm.mbarrier.arrive.nocomplete.shared")
def arrive_nocomplete(o: Op) -> Step:
    addr, count = operands(o, "addr")[0], operands(o, "count")[0]
    outs = o.outs
    loc = o.loc

    def step(fr: Frame) -> None:
        b = fr.need_block(o.name, loc)
        m = effective(fr, [])
        addrs = _addrs(fr, addr, m)
        cnt = per_thread(fr.regs[count], fr.T)[m]
        for a, n in zip(addrs, cnt):
            bar = b.barrier(a, loc)
            bar.pending -= int(n)
            if bar.pending <= 0:
                raise EmulationError(f"mbarrier.arrive.nocomplete completed the phase at {loc}")
        _no_state(fr, outs)
    return step


def _no_state(fr: Frame, outs) -> None:
    """An arrival's result, the barrier state token: nothing in lockstep reads
    it but a test, which the emulator answers from the barrier itself."""
    for out in outs:
        fr.regs[out] = np.asarray(0, np.int64)


@rule("nvvm.mbarrier.try_wait.parity", "nvvm.mbarrier.try_wait.parity.shared")
def try_wait_parity(o: Op) -> Step:
    addr, phase = operands(o, "addr")[0], operands(o, "phase")[0]
    loc = o.loc
    outs = o.outs

    def step(fr: Frame) -> None:
        if outs:
            fr.regs[outs[0]] = mbarrier_test(fr, addr, phase, loc)
        else:
            mbarrier_wait(fr, addr, phase, loc)
    return step


# --- TMA -----------------------------------------------------------------------

def _coords(fr: Frame, slots: list[int], t: int) -> list[int]:
    return [int(per_thread(fr.regs[s], fr.T)[t]) for s in slots]


@rule("nvvm.cp.async.bulk.tensor.shared.cluster.global")
def tma_load(o: Op) -> Step:
    mode = str(o.attr_or("mode", "tile"))
    if "tile>" not in mode and mode != "tile":
        raise o.unsupported(f"TMA load in mode {mode}")
    mcast = operands(o, "multicastMask")
    if operands(o, "im2colOffsets"):
        raise o.unsupported("im2col TMA load")
    dst, desc = operands(o, "dstMem")[0], operands(o, "tmaDescriptor")[0]
    bar = operands(o, "mbar")[0]
    coords = operands(o, "coordinates")
    pred = operands(o, "predicate")
    loc = o.loc

    site = o.site("cp.async.bulk.tensor (TMA load)")

    def step(fr: Frame) -> None:
        b = fr.need_block("TMA load", loc)
        m = effective(fr, pred)
        for t in np.flatnonzero(m):
            d = tma.descriptor(fr, per_thread(fr.regs[desc], fr.T)[t], loc)
            smem = int(per_thread(fr.regs[dst], fr.T)[t])
            at = int(per_thread(fr.regs[bar], fr.T)[t])
            if mcast:  # the box lands at the same offset of every block in the mask
                mask = int(per_thread(fr.regs[mcast[0]], fr.T)[t]) & 0xFFFF
                targets = [b.peer(k, loc) for k in range(16) if mask >> k & 1]
            else:
                targets = [b]
            for tb in targets:
                target = tb.barrier(at, loc)
                check = tma_load_check(fr, t, tb, target, site)
                n = tma.load(fr, d, smem, _coords(fr, coords, t), loc, smem_space=tb.smem,
                             check=check)
                target.complete_tx(n)
    return step


def tma_load_check(fr: Frame, t: int, target_block, bar: MBarrier, site):
    """The checker's view of a TMA transfer thread ``t`` issues that completes
    on ``bar`` (of ``target_block``): checked against what the thread knows
    now, recorded under the barrier's transfers (visible once a wait acquires
    the phase it completes). None when the checker is off."""
    sync, b = fr.sync, fr.block
    if sync is None or b is None:  # (a block's frame whenever the checker is on)
        return None
    row = int(b.warp_rows[t])
    view = sync.clocks.matrix[row].copy()
    comp = sync.barrier_component(bar, target_block)
    stamp = bar.phase + 1  # its complete_tx joins the phase in progress
    bar.point.stamp(comp, stamp)
    agent = f"TMA load issued by {sync.clocks.names[row]}"

    def check(space, addrs, itemsize: int, is_write: bool) -> None:
        sync.async_access(view, space, addrs, itemsize, is_write, site, comp, stamp, agent)
    return check


def tma_store_check(fr: Frame, t: int, site, what: str = "TMA store"):
    """The checker's view of a bulk async copy (a TMA store) thread ``t``
    issues: reads recorded under its bulk group's reads, writes under its
    writes (visible after ``wait_group.read`` / ``wait_group``)."""
    sync, b = fr.sync, fr.block
    if sync is None or b is None:  # (a block's frame whenever the checker is on)
        return None
    row = int(b.warp_rows[t])
    view = sync.clocks.matrix[row].copy()
    reads, writes, stamp = sync.bulk_issue(b, int(b.flat[t]))
    agent = f"{what} issued by {sync.clocks.names[row]}"

    def check(space, addrs, itemsize: int, is_write: bool, atomic: bool = False) -> None:
        sync.async_access(view, space, addrs, itemsize, is_write, site,
                          writes if is_write else reads, stamp, agent, atomic=atomic)
    return check


@rule("nvvm.cp.async.bulk.tensor.global.shared.cta")
def tma_store(o: Op) -> Step:
    mode = str(o.attr_or("mode", "tile"))
    if "tile>" not in mode and mode != "tile":
        raise o.unsupported(f"TMA store in mode {mode}")
    src, desc = operands(o, "srcMem")[0], operands(o, "tmaDescriptor")[0]
    coords = operands(o, "coordinates")
    pred = operands(o, "predicate")
    loc = o.loc

    site = o.site("cp.async.bulk.tensor (TMA store)")

    def step(fr: Frame) -> None:
        fr.need_block("TMA store", loc)
        m = effective(fr, pred)
        for t in np.flatnonzero(m):
            d = tma.descriptor(fr, per_thread(fr.regs[desc], fr.T)[t], loc)
            tma.store(fr, d, int(per_thread(fr.regs[src], fr.T)[t]), _coords(fr, coords, t), loc,
                      check=tma_store_check(fr, t, site))
    return step


def _noop(o: Op) -> Step:
    outs = o.outs

    def step(fr: Frame) -> None:
        for out in outs:
            fr.regs[out] = None
    return step


# no memory ordering the checker models: mbarrier-init and tensormap fences,
# prefetches, register allocation, warp-synchronous points (a warp is one
# agent), wgmma.fence (orders register accesses, which are not tracked)
for _n in ("nvvm.fence.mbarrier.init", "nvvm.fence.proxy.acquire", "nvvm.fence.proxy.release",
           "nvvm.prefetch.tensormap", "nvvm.setmaxregister", "nvvm.bar.warp.sync",
           "nvvm.cp.async.bulk.tensor.prefetch", "nvvm.wgmma.fence.aligned"):
    rule(_n)(_noop)


def bulk_commit(fr: Frame, pred_slots=()) -> None:
    """``cp.async.bulk.commit_group``: each executing thread's pending bulk
    copies become its newest group."""
    if fr.sync is not None:
        fr.sync.bulk_commit(fr, np.flatnonzero(effective(fr, list(pred_slots))))


def bulk_wait(fr: Frame, pending: int, read_only: bool, pred_slots=()) -> None:
    """``cp.async.bulk.wait_group[.read] pending``: each executing thread's
    groups but the newest ``pending`` have completed (their reads)."""
    if fr.sync is not None:
        fr.sync.bulk_wait(fr, np.flatnonzero(effective(fr, list(pred_slots))), pending, read_only)


def proxy_fence(named: str = "") -> Step:
    """``fence.proxy.async`` of the state space ``named`` (the text naming it:
    ``shared``, ``global``; none: every space): the executing warps' earlier
    generic writes there become visible to the async proxy (TMA, WGMMA)."""
    spaces = (frozenset({"smem"}) if "shared" in named else
              frozenset({"gmem"}) if "global" in named else ALL_SPACES)

    def step(fr: Frame) -> None:
        if fr.sync is not None:
            fr.sync.fence(fr.sync.rows(fr), spaces)
    return step


def wgmma_commit(fr: Frame) -> None:
    if fr.sync is not None:
        fr.sync.wgmma_commit(fr)


def wgmma_wait(fr: Frame, pending: int) -> None:
    if fr.sync is not None:
        fr.sync.wgmma_wait(fr, pending)


def _int_attr(o: Op, name: str) -> int:
    return int(o.attr(name).value) if o.has(name) else 0


@rule("nvvm.cp.async.bulk.commit.group")
def cp_async_bulk_commit_group(o: Op) -> Step:
    return bulk_commit


@rule("nvvm.cp.async.bulk.wait_group")
def cp_async_bulk_wait_group(o: Op) -> Step:
    pending, read_only = _int_attr(o, "group"), _flag(o, "read")
    return lambda fr: bulk_wait(fr, pending, read_only)


@rule("nvvm.fence.proxy")
def fence_proxy(o: Op) -> Step:
    kind = str(o.attr("kind"))
    if "async" not in kind:  # alias / tensormap proxies order nothing modelled
        return _noop(o)
    return proxy_fence(kind)  # (async.shared: its space attribute, cta or cluster, is SMEM)


def group_rules(commit: str, wait: str, pending_attr: str, on_commit: Step,
                on_wait: Callable[[Frame, int], None]) -> None:
    """Registers the rules of an async-group pair: op ``commit`` closes a
    group (``on_commit``), op ``wait`` waits until at most its attribute
    ``pending_attr`` of the groups are pending (``on_wait``)."""
    rule(commit)(lambda o: on_commit)

    def wait_rule(o: Op) -> Step:
        pending = _int_attr(o, pending_attr)
        return lambda fr: on_wait(fr, pending)
    rule(wait)(wait_rule)


group_rules("nvvm.wgmma.commit.group.sync.aligned", "nvvm.wgmma.wait.group.sync.aligned",
            "group", wgmma_commit, wgmma_wait)


@rule("nvvm.barrier0", "nvvm.barrier")
def barrier(o: Op) -> Step:
    from .gpu import full_block_barrier, named_barrier
    loc = o.loc
    if not o.ins:
        return lambda fr: full_block_barrier(fr, o.name, loc)
    ident = operands(o, "barrierId")
    count = operands(o, "numberOfThreads")
    if len(ident) != 1 or len(count) > 1:
        raise o.unsupported(f"{o.name} with {len(o.ins)} operands")

    def step(fr: Frame) -> None:
        i = int(uniform(fr.regs[ident[0]], fr, "a barrier id", loc))
        if not count:
            if i == 0:
                return full_block_barrier(fr, o.name, loc)
            n = fr.need_block(o.name, loc).block_T
        else:
            n = int(uniform(fr.regs[count[0]], fr, "a barrier's thread count", loc))
        named_barrier(fr, i, n, o.name, loc)
    return step


@rule("nvvm.mapa")
def mapa(o: Op) -> Step:
    """``mapa``: the shared::cluster address of the same SMEM offset in the
    block of CTA rank ``b`` (:func:`..memory.cluster_address`)."""
    if o.in_types[0].space != "shared" or o.out_types[0].space != "cluster":
        raise o.unsupported(f"nvvm.mapa from {o.in_types[0].text} to {o.out_types[0].text}")
    (a, rank), (out,) = o.ins, o.outs
    return mapa_step(a, rank, out, o.loc)


def mapa_step(a: int, rank: int, out: int, loc: str) -> Step:
    """``mapa`` of the SMEM address in slot ``a`` to the block of CTA rank
    ``rank`` (``nvvm.mapa``, and the inline PTX form jax 0.12 emits)."""
    def step(fr: Frame) -> None:
        b = fr.need_block("mapa", loc)
        rk = np.asarray(fr.regs[rank], np.int64)
        if np.any((rk < 0) | (rk >= b.cluster.size)):
            raise EmulationError(f"mapa to CTA rank {rk.max()} in a cluster of {b.cluster.size} "
                                 f"at {loc}")
        fr.regs[out] = _mapa_address(b, rk, fr.regs[a])
    return step


def _mapa_address(b, rank, addr):
    from ..memory import cluster_address

    return cluster_address(rank, addr)


SREG = {
    "nvvm.read.ptx.sreg.tid.x": lambda b: b.tid[0], "nvvm.read.ptx.sreg.tid.y": lambda b: b.tid[1],
    "nvvm.read.ptx.sreg.tid.z": lambda b: b.tid[2],
    "nvvm.read.ptx.sreg.ctaid.x": lambda b: b.block_id[0],
    "nvvm.read.ptx.sreg.ctaid.y": lambda b: b.block_id[1],
    "nvvm.read.ptx.sreg.ctaid.z": lambda b: b.block_id[2],
    "nvvm.read.ptx.sreg.ntid.x": lambda b: b.block_dim[0],
    "nvvm.read.ptx.sreg.ntid.y": lambda b: b.block_dim[1],
    "nvvm.read.ptx.sreg.ntid.z": lambda b: b.block_dim[2],
    "nvvm.read.ptx.sreg.nctaid.x": lambda b: b.grid[0],
    "nvvm.read.ptx.sreg.nctaid.y": lambda b: b.grid[1],
    "nvvm.read.ptx.sreg.nctaid.z": lambda b: b.grid[2],
    "nvvm.read.ptx.sreg.laneid": lambda b: b.lane,
    "nvvm.read.ptx.sreg.cluster.ctarank": lambda b: b.rank,
    "nvvm.read.ptx.sreg.cluster.nctarank": lambda b: b.cluster.size,
    "nvvm.read.ptx.sreg.cluster.ctaid.x": lambda b: b.cluster_pos[0],
    "nvvm.read.ptx.sreg.cluster.ctaid.y": lambda b: b.cluster_pos[1],
    "nvvm.read.ptx.sreg.cluster.ctaid.z": lambda b: b.cluster_pos[2],
    "nvvm.read.ptx.sreg.cluster.nctaid.x": lambda b: b.cluster.dims[0],
    "nvvm.read.ptx.sreg.cluster.nctaid.y": lambda b: b.cluster.dims[1],
    "nvvm.read.ptx.sreg.cluster.nctaid.z": lambda b: b.cluster.dims[2],
    "nvvm.read.ptx.sreg.clusterid.x": lambda b: b.cluster.cluster_id[0],
    "nvvm.read.ptx.sreg.clusterid.y": lambda b: b.cluster.cluster_id[1],
    "nvvm.read.ptx.sreg.clusterid.z": lambda b: b.cluster.cluster_id[2],
    "nvvm.read.ptx.sreg.nclusterid.x": lambda b: b.cluster.nclusters[0],
    "nvvm.read.ptx.sreg.nclusterid.y": lambda b: b.cluster.nclusters[1],
    "nvvm.read.ptx.sreg.nclusterid.z": lambda b: b.cluster.nclusters[2],
    "nvvm.read.ptx.sreg.warpid": lambda b: b.flat // 32,
}
for _n, _f in SREG.items():
    def _sreg(o: Op, f=_f) -> Step:
        (out,) = o.outs
        dt = o.out_types[0].dtype
        loc = o.loc
        return lambda fr: fr.regs.__setitem__(
            out, np.asarray(f(fr.need_block(o.name, loc))).astype(dt))
    rule(_n)(_sreg)


@rule("nvvm.vote.sync")
def vote_sync(o: Op) -> Step:
    kind = str(o.attr("kind")).split("<")[-1].rstrip(">")
    _, pred = o.ins
    (out,) = o.outs
    loc = o.loc

    def step(fr: Frame) -> None:
        p = _by_warp(fr, pred, bool, "vote.sync", loc)
        if kind == "ballot":
            bits = (p.astype(np.uint64) << np.arange(32, dtype=np.uint64)).sum(1)
            fr.regs[out] = np.repeat(bits.astype(np.uint32).view(np.int32), 32)
        elif kind == "any":
            fr.regs[out] = np.repeat(p.any(1), 32)
        elif kind == "all":
            fr.regs[out] = np.repeat(p.all(1), 32)
        else:
            raise Unsupported(f"vote.sync {kind}", loc)
    return step


_REDUX = {
    "add": lambda v: v.astype(np.int64).sum(1), "and": np.bitwise_and.reduce,
    "or": np.bitwise_or.reduce, "xor": np.bitwise_xor.reduce,
    "min": lambda v: v.min(1), "max": lambda v: v.max(1),
    "umin": lambda v: v.view(np.uint32).min(1), "umax": lambda v: v.view(np.uint32).max(1),
}


@rule("nvvm.redux.sync")
def redux_sync(o: Op) -> Step:
    """A reduction of a 32-bit value over the 32 lanes of each warp, every
    lane getting the result (the full-warp mask jax uses). f32 ``fmax``/``fmin``
    (Blackwell) propagate NaN with ``nan``, else ignore it."""
    kind = str(o.attr("kind")).split("<")[-1].rstrip(">").split()[-1]
    if kind in ("fmax", "fmin"):
        return _redux_f32(o, kind)
    if kind not in _REDUX:
        raise o.unsupported(f"nvvm.redux.sync kind {kind}")
    val, mask = o.ins
    (out,) = o.outs
    loc = o.loc

    def step(fr: Frame) -> None:
        v = _by_warp(fr, val, np.int32, "redux.sync", loc)
        if np.any(per_thread(fr.regs[mask], fr.T).astype(np.int64) & 0xFFFFFFFF != 0xFFFFFFFF):
            raise Unsupported("nvvm.redux.sync with a partial member mask", loc)
        fn = _REDUX[kind]
        res = fn(v) if kind not in ("and", "or", "xor") else fn(v, axis=1)
        fr.regs[out] = np.repeat(np.asarray(res).astype(np.int64).astype(np.uint32)
                                 .view(np.int32), 32)
    return step


def _flag(o: Op, name: str) -> bool:
    """A unit or boolean attribute: MLIR now keeps ``nan = false`` and
    ``abs = false`` as properties, so being there is not being set."""
    if not o.has(name):
        return False
    return bool(getattr(o.attr(name), "value", True))


def _redux_f32(o: Op, kind: str) -> Step:
    nan = _flag(o, "nan")
    absolute = _flag(o, "abs")  # .abs: of each input's absolute value
    extremum = arith.extremum(kind == "fmax", nan)
    val, mask = o.ins
    (out,) = o.outs
    loc = o.loc

    def step(fr: Frame) -> None:
        v = _by_warp(fr, val, np.float32, "redux.sync", loc)
        if absolute:
            v = np.abs(v)
        fr.regs[out] = np.repeat(arith.reduce_columns(extremum, v).astype(np.float32), 32)
    return step


# --- ldmatrix / stmatrix -------------------------------------------------------
#
# A warp moves ``num`` 8x8 matrices of 16-bit elements: lanes 8k..8k+7 give
# the SMEM addresses of matrix k's rows; lane l holds row l // 4, columns
# 2 (l % 4) and 2 (l % 4) + 1 of each, packed in one 32-bit register per
# matrix (``.trans``: of the transposed matrix). Both run in runs
# (:mod:`..fusion`): a run of them is one access of every matrix, each warp's
# side by side. Matrix element (r, c) is then half c % 2 of lane 4 r + c // 2:
# a warp's registers of one matrix, in lane order and split in their 16-bit
# halves (low first), are the matrix's 64 elements in row-major order.


def _matrix_shape(o: Op) -> None:
    elt = str(o.attr_or("eltType", "b16"))
    shape = str(o.attr_or("shape", "m = 8, n = 8"))
    if "b16" not in elt or "m = 8, n = 8" not in shape:
        raise o.unsupported(f"{o.name} of {elt} {shape}")


@dataclass(frozen=True)
class MatrixAccess:
    """One ``ldmatrix`` or ``stmatrix``: its address operand, its registers
    (a store's sources; a load's result), how many matrices, transposed or
    not, and its site (:class:`..fusion.Fusable`)."""

    is_store: bool
    ptr: int
    values: tuple[int, ...]
    num: int
    trans: bool
    site: OpSite
    loc: str

    @property
    def what(self) -> str:
        return "stmatrix" if self.is_store else "ldmatrix"

    @property
    def fusion_key(self) -> tuple:
        return ("matrix", self.is_store, self.trans, self.site)

    def fused(self, run: Sequence[MatrixAccess], alone: Sequence[Step], splits: Splits) -> Step:
        """The matrices of every access of ``run`` as one access: each warp's
        side by side, as one instruction of them all would move them (the
        registers are few: no stacks to keep)."""
        def step(fr: Frame) -> None:
            _warps(fr, self.loc)
            _check_full_warps(fr, self.what, self.loc)
            rows = np.concatenate([_matrix_rows(fr, a.ptr, a.num) for a in run], axis=1)
            if self.is_store:
                vals = np.concatenate([_matrices(fr, a.values, a.trans) for a in run], axis=1)
                _store_matrices(fr, rows, vals, self.site, self.loc)
                return
            vals = _load_matrices(fr, rows, self.site, self.loc)
            k = 0
            for a in run:
                _fragments(fr, vals[:, k:k + a.num], a.trans, a.values[0])
                k += a.num
        return step


def _matrix_rows(fr: Frame, ptr: int, num: int) -> np.ndarray:
    """The SMEM byte address of each element of each warp's ``num`` matrices:
    (warps, num, 8 rows, 8 columns)."""
    W = fr.T // 32
    addrs = per_thread(fr.regs[ptr], fr.T).astype(np.int64).reshape(W, 32)[:, :8 * num]
    return plus_offsets(addrs.reshape(W, num, 8), ROW_OFFSETS)


ROW_OFFSETS = np.arange(8) * 2  # a matrix row's elements' byte offsets


def _warp_mask(fr: Frame, shape: tuple[int, ...]) -> np.ndarray | None:
    """Which warps' elements (of ``shape``, warps first) are active."""
    if fr.mask is None:
        return None
    return np.broadcast_to(fr.mask.reshape(-1, 32)[:, :1, None, None], shape)


def _load_matrices(fr: Frame, rows: np.ndarray, site: OpSite, loc: str) -> np.ndarray:
    wm = _warp_mask(fr, rows.shape)
    vals = fr.mem["shared"].load(rows, np.dtype(np.uint16), wm, loc)
    if fr.sync is not None:
        fr.sync.thread_access(fr, "shared", rows, 3, 2, False, site, mask=wm, by_warp=True)
    if fr.prof is not None:
        fr.prof.access(fr, "shared", rows, 3, 2, False, site, by_warp=True)
    return vals


def _store_matrices(fr: Frame, rows: np.ndarray, vals: np.ndarray, site: OpSite,
                    loc: str) -> None:
    wm = _warp_mask(fr, rows.shape)
    # the checker tells warps storing equal values (a replicated layout,
    # which jax stores from every warp) and rewrites of the bytes already there
    overwritten = fr.mem["shared"].store(rows, vals, np.dtype(np.uint16), wm, loc,
                                         keep_old=fr.sync is not None)
    if fr.sync is not None:
        fr.sync.thread_access(fr, "shared", rows, 3, 2, True, site, mask=wm, by_warp=True,
                              values=vals, overwritten=overwritten)
    if fr.prof is not None:
        fr.prof.access(fr, "shared", rows, 3, 2, True, site, by_warp=True)


def _fragments(fr: Frame, vals: np.ndarray, trans: bool, out: int) -> None:
    """Each lane's registers of loaded matrices ``vals`` (warps, num, 8, 8)
    into ``out`` (one value, or a tuple of ``num``)."""
    num = vals.shape[1]
    if trans:
        vals = np.swapaxes(vals, -1, -2)
    halves = np.ascontiguousarray(vals).astype("<u2", copy=False).reshape(vals.shape[0], num, 64)
    # (W, num, 32): lane l's register of each matrix (little-endian: the low half first)
    by_matrix = halves.view("<u4").astype(np.uint32, copy=False).view(np.int32)
    regs = np.transpose(by_matrix, (0, 2, 1)).reshape(fr.T, num)
    fr.regs[out] = regs[:, 0] if num == 1 else tuple(regs[:, k] for k in range(num))


def _matrices(fr: Frame, srcs: tuple[int, ...], trans: bool) -> np.ndarray:
    """The matrices (warps, num, 8, 8) the lanes' registers ``srcs`` hold."""
    W, num = fr.T // 32, len(srcs)
    regs = np.stack([per_thread(fr.regs[s], fr.T).astype(np.int32) for s in srcs])  # (num, T)
    regs = np.ascontiguousarray(regs.reshape(num, W, 32).transpose(1, 0, 2))  # (W, num, 32)
    halves = regs.view(np.uint32).astype("<u4", copy=False).view("<u2")  # the low half first
    vals = halves.astype(np.uint16, copy=False).reshape(W, num, 8, 8)
    return np.swapaxes(vals, -1, -2) if trans else vals


@rule("nvvm.ldmatrix")
def ldmatrix(o: Op) -> Step:
    _matrix_shape(o)
    (ptr,), (out,) = o.ins, o.outs
    return _matrix_step(MatrixAccess(False, ptr, (out,), int(o.attr("num").value),
                                     "col" in str(o.attr("layout")), o.site(), o.loc))


@rule("nvvm.stmatrix")
def stmatrix(o: Op) -> Step:
    _matrix_shape(o)
    ptr, *srcs = o.ins
    return _matrix_step(MatrixAccess(True, ptr, tuple(srcs), len(srcs),
                                     "col" in str(o.attr("layout")), o.site(), o.loc))


def _matrix_step(access: MatrixAccess) -> Step:
    """The op's step: a run of one (its neighbours may join it: ..fusion)."""
    step = access.fused([access], (), Splits())
    step.fusable = access  # type: ignore[attr-defined]
    return step


del thread_axis
