"""The typed registries handed to plugins, and the records they produce.

Each registration hook receives a registry bound to the plugin being called,
so every rule knows which plugin it came from: conflicts, crashes and the
``smalti plugins`` table name it.
"""

from __future__ import annotations

import enum
import importlib
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar, TypedDict, Unpack

from smalti.diagnostics import PluginError
from smalti.records import Record

Arch = tuple[int, int]


def _arch(value: Any) -> Arch | None:
    if value is None:
        return None
    value = tuple(value)
    if len(value) != 2 or not all(isinstance(v, int) for v in value):
        raise ValueError(f"an architecture is a (major, minor) pair of ints, got {value!r}")
    return value


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
        def fmt(arch: tuple[int, int]) -> str:
            return f"sm_{arch[0]}{arch[1]}"

        minimum, maximum = self.minimum, self.maximum
        if minimum is None:
            return "any" if maximum is None else f"<={fmt(maximum)}"
        if maximum is None:
            return f">={fmt(minimum)}"
        if minimum == maximum:
            return fmt(minimum)
        return f"{fmt(minimum)}..{fmt(maximum)}"


class JaxVersions(Record):
    """A range of jax versions: ``since`` included, ``before`` excluded
    (``JaxVersions(since="0.12")``, ``JaxVersions(before="0.12")``).

    A rule registered with ``jax=`` takes part only in pipelines built under
    a jax in the range: where jax changed what a rule must emit, each
    version's rule is registered once, side by side, and the pipeline picks
    when it is built (never a version check per op).
    """

    __slots__ = ("since", "before")
    since: JaxVersion | None
    before: JaxVersion | None

    def __init__(self, since: str | Iterable[int] | None = None,
                 before: str | Iterable[int] | None = None) -> None:
        self._set(_jax_version(since), _jax_version(before))

    def supports(self, version: JaxVersion) -> bool:
        return (self.since is None or version >= self.since) and (
            self.before is None or version < self.before)

    def __str__(self) -> str:
        def fmt(version: tuple[int, ...]) -> str:
            return ".".join(map(str, version))

        parts = ([f">={fmt(self.since)}"] if self.since is not None else []) + (
            [f"<{fmt(self.before)}"] if self.before is not None else [])
        return "jax " + (",".join(parts) if parts else "any")


JaxVersion = tuple[int, ...]


def _jax_version(value: Any) -> JaxVersion | None:
    if value is None:
        return None
    parts = value.split(".") if isinstance(value, str) else list(value)
    try:
        version = tuple(int(p) for p in parts)
    except (TypeError, ValueError):
        version = ()
    if not version:
        raise ValueError(f"a jax version is like '0.12' or (0, 12), got {value!r}")
    return version


def installed_jax() -> JaxVersion:
    """The version of the installed jax, its release part (``0.12.0.1`` ->
    ``(0, 12, 0, 1)``)."""
    from jax import version

    release = re.match(r"[0-9]+(\.[0-9]+)*", version._version)
    return _jax_version(release.group(0) if release else "0")  # type: ignore[return-value]


ANY_JAX = JaxVersions()
ANY_ARCH = Architectures()
HOPPER_AND_LATER = Architectures(minimum=(9, 0))
BLACKWELL_AND_LATER = Architectures(minimum=(10, 0))


class RuleKind(enum.Enum):
    CONSTRAINT = "constraint"
    LOWERING = "lowering"
    PALLAS = "pallas"
    PALLAS_RESOURCES = "pallas resource estimation"
    PALLAS_REWRITE = "pallas jaxpr rewrite"


# The options of a registration, defined once: each registry takes the
# keywords of one of these TypedDicts (its ``options``), checks them in
# ``_Registry._add`` and stores each under its name in the RuleRecord; an
# option left out has its DEFAULT_OPTIONS value.


class PallasOptions(TypedDict, total=False):
    """The options a Pallas lowering or resource estimator is registered
    with (``PallasRegistry.pallas_lowering``, ``resource_estimator``)."""

    #: The plugin whose rule for the same op (or primitive) this one replaces.
    overrides: str | None
    #: The jax versions the rule is for (:class:`JaxVersions`): a pipeline
    #: built under another jax leaves it out.
    jax: JaxVersions


