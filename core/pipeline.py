"""Building a pipeline: discovering plugins, collecting and checking their rules.

A :class:`Pipeline` is made once (per set of plugins) and then answers, by op
name and architecture, which rule handles an op: the plugins' registrations
are compiled into plain dicts, so dispatch costs one lookup per op.

Discovery follows pytest's model: every entry point of the ``smalti`` group is
loaded, unless autoloading is switched off (``SMALTI_DISABLE_PLUGIN_AUTOLOAD=1``
or ``autoload=False``); plugins can be blocked by name
(``SMALTI_BLOCK_PLUGINS=a,b`` or ``block=[...]``); more plugins can be passed
explicitly (``plugins=[...]``).
"""

from __future__ import annotations

import difflib
import functools
import inspect
import os
import warnings
from collections import defaultdict
from collections.abc import Iterable, Sequence
from importlib import metadata
from typing import Any

import pluggy

from smalti import arch_policy, hookspec
from smalti.diagnostics import PluginError, SmaltiError
from smalti.records import Record
from smalti.registry import (
    Arch,
    ConstraintRegistry,
    LoweringRegistry,
    PallasRegistry,
    RuleKind,
    RuleRecord,
    installed_jax,
)

AUTOLOAD_ENV = "SMALTI_DISABLE_PLUGIN_AUTOLOAD"
BLOCK_ENV = "SMALTI_BLOCK_PLUGINS"

_HOOKS = (
    ("smalti_register_constraint_rules", ConstraintRegistry),
    ("smalti_register_lowering_rules", LoweringRegistry),
    ("smalti_register_pallas_lowerings", PallasRegistry),
)


class PluginInfo(Record):
    """A plugin taking part in a pipeline."""

    __slots__ = ("name", "version", "source", "module")
    _uncompared = frozenset({"module"})
    name: str
    version: str
    source: str  # "entry point <dist>" or "explicit"
    module: Any

    def __init__(self, name: str, version: str, source: str, module: Any) -> None:
        self._set(name, version, source, module)


class Problem(Record):
    """A plugin that could not take part, and why (shown by ``smalti plugins``)."""

    __slots__ = ("plugin", "error")
    plugin: str
    error: SmaltiError

    def __init__(self, plugin: str, error: SmaltiError) -> None:
        self._set(plugin, error)


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no")


def _env_list(name: str) -> list[str]:
    return [p.strip() for p in os.environ.get(name, "").split(",") if p.strip()]


