"""``scf``: structured control flow in lockstep.

All threads of a block run every step together. An ``scf.for`` whose bounds
differ between the active threads runs each iteration for the threads that
have it, under a mask (its step must agree); an ``scf.while`` whose condition
differs lets each thread leave when its own condition is false and runs the
others on under a mask. ``scf.if`` on a condition that differs
between threads runs each branch under a mask (the threads that took it) and
merges the yielded values per thread, as a SIMT machine does; a branch no
active thread takes is skipped. ``scf.index_switch`` likewise runs each case
some active thread selects."""

from __future__ import annotations

import numpy as np

from ..compiler import REGIONS, Op, Step, rule
from ..deadline import check as check_deadline
from ..errors import Unsupported
from ..machine import Frame, uniform
from ._util import thread_axis


def _hand(fr: Frame, sources: list[int], targets: list[int], merge: bool = False) -> None:
    """Values copied from ``sources`` to ``targets``: a WGMMA accumulator not
    yet waited for stays pending in its copy (the checker's; ``merge``: a
    second branch's values merged in, pending where either is)."""
    pending = fr.pending
    if not pending:
        return
    got = [pending.get(s) for s in sources]
    for t, g in zip(targets, got):
        if g is not None:
            pending[t] = g
        elif not merge:
            pending.pop(t, None)


def _forget(fr: Frame, targets: list[int]) -> None:
    """``targets`` get new values none of which is pending yet (before
    divergent branches' values are merged into them)."""
    for t in targets:
        fr.pending.pop(t, None)


