"""Atomic PTX as Mosaic GPU emits it: ``red`` (``FragmentedArray``'s atomic
stores, ``pl.atomic_add``..., semaphore signals), ``atom.cas`` (semaphore
waits), strong loads (``ld.relaxed``/``ld.acquire``: semaphore reads) and the
``fence.acquire`` that ends a wait.

**Values.** The active threads' operations are applied one after another in
thread order, each element in turn (a valid order of the GPU's; for the
integer operations and min/max any order gives the same memory). Each is a
read-modify-write of one element: ``add`` wraps (integers) or rounds once to
the element type (floats: f32 is IEEE, f16/bf16 are added in f32, which is
correctly rounded for them), ``min``/``max`` compare signed (``.s32``) or
unsigned (``.u32``), floats as ``fmin``/``fmax`` (a NaN operand loses), ``inc``
gives ``old >= v ? 0 : old + 1`` and ``dec`` ``old == 0 || old > v ? v : old - 1``
(unsigned, as the PTX ISA defines them). ``atom.cas`` stores the new value where
memory holds the expected one and returns what memory held.

**State spaces.** ``.shared::cta`` and ``.global`` name their space; an
instruction that names none takes generic addresses, each thread's reaching
the space its window maps it to (:mod:`..generic`).

**Synchronization.** The checker records them as atomic accesses: an atomic
access races with no other atomic one, only with plain reads and writes it is
not ordered with. Their ``.release``/``.acquire`` semantics, and the fences
around relaxed ones, order the threads' other accesses as the PTX memory
model says (:mod:`..sync.memory_order`): the data a semaphore hands from one
warpgroup, block or cluster to another is not a race.

**Spinning.** A semaphore wait polls memory in a loop. Blocks of different
clusters run one after another, and the warpgroups of one block switch only
where one waits: a poll that sees memory unchanged lets the other warpgroups
of the block (or cluster) run first; when none can, or after
``sched.MAX_POLLS`` unchanged polls in a block of one warpgroup, the wait
could only be ended by a block that has not run yet, which is not modelled:
:class:`..sync.reports.Deadlock`. A poll that sees memory unchanged while
some warps of its warpgroup are masked off (one warp waits, another of the
same warpgroup signals) makes that warpgroup's warps tasks (``sched``)."""

from __future__ import annotations

import re
import weakref

import numpy as np

from .. import generic
from ..compiler import Step
from ..errors import Unsupported
from ..machine import Frame
from ..sched import MAX_POLLS, must_block
from ..sync.memory_order import Agent, semantics_and_scope
from ..sync.reports import Deadlock
from .inline_asm import Instr, ptx, ptx_pattern
from .nvvm import effective, per_thread

RED = (r"red(?:\.(?:shared::cta|global))?\.(?:relaxed|release)\.(?:cta|cluster|gpu|sys)"
       r"(?:\.(?:shared::cta|global))?\.(add|min|max|and|or|xor|inc|dec)(?:\.noftz)?"
       r"(?:\.v([24]))?\.(u32|s32|b32|f32|f16|bf16|f16x2|bf16x2)")
ATOM = (r"atom(?:\.(?:relaxed|acquire|release|acq_rel))?(?:\.(?:cta|cluster|gpu|sys))?"
        r"(?:\.(?:shared::cta|global))?\.(cas|exch|add|min|max|and|or|xor|inc|dec)"
        r"\.(b32|u32|s32)")
STRONG_LD = (r"ld\.(?:relaxed|acquire)\.(?:cta|cluster|gpu|sys)(?:\.(?:shared::cta|global))?"
             r"\.(b32|u32|s32)")

ELEMS = {"u32": np.uint32, "s32": np.int32, "b32": np.uint32, "f32": np.float32,
         "f16": np.float16, "f16x2": np.float16}


def _elem(ty: str) -> np.dtype:
    if ty.startswith("bf16"):
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(ELEMS[ty])