class Pipeline:
    """The rules of a set of plugins, checked and compiled into dispatch tables."""

    def __init__(self, plugins: Sequence[PluginInfo], records: Iterable[RuleRecord],
                 required_prefixes: Iterable[str], problems: Sequence[Problem] = (),
                 *, blocked: Iterable[str] = (), autoload: bool = True) -> None:
        self.plugins = list(plugins)
        #: Plugin names kept out on purpose, and whether entry points were loaded.
        self.blocked = tuple(sorted(blocked))
        self.autoload = autoload
        self.problems = list(problems)
        self.required_prefixes = tuple(dict.fromkeys(required_prefixes))
        self.rules: dict[RuleKind, dict[str, list[RuleRecord]]] = {k: {} for k in RuleKind}
        self.overridden: list[tuple[RuleRecord, RuleRecord]] = []  # (winner, loser)
        #: The jax this pipeline is for, and the rules left out as for another.
        self.jax = installed_jax()
        self.other_jax: list[RuleRecord] = []
        grouped: dict[tuple[RuleKind, str], list[RuleRecord]] = defaultdict(list)
        for record in records:
            if not record.jax.supports(self.jax):
                self.other_jax.append(record)
                continue
            grouped[record.kind, record.key].append(record)
        present = {p.name for p in self.plugins}
        for (kind, key), group in grouped.items():
            self.rules[kind][key] = self._resolve(kind, key, group, present)
        self._tables: dict[tuple[Any, ...], Any] = {}

    def _resolve(self, kind: RuleKind, key: str, group: list[RuleRecord],
                 present: set[str]) -> list[RuleRecord]:
        losers: set[int] = set()
        for winner in group:
            if winner.overrides is None or winner.overrides not in present:
                continue  # overriding an absent plugin is inert
            targets = [i for i, r in enumerate(group) if r.plugin == winner.overrides]
            if not targets:
                raise PluginError(
                    "SM008",
                    f"plugin {winner.plugin!r} overrides the {kind.value} rule of "
                    f"{winner.overrides!r} for {key!r}, but {winner.overrides!r} "
                    f"registers no such rule",
                    values={"rule": winner.name},
                    fix=f"remove overrides={winner.overrides!r} from the registration of {key!r}",
                )
            for i in targets:
                losers.add(i)
                self.overridden.append((winner, group[i]))
        kept = [r for i, r in enumerate(group) if i not in losers]
        # An overridden rule stays as a fallback, behind every kept rule, for the
        # architectures its overrides do not support.
        fallback = [r for i, r in enumerate(group) if i in losers]
        for i, a in enumerate(kept):
            for b in kept[i + 1 :]:
                if not a.archs.overlaps(b.archs):
                    continue
                if a.plugin == b.plugin:
                    raise PluginError(
                        "SM006",
                        f"plugin {a.plugin!r} registers two {kind.value} rules for "
                        f"{key!r} on overlapping architectures ({a.archs}, {b.archs})",
                        values={"rules": f"{a.name}, {b.name}"},
                        fix="register one rule per op and architecture range",
                    )
                raise PluginError(
                    "SM001",
                    f"plugins {a.plugin!r} and {b.plugin!r} both register a "
                    f"{kind.value} rule for {key!r}",
                    values={
                        a.plugin: f"{a.name} (archs {a.archs})",
                        b.plugin: f"{b.name} (archs {b.archs})",
                    },
                    fix=[
                        f"block one of them: {BLOCK_ENV}={b.plugin}",
                        f"or have one declare overrides={a.plugin!r} when registering {key!r}",
                    ],
                )
        return kept + fallback

    # --- dispatch ----------------------------------------------------------------

    def table(self, kind: RuleKind, arch: Arch) -> dict[str, RuleRecord]:
        """The op-name -> rule dispatch table of ``kind`` for ``arch``."""
        key = (kind, arch)
        table = self._tables.get(key)
        if table is None:
            table = {}
            for name, records in self.rules[kind].items():
                for record in records:
                    if record.archs.supports(arch):
                        table[name] = record
                        break
            self._tables[key] = table
        return table

    def table_with_fallbacks(self, kind: RuleKind, arch: Arch
                             ) -> tuple[dict[str, RuleRecord], frozenset[str]]:
        """:meth:`table`, completed for the lenient architecture policy
        (:mod:`smalti.arch_policy`): each op none of whose rules supports
        ``arch`` maps to the nearest rule. Also returns those ops' names."""
        key = (kind, arch, "fallbacks")
        cached = self._tables.get(key)
        if cached is None:
            table = dict(self.table(kind, arch))
            fallbacks = frozenset(name for name in self.rules[kind] if name not in table)
            for name in fallbacks:
                table[name] = arch_policy.nearest(self.rules[kind][name], arch)
            cached = self._tables[key] = (table, fallbacks)
        return cached

    def unsupported_on(self, kind: RuleKind, key: str) -> list[RuleRecord]:
        """The rules for ``key`` (all of them unsupported on the asked architecture)."""
        return self.rules[kind].get(key, [])

    def ops(self, plugin: str) -> dict[RuleKind, list[RuleRecord]]:
        by_kind: dict[RuleKind, list[RuleRecord]] = {k: [] for k in RuleKind}
        for kind, rules in self.rules.items():
            for records in rules.values():
                by_kind[kind].extend(r for r in records if r.plugin == plugin)
        return by_kind

    def __repr__(self) -> str:
        return f"Pipeline(plugins={[p.name for p in self.plugins]})"


def _distribution_of(module: Any) -> tuple[str, str]:
    """(distribution name, version) of the installed distribution shipping ``module``."""
    top = getattr(module, "__name__", "").split(".")[0]
    for dist_name in metadata.packages_distributions().get(top, []):
        try:
            return dist_name, metadata.version(dist_name)
        except metadata.PackageNotFoundError:
            continue
    return "", getattr(module, "__version__", "unknown")


def _entry_points() -> list[metadata.EntryPoint]:
    return sorted(metadata.entry_points(group=hookspec.ENTRY_POINT_GROUP), key=lambda e: e.name)


def build_pipeline(
    *,
    plugins: Sequence[Any] | dict[str, Any] = (),
    autoload: bool | None = None,
    block: Sequence[str] = (),
) -> Pipeline:
    """Builds a pipeline from the installed plugins and/or explicit ones.

    Args:
      plugins: extra plugins (modules or objects with hook implementations),
        as a sequence (named after their ``__name__``) or a name -> plugin dict.
      autoload: load the ``smalti`` entry points. Defaults to on unless the
        ``SMALTI_DISABLE_PLUGIN_AUTOLOAD`` environment variable is set.
      block: names of plugins not to load, in addition to those listed in
        ``SMALTI_BLOCK_PLUGINS`` (comma-separated).
    """
    return discover(plugins=plugins, autoload=autoload, block=block).pipeline()


