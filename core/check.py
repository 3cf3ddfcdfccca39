"""``smalti plugins --check``: finds what is wrong with the installed plugins
before a kernel runs into it.

Building a pipeline stops at the first conflict; the check looks at every
rule on its own and reports everything it finds:

- plugins that could not take part (failed imports, unknown hooks or hook
  signatures, unsupported hook versions, malformed registrations);
- two plugins claiming one op (``SM001``) and stale overrides (``SM008``);
- rules whose architecture range contains no target (``SM010``);
- rules for ops that a registered dialect does not define (``SM011``);
- ``"module:attribute"`` references that do not resolve (``SM013``): a
  Pallas rule's primitive, or a :func:`~smalti.registry.deferred` rule's
  function, which nothing else imports before a kernel needs them.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from jax._src.lib.mlir import ir

from smalti.diagnostics import PluginError, SmaltiError
from smalti.kernels import make_context
from smalti.pipeline import Discovery
from smalti.registry import Arch, RuleKind, RuleRecord, installed_jax, resolve

#: The architectures Mosaic GPU compiles for. A rule supporting none of them
#: can never be used.
TARGETS: tuple[Arch, ...] = (
    (8, 0), (8, 6), (8, 7), (8, 9), (9, 0), (10, 0), (10, 1), (10, 3), (11, 0), (12, 0), (12, 1),
)


@dataclass(frozen=True, slots=True)
class Finding:
    """One problem, and the plugin it concerns (``None`` when it concerns several)."""

    plugin: str | None
    error: SmaltiError


def check(discovery: Discovery, context: ir.Context | None = None) -> list[Finding]:
    """Every problem with the discovered plugins; an empty list if there is none."""
    findings = [Finding(p.plugin, p.error) for p in discovery.problems]
    findings += _conflicts(discovery)
    findings += [Finding(r.plugin, e) for r, e in _without_target(discovery.records)]
    context = context or make_context()
    findings += [Finding(r.plugin, e) for r, e in _unknown_ops(discovery.records, context)]
    findings += [Finding(r.plugin, e) for r, e in _unresolved(discovery.records)]
    return findings


def _conflicts(discovery: Discovery) -> list[Finding]:
    # One op at a time, so that a conflict does not hide the next one.
    grouped: dict[tuple[RuleKind, str], list[RuleRecord]] = defaultdict(list)
    for record in discovery.records:
        grouped[record.kind, record.key].append(record)
    findings = []
    for _, group in sorted(grouped.items(), key=lambda item: item[0][1]):
        try:
            discovery.pipeline(group)
        except SmaltiError as e:
            plugins = sorted({r.plugin for r in group})
            findings.append(Finding(plugins[0] if len(plugins) == 1 else None, e))
    return findings


def _without_target(records: list[RuleRecord]) -> list[tuple[RuleRecord, SmaltiError]]:
    found: list[tuple[RuleRecord, SmaltiError]] = []
    for record in records:
        if any(record.archs.supports(arch) for arch in TARGETS):
            continue
        archs = record.archs
        empty = (archs.minimum is not None and archs.maximum is not None
                 and archs.minimum > archs.maximum)
        why = "is empty (its minimum is above its maximum)" if empty else \
            "contains none of the architectures Mosaic GPU targets"
        found.append((record, PluginError(
            "SM010",
            f"plugin {record.plugin!r} registers a {record.kind.value} rule for "
            f"{record.key!r} whose architecture range {why}",
            values={"rule": record.name, "archs": repr(archs),
                    "targets": ", ".join(f"sm_{a}{b}" for a, b in TARGETS)},
            fix="correct the archs= argument of the registration (bounds are included)",
        )))
    return found


#: Rule kinds keyed by a Pallas primitive's (or a rewrite's) name, not by an op's.
_PRIMITIVE_KINDS = frozenset({RuleKind.PALLAS, RuleKind.PALLAS_RESOURCES,
                              RuleKind.PALLAS_REWRITE})


def _unknown_ops(records: list[RuleRecord],
                 context: ir.Context) -> list[tuple[RuleRecord, SmaltiError]]:
    found: list[tuple[RuleRecord, SmaltiError]] = []
    seen = set()
    jax = installed_jax()
    for record in records:
        if record.kind in _PRIMITIVE_KINDS or (record.plugin, record.key) in seen:
            continue  # Pallas rules are keyed by primitive, not op
        if not record.jax.supports(jax):
            continue  # a rule for another jax, whose dialect may differ (mosaic_gpu.wait)
        seen.add((record.plugin, record.key))
        dialect, dot, _ = record.key.partition(".")
        if not dot or not context.is_dialect_loaded(dialect):
            continue  # an unregistered dialect: nothing to check against
        if context.is_registered_operation(record.key):
            continue
        found.append((record, PluginError(
            "SM011",
            f"plugin {record.plugin!r} registers a {record.kind.value} rule for "
            f"{record.key!r}, but the {dialect!r} dialect defines no such op",
            values={"rule": record.name},
            fix=[f"check the spelling of {record.key!r} (as printed in the kernel's MLIR)",
                 "or drop the rule if the op is not in the installed jax"],
        )))
    return found


def _unresolved(records: list[RuleRecord]) -> list[tuple[RuleRecord, SmaltiError]]:
    found: list[tuple[RuleRecord, SmaltiError]] = []
    jax = installed_jax()
    for record in records:
        if not record.jax.supports(jax):
            continue  # a rule for another jax may name what this one lacks
        references = [("function", getattr(record.function, "reference", None)),
                      ("primitive", record.target)]
        for what, reference in references:
            if not isinstance(reference, str):
                continue
            try:
                resolved = resolve(reference)
            except Exception as e:  # noqa: BLE001 -- any failure to import is the finding
                why = f"{type(e).__name__}: {e}"
            else:
                if what == "primitive" or callable(resolved):
                    continue
                why = f"it names {type(resolved).__name__} {resolved!r}, which is not callable"
            found.append((record, PluginError(
                "SM013",
                f"plugin {record.plugin!r} registers a {record.kind.value} rule for "
                f"{record.key!r} whose {what} {reference!r} does not resolve: {why}",
                values={"rule": record.name, what: reference},
                fix=[f"check the spelling of {reference!r} ('package.module:attribute')",
                     "or register the rule only for the jax versions that have it "
                     "(jax=JaxVersions(...))"],
            )))
    return found
