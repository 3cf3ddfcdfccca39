"""``smalti plugins --check``: passes on the installed plugins, and names the
plugin, the rule and the fix for each kind of problem, exiting 1."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

import smalti
from smalti import check, cli
from smalti.pipeline import AUTOLOAD_ENV, BLOCK_ENV, discover
from smalti.registry import Architectures, JaxVersions, deferred

RIVAL_SOURCE = '''
import smalti

SMALTI_HOOK_VERSION = 1


def add(op, b):
    b.variable(*b.layout_sites())


@smalti.hookimpl
def smalti_register_constraint_rules(registry):
    registry.constraint_rule("arith.addf")(add)   # smalti.plugins has one: a conflict
'''


def make_dist(root: Path, name: str, module: str, source: str) -> Path:
    """A minimal installed distribution ``name`` publishing ``module`` as a plugin."""
    info = root / f"{name}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[smalti]\n{module} = {module}\n")
    (root / f"{module}.py").write_text(textwrap.dedent(source))
    return root


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    monkeypatch.delenv(AUTOLOAD_ENV, raising=False)
    monkeypatch.delenv(BLOCK_ENV, raising=False)


def plugin(**hooks):
    return SimpleNamespace(**{name: smalti.hookimpl(fn) for name, fn in hooks.items()})


def rules(*registrations):
    """A plugin registering constraint rules: (op name, options) pairs."""
    def smalti_register_constraint_rules(registry):
        for op_name, options in registrations:
            registry.constraint_rule(op_name, **options)(lambda op, b: None)
    return plugin(smalti_register_constraint_rules=smalti_register_constraint_rules)


def findings_of(**plugins):
    """The check's findings for smalti.plugins and ``plugins``, nothing installed."""
    everything = {"smalti.plugins": smalti.plugins, **plugins}
    return check.check(discover(plugins=everything, autoload=False))


def codes(findings):
    return sorted(f.error.code for f in findings)


def test_the_installed_plugins_pass(capsys):
    assert cli.main(["plugins", "--check"]) == 0
    out = capsys.readouterr().out
    assert "no problems" in out
    assert f"{len(discover().plugins)} plugins" in out


def test_a_conflicting_installed_plugin_fails_the_check(tmp_path, capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(make_dist(tmp_path, "rival-dist", "rival", RIVAL_SOURCE)))
    try:
        assert cli.main(["plugins", "--check"]) == 1
    finally:
        sys.modules.pop("rival", None)
    out = capsys.readouterr().out
    assert "1 problem" in out
    assert "[SM001]" in out
    assert "'rival'" in out and "'smalti.plugins'" in out and "'arith.addf'" in out
    assert f"{BLOCK_ENV}=" in out  # the fix