class Discovery(Record):
    """The plugins found and the rules they registered, before any conflict
    check: what :func:`build_pipeline` compiles, and what ``smalti plugins
    --check`` inspects rule by rule."""

    __slots__ = ("plugins", "records", "required_prefixes", "problems", "blocked", "autoload")
    plugins: list[PluginInfo]
    records: list[RuleRecord]
    required_prefixes: list[str]
    problems: list[Problem]
    blocked: frozenset[str]
    autoload: bool

    def __init__(self, plugins: list[PluginInfo], records: list[RuleRecord],
                 required_prefixes: list[str], problems: list[Problem],
                 blocked: frozenset[str], autoload: bool) -> None:
        self._set(plugins, records, required_prefixes, problems, blocked, autoload)

    def pipeline(self, records: Iterable[RuleRecord] | None = None) -> Pipeline:
        """The pipeline of these plugins (of only ``records``, if given)."""
        return Pipeline(self.plugins, self.records if records is None else records,
                        self.required_prefixes, self.problems, blocked=self.blocked,
                        autoload=self.autoload)


def discover(
    *,
    plugins: Sequence[Any] | dict[str, Any] = (),
    autoload: bool | None = None,
    block: Sequence[str] = (),
) -> Discovery:
    """Loads the plugins and collects their rules; arguments as for :func:`build_pipeline`."""
    if autoload is None:
        autoload = not _env_flag(AUTOLOAD_ENV)
    blocked = set(block) | set(_env_list(BLOCK_ENV))

    pm = pluggy.PluginManager(hookspec.PROJECT_NAME)
    pm.add_hookspecs(hookspec)
    infos: list[PluginInfo] = []
    problems: list[Problem] = []

    def adopt(name: str, plugin: Any, version: str, source: str) -> None:
        if name in blocked:
            return
        if pm.has_plugin(name):
            if pm.get_plugin(name) is not plugin:
                problems.append(Problem(name, PluginError(
                    "SM007", f"two different plugins are named {name!r}; the second was "
                    "not loaded",
                    fix="pass explicit plugins as a dict to give each a distinct name")))
            return
        try:
            _check_hook_version(name, plugin)
            _check_hooks(pm, name, plugin)
            pm.register(plugin, name=name)
            try:
                pm.check_pending()  # hook implementations no spec knows (typos)
            except Exception:
                pm.unregister(plugin)
                raise
        except SmaltiError as e:
            problems.append(Problem(name, e))
            return
        except Exception as e:  # pluggy validation errors: unknown hooks, bad signatures
            problems.append(Problem(name, PluginError(
                "SM007", f"plugin {name!r} could not be registered: {e}",
                fix=f"fix the plugin, or block it with {BLOCK_ENV}={name}")))
            return
        infos.append(PluginInfo(name, version, source, plugin))

    if autoload:
        # (name, version) by distribution: each read of its metadata parses
        # it again, and one distribution may ship several plugins (smalti does).
        about: dict[metadata.Distribution, tuple[str, str]] = {}
        for ep in _entry_points():
            if ep.name in blocked:
                continue
            try:
                plugin = ep.load()
            except Exception as e:
                problems.append(Problem(ep.name, PluginError(
                    "SM007", f"entry point {ep.name!r} ({ep.value}) failed to import: "
                    f"{type(e).__name__}: {e}",
                    fix=f"reinstall the plugin, or block it with {BLOCK_ENV}={ep.name}")))
                continue
            dist, version = "", "unknown"
            if ep.dist is not None:
                known = about.get(ep.dist)
                if known is None:
                    fields = ep.dist.metadata
                    known = about[ep.dist] = (fields["Name"], fields["Version"])
                dist, version = known
            adopt(ep.name, plugin, version, f"entry point ({dist})" if dist else "entry point")
    explicit = plugins.items() if isinstance(plugins, dict) else (
        (getattr(p, "__name__", type(p).__name__), p) for p in plugins)
    for name, plugin in explicit:
        _, version = _distribution_of(plugin)
        adopt(name, plugin, version, "explicit")

    records: list[RuleRecord] = []
    prefixes: list[str] = []
    loaded: list[PluginInfo] = []
    for info in infos:
        try:
            plugin_records, plugin_prefixes = _collect(pm, info.name, info.module)
        except SmaltiError as e:
            problems.append(Problem(info.name, e))
            continue
        records += plugin_records
        prefixes += plugin_prefixes
        loaded.append(info)
    return Discovery(loaded, records, prefixes, problems, frozenset(blocked), autoload)


