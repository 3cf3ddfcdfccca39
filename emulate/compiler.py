"""Compiles MLIR into Python closures, once per module.

Every SSA value gets a slot in a flat register list; every op becomes a
*step*, a closure ``step(frame)`` with its operand and result slots bound.
Rules (one per op name, in ``ops/*.py``) build the steps. An op with no rule
compiles to a step that raises :class:`Unsupported` when reached, so a module
runs as far as it is modelled and never past."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from . import irtypes
from .batching import batch
from .errors import Unsupported
from .fusion import Entry, fuse, nothing
from .machine import Frame
from .stacks import Splits

Step = Callable[[Frame], None]
Rule = Callable[["Op"], Step]
RULES: dict[str, Rule] = {}

# How an op treats a WGMMA accumulator not yet waited for (the checker's):
READS = "reads"  # the default: using it is a race on registers
MOVES = "moves"  # only moves registers (no instruction, or a move): what it gives is pending too
REGIONS = "regions"  # control flow: hands values to and from its regions (Compiler.hand_over)
OWNS = "owns"  # the step keeps the pending state itself (a WGMMA)
ACCUMULATOR_USE: dict[str, str] = {}  # op name -> MOVES or REGIONS, as its rule declares


def rule(*names: str, accumulators: str = READS) -> Callable[[Rule], Rule]:
    """Registers a rule for ops ``names``; ``accumulators`` says how they treat
    a WGMMA accumulator before its wait (:data:`MOVES`, :data:`REGIONS`)."""
    def register(fn: Rule) -> Rule:
        for n in names:
            RULES[n] = fn
            if accumulators != READS:
                ACCUMULATOR_USE[n] = accumulators
        return fn
    return register


def accumulator_use(step: Step, use: str) -> Step:
    """Marks one step (where its op's rule covers other forms too, as
    ``llvm.inline_asm``'s does) with how it treats pending accumulators."""
    step.accumulators = use
    return step


class Op:
    """The compile-time view of one op that rules see."""

    def __init__(self, op: Any, comp: Compiler) -> None:
        self.op = op
        self.name: str = op.name
        self.comp = comp
        self.ins: list[int] = [comp.slot(v) for v in op.operands]
        self.outs: list[int] = [comp.slot(v) for v in op.results]

    @property
    def loc(self) -> str:
        return str(self.op.location)

    def site(self, op: str | None = None):
        """What the synchronization checker reports of this op (``op``: the
        PTX instruction an inline-asm op executes)."""
        from .sync.reports import primitive_name, source_line
        from .sync.shadow import OpSite

        loc = self.loc
        return OpSite(op or self.name, source_line(loc), primitive_name(loc))

    @property
    def in_types(self) -> list[irtypes.T]:
        return [self.comp.type_of(v) for v in self.op.operands]

    @property
    def out_types(self) -> list[irtypes.T]:
        return [self.comp.type_of(v) for v in self.op.results]

    def has(self, name: str) -> bool:
        return name in self.op.attributes

    def attr(self, name: str) -> Any:
        return self.op.attributes[name]

    def attr_or(self, name: str, default: Any) -> Any:
        return self.op.attributes[name] if name in self.op.attributes else default

    def unsupported(self, what: str | None = None) -> Unsupported:
        return Unsupported(what or f"op {self.name}", self.loc)

    def region_block(self, i: int = 0, b: int = 0) -> BlockProgram:
        return self.comp.block(self.op.regions[i].blocks[b])

    def segments(self, name: str = "operandSegmentSizes") -> list[list[int]]:
        """Operand slots split by the op's segment sizes."""
        sizes = list(self.attr(name))
        out, i = [], 0
        for s in sizes:
            out.append(self.ins[i:i + s])
            i += s
        return out


class BlockProgram:
    """A block's steps, its argument slots and its terminator's operand slots."""

    __slots__ = ("args", "steps", "term", "term_name", "term_op")

    def __init__(self, args: list[int], steps: list[Step], term: list[int], term_name: str,
                 term_op: Op | None) -> None:
        self.args = args
        self.steps = steps
        self.term = term
        self.term_name = term_name
        self.term_op = term_op

    def run(self, fr: Frame) -> None:
        for s in self.steps:
            s(fr)


TERMINATORS = {"scf.yield", "scf.condition", "gpu.terminator", "func.return", "gpu.return",
               "llvm.return"}

#: Ops whose results depend only on a thread's place in its group of threads
#: and the block's shape: the same in every block of a launch and every launch.
THREAD_PLACE = frozenset({
    "gpu.thread_id", "gpu.block_dim", "gpu.lane_id",
    "nvvm.read.ptx.sreg.tid.x", "nvvm.read.ptx.sreg.tid.y", "nvvm.read.ptx.sreg.tid.z",
    "nvvm.read.ptx.sreg.ntid.x", "nvvm.read.ptx.sreg.ntid.y", "nvvm.read.ptx.sreg.ntid.z",
    "nvvm.read.ptx.sreg.laneid",
})
CONSTANTS = frozenset({"arith.constant", "llvm.mlir.constant"})


class Compiler:
    """``checked``: once the module is compiled (:meth:`finish`), guard each
    op's operands for the synchronization checker -- a WGMMA accumulator read
    before the ``wgmma.wait_group`` covering it -- if the module has a WGMMA.
    ``dead``: operations to leave out (:func:`.liveness.dead_ops`: what a
    GPU compiler removes)."""

    def __init__(self, checked: bool = False, profiled: bool = False,
                 dead: set[Any] | frozenset[Any] = frozenset()) -> None:
        self.dead = dead
        self.slots: dict[Any, int] = {}
        self.checked = checked
        self.profiled = profiled  # wrap steps to count instructions (.profiling)
        self.accumulators: set[int] = set()  # slots WGMMAs write (set by their rule)
        # (from, to) slots control flow copies values along (region arguments, yields)
        self.handoffs: list[tuple[int, int]] = []
        self._compiled: list[tuple[list[Step], int, Op, str]] = []
        # each block's steps, and per step its place-only form (see merge_placed)
        self._blocks: list[tuple[list[Step], list[PlaceOnly | None]]] = []
        # slots whose value depends only on the thread's place (see per_group)
        self.placed: set[int] = set()
        self._types: dict[Any, irtypes.T] = {}  # (see type_of)

    @property
    def nslots(self) -> int:
        return len(self.slots)

    def type_of(self, value: Any) -> irtypes.T:
        """``value``'s type, parsed once per type this compilation meets
        (MLIR uniques types in a context: printing one costs microseconds,
        a lookup by it a tenth of one)."""
        t = value.type
        got = self._types.get(t)
        if got is None:
            got = self._types[t] = irtypes.of(t)
        return got

    def slot(self, value: Any) -> int:
        s = self.slots.get(value)
        if s is None:
            s = self.slots[value] = len(self.slots)
        return s

    def block(self, block: Any) -> BlockProgram:
        args = [self.slot(a) for a in block.arguments]
        steps: list[Step] = []
        term: list[int] = []
        term_name = ""
        term_op = None
        entries: list[Entry] = []  # for .fusion
        place_only: list[PlaceOnly | None] = []  # for merge_placed
        for raw in block.operations:
            name = raw.operation.name
            if name in TERMINATORS:
                term_op = Op(raw.operation, self)
                term, term_name = term_op.ins, name
                continue
            if raw.operation in self.dead:
                continue
            o = Op(raw.operation, self)
            step = computes = self.op(o)
            placed = self._placed(o)
            if placed:
                step = per_group(step, o.outs)
            if self.checked and o.ins:
                use = getattr(step, "accumulators", None) or ACCUMULATOR_USE.get(o.name, READS)
                self._compiled.append((steps, len(steps), o, use))
            if self.profiled:
                from .profiling import counting
                step = counting(step, o)
            else:
                entries.append(Entry(o.name, o.ins, o.outs, step))
                only = placed or o.name in CONSTANTS
                place_only.append((step, computes, o.outs) if only else None)
            steps.append(step)
        if entries:  # runs as one step (not profiled: it counts each instruction)
            splits = Splits()
            fuse(entries, steps, splits)
            batch(entries, steps, splits)
            self._blocks.append((steps, place_only))
        return BlockProgram(args, steps, term, term_name, term_op)

    def hand_over(self, sources: list[int], targets: list[int]) -> None:
        """Control flow copies ``sources`` into ``targets`` (a region's
        arguments, its yields into the op's results): a WGMMA accumulator
        pending in one is pending in the other (see :meth:`finish`)."""
        self.handoffs.extend(zip(sources, targets))

    def _placed(self, o: Op) -> bool:
        """Whether ``o``'s results depend only on the thread's place: a read
        of it, or integer and float arithmetic of such values and constants
        (``arith`` ops are pure and compute every thread, masked or not).
        Records its results as such; constants need no cache."""
        name = o.name
        if name in CONSTANTS:
            self.placed.update(o.outs)
            return False
        if name in THREAD_PLACE or (name.startswith("arith.") and o.ins and o.outs
                                    and self.placed.issuperset(o.ins)):
            self.placed.update(o.outs)
            return True
        return False

    def op(self, o: Op) -> Step:
        fn = RULES.get(o.name)
        if fn is None:
            return _unsupported_step(o.unsupported())
        try:
            return fn(o)
        except Unsupported as e:  # a rule refused this op's attributes or types
            return _unsupported_step(e)

    def finish(self) -> None:
        """Guards the steps that may take a WGMMA's accumulators: those whose
        operands are slots a WGMMA writes, or moves of them (found from the
        operands; a guard costs a call per execution, so no other step has it);
        then merges each block's runs of place-only steps (:func:`merge_placed`)."""
        held = set(self.accumulators)
        grew = bool(held)
        while grew:  # what moves and control flow make of them
            before = len(held)
            for _, _, o, use in self._compiled:
                if use in (MOVES, OWNS) and not held.isdisjoint(o.ins):
                    held.update(o.outs)
            held.update(t for s, t in self.handoffs if s in held)
            grew = len(held) > before
        for steps, k, o, use in self._compiled:
            if held.isdisjoint(o.ins):
                continue
            if use == READS:
                steps[k] = _reading(steps[k], o)
            elif use == MOVES:
                steps[k] = _moving(steps[k], o)
        self._compiled = []
        for steps, place_only in self._blocks:
            steps[:] = merge_placed(steps, place_only)
        self._blocks = []


def per_group(step: Step, outs: list[int]) -> Step:
    """``step``, its results kept per group of threads (the block's shape,
    the group's first thread and size: ``Block.group_key``) after its first
    execution there and handed out again after: thread-id arithmetic, which
    is a large part of a small kernel's ops, is then computed once per
    program, not once per block and launch. The kept arrays are read-only."""
    return placed_run([step], outs)


#: a step whose results depend only on the thread's place, or a constant's:
#: (the step as compiled, the step computing its results, their slots)
PlaceOnly = tuple[Step, Step, list[int]]


def merge_placed(steps: list[Step], place_only: list[PlaceOnly | None]) -> list[Step]:
    """``steps`` with each run of consecutive steps that only compute
    place-only values (:func:`per_group`'s) and constants -- or do nothing,
    their work done by a fused run's last step -- as one step, kept per
    group of threads as :func:`per_group` keeps one: a kernel's index
    arithmetic comes in such runs, tens of steps each, and handing out a
    run's values costs a lookup per run, not one per op. ``place_only``
    tells, per step, its place-only form (None: not one)."""
    merged: list[Step] = []
    run: list[PlaceOnly] = []
    for step, only in zip(steps, place_only):
        if step is nothing:
            continue
        if only is not None and only[0] is step:  # (not wrapped since: see finish)
            run.append(only)
            continue
        merged.extend(_as_one(run))
        run = []
        merged.append(step)
    merged.extend(_as_one(run))
    return merged


def _as_one(run: list[PlaceOnly]) -> list[Step]:
    if len(run) < 2:
        return [compiled for compiled, _, _ in run]
    return [placed_run([step for _, step, _ in run], [slot for _, _, outs in run for slot in outs])]


def placed_run(steps: list[Step], outs: list[int]) -> Step:
    """``steps`` (place-only or constant), their results ``outs`` kept per
    group of threads after their first execution there (see
    :func:`per_group`)."""
    kept: dict[tuple, tuple] = {}

    def run(fr: Frame) -> None:
        block = fr.block
        if block is None:
            for step in steps:
                step(fr)
            return
        regs = fr.regs
        got = kept.get(block.group_key)
        if got is None:
            for step in steps:
                step(fr)
            kept[block.group_key] = tuple(_read_only(regs[slot]) for slot in outs)
            return
        for slot, value in zip(outs, got):
            regs[slot] = value
    return run


def _read_only(value: Any) -> Any:
    if isinstance(value, np.ndarray) and value.flags.writeable:
        value.setflags(write=False)
    return value


def _moving(step: Step, o: Op) -> Step:
    """``step``, its results pending like the accumulator it moved."""
    ins, outs = o.ins, o.outs

    def moved(fr: Frame) -> None:
        step(fr)
        pending = fr.pending
        if pending:
            held = [pending[s] for s in ins if s in pending]
            for s in outs:
                if held:
                    pending[s] = held[0]
                else:
                    pending.pop(s, None)
    return moved


def _reading(step: Step, o: Op) -> Step:
    """``step``, after reporting each operand that is a WGMMA accumulator no
    ``wgmma.wait_group`` has covered yet; its results are not pending."""
    ins, outs = o.ins, o.outs
    site = o.site()

    def guarded(fr: Frame) -> None:
        pending, sync = fr.pending, fr.sync
        if pending and sync is not None:  # only the checker leaves accumulators pending
            for s in ins:
                if s in pending:
                    sync.accumulator_read(fr, pending.pop(s), site)
            step(fr)
            for s in outs:
                pending.pop(s, None)
            return
        step(fr)
    return guarded


def _unsupported_step(err: Unsupported) -> Step:
    def step(fr: Frame) -> None:
        raise err
    step.refused = err  # (.fusion: moves no refused op)
    return step