def _combine(op: str, dt: np.dtype):
    """new = f(old, v) for elements of ``dt`` (unsigned for u32/b32)."""
    is_float = dt.kind in "fV"
    if op == "add":
        return np.add
    if op in ("min", "max"):
        if is_float:
            return np.fmin if op == "min" else np.fmax
        return np.minimum if op == "min" else np.maximum
    if op in ("and", "or", "xor"):
        return {"and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor}[op]
    if op == "exch":
        return lambda old, v: v
    if op == "inc":
        return lambda old, v: np.where(old >= v, dt.type(0), old + dt.type(1)).astype(dt)
    if op == "dec":
        return lambda old, v: np.where((old == 0) | (old > v), v, old - dt.type(1)).astype(dt)
    raise ValueError(op)


def _space_name(text: str) -> str:
    """The state space an atomic's opcode names; ``generic`` where it names none."""
    if "shared::cta" in text:
        return "shared"
    return "global" if ".global" in text else "generic"


def _parts(fr: Frame, name: str, addrs: np.ndarray, m: np.ndarray, loc: str, what: str):
    """(space, addresses, mask) of an atomic's per-thread ``addrs`` (T, n) in
    state space ``name``: a generic one's split by window (:mod:`..generic`)."""
    if name != "generic":
        return ((name, addrs, m),)
    return generic.spaces(fr, "global", addrs, 1, loc, what, mask=m)


def read_modify_write(space, addrs: np.ndarray, vals: np.ndarray, dt: np.dtype, fn,
                      where: str) -> np.ndarray:
    """Applies ``fn`` at each address in order (``addrs``, ``vals`` flat);
    returns the value each operation found."""
    with np.errstate(over="ignore"):
        if np.unique(addrs).size == addrs.size:  # no element twice: all at once
            old = space.load(addrs, dt, None, where)
            space.store(addrs, np.asarray(fn(old, vals), dt), dt, None, where)
            return old
        found = np.empty(addrs.size, dt)
        for k in range(addrs.size):
            a = addrs[k:k + 1]
            found[k] = space.load(a, dt, None, where)[0]
            space.store(a, np.asarray(fn(found[k:k + 1], vals[k:k + 1]), dt), dt, None, where)
        return found


def _regs_as(vals: list[np.ndarray], T: int, dt: np.dtype) -> np.ndarray:
    """Per thread, the elements the registers hold, in order: (T, n)."""
    cols = []
    for v in vals:
        v = per_thread(v, T)
        raw = np.ascontiguousarray(v).reshape(T, -1).view(np.uint8)
        cols.append(raw)
    return np.concatenate(cols, axis=1).view(dt).reshape(T, -1)


def _check(fr: Frame, space_name: str, addrs: np.ndarray, m: np.ndarray, itemsize: int,
           is_write: bool, site) -> None:
    if fr.sync is not None and m.any():
        fr.sync.thread_access(fr, space_name, addrs, 1, itemsize, is_write, site, mask=m,
                              atomic=True)


def _location(space_name: str, run: int, rank: int, addr: int) -> tuple:
    """An atomic location: a global address, or a block's shared one."""
    return ("global", addr) if space_name == "global" else (space_name, run, rank, addr)


def _order(fr: Frame, opcode: str, space_name: str, addrs: np.ndarray, threads: np.ndarray,
           is_write: bool) -> None:
    """Tells the checker's memory order (:mod:`..sync.memory_order`) that
    ``threads`` (indices into the frame's) read or wrote atomically at
    ``addrs`` (a row of addresses per thread of the frame)."""
    sync, b = fr.sync, fr.block
    if sync is None or b is None or threads.size == 0:
        return
    order = sync.memory_order
    sem, scope = semantics_and_scope(opcode)
    if is_write and sem not in ("release", "acq_rel") and not order.fenced:
        return  # continues the release sequences already there
    if not is_write and not order.locations:
        return  # nothing was released anywhere
    agent = Agent(sync.cluster, b.rank)
    rows = b.warp_rows[threads]
    for row in np.unique(rows).tolist():
        mine = np.unique(np.asarray(addrs)[threads[rows == row]])
        locs = [_location(space_name, sync.cluster, b.rank, int(a)) for a in mine.tolist()]
        (order.write if is_write else order.read)(row, agent, locs, sem, scope)


@ptx_pattern(RED, "red[.space].{relaxed,release}.{cta,cluster,gpu,sys}[.space].op[.noftz]"
             "[.v2|.v4].type [addr], value(s): an atomic reduction into memory, each active "
             "thread's in turn (op: add/min/max/and/or/xor/inc/dec; type: "
             "u32/s32/b32/f32/f16[x2]/bf16[x2]; no .space: a generic address)")
def red(i: Instr) -> Step:
    m = re.fullmatch(RED, i.opcode)
    op, vec, ty = m[1], int(m[2] or 1), m[3]
    if len(i.args) < 2:
        raise i.unknown
    ptr, *vals = (i.arg_slot(a) for a in i.args)
    dt = _elem(ty)
    if dt.kind in "fV" and op not in ("add", "min", "max"):
        raise i.unknown
    if op in ("min", "max") and ty == "b32":
        raise i.unknown
    fn = _combine(op, dt)
    name, pred_slots, loc, site = _space_name(i.opcode), i.pred_slots, i.loc, i.site
    if len(vals) != vec:
        raise i.unknown

    def step(fr: Frame) -> None:
        m = effective(fr, pred_slots)
        if not m.any():
            return
        elems = _regs_as([fr.regs[v] for v in vals], fr.T, dt)  # (T, n)
        n = elems.shape[1]
        base = per_thread(np.asarray(fr.regs[ptr], np.int64), fr.T)
        addrs = base[:, None] + np.arange(n, dtype=np.int64) * dt.itemsize
        for space, a, sel in _parts(fr, name, addrs, m, loc, i.opcode):
            t = np.flatnonzero(sel)
            read_modify_write(fr.mem[space], a[t].reshape(-1), elems[t].reshape(-1), dt, fn, loc)
            _check(fr, space, a, sel, dt.itemsize, True, site)
            _order(fr, i.opcode, space, a, t, is_write=True)
    return step


class _Polls:
    """Per launch: the last value each polling op saw at an address, and how
    many times in a row it saw it."""

    def __init__(self) -> None:
        self.seen: dict[tuple, tuple[int, int]] = {}


_POLLS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _observe(fr: Frame, key: tuple, value: int, what: str) -> None:
    """A poll that saw ``value``: when it saw the same last time, the other
    warpgroups may run first (see the module docstring)."""
    polls = _POLLS.setdefault(fr.launch, _Polls())
    last, count = polls.seen.get(key, (None, 0))
    count = count + 1 if last == value else 0
    polls.seen[key] = (value, count)
    if count == 0:
        return
    must_block(fr, what)  # a warp masked off here may be the one to change it (..sched)
    s = None if fr.block is None else fr.block.sched
    if s is not None and any(t is not s.current and not t.done and (t.cond is None or t.cond())
                             for t in s.tasks):
        s.poll(what)  # another warpgroup may change it: let it run first
        return
    if count > MAX_POLLS:
        raise Deadlock(f"{what} saw the same value {MAX_POLLS} times in a row and nothing in "
                       "this block (or cluster) can change it: only a block of another cluster "
                       "could, and blocks of different clusters run one after another in the "
                       "emulator (grid-wide waits are not modelled); on the GPU this may hang too")


@ptx_pattern(ATOM, "atom[.sem][.scope][.space].op.{b32,u32,s32} $0, [addr], v[, new]: an atomic "
             "read-modify-write returning the old value, each active thread's in turn "
             "(cas: store new where memory holds v; no .space: a generic address)", value=True)
def atom(i: Instr) -> Step:
    m = re.fullmatch(ATOM, i.opcode)
    op, ty = m[1], m[2]
    if len(i.args) != (4 if op == "cas" else 3) or len(i.results) != 1:
        raise i.unknown
    ptr, *vals = (i.arg_slot(a) for a in i.args[1:])
    dt = np.dtype(ELEMS[ty])
    (out,) = i.results
    name, loc, site = _space_name(i.opcode), i.loc, i.site
    fn = None if op == "cas" else _combine(op, dt)

    def step(fr: Frame) -> None:
        m = effective(fr, [])
        addrs = per_thread(np.asarray(fr.regs[ptr], np.int64), fr.T)
        args = [per_thread(np.asarray(fr.regs[v]), fr.T).astype(np.int64).astype(dt)
                for v in vals]
        found = np.zeros(fr.T, dt)
        failed = []  # cas polls that found another value
        for name_, where, sel in _parts(fr, name, addrs[:, None], m, loc, i.opcode):
            space = fr.mem[name_]
            threads = np.flatnonzero(sel)
            wrote = np.ones(threads.size, bool)  # a failed cas writes nothing
            for k, t in enumerate(threads):
                a = where[t]
                old = space.load(a, dt, None, loc)
                if op == "cas":
                    new = args[1][t:t + 1] if old[0] == args[0][t] else old
                    if old[0] != args[0][t]:
                        wrote[k] = False
                        failed.append(((id(site), name_, int(a[0])), int(old[0]),
                                       f"an atom.cas poll of {int(a[0]):#x} at {loc}"))
                else:
                    with np.errstate(over="ignore"):
                        new = np.asarray(fn(old, args[0][t:t + 1]), dt)
                space.store(a, new, dt, None, loc)
                found[t] = old[0]
            _check(fr, name_, where, sel, dt.itemsize, True, site)
            _order(fr, i.opcode, name_, where, threads, is_write=False)  # acquire, then release
            _order(fr, i.opcode, name_, where, threads[wrote], is_write=True)
        fr.regs[out] = found.view(np.int32) if dt.itemsize == 4 else found
        # only now may other tasks run (_observe): a read-modify-write is atomic,
        # and a signal made meanwhile must not be overwritten by this one's store
        for key, value, what in failed:
            _observe(fr, key, value, what)
    return step


@ptx_pattern(STRONG_LD, "ld.{relaxed,acquire}.{cta,cluster,gpu,sys}[.space].{b32,u32,s32} "
             "$0, [addr]: a strong (atomic) load (no .space: a generic address)", value=True)
def strong_load(i: Instr) -> Step:
    if len(i.args) != 2 or len(i.results) != 1:
        raise i.unknown
    ptr = i.arg_slot(i.args[1])
    (out,) = i.results
    name, loc, site = _space_name(i.opcode), i.loc, i.site

    def step(fr: Frame) -> None:
        m = effective(fr, [])
        addrs = per_thread(np.asarray(fr.regs[ptr], np.int64), fr.T)
        vals = np.zeros(fr.T, np.int32)
        seen = []
        for space, a, sel in _parts(fr, name, addrs[:, None], m, loc, i.opcode):
            got = fr.mem[space].load(a[:, 0], np.dtype(np.int32), sel, loc)
            vals = np.where(sel, got, vals)
            if sel.any():
                first = np.flatnonzero(sel)[0]
                at = int(a[first, 0])
                seen.append(((id(site), space, at), int(got[first]),
                             f"a poll ({i.opcode}) of {at:#x} at {loc}"))
                _check(fr, space, a, sel, 4, False, site)
                _order(fr, i.opcode, space, a, np.flatnonzero(sel), is_write=False)
        fr.regs[out] = vals
        for key, value, what in seen:  # the load is done: others may run now
            _observe(fr, key, value, what)
    return step


@ptx(*(f"fence.{sem}.{scope}" for sem in ("acquire", "release", "acq_rel", "sc")
       for scope in ("cta", "cluster", "gpu", "sys")))
def memory_fence(i: Instr) -> Step:
    """Nothing to compute (memory effects are immediate); for the checker, an
    acquire fence makes what the thread's earlier strong reads saw released
    ordered before its later accesses, a release fence makes its next strong
    write publish what the thread knows now (:mod:`..sync.memory_order`);
    ``acq_rel`` and ``sc`` do both."""
    if i.args:
        raise i.unknown
    sem, _ = semantics_and_scope(i.opcode)
    pred_slots = i.pred_slots

    def step(fr: Frame) -> None:
        if fr.sync is None or fr.block is None:
            return
        m = effective(fr, pred_slots)
        if m.any():
            fr.sync.memory_order.fence(fr.block.warp_rows[m], sem)
    return step



# --- red.async: a reduction into a (peer's) SMEM word completing on an mbarrier ---

RED_ASYNC_PREFIX = "red.async.relaxed.cluster.shared::cluster.mbarrier::complete_tx::bytes"
#: op and type pairs the PTX ISA allows for red.async
RED_ASYNC_FORMS = {("inc", "u32"), ("dec", "u32"), ("min", "u32"), ("max", "u32"),
                   ("add", "u32"), ("min", "s32"), ("max", "s32"), ("add", "s32"),
                   ("and", "b32"), ("or", "b32"), ("xor", "b32"), ("add", "u64")}
RED_ASYNC = re.escape(RED_ASYNC_PREFIX) + r"\.(add|min|max|and|or|xor|inc|dec)\.(u32|s32|b32|u64)"


@ptx_pattern(RED_ASYNC, f"{RED_ASYNC_PREFIX}.op.type [addr], value, [mbar]: an atomic "
             "reduction into a shared::cluster word (usually a peer block's) whose completion "
             "adds its bytes to the mbarrier's transaction count (op.type: inc/dec/min/max/add"
             ".u32, min/max/add.s32, and/or/xor.b32, add.u64)")
def red_async(i: Instr) -> Step:
    m = re.fullmatch(RED_ASYNC, i.opcode)
    op, ty = m[1], m[2]
    if (op, ty) not in RED_ASYNC_FORMS or len(i.args) != 3:
        raise i.unknown
    ptr, val, bar = (i.arg_slot(a) for a in i.args)
    dt = np.dtype({"u32": np.uint32, "s32": np.int32, "b32": np.uint32, "u64": np.uint64}[ty])
    fn = _combine(op, dt)
    pred_slots, loc, site = i.pred_slots, i.loc, i.site

    def step(fr: Frame) -> None:
        b = fr.need_block("red.async", loc)
        m = effective(fr, pred_slots)
        if not m.any():
            return
        if b.cluster.size < 2:
            raise Unsupported("red.async outside a cluster of several blocks", loc)
        x = np.asarray(fr.regs[val])
        if x.dtype.itemsize != dt.itemsize:
            raise Unsupported(f"{i.opcode} from a {x.dtype} register", loc)
        elems = per_thread(np.ascontiguousarray(x).view(dt), fr.T)
        addrs = per_thread(np.asarray(fr.regs[ptr], np.int64), fr.T)
        t = np.flatnonzero(m)
        read_modify_write(fr.mem["cluster"], addrs[t], elems[t], dt, fn, loc)
        bars = per_thread(np.asarray(fr.regs[bar], np.int64), fr.T)[m]
        if fr.sync is not None:
            fr.sync.remote_async_writes(fr, m, addrs[m][:, None], bars, dt.itemsize, site, loc,
                                        "red.async", atomic=True)
        if fr.prof is not None:
            fr.prof.access(fr, "cluster", addrs[:, None], 1, dt.itemsize, True, site, mask=m)
        for a in np.unique(bars):
            b.remote_barrier(int(a), loc).complete_tx(int((bars == a).sum()) * dt.itemsize)
    return step
