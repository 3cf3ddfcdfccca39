"""Running a run of one elementwise op as one numpy call.

A layout's register tile is computed one register at a time: ``exp`` of a
(128, 128) f32 block in WGMMA's layout is 64 ``math.exp`` of
``vector<2xf32>`` one after another, then 64 ``arith.mulf``, and so on.
Each costs the emulator a numpy call for its few elements per thread, far
above the work, so such a run runs as one call at the place of its last op:
each operand position stacked along a new leading axis (one the whole run
shares, such as a splat constant, is passed once: it broadcasts), the result
split back into each op's.

A step that can run so carries an :class:`Elementwise` (``step.elementwise``;
:func:`.ops._util.unary`/``binary`` with ``batch=True``): its function, which
computes each element from the same elements of its operands and accepts a
leading axis (numpy ufuncs and arithmetic on them: arith's arithmetic and
comparisons, math's functions), and what must be equal for two ops to
batch (the op name, the function -- so the attributes it was made from --
and the operand and result types). A run is batched only where that
changes nothing observable:

* its ops agree on that key, and none uses another's result;
* between them are only pure ops (:func:`.liveness.is_pure`) that use none
  of the run's results, and no op whose rule refused it;
* nothing in it was already replaced by :mod:`.fusion` (which runs first);
* the module is not being profiled (the profiler counts each instruction).

Every element is computed by the same function from the same operands as
op by op; the results are read only after the run's last place. The WGMMA
accumulator guards (:meth:`.compiler.Compiler.finish`) stay at each op's
place."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

import numpy as np

from .fusion import Entry, nothing
from .liveness import is_pure
from .machine import Frame
from .stacks import Splits

Step = Callable[[Frame], None]


@dataclass(frozen=True)
class Elementwise:
    """What :func:`batch` needs of an elementwise op's step."""

    key: Hashable  # equal for ops that may batch
    fn: Callable  # elementwise, indifferent to a leading axis
    # per operand: the vector shape (() for a scalar) a thread's value has
    shapes: tuple[tuple[int, ...], ...]


def batch(entries: Sequence[Entry], steps: list[Step], splits: Splits) -> None:
    """Replaces, in ``steps`` (one per entry), each run of one elementwise op:
    its ops but the last by nothing, the last by the run's one call (which
    keeps its stacked results in ``splits``, and takes stacked operands
    from there where a run split them)."""
    k = 0
    while k < len(entries):
        first = _elementwise(steps[k])
        if first is None:
            k += 1
            continue
        members, made = [k], set(entries[k].outs)
        j = k + 1
        while j < len(entries):
            entry = entries[j]
            if steps[j] is not entry.step:  # (replaced by .fusion)
                break
            uses = not made.isdisjoint(entry.ins)
            this = _elementwise(steps[j])
            if this is not None and this.key == first.key and not uses:
                members.append(j)
                made.update(entry.outs)
            elif uses or not is_pure(entry.name) or hasattr(entry.step, "refused"):
                break
            j += 1
        if len(members) > 1:
            for m in members[:-1]:
                steps[m] = nothing
            steps[members[-1]] = _batched(first, [entries[m] for m in members], splits)
            k = members[-1] + 1
        else:
            k += 1


def _elementwise(step: Step) -> Elementwise | None:
    return getattr(step, "elementwise", None)  # (never on a step .fusion made)


def _batched(op: Elementwise, run: list[Entry], splits: Splits) -> Step:
    """The run's one call: per operand position, the one slot all share or
    each op's stacked (each held per thread where any operand is)."""
    fn, shapes = op.fn, op.shapes
    columns = [tuple(col) for col in zip(*(e.ins for e in run))]  # per position: each op's slot
    shared = [len(set(col)) == 1 for col in columns]
    outs = [e.outs[0] for e in run]
    split = splits.made(outs)

    def step(fr: Frame) -> None:
        r = fr.regs
        per_thread = any(np.ndim(r[s]) > len(shape)
                         for col, shape in zip(columns, shapes) for s in col)
        args: list = []
        made: dict[tuple[int, ...], np.ndarray] = {}  # (x * x stacks x once)
        for col, shape, one in zip(columns, shapes, shared):
            if one:
                args.append(r[col[0]])
                continue
            stack = made.get(col)
            if stack is None:
                stack = made[col] = _stacked(fr, r, col, shape, per_thread, splits)
            args.append(stack)
        got = fn(*args)
        if all(shared):  # the same op of the same values, again and again
            for s in outs:
                r[s] = got
            return
        values = list(got)
        for s, v in zip(outs, values):
            r[s] = v
        split.keep(got, values)
    return step


def _stacked(fr: Frame, r: list, col: tuple[int, ...], shape: tuple[int, ...], per_thread: bool,
             splits: Splits) -> np.ndarray:
    """The values of slots ``col`` stacked on a leading axis: as a run split
    them where one did, else stacked now."""
    stack = splits.stacked(r, col)
    if stack is not None:
        if per_thread and stack.ndim == 1 + len(shape):  # the same in every thread
            stack = stack.reshape(stack.shape[:1] + (1,) + shape)
        return stack
    values = [np.asarray(r[s]) for s in col]
    if per_thread:
        full = (fr.T,) + shape
        values = [v if v.shape == full else np.broadcast_to(v, full) for v in values]
    return np.stack(values)