@rule("scf.for", accumulators=REGIONS)
def for_(o: Op) -> Step:
    """Bounds the same in every active thread loop them together; bounds that
    differ (a uniform step) run iteration ``k`` for the threads that have a
    k-th iteration, under a mask, each with its own induction variable, the
    others keeping their carried values -- as a SIMT machine runs it."""
    lb, ub, st, *inits = o.ins
    body = o.region_block()
    iv, *carried = body.args
    outs = o.outs
    vranks = [t.vrank for t in o.out_types]
    loc = o.loc
    here = f"scf.for at {loc}"  # for the deadline's message
    idt = o.in_types[0].dtype
    for sources in (inits, body.term):
        o.comp.hand_over(sources, carried)
        o.comp.hand_over(sources, outs)

    def step(fr: Frame) -> None:
        r = fr.regs
        if _differs(fr, r[lb]) or _differs(fr, r[ub]):
            return _divergent_for(fr)
        lo = uniform(r[lb], fr, "scf.for lower bound", loc)
        hi = uniform(r[ub], fr, "scf.for upper bound", loc)
        s = uniform(r[st], fr, "scf.for step", loc)
        vals = [r[i] for i in inits]
        last = inits
        if lo is not None:
            for i in range(int(lo), int(hi), int(s)):
                check_deadline(here)
                r[iv] = np.asarray(i, idt)
                for a, v in zip(carried, vals):
                    r[a] = v
                _hand(fr, last, carried)
                body.run(fr)
                vals = [r[t] for t in body.term]
                last = body.term
        for out, v in zip(outs, vals):
            r[out] = v
        _hand(fr, last, outs)

    def _divergent_for(fr: Frame) -> None:
        r = fr.regs
        s = int(uniform(r[st], fr, "scf.for step (with bounds that differ between threads)",
                        loc))
        lo = np.broadcast_to(np.asarray(r[lb], np.int64), (fr.T,))
        hi = np.broadcast_to(np.asarray(r[ub], np.int64), (fr.T,))
        trips = np.maximum(-(-(hi - lo) // s), 0)
        saved = fr.mask
        base = np.ones(fr.T, bool) if saved is None else saved
        vals = [r[i] for i in inits]
        _hand(fr, inits, carried)
        for k in range(int(trips[base].max(initial=0))):
            check_deadline(here)
            go = base & (k < trips)
            fr.mask = go
            r[iv] = (lo + k * s).astype(idt)
            for a, v in zip(carried, vals):
                r[a] = v
            body.run(fr)
            vals = [_merge(go, r[t], v, vr, loc) for t, v, vr in zip(body.term, vals, vranks)]
            _hand(fr, body.term, carried, merge=True)
        fr.mask = saved
        for out, v in zip(outs, vals):
            r[out] = v
        _hand(fr, inits, outs)
        _hand(fr, carried, outs, merge=True)
    return step


def _differs(fr: Frame, x) -> bool:
    """Whether ``x`` has different values in the active threads."""
    a = np.asarray(x)
    if a.ndim == 0:
        return False
    if fr.mask is not None:
        a = a[fr.mask]
    return a.size > 0 and bool(np.any(a != a.flat[0]))


def _merge(cond: np.ndarray, a, b, vrank: int, where: str):
    """Per thread: ``a`` where ``cond`` else ``b``."""
    if isinstance(a, (np.ndarray, np.generic)) and isinstance(b, (np.ndarray, np.generic)):
        return np.where(thread_axis(cond, vrank), a, b)
    if a is b or a == b:
        return a
    raise Unsupported("scf.if yielding non-register values that differ between threads", where)


@rule("scf.if", accumulators=REGIONS)
def if_(o: Op) -> Step:
    (cond,) = o.ins
    then = o.region_block(0)
    has_else = len(o.op.regions) > 1 and len(o.op.regions[1].blocks) > 0
    other = o.region_block(1) if has_else else None
    outs = o.outs
    vranks = [t.vrank for t in o.out_types]
    loc = o.loc
    for branch in (then, other):
        if branch is not None:
            o.comp.hand_over(branch.term, outs)

    def step(fr: Frame) -> None:
        r = fr.regs
        c = np.asarray(r[cond])
        if c.ndim == 0:
            take: bool | None = bool(c)
        else:
            act = c if fr.mask is None else c[fr.mask]
            take = True if act.all() else False if not act.any() else None
        if take is not None:
            branch = then if take else other
            if branch is not None:
                branch.run(fr)
                for out, t in zip(outs, branch.term):
                    r[out] = r[t]
                _hand(fr, branch.term, outs)
            return
        saved = fr.mask
        base = np.ones(fr.T, bool) if saved is None else saved
        fr.mask = base & c
        then.run(fr)
        tv = [r[t] for t in then.term]
        ev = []
        if other is not None:
            fr.mask = base & ~c
            other.run(fr)
            ev = [r[t] for t in other.term]
        fr.mask = saved
        for out, a, b, vr in zip(outs, tv, ev, vranks):
            r[out] = _merge(c, a, b, vr, loc)
        _hand(fr, then.term, outs)
        if other is not None:
            _hand(fr, other.term, outs, merge=True)
    return step


@rule("scf.while", accumulators=REGIONS)
def while_(o: Op) -> Step:
    """A condition the same in every active thread loops them together; one
    that differs lets the threads whose condition is false leave (their
    results are what they forwarded then) while the others go on under a mask,
    until none is left -- as a SIMT machine runs a divergent loop."""
    before = o.region_block(0)
    after = o.region_block(1)
    inits, outs = o.ins, o.outs
    vranks = [t.vrank for t in o.out_types]
    loc = o.loc
    here = f"scf.while at {loc}"  # for the deadline's message
    forwarded = before.term[1:]
    o.comp.hand_over(inits, before.args)
    o.comp.hand_over(after.term, before.args)
    o.comp.hand_over(forwarded, after.args)
    o.comp.hand_over(forwarded, outs)

    def step(fr: Frame) -> None:
        r = fr.regs
        vals = [r[i] for i in inits]
        _hand(fr, inits, before.args)
        saved = fr.mask
        left: np.ndarray | None = None  # threads that left, once the condition diverged
        results: list = [None] * len(outs)
        while True:
            check_deadline(here)
            for a, v in zip(before.args, vals):
                r[a] = v
            before.run(fr)
            c, *fwd = before.term
            cond = np.asarray(r[c])
            fwd_vals = [r[f] for f in fwd]
            base = np.ones(fr.T, bool) if fr.mask is None else fr.mask
            together = _together(cond, base) if left is None else None
            if together is False:  # every active thread leaves
                results = fwd_vals
                break
            if together is None:  # diverged: the threads whose condition is false leave
                if left is None:
                    _forget(fr, outs)  # (then pending where the leaving threads' values are)
                _hand(fr, forwarded, outs, merge=True)
                go = base & np.broadcast_to(cond, (fr.T,))
                leaving = base & ~go
                for k, v in enumerate(fwd_vals):
                    results[k] = v if results[k] is None else _merge(leaving, v, results[k],
                                                                     vranks[k], loc)
                left = leaving if left is None else left | leaving
                if not go.any():
                    break
                fr.mask = go
            for a, v in zip(after.args, fwd_vals):
                r[a] = v
            _hand(fr, forwarded, after.args)
            after.run(fr)
            vals = [r[t] for t in after.term]
            _hand(fr, after.term, before.args)
        fr.mask = saved
        for out, v in zip(outs, results):
            r[out] = v
        _hand(fr, forwarded, outs, merge=left is not None)  # (left: outs were cleared)
    return step


def _together(cond: np.ndarray, active: np.ndarray) -> bool | None:
    """The condition every active thread has (False when none is active), or
    None where it differs between them."""
    if cond.ndim == 0:
        return bool(cond)
    a = cond[active]
    if a.size == 0:
        return False
    return bool(a[0]) if (a.all() or not a.any()) else None


@rule("scf.execute_region")
def execute_region(o: Op) -> Step:
    if len(o.op.regions[0].blocks) != 1:
        raise o.unsupported("scf.execute_region with several blocks")
    body = o.region_block()
    outs = o.outs
    o.comp.hand_over(body.term, outs)

    def step(fr: Frame) -> None:
        body.run(fr)
        for out, t in zip(outs, body.term):
            fr.regs[out] = fr.regs[t]
        _hand(fr, body.term, outs)
    return step


@rule("scf.index_switch", accumulators=REGIONS)
def index_switch(o: Op) -> Step:
    """A selector the same in every active thread runs its case; one that
    differs runs each case taken (in case order, then the default) under the
    mask of the threads that take it, and merges the yielded values per
    thread, as a divergent ``scf.if`` does."""
    cases = [int(c) for c in o.attr("cases")]
    default = o.region_block(0)
    blocks = [o.region_block(i + 1) for i in range(len(cases))]
    (arg,), outs = o.ins, o.outs
    vranks = [t.vrank for t in o.out_types]
    loc = o.loc
    for b in (default, *blocks):
        o.comp.hand_over(b.term, outs)

    def step(fr: Frame) -> None:
        r = fr.regs
        sel = np.asarray(r[arg])
        base = np.ones(fr.T, bool) if fr.mask is None else fr.mask
        act = sel if sel.ndim == 0 else sel[base]
        if sel.ndim == 0 or act.size == 0 or np.all(act == act.flat[0]):
            v = int(sel) if sel.ndim == 0 else (int(act.flat[0]) if act.size else None)
            b = blocks[cases.index(v)] if v in cases else default
            b.run(fr)
            for out, t in zip(outs, b.term):
                r[out] = r[t]
            _hand(fr, b.term, outs)
            return
        saved = fr.mask
        taken = np.zeros(fr.T, bool)
        results: list = [None] * len(outs)
        _forget(fr, outs)
        arms = [(blocks[k], sel == c) for k, c in enumerate(cases)]
        arms.append((default, ~np.isin(sel, cases)))
        for block, who in arms:
            m = base & who & ~taken
            if not m.any():
                continue
            taken |= m
            fr.mask = m
            block.run(fr)
            for k, t in enumerate(block.term):
                results[k] = r[t] if results[k] is None else _merge(m, r[t], results[k],
                                                                     vranks[k], loc)
            _hand(fr, block.term, outs, merge=True)
        fr.mask = saved
        for out, v in zip(outs, results):
            r[out] = v
    return step


