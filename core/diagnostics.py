"""smalti's errors: a stable code, the op and its location, the values involved, a fix.

Every error a user (a kernel author or a plugin author) can cause is raised as
a subclass of :class:`SmaltiError`. Each concrete class also derives from the
built-in exception class jax raises for the same situation (``ValueError`` or
``NotImplementedError``), so code written against jax keeps working.

The long form of every code lives in :mod:`smalti.codes` and is printed by
``smalti explain CODE``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from jax._src.lib.mlir import ir

from smalti import codes

_FILE_LOC = re.compile(r'"([^"]+)":(\d+)(?::(\d+))?')


def format_location(location: ir.Location | None) -> str | None:
    """Renders an MLIR location as ``file:line[:col]``, or ``None`` if unknown.

    Pallas and Mosaic GPU wrap the user's frame in name and call-site locations;
    the innermost file location is the line of Python that built the op.
    """
    if location is None:
        return None
    text = str(location)
    found = _FILE_LOC.findall(text)
    if not found:
        return None
    # In `callsite(callee at caller)`, the callee (the first file) is the
    # innermost frame, which is the user's line.
    file, line, col = found[0]
    return f"{file}:{line}" + (f":{col}" if col else "")


def describe_op(op: ir.Operation | ir.OpView) -> str:
    """A one-line description of an op: its name, operand and result types."""
    operation = op.operation
    operands = ", ".join(str(v.type) for v in operation.operands)
    results = ", ".join(str(r.type) for r in operation.results)
    return f"{operation.name}({operands})" + (f" -> {results}" if results else "")


class SmaltiError(Exception):
    """Base class of every error smalti raises.

    Attributes:
      code: The stable error code (see ``smalti explain CODE``).
      message: What went wrong, in one or a few sentences.
      op: A description of the op at fault, if any.
      location: ``file:line`` of the op at fault, if the module carries it.
      values: The offending values, by name.
      fix: At least one concrete way to fix the problem.
    """

    def __init__(
        self,
        code: str,
        message: str,
        *,
        op: ir.Operation | ir.OpView | None = None,
        location: str | None = None,
        values: Mapping[str, Any] | None = None,
        fix: str | Iterable[str] = (),
    ) -> None:
        if code not in codes.CATALOGUE:
            raise KeyError(f"smalti internal error: unknown error code {code!r}")
        self.code = code
        self.message = message
        self.op = describe_op(op) if op is not None else None
        if location is None and op is not None:
            location = format_location(op.operation.location)
        self.location = location
        self.values = dict(values or {})
        self.fixes = [fix] if isinstance(fix, str) else list(fix)
        super().__init__(self.render())

    def render(self) -> str:
        lines = [f"[{self.code}] {self.message}"]
        if self.op is not None:
            where = f" at {self.location}" if self.location else ""
            lines.append(f"  op: {self.op}{where}")
        elif self.location:
            lines.append(f"  at: {self.location}")
        for name, value in self.values.items():
            lines.append(f"  {name}: {value}")
        for fix in self.fixes:
            lines.append(f"  fix: {fix}")
        lines.append(f"  (run `smalti explain {self.code}` for details)")
        return "\n".join(lines)


class SmaltiValueError(SmaltiError, ValueError):
    """A user error in the kernel or its layouts (jax raises ``ValueError``)."""


class SmaltiNotImplementedError(SmaltiError, NotImplementedError):
    """Something valid that no registered rule supports (jax raises ``NotImplementedError``)."""

    #: Whether jax's own rule certainly fails too (set by a plugin's refusal
    #: that hands other cases to jax's rule: smalti.vocabulary's).
    jax_cannot: bool = False


class PluginError(SmaltiError, ValueError):
    """A plugin is misconfigured or misbehaves: conflicts, crashes, malformed rules."""


class UnsatisfiableLayoutsError(SmaltiValueError):
    """No layout assignment satisfies the kernel's constraints.

    ``conflict`` holds the constraints that cannot hold together, each with the
    op and location it came from.
    """

    def __init__(self, message: str, *, conflict: list[str], **kwargs: Any) -> None:
        self.conflict = conflict
        super().__init__("SM101", message, **kwargs)
