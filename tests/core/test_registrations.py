"""How the built-in plugins register their rules: each module registers its
own (``register_constraints`` / ``register_lowerings`` /
``register_pallas_lowerings`` at its end) and the package's hooks only loop
over the modules; rules whose module imports Pallas are
:func:`smalti.registry.deferred` references, imported on first call."""

from __future__ import annotations

import importlib
import json
import pkgutil
import subprocess
import sys
import textwrap

import pytest

from smalti.diagnostics import PluginError
from smalti.pipeline import discover
from smalti.registry import (
    ConstraintRegistry,
    LoweringRegistry,
    PallasRegistry,
    RuleKind,
    deferred,
)

PACKAGES = ("smalti.plugins", "smalti.hopper", "smalti.blackwell", "smalti.vocabulary")

#: A module's registration function, the registry it takes, and the rule
#: kinds it registers.
REGISTRATIONS = {
    "register_constraints": (ConstraintRegistry, {RuleKind.CONSTRAINT}),
    "register_lowerings": (LoweringRegistry, {RuleKind.LOWERING}),
    "register_pallas_lowerings": (PallasRegistry, {RuleKind.PALLAS, RuleKind.PALLAS_RESOURCES}),
}


def registered_by_modules(package: str, function: str) -> list[tuple[object, ...]]:
    """What every module of ``package`` that has ``function`` registers with it."""
    registry_type, _ = REGISTRATIONS[function]
    found: list[tuple[object, ...]] = []
    path = importlib.import_module(package).__path__
    for info in pkgutil.iter_modules(path):
        module = importlib.import_module(f"{package}.{info.name}")
        if hasattr(module, function):
            registry = registry_type(package)
            getattr(module, function)(registry)
            found += [summary(r) for r in registry.records]
    return found


def summary(record):
    return (record.kind, record.key, record.name, str(record.archs), str(record.jax),
            record.overrides, record.warp_semantics, record.warp_regions,
            record.opaque_regions, record.check, record.target)


@pytest.mark.parametrize("package", PACKAGES)
def test_the_plugin_registers_exactly_what_its_modules_register(package):
    """A module whose registrations the package's hooks forget to call would
    silently drop its rules; a rule registered in ``__init__`` itself would
    not sit beside its function. (The vocabulary's Pallas rules come from its
    tables, not from modules: see its docstring.)"""
    plugin = importlib.import_module(package)
    records = discover(plugins={package: plugin}, autoload=False).records
    compared = 0
    for function, (_, kinds) in REGISTRATIONS.items():
        by_modules = registered_by_modules(package, function)
        if by_modules:
            by_plugin = [summary(r) for r in records if r.kind in kinds]
            assert sorted(by_plugin, key=repr) == sorted(by_modules, key=repr), function
            compared += len(by_modules)
    assert compared > 0


def test_building_a_pipeline_imports_no_deferred_rule():
    """The modules deferred rules name import Pallas: building a pipeline
    (in a fresh interpreter) must not import them."""
    script = textwrap.dedent("""
        import json, sys
        import smalti
        pipeline = smalti.build_pipeline()
        references = sorted({getattr(r.function, "reference", "")
                             for kinds in pipeline.rules.values()
                             for records in kinds.values() for r in records} - {""})
        modules = {ref.partition(":")[0] for ref in references}
        print(json.dumps([references, sorted(modules & set(sys.modules))]))
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr
    references, imported = json.loads(result.stdout.splitlines()[-1])
    assert "smalti.hopper.pallas_stores:lower_async_store_smem" in references
    assert "smalti.vocabulary.primitives:lower_floor" in references
    assert imported == []


def test_a_deferred_rule_imports_its_function_on_first_call(tmp_path, monkeypatch):
    (tmp_path / "deferred_target.py").write_text(
        "def triple(x, *, by=3):\n    return x * by\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "deferred_target", raising=False)
    rule = deferred("deferred_target:triple")
    assert "deferred_target" not in sys.modules
    assert (rule.__module__, rule.__qualname__) == ("deferred_target", "triple")
    assert rule.reference == "deferred_target:triple"
    assert rule(2) == 6 and rule(2, by=5) == 10
    assert "deferred_target" in sys.modules


@pytest.mark.parametrize("reference", ["lower_floor", "pkg.mod:", ":fn", "pkg.mod:a:b",
                                       "pkg.mod:not-a-name", 42])
def test_a_malformed_deferred_reference_is_sm006(reference):
    with pytest.raises(PluginError) as error:
        deferred(reference)
    assert error.value.code == "SM006" and repr(reference) in str(error.value)
    assert "package.module:function" in str(error.value)
