"""What smalti does with an op none of whose rules supports the target architecture.

Rules are scoped to architectures (``archs=`` when a plugin registers them;
``smalti plugins`` shows the ranges). jax's own inference and lowering do not
check the architecture at all: they infer a Blackwell kernel for ``(9, 0)``
— the architecture ``mgpu.utils._infer_arch()`` reports on a machine without a
GPU — exactly as for ``(10, 0)``. So that smalti never refuses what jax
accepts, the default policy is *lenient*: such an op is handled by the rule
whose architecture range comes nearest, and smalti warns once per op name and
call with SM002's full text (the op, the architecture, the plugin, the fix),
as an :class:`ArchitectureWarning`; the inference and lowering reports list
the same texts in ``arch_fallbacks``.

The *strict* policy — ``strict_arch=True`` to :func:`smalti.infer_layouts` and
:func:`smalti.lower`, or the environment variable ``SMALTI_STRICT_ARCH=1`` —
refuses such an op with the SM002 error instead.
"""

from __future__ import annotations

import os
import warnings

from jax._src.lib.mlir import ir

from smalti.diagnostics import SmaltiNotImplementedError
from smalti.registry import Arch, RuleKind, RuleRecord

STRICT_ARCH_ENV = "SMALTI_STRICT_ARCH"


class ArchitectureWarning(UserWarning):
    """An op was handled by a rule that does not declare support for the
    target architecture (SM002; see :mod:`smalti.arch_policy`)."""

    def __init__(self, error: SmaltiNotImplementedError) -> None:
        self.code = error.code
        self.op = error.op
        self.location = error.location
        super().__init__(error.render())


def strict(setting: bool | None) -> bool:
    """The policy in force: ``setting`` if given, else ``SMALTI_STRICT_ARCH``."""
    if setting is not None:
        return setting
    return os.environ.get(STRICT_ARCH_ENV, "").strip().lower() not in ("", "0", "false", "no")


def nearest(records: list[RuleRecord], arch: Arch) -> RuleRecord:
    """The rule whose architecture range comes nearest ``arch`` (the first
    registered among equals)."""
    return min(records, key=lambda record: record.archs.distance(arch))


def unsupported(op: ir.Operation, arch: Arch, kind: RuleKind, records: list[RuleRecord],
                used: RuleRecord | None = None) -> SmaltiNotImplementedError:
    """SM002 for ``op`` on ``arch``, whose ``kind`` rules are ``records``;
    ``used``: the rule the lenient policy handles it with."""
    owners = ", ".join(f"{r.plugin} (archs {r.archs})" for r in records)
    target = f"sm_{arch[0]}{arch[1]}"
    message = f"{op.name} is not supported on {target}"
    values = {"architecture": f"{arch}", "handled by": owners}
    fix = [f"compile for an architecture {owners} supports, or install a plugin that "
           f"provides {op.name} for {target}"]
    if used is None:
        fix.append(f"or unset {STRICT_ARCH_ENV} / pass strict_arch=False to use the nearest "
                   "rule with a warning, as jax does")
    else:
        message += (f": using the {kind.value} rule {used.name} of {used.plugin} "
                    f"(archs {used.archs}), as jax does")
        fix.append(f"set {STRICT_ARCH_ENV}=1 or pass strict_arch=True to make this an error")
    return SmaltiNotImplementedError("SM002", message, op=op, values=values, fix=fix)


def warn_fallbacks(used: dict[str, ir.Operation], table: dict[str, RuleRecord],
                   rules: dict[str, list[RuleRecord]], arch: Arch, kind: RuleKind,
                   stacklevel: int) -> list[str]:
    """Warns once for each op name in ``used`` (the first op of that name) that
    the lenient policy handled with ``table``'s rule; returns the texts."""
    texts = []
    for name, op in used.items():
        error = unsupported(op, arch, kind, rules[name], table[name])
        warnings.warn(ArchitectureWarning(error), stacklevel=stacklevel + 1)
        texts.append(error.render())
    return texts