def _check_hook_version(name: str, plugin: Any) -> None:
    version = getattr(plugin, "SMALTI_HOOK_VERSION", hookspec.HOOK_VERSION)
    if not isinstance(version, int) or version > hookspec.HOOK_VERSION or version < 1:
        raise PluginError(
            "SM009",
            f"plugin {name!r} was written for smalti hook version {version!r}; this smalti "
            f"supports versions 1..{hookspec.HOOK_VERSION}",
            fix=f"upgrade smalti, or install a release of {name!r} for hook version "
            f"{hookspec.HOOK_VERSION}",
        )


def _check_hooks(pm: pluggy.PluginManager, name: str, plugin: Any) -> None:
    """Every hook the plugin implements exists here, with parameters smalti
    passes: a plugin written for another hook version gets SM007 naming the
    hook, rather than pluggy's generic error or a silently ignored hook."""
    specs = {hook: list(inspect.signature(getattr(hookspec, hook)).parameters)
             for hook, _ in _HOOKS}
    declared = getattr(plugin, "SMALTI_HOOK_VERSION", None)
    written_for = (f"the plugin declares SMALTI_HOOK_VERSION = {declared!r}"
                   if declared is not None else "the plugin declares no SMALTI_HOOK_VERSION")
    versions = {"hook version of this smalti": f"{hookspec.HOOK_VERSION} ({written_for})"}
    for attr in dir(plugin):
        if not attr.startswith("smalti_") or pm.parse_hookimpl_opts(plugin, attr) is None:
            continue
        if attr not in specs:
            close = difflib.get_close_matches(attr, list(specs), n=1)
            raise PluginError(
                "SM007",
                f"plugin {name!r} implements the hook {attr!r}, which this smalti does not "
                "define (a typo, or a plugin written for another hook version)",
                values={**versions, "hooks smalti defines": ", ".join(specs)},
                fix=[*([f"rename {attr!r} to {close[0]!r}"] if close else []),
                     f"install a release of {name!r} written for hook version "
                     f"{hookspec.HOOK_VERSION}, or block it with {BLOCK_ENV}={name}"],
            )
        try:
            params = inspect.signature(getattr(plugin, attr)).parameters.values()
        except (TypeError, ValueError):
            continue  # not introspectable: pluggy will judge
        required = [p.name for p in params if p.default is p.empty
                    and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        unknown = [p for p in required if p not in specs[attr]]
        if unknown:
            expected = f"{attr}({', '.join(specs[attr])})"
            raise PluginError(
                "SM007",
                f"plugin {name!r} implements the hook {attr!r} with parameter(s) "
                f"{', '.join(map(repr, unknown))}, which smalti does not pass "
                "(a plugin written for another hook version?)",
                values={**versions, "smalti calls": expected,
                        "the plugin defines": f"{attr}({', '.join(required)})"},
                fix=[f"name the parameters as smalti passes them: {expected}",
                     f"or block the plugin with {BLOCK_ENV}={name}"],
            )


def _collect(pm: pluggy.PluginManager, name: str,
             plugin: Any) -> tuple[list[RuleRecord], list[str]]:
    """Calls one plugin's registration hooks with registries bound to it."""
    records: list[RuleRecord] = []
    prefixes: list[str] = []
    for hook_name, registry_type in _HOOKS:
        hook = getattr(pm.hook, hook_name)
        for impl in hook.get_hookimpls():
            if impl.plugin is not plugin:
                continue
            registry = registry_type(name)
            try:
                impl.function(registry=registry)
            except SmaltiError:
                raise
            except Exception as e:
                raise PluginError(
                    "SM007",
                    f"plugin {name!r} raised in {hook_name}: {type(e).__name__}: {e}",
                    fix=f"fix the plugin, or block it with {BLOCK_ENV}={name}",
                ) from e
            records += registry.records
            prefixes += getattr(registry, "required_prefixes", [])
    return records, prefixes


@functools.cache
def _default_pipeline(autoload: bool, blocked: tuple[str, ...]) -> Pipeline:
    pipeline = build_pipeline(autoload=autoload, block=blocked)
    for problem in pipeline.problems:
        warnings.warn(f"smalti: plugin {problem.plugin!r} was skipped:\n{problem.error}",
                      stacklevel=3)
    return pipeline


def default_pipeline() -> Pipeline:
    """The pipeline of the installed plugins, honouring the environment; cached."""
    return _default_pipeline(not _env_flag(AUTOLOAD_ENV), tuple(sorted(_env_list(BLOCK_ENV))))