class ConstraintOptions(PallasOptions, total=False):
    """The options a constraint rule is registered with (the keywords of
    ``ConstraintRegistry.add``, of its ``constraint_rule`` decorator and of
    the registry called as a decorator): those of :class:`PallasOptions`
    and these."""

    #: The GPU architectures the rule supports (:class:`Architectures`).
    archs: Architectures
    #: The op's regions are already at Lane level: inference and lowering's
    #: checks do not enter them (e.g. ``mosaic_gpu.custom_primitive``).
    opaque_regions: bool


class LoweringOptions(ConstraintOptions, total=False):
    """The options a lowering rule is registered with (the keywords of
    ``LoweringRegistry.add`` and ``lowering_rule``): those of a constraint
    rule (:class:`ConstraintOptions`) and these."""

    #: The rule also lowers its op under warp semantics (inside a
    #: ``mosaic_gpu.warp_map``, where ``ctx.thread_semantics`` is WARP).
    warp_semantics: bool
    #: The rule lowers the op's regions under warp semantics
    #: (``mosaic_gpu.warp_map``): every op inside needs ``warp_semantics``.
    warp_regions: bool
    #: The rule's check, ``check(op)``: raises a smalti error for an op the
    #: rule cannot lower, for a reason visible before rewriting (lowering runs
    #: it on every such op before the first rewrite, so that no module is
    #: left half-lowered).
    check: Callable[[Any], None] | None


#: The value of each option a registration leaves out.
DEFAULT_OPTIONS: LoweringOptions = {
    "overrides": None, "jax": ANY_JAX, "archs": ANY_ARCH, "opaque_regions": False,
    "warp_semantics": False, "warp_regions": False, "check": None,
}


#: The attribute that marks a constraint rule as giving all the layout sites
#: of its op one variable (:func:`smalti.rules.same_layout`): its record's
#: ``same_layout``, which inference applies from the op's sites without
#: calling the rule.
SAME_LAYOUT = "smalti_same_layout"


class RuleRecord(Record):
    """One rule as registered: what it handles, where it came from, and its
    options (:class:`LoweringOptions` says what each means); ``same_layout``
    says whether its function is marked :data:`SAME_LAYOUT` (unless given)."""

    __slots__ = ("kind", "key", "function", "plugin", "archs", "overrides", "target",
                 "opaque_regions", "warp_semantics", "warp_regions", "jax", "check",
                 "same_layout")
    kind: RuleKind
    key: str  # op name, or a Pallas primitive's name
    function: Callable[..., Any]
    plugin: str
    archs: Architectures
    overrides: str | None
    target: Any  # the Pallas primitive object, for PALLAS rules
    opaque_regions: bool
    warp_semantics: bool
    warp_regions: bool
    jax: JaxVersions
    check: Callable[[Any], None] | None
    same_layout: bool

    def __init__(self, kind: RuleKind, key: str, function: Callable[..., Any], plugin: str,
                 archs: Architectures = ANY_ARCH, overrides: str | None = None,
                 target: Any = None, opaque_regions: bool = False,
                 warp_semantics: bool = False, warp_regions: bool = False,
                 jax: JaxVersions = ANY_JAX, check: Callable[[Any], None] | None = None,
                 same_layout: bool | None = None) -> None:
        if same_layout is None:
            same_layout = getattr(function, SAME_LAYOUT, False) is True
        self._set(kind, key, function, plugin, archs, overrides, target, opaque_regions,
                  warp_semantics, warp_regions, jax, check, same_layout)

    @property
    def name(self) -> str:
        fn = self.function
        return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


