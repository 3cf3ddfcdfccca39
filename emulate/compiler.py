"""Compiles MLIR into Python closures, once per module.

Every SSA value gets a slot in a flat register list; every op becomes a
*step*, a closure ``step(frame)`` with its operand and result slots bound.
Rules (one per op name, in ``ops/*.py``) build the steps. An op with no rule
compiles to a step that raises :class:`Unsupported` when reached, so a module
runs as far as it is modelled and never past."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import irtypes
from .errors import Unsupported
from .machine import Frame

Step = Callable[[Frame], None]
Rule = Callable[["Op"], Step]
RULES: dict[str, Rule] = {}


def rule(*names: str) -> Callable[[Rule], Rule]:
    def register(fn: Rule) -> Rule:
        for n in names:
            RULES[n] = fn
        return fn
    return register


class Op:
    """The compile-time view of one op that rules see."""

    def __init__(self, op: Any, comp: "Compiler") -> None:
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
        return [irtypes.of(v) for v in self.op.operands]

    @property
    def out_types(self) -> list[irtypes.T]:
        return [irtypes.of(v) for v in self.op.results]

    def has(self, name: str) -> bool:
        return name in self.op.attributes

    def attr(self, name: str) -> Any:
        return self.op.attributes[name]

    def attr_or(self, name: str, default: Any) -> Any:
        return self.op.attributes[name] if name in self.op.attributes else default

    def unsupported(self, what: str | None = None) -> Unsupported:
        return Unsupported(what or f"op {self.name}", self.loc)

    def region_block(self, i: int = 0, b: int = 0) -> "BlockProgram":
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


class Compiler:
    """``checked``: once the module is compiled (:meth:`finish`), guard each
    op's operands for the synchronization checker -- a WGMMA accumulator read
    before the ``wgmma.wait_group`` covering it -- if the module has a WGMMA."""

    def __init__(self, checked: bool = False) -> None:
        self.slots: dict[Any, int] = {}
        self.checked = checked
        self.accumulators: set[int] = set()  # slots WGMMAs write (set by their rule)
        self._compiled: list[tuple[list[Step], int, Op, bool]] = []

    @property
    def nslots(self) -> int:
        return len(self.slots)

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
        for raw in block.operations:
            name = raw.operation.name
            if name in TERMINATORS:
                term_op = Op(raw.operation, self)
                term, term_name = term_op.ins, name
                continue
            o = Op(raw.operation, self)
            step = self.op(o)
            if self.checked and o.ins:
                passes = getattr(step, "passes_accumulators", False)
                self._compiled.append((steps, len(steps), o, passes))
            steps.append(step)
        return BlockProgram(args, steps, term, term_name, term_op)

    def op(self, o: "Op") -> Step:
        fn = RULES.get(o.name)
        if fn is None:
            return _unsupported_step(o.unsupported())
        try:
            return fn(o)
        except Unsupported as e:  # a rule refused this op's attributes or types
            return _unsupported_step(e)

    def finish(self) -> None:
        """Guards the steps that may read a WGMMA's accumulators: those taking
        a slot a WGMMA writes, or a move of one (found from the ops' operands;
        the guard costs a call per execution, so no other op has it)."""
        held = set(self.accumulators)
        grew = bool(held)
        while grew:  # what moves (and optimization barriers) make of them
            before = len(held)
            for _, _, o, passes in self._compiled:
                if (passes or o.name in MOVES) and not held.isdisjoint(o.ins):
                    held.update(o.outs)
            grew = len(held) > before
        for steps, k, o, passes in self._compiled:
            if not passes and not held.isdisjoint(o.ins):
                steps[k] = _guarded(steps[k], o)
        self._compiled = []


def passes_accumulators(step: Step) -> Step:
    """Marks a step that may take a WGMMA's accumulators before the wait (the
    next WGMMA, extracting them, an optimization barrier): it carries their
    pending state itself, and the checker does not guard it."""
    step.passes_accumulators = True  # type: ignore[attr-defined]
    return step


#: ops that only move register values (no instruction on the GPU, or a
#: register move): an accumulator they take stays pending in what they give
MOVES = frozenset({
    "llvm.extractvalue", "llvm.insertvalue", "llvm.bitcast", "vector.bitcast", "vector.shuffle",
    "vector.extract", "vector.insert", "vector.extract_strided_slice",
    "vector.insert_strided_slice", "vector.shape_cast", "vector.broadcast",
    "builtin.unrealized_conversion_cast"})
#: control flow: it hands values to its regions (an accumulator pending across
#: it is not followed there)
CONTROL = frozenset({"scf.for", "scf.while", "scf.if", "scf.index_switch", "gpu.launch"})


def _guarded(step: Step, o: Op) -> Step:
    """``step``, after checking that no operand is a WGMMA accumulator whose
    group no ``wgmma.wait_group`` has covered yet; its results are not (a
    move's results are pending like what it moved)."""
    ins, outs = o.ins, o.outs
    site = o.site()
    if o.name in CONTROL:
        return step
    if o.name in MOVES:
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

    def guarded(fr: Frame) -> None:
        pending = fr.pending
        if pending:
            for s in ins:
                if s in pending:
                    fr.sync.accumulator_read(fr, pending.pop(s), site)
            step(fr)
            for s in outs:
                pending.pop(s, None)
            return
        step(fr)
    return guarded


def _unsupported_step(err: Unsupported) -> Step:
    def step(fr: Frame) -> None:
        raise err
    return step
