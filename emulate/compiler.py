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
    def __init__(self) -> None:
        self.slots: dict[Any, int] = {}

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
            steps.append(self.op(raw.operation))
        return BlockProgram(args, steps, term, term_name, term_op)

    def op(self, raw: Any) -> Step:
        o = Op(raw, self)
        fn = RULES.get(o.name)
        if fn is None:
            return _unsupported_step(o.unsupported())
        try:
            return fn(o)
        except Unsupported as e:  # a rule refused this op's attributes or types
            return _unsupported_step(e)


def _unsupported_step(err: Unsupported) -> Step:
    def step(fr: Frame) -> None:
        raise err
    return step