class _Registry:
    kind: RuleKind
    #: The options its rules take (a TypedDict: its keys are their names).
    options: ClassVar[type]

    def __init__(self, plugin: str) -> None:
        self.plugin = plugin
        self.records: list[RuleRecord] = []

    def _add(self, key: Any, function: Any, options: Mapping[str, Any], target: Any = None,
             kind: RuleKind | None = None) -> None:
        """Records a rule, once its key, function and options are checked:
        an option the registry does not take is a ``TypeError``, as an
        unknown keyword is; a malformed value, a :class:`PluginError`."""
        allowed = self.options.__annotations__
        for name in options:
            if name not in allowed:
                raise TypeError(f"{type(self).__name__} takes no option {name!r} "
                                f"(its options: {', '.join(allowed)})")
        given = {**DEFAULT_OPTIONS, **options}
        problems = []
        if not isinstance(key, str) or not key:
            problems.append(f"op name {key!r} is not a non-empty string")
        if not callable(function):
            problems.append(f"rule {function!r} is not callable")
        if not isinstance(given["archs"], Architectures):
            problems.append(f"archs={given['archs']!r} is not a smalti.registry.Architectures")
        if given["overrides"] is not None and not isinstance(given["overrides"], str):
            problems.append(f"overrides={given['overrides']!r} is not a plugin name")
        if not isinstance(given["jax"], JaxVersions):
            problems.append(f"jax={given['jax']!r} is not a smalti.registry.JaxVersions")
        if given["check"] is not None and not callable(given["check"]):
            problems.append(f"check={given['check']!r} is not callable")
        if problems:
            raise PluginError(
                "SM006",
                f"plugin {self.plugin!r} registered a malformed {self.kind.value} rule: "
                + "; ".join(problems),
                fix="fix the registration call in the plugin",
            )
        for name, default in DEFAULT_OPTIONS.items():
            if type(default) is bool:  # a flag: stored as True or False
                given[name] = bool(given[name])
        self.records.append(RuleRecord(kind or self.kind, key, function, self.plugin,
                                       target=target, **given))