def test_the_check_exits_1_from_the_command_line(tmp_path):
    make_dist(tmp_path, "rival-dist", "rival", RIVAL_SOURCE)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run([sys.executable, "-m", "smalti.cli", "plugins", "--check"],
                            capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "SM001" in result.stdout and "rival" in result.stdout


def test_every_conflict_is_reported_not_just_the_first():
    found = findings_of(a=rules(("arith.addf", {})), b=rules(("arith.mulf", {})))
    assert codes(found) == ["SM001", "SM001"]
    assert {"'a'", "'b'"} <= {word for f in found for word in f.error.message.split()}


def test_an_empty_architecture_range_is_reported():
    empty = Architectures(minimum=(10, 0), maximum=(9, 0))
    [finding] = findings_of(odd=rules(("odd.op", {"archs": empty})))
    assert finding.error.code == "SM010" and finding.plugin == "odd"
    assert "'odd.op'" in finding.error.message and "empty" in finding.error.message


def test_a_range_without_any_target_is_reported():
    [finding] = findings_of(old=rules(("old.op", {"archs": Architectures(maximum=(7, 5))})))
    assert finding.error.code == "SM010"
    assert "none of the architectures" in finding.error.message


def test_an_op_its_registered_dialect_lacks_is_reported():
    found = findings_of(typo=rules(("arith.add_f", {}), ("mosaic_gpu.vector_lod", {})))
    assert codes(found) == ["SM011", "SM011"]
    assert {f.plugin for f in found} == {"typo"}
    assert "'arith.add_f'" in found[0].error.message and "'arith'" in found[0].error.message
    assert "'mosaic_gpu.vector_lod'" in found[1].error.message


def test_ops_of_unregistered_dialects_are_not_flagged():
    assert findings_of(mine=rules(("my_dialect.anything", {}))) == []


def pallas_rules(*registrations):
    """A plugin registering Pallas lowerings: (primitive, function, options) triples."""
    def smalti_register_pallas_lowerings(registry):
        for primitive, function, options in registrations:
            registry.pallas_lowering(primitive, **options)(function)
    return plugin(smalti_register_pallas_lowerings=smalti_register_pallas_lowerings)


def test_references_that_do_not_resolve_are_reported():
    found = findings_of(typo=pallas_rules(
        ("jax._src.lax.lax:floor_p", deferred("smalti.vocabulary.primitives:lower_flor"), {}),
        ("jax._src.lax.lax:ceil_pp", deferred("smalti.vocabulary.primitives:lower_ceil"), {}),
        ("jax._src.lax.lax:sign_p", deferred("smalti.no_such_module:lower_sign"), {}),
        ("jax._src.lax.lax:tan_p", deferred("smalti.vocabulary:PRIMITIVES"), {})))
    assert codes(found) == ["SM013"] * 4 and {f.plugin for f in found} == {"typo"}
    flor, ceil, module, table = (str(f.error) for f in found)
    assert "'floor_p'" in flor and "'smalti.vocabulary.primitives:lower_flor'" in flor
    assert "AttributeError" in flor and "lower_flor" in flor
    assert "primitive 'jax._src.lax.lax:ceil_pp'" in ceil
    assert "ModuleNotFoundError" in module and "smalti.no_such_module" in module
    assert "not callable" in table
    assert all("check the spelling" in text for text in (flor, ceil, module, table))


def test_references_that_resolve_are_not_flagged():
    assert findings_of(fine=pallas_rules(
        ("jax._src.lax.lax:floor_p", deferred("smalti.vocabulary.primitives:lower_floor"), {}),
        ("jax._src.lax.lax:ceil_p", deferred("smalti.vocabulary.primitives:lower_ceil"),
         {"jax": JaxVersions(since="0.11")}))) == []


def test_references_of_rules_for_another_jax_are_not_checked():
    other = JaxVersions(before="0.1")  # a primitive that jax has no more
    assert findings_of(old=pallas_rules(
        ("jax._src.lax.lax:gone_p", deferred("smalti.gone:lower_gone"), {"jax": other}))) == []


def test_plugins_that_cannot_load_are_reported():
    def smalti_register_lowering_rule(registry):
        pass

    [finding] = findings_of(old=plugin(smalti_register_lowering_rule=smalti_register_lowering_rule))
    assert finding.error.code == "SM007" and finding.plugin == "old"
    assert "smalti_register_lowering_rule" in finding.error.message
    assert "smalti_register_lowering_rules" in str(finding.error)  # did you mean


def test_a_hook_with_other_parameters_is_reported_with_the_expected_signature():
    def smalti_register_constraint_rules(rules):  # e.g. from an older hook specification
        pass

    found = findings_of(
        old=plugin(smalti_register_constraint_rules=smalti_register_constraint_rules))
    [finding] = found
    assert finding.error.code == "SM007"
    assert "'old'" in finding.error.message and "'rules'" in finding.error.message
    assert finding.error.values["smalti calls"] == "smalti_register_constraint_rules(registry)"


def test_a_stale_override_is_reported():
    [finding] = findings_of(stale=rules(("fake.op", {"overrides": "smalti.plugins"})))
    assert finding.error.code == "SM008"


def test_report_lists_each_problem_under_its_plugin():
    found = findings_of(odd=rules(("arith.add_f", {})))
    lines = cli.check_report(found, plugins=2, rules=10)
    assert lines[0] == "checked 2 plugins (10 rules): 1 problem"
    assert "odd:" in lines
