"""Rules registered through jax's private registry, given to smalti as a plugin.

jax's tests register test-only layout-inference rules in
``layout_inference._constraint_system_derivation_rules`` (through
``_add_constraint_system_derivation_rule``) and remove them again. A rule
there is a function ``rule(ctx, op) -> (ConstraintSystem, {Variable:
[ValueSite, ...]})`` in jax's constraint language. :func:`registered_rules`
reads what the tests added since the runner started; :func:`plugin` wraps
each as a smalti constraint rule that calls it and states the same in
smalti's language:

- each jax variable becomes one smalti variable of its value sites;
- an assignment, or an ``Equals`` with a constant side, pins the variable;
- an ``Equals`` between two variables makes them equal.

Other jax constraints are refused with a clear error naming them: what a
test rule says must not be dropped silently.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from jax._src.lib.mlir import ir
from jax.experimental.mosaic.gpu import constraints as jax_cs
from jax.experimental.mosaic.gpu import layout_inference as jax_inference

from smalti import layouts
from smalti.constraints import Equal, Variable
from smalti.diagnostics import PluginError
from smalti.hookspec import hookimpl
from smalti.pipeline import Pipeline
from smalti.registry import ConstraintRegistry, RuleKind
from smalti.rules import ConstraintBuilder
from smalti.sites import ValueSite

#: The smalti plugin name under which the bridged rules are registered.
PLUGIN_NAME = "jax-registered rules"

JaxRule = Callable[[Any, ir.OpView], Any]


def jax_registry() -> dict[str, JaxRule]:
    """jax's own dictionary of constraint-system rules, by op name."""
    return jax_inference._constraint_system_derivation_rules


def registered_rules(baseline: Mapping[str, JaxRule]) -> dict[str, JaxRule]:
    """The rules in jax's registry now that are not in ``baseline`` (its
    contents when the runner started): the ones a test registered."""
    return {name: rule for name, rule in jax_registry().items() if baseline.get(name) is not rule}


class BridgePlugin:
    """A smalti plugin holding jax-registered rules (one per op name); where
    smalti's own plugins also have a rule for the op, the bridged rule
    overrides it, as the test's rule replaced jax's."""

    SMALTI_HOOK_VERSION = 1

    def __init__(self, rules: Mapping[str, JaxRule], owners: Mapping[str, str]) -> None:
        self.rules = dict(rules)
        self.owners = dict(owners)

    @hookimpl
    def smalti_register_constraint_rules(self, registry: ConstraintRegistry) -> None:
        for name, rule in self.rules.items():
            registry.constraint_rule(name, overrides=self.owners.get(name))(bridged(rule))


def plugin(rules: Mapping[str, JaxRule], base: Pipeline) -> BridgePlugin:
    """The plugin bridging ``rules`` into a pipeline built like ``base``."""
    owners = {}
    for name in rules:
        records = base.rules[RuleKind.CONSTRAINT].get(name)
        if records:
            owners[name] = records[0].plugin
    return BridgePlugin(rules, owners)


def bridged(rule: JaxRule) -> Callable[[ir.OpView, ConstraintBuilder], None]:
    """``rule`` (jax's form) as a smalti constraint rule."""

    def bridged_rule(op: ir.OpView, b: ConstraintBuilder) -> None:
        system, mapping = rule(jax_inference.DerivationContext(), op)
        variables = {}
        for variable, sites in mapping.items():
            variables[variable] = b.variable(*[_site(b, site) for site in sites])
        for variable, constant in system.assignments.items():
            b.assign(_variable(variables, variable, rule), _constant(constant, rule))
        for constraint in system.constraints:
            _state(b, variables, constraint, rule)

    bridged_rule.__name__ = bridged_rule.__qualname__ = getattr(rule, "__name__", "rule")
    bridged_rule.__module__ = getattr(rule, "__module__", __name__)
    return bridged_rule


def _site(b: ConstraintBuilder, site: Any) -> ValueSite:
    kind = site.type
    if kind == jax_inference.VariableType.OPERAND:
        return b.operand(site.index)
    if kind == jax_inference.VariableType.RESULT:
        return b.result(site.index)
    return b.argument(site.region_index, site.index)


def _variable(variables: Mapping[Any, Variable], variable: Any, rule: JaxRule) -> Variable:
    if variable not in variables:
        raise _untranslatable(rule, f"a variable without value sites ({variable})")
    return variables[variable]


def _constant(constant: Any, rule: JaxRule) -> layouts.Constant:
    match constant:
        case jax_cs.RegisterLayout(value=layout):
            return layouts.RegisterLayout.of(layout)
        case jax_cs.TMEMLayout(value=layout):
            return layouts.TmemLayout(layout)
        case jax_cs.SMEMTransforms(tiling=tiling, swizzle=swizzle):
            return layouts.SmemTransforms(None if tiling is None else tiling.tiling, swizzle)
    raise _untranslatable(rule, f"the constant {constant}")


def _state(b: ConstraintBuilder, variables: Mapping[Any, Variable], constraint: Any,
           rule: JaxRule) -> None:
    if isinstance(constraint, jax_cs.AlwaysTrue):
        return
    if isinstance(constraint, jax_cs.Equals):
        sides = []
        for side in (constraint.lhs, constraint.rhs):
            if isinstance(side, jax_cs.Variable):
                sides.append(_variable(variables, side, rule))
            else:
                sides.append(_constant(side, rule))
        lhs, rhs = sides
        if isinstance(lhs, Variable) and isinstance(rhs, Variable):
            b.require(Equal(lhs, rhs))
        elif isinstance(lhs, Variable):
            b.assign(lhs, rhs)  # type: ignore[arg-type]
        elif isinstance(rhs, Variable):
            b.assign(rhs, lhs)
        elif lhs != rhs:
            raise _untranslatable(rule, f"an unsatisfiable constraint ({constraint})")
        return
    raise _untranslatable(rule, f"a {type(constraint).__name__} constraint ({constraint})")


def _untranslatable(rule: JaxRule, what: str) -> PluginError:
    name = getattr(rule, "__qualname__", repr(rule))
    return PluginError(
        "SM006",
        f"the rule {name} registered through jax's private registry states {what}, "
        "which the conformance runner does not translate into smalti's constraint language",
        values={"rule": name},
        fix=["register the rule as a smalti plugin instead (docs/writing-plugins.md)",
             "or extend smalti.conformance.bridge to translate it"],
    )