class _OpRuleRegistry(_Registry):
    def add(self, op_name: str, rule: Callable[..., Any],
            **options: Unpack[ConstraintOptions]) -> None:
        """Registers ``rule`` for the op named ``op_name`` (``op.operation.name``),
        with the options of :attr:`options` (:class:`ConstraintOptions`)."""
        self._add(op_name, rule, options)

    def __call__(self, *op_names: str, **options: Any
                 ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorator: registers the decorated function for each op name, with
        the options :meth:`add` takes."""
        def decorate(rule: Callable[..., Any]) -> Callable[..., Any]:
            for name in op_names:
                self.add(name, rule, **options)
            return rule

        return decorate


class ConstraintRegistry(_OpRuleRegistry):
    """Where a plugin registers its constraint (layout inference) rules."""

    kind = RuleKind.CONSTRAINT
    options = ConstraintOptions

    def constraint_rule(self, *op_names: str, **options: Unpack[ConstraintOptions]
                        ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorator: registers the decorated function for each op name
        (options: :class:`ConstraintOptions`)."""
        return self(*op_names, **options)


class LoweringRegistry(_OpRuleRegistry):
    """Where a plugin registers its lowering rules."""

    kind = RuleKind.LOWERING
    options = LoweringOptions

    def __init__(self, plugin: str) -> None:
        super().__init__(plugin)
        self.required_prefixes: list[str] = []

    def add(self, op_name: str, rule: Callable[..., Any],
            **options: Unpack[LoweringOptions]) -> None:
        """Registers ``rule`` for the op named ``op_name`` (``op.operation.name``),
        with the options of :class:`LoweringOptions`."""
        self._add(op_name, rule, options)

    def lowering_rule(self, *op_names: str, **options: Unpack[LoweringOptions]
                      ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorator: registers the decorated function for each op name
        (options: :class:`LoweringOptions`)."""
        return self(*op_names, **options)

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
    options = PallasOptions

    def pallas_lowering(self, primitive: Any, **options: Unpack[PallasOptions]
                        ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorator: lowers the Pallas ``primitive`` (options:
        :class:`PallasOptions`).

        ``primitive`` is the ``jax.extend.core.Primitive`` object, or a
        ``"module:attribute"`` reference to it, resolved only when smalti is
        installed into jax (so that building a pipeline does not import
        Pallas); a function whose module imports Pallas is registered the
        same way, as :func:`deferred` ``("module:function")``.
        """

        return self._primitive_rule(primitive, RuleKind.PALLAS, options)

    def resource_estimator(self, primitive: Any, **options: Unpack[PallasOptions]
                           ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorator: estimates the resources Pallas reserves for ``primitive``
        (options: :class:`PallasOptions`).

        Pallas sizes a kernel's scratch SMEM, barriers and TMEM before lowering
        it, by walking the kernel's jaxpr with a table of estimators; a
        primitive with none counts as needing nothing, and one whose
        parameters hold a jaxpr (``custom_jvp_call``) makes estimation fail.
        Register an estimator for a primitive whose lowering takes scratch
        (``ctx.module_ctx.scratch_view``) or that carries a jaxpr.

        The function has Pallas' estimator signature: ``fn(ctx, *avals,
        **params)``, returning a
        ``jax._src.pallas.mosaic_gpu.lowering.Resources``. ``primitive`` is as
        for :meth:`pallas_lowering`.
        """
        return self._primitive_rule(primitive, RuleKind.PALLAS_RESOURCES, options)

    def jaxpr_rewrite(self, name: str, **options: Unpack[PallasOptions]
                      ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorator: rewrites every jaxpr Pallas lowers with Warpgroup
        semantics (a kernel's body and each jaxpr nested in it: loop bodies,
        branches, scopes) before its equations are lowered, as
        ``fn(jaxpr)``, which returns a ``jax.extend.core.Jaxpr`` with the same
        ``invars`` and ``outvars`` (and ``constvars``) computing the same
        values, or ``None`` to leave it as it is. ``name`` names the rewrite
        (in conflicts, ``overrides`` and ``smalti plugins``); rewrites run in
        the order their plugins were loaded.

        A rewrite fuses equations that are costly or impossible to lower one
        at a time into one that a plugin lowers well (``broadcast_in_dim``
        then ``reshape`` into a repeat, say). Pallas sizes a kernel's scratch
        from the jaxpr before the rewrite: the equations put in must need no
        more scratch than those they replace.
        """
        def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
            self._add(name, fn, options, kind=RuleKind.PALLAS_REWRITE)
            return fn

        return decorate

    def _primitive_rule(self, primitive: Any, kind: RuleKind, options: PallasOptions
                        ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
            name: str | None
            if isinstance(primitive, str) and primitive.count(":") == 1:
                name = primitive.split(":")[1]
            else:
                name = getattr(primitive, "name", None)
            if name is None:
                raise PluginError(
                    "SM006",
                    f"plugin {self.plugin!r} registered a Pallas {kind.value} rule for "
                    f"{primitive!r}, which is not a jax primitive",
                    fix="pass the primitive object (e.g. my_op_p) or 'module:my_op_p'",
                )
            self._add(name, fn, options, target=primitive, kind=kind)
            return fn

        return decorate


# --- rules and primitives named by reference ---------------------------------------------


def resolve(reference: Any) -> Any:
    """The object a ``"module:attribute"`` reference names, its module
    imported now; anything but a string is returned as it is."""
    if not isinstance(reference, str):
        return reference
    module, _, attribute = reference.partition(":")
    return getattr(importlib.import_module(module), attribute)


def deferred(reference: str) -> Callable[..., Any]:
    """The rule at ``reference`` (``"module:function"``), imported on its
    first call: for a rule whose module must not be imported while a
    pipeline is built -- a Pallas lowering or estimator whose module imports
    Pallas -- registered like any other::

        registry.pallas_lowering("my_pkg.ops:square_p")(deferred("my_pkg.pallas:lower_square"))

    The returned function is named after the one it stands for (so the
    ``smalti plugins`` table and errors name it) and keeps the reference as
    ``.reference``: ``smalti plugins --check`` imports every one (SM013), so
    a misspelt reference is found before a kernel needs it.
    """
    module, colon, name = reference.partition(":") if isinstance(reference, str) else ("", "", "")
    if not (module and colon and name.isidentifier()):
        raise PluginError(
            "SM006", f"deferred({reference!r}): not a 'module:function' reference",
            values={"reference": repr(reference)},
            fix="name the function as 'package.module:function'",
        )

    def call(*args: Any, **kwargs: Any) -> Any:
        # Looked up at each call (cheap once imported): always the module's current function.
        return resolve(reference)(*args, **kwargs)

    call.__module__, call.__name__, call.__qualname__ = module, name, name
    call.reference = reference  # type: ignore[attr-defined]
    return call

