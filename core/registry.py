"""The typed registries handed to plugins, and the records they produce.

Each registration hook receives a registry bound to the plugin being called,
so every rule knows which plugin it came from: conflicts, crashes and the
``smalti plugins`` table name it.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable
from typing import Any

from smalti.diagnostics import PluginError
from smalti.records import Record

Arch = tuple[int, int]


def _arch(value: Any) -> Arch | None:
    if value is None:
        return None
    value = tuple(value)
    if len(value) != 2 or not all(isinstance(v, int) for v in value):
        raise ValueError(f"an architecture is a (major, minor) pair of ints, got {value!r}")
    return value  # type: ignore[return-value]


class Architectures(Record):
    """A range of GPU architectures ``(major, minor)``, bounds included."""

    __slots__ = ("minimum", "maximum")
    minimum: Arch | None
    maximum: Arch | None

    def __init__(self, minimum: Iterable[int] | None = None,
                 maximum: Iterable[int] | None = None) -> None:
        self._set(_arch(minimum), _arch(maximum))

    def supports(self, arch: Arch) -> bool:
        return (self.minimum is None or arch >= self.minimum) and (
            self.maximum is None or arch <= self.maximum
        )

    def distance(self, arch: Arch) -> Arch:
        """How far ``arch`` lies outside the range, as a (major, minor) gap:
        ``(0, 0)`` inside it. Orders the rules of an op by how near they come."""
        if self.minimum is not None and arch < self.minimum:
            return (self.minimum[0] - arch[0], self.minimum[1] - arch[1])
        if self.maximum is not None and arch > self.maximum:
            return (arch[0] - self.maximum[0], arch[1] - self.maximum[1])
        return (0, 0)

    def overlaps(self, other: Architectures) -> bool:
        lo = max((a for a in (self.minimum, other.minimum) if a is not None), default=None)
        hi = min((a for a in (self.maximum, other.maximum) if a is not None), default=None)
        return lo is None or hi is None or lo <= hi

    def __str__(self) -> str:
        fmt = lambda a: f"sm_{a[0]}{a[1]}"
        if self.minimum is None and self.maximum is None:
            return "any"
        if self.maximum is None:
            return f">={fmt(self.minimum)}"
        if self.minimum is None:
            return f"<={fmt(self.maximum)}"
        if self.minimum == self.maximum:
            return fmt(self.minimum)
        return f"{fmt(self.minimum)}..{fmt(self.maximum)}"


ANY_ARCH = Architectures()
HOPPER_AND_LATER = Architectures(minimum=(9, 0))
BLACKWELL_AND_LATER = Architectures(minimum=(10, 0))


class RuleKind(enum.Enum):
    CONSTRAINT = "constraint"
    LOWERING = "lowering"
    PALLAS = "pallas"


class RuleRecord(Record):
    """One rule as registered: what it handles, where it came from."""

    __slots__ = ("kind", "key", "function", "plugin", "archs", "overrides", "target",
                 "opaque_regions", "warp_semantics", "warp_regions")
    kind: RuleKind
    key: str  # op name, or a Pallas primitive's name
    function: Callable[..., Any]
    plugin: str
    archs: Architectures
    overrides: str | None
    target: Any  # the Pallas primitive object, for PALLAS rules
    #: The op's regions are already at Lane level: inference and lowering's
    #: checks do not enter them (e.g. ``mosaic_gpu.custom_primitive``).
    opaque_regions: bool
    #: A lowering rule that may run under warp semantics (inside a
    #: ``mosaic_gpu.warp_map``, where ``ctx.thread_semantics`` is WARP).
    warp_semantics: bool
    #: A lowering rule that lowers the op's regions under warp semantics
    #: (``mosaic_gpu.warp_map``): every op inside needs ``warp_semantics``.
    warp_regions: bool

    def __init__(self, kind: RuleKind, key: str, function: Callable[..., Any], plugin: str,
                 archs: Architectures = ANY_ARCH, overrides: str | None = None,
                 target: Any = None, opaque_regions: bool = False,
                 warp_semantics: bool = False, warp_regions: bool = False) -> None:
        self._set(kind, key, function, plugin, archs, overrides, target, opaque_regions,
                  warp_semantics, warp_regions)

    @property
    def name(self) -> str:
        fn = self.function
        return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


class _Registry:
    kind: RuleKind

    def __init__(self, plugin: str) -> None:
        self.plugin = plugin
        self.records: list[RuleRecord] = []

    def _check(self, key: Any, function: Any, archs: Any, overrides: Any) -> None:
        problems = []
        if not isinstance(key, str) or not key:
            problems.append(f"op name {key!r} is not a non-empty string")
        if not callable(function):
            problems.append(f"rule {function!r} is not callable")
        if not isinstance(archs, Architectures):
            problems.append(f"archs={archs!r} is not a smalti.registry.Architectures")
        if overrides is not None and not isinstance(overrides, str):
            problems.append(f"overrides={overrides!r} is not a plugin name")
        if problems:
            raise PluginError(
                "SM006",
                f"plugin {self.plugin!r} registered a malformed {self.kind.value} rule: "
                + "; ".join(problems),
                fix="fix the registration call in the plugin",
            )

    def _add(self, key: str, function: Callable[..., Any], archs: Architectures,
             overrides: str | None, target: Any = None, **flags: bool) -> None:
        self._check(key, function, archs, overrides)
        self.records.append(
            RuleRecord(self.kind, key, function, self.plugin, archs, overrides, target,
                       **{name: bool(value) for name, value in flags.items()})
        )


class _OpRuleRegistry(_Registry):
    def add(
        self,
        op_name: str,
        rule: Callable[..., Any],
        *,
        archs: Architectures = ANY_ARCH,
        overrides: str | None = None,
        opaque_regions: bool = False,
    ) -> None:
        """Registers ``rule`` for the op named ``op_name`` (``op.operation.name``).

        ``opaque_regions=True`` says the op's regions hold Lane-level code that
        smalti must not look into (no inference inside, no lowering checks)."""
        self._add(op_name, rule, archs, overrides, opaque_regions=opaque_regions)

    def __call__(
        self, *op_names: str, archs: Architectures = ANY_ARCH, overrides: str | None = None,
        **flags: bool,
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        def decorate(rule: Callable[..., Any]) -> Callable[..., Any]:
            for name in op_names:
                self.add(name, rule, archs=archs, overrides=overrides, **flags)
            return rule

        return decorate


class ConstraintRegistry(_OpRuleRegistry):
    """Where a plugin registers its constraint (layout inference) rules."""

    kind = RuleKind.CONSTRAINT

    def constraint_rule(self, *op_names: str, archs: Architectures = ANY_ARCH,
                        overrides: str | None = None, opaque_regions: bool = False):
        """Decorator: registers the decorated function for each op name."""
        return self(*op_names, archs=archs, overrides=overrides,
                    opaque_regions=opaque_regions)


class LoweringRegistry(_OpRuleRegistry):
    """Where a plugin registers its lowering rules."""

    kind = RuleKind.LOWERING

    def __init__(self, plugin: str) -> None:
        super().__init__(plugin)
        self.required_prefixes: list[str] = []

    def add(
        self,
        op_name: str,
        rule: Callable[..., Any],
        *,
        archs: Architectures = ANY_ARCH,
        overrides: str | None = None,
        opaque_regions: bool = False,
        warp_semantics: bool = False,
        warp_regions: bool = False,
    ) -> None:
        """Registers ``rule`` for the op named ``op_name`` (``op.operation.name``).

        ``warp_semantics=True`` says the rule also lowers the op under warp
        semantics (inside ``mosaic_gpu.warp_map``, ``ctx.thread_semantics`` is
        WARP); ``warp_regions=True`` that it lowers the op's regions under warp
        semantics; ``opaque_regions=True`` that the op's regions are Lane-level
        code, not checked before lowering."""
        self._add(op_name, rule, archs, overrides, opaque_regions=opaque_regions,
                  warp_semantics=warp_semantics, warp_regions=warp_regions)

    def lowering_rule(self, *op_names: str, archs: Architectures = ANY_ARCH,
                      overrides: str | None = None, opaque_regions: bool = False,
                      warp_semantics: bool = False, warp_regions: bool = False):
        """Decorator: registers the decorated function for each op name."""
        return self(*op_names, archs=archs, overrides=overrides,
                    opaque_regions=opaque_regions, warp_semantics=warp_semantics,
                    warp_regions=warp_regions)

    def require_lowering(self, prefix: str) -> None:
        """Every op whose name starts with ``prefix`` must be lowered by a rule:
        lowering fails (SM004) on one that no rule handles, instead of leaving
        it in the IR."""
        if not isinstance(prefix, str) or not prefix:
            raise PluginError("SM006", f"plugin {self.plugin!r}: bad prefix {prefix!r}",
                              fix="pass a dialect prefix such as 'mosaic_gpu.'")
        self.required_prefixes.append(prefix)


class PallasRegistry(_Registry):
    """Where a plugin registers Warpgroup lowerings of Pallas primitives."""

    kind = RuleKind.PALLAS

    def pallas_lowering(self, primitive: Any, *, overrides: str | None = None):
        """Decorator: lowers the Pallas ``primitive``.

        ``primitive`` is the ``jax.extend.core.Primitive`` object, or a
        ``"module:attribute"`` reference to it, resolved only when smalti is
        installed into jax (so that building a pipeline does not import
        Pallas).
        """

        def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
            if isinstance(primitive, str) and primitive.count(":") == 1:
                name = primitive.split(":")[1]
            else:
                name = getattr(primitive, "name", None)
            if name is None:
                raise PluginError(
                    "SM006",
                    f"plugin {self.plugin!r} registered a Pallas lowering for "
                    f"{primitive!r}, which is not a jax primitive",
                    fix="pass the primitive object (e.g. my_op_p) or 'module:my_op_p'",
                )
            self._add(name, fn, ANY_ARCH, overrides, target=primitive)
            return fn

        return decorate
