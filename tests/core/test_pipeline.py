"""The plugin manager: discovery, blocking, conflicts, overrides, architectures,
and how plugin faults are reported (codes, plugin names, op names)."""

from __future__ import annotations

import sys
import textwrap
import time
from types import SimpleNamespace

import pytest
from jax._src.lib.mlir import ir

import smalti
from smalti.kernels import make_context
from smalti.pipeline import AUTOLOAD_ENV, BLOCK_ENV
from smalti.registry import RuleKind

BUILTINS = ("smalti.plugins", "smalti.hopper", "smalti.blackwell")
HOPPER = (9, 0)
BLACKWELL = (10, 0)


# --- helpers ----------------------------------------------------------------------


def same_layout(op, b):
    """A constraint rule: every vector site of the op shares one layout."""
    b.variable(*b.layout_sites())


def constraint_plugin(*op_names, rule=same_layout, **options):
    """A plugin object registering ``rule`` for ``op_names``."""

    @smalti.hookimpl
    def smalti_register_constraint_rules(registry):
        registry.constraint_rule(*op_names, **options)(rule)

    return SimpleNamespace(smalti_register_constraint_rules=smalti_register_constraint_rules)


def names(pipeline):
    return [p.name for p in pipeline.plugins]


def constraint_table(pipeline, arch=HOPPER):
    return pipeline.table(RuleKind.CONSTRAINT, arch)


def parse(body: str) -> ir.Module:
    """A module holding ``func.func @f() { body; return }``; unregistered ops allowed."""
    context = make_context()
    context.allow_unregistered_dialects = True
    ops = textwrap.indent(textwrap.dedent(body).strip(), "  ")
    text = f"func.func @f() {{\n{ops}\n  return\n}}"
    with context, ir.Location.unknown():
        return ir.Module.parse(text)


def module_with(op_name: str) -> ir.Module:
    """A vector constant (which has a built-in rule) fed through op ``op_name``."""
    return parse(f"""
        %a = arith.constant dense<1.0> : vector<128xf32>
        %0 = "{op_name}"(%a) : (vector<128xf32>) -> vector<128xf32>
    """)


def find_op(module: ir.Module, op_name: str) -> ir.Operation:
    func = module.body.operations[0]
    [op] = [o.operation for o in func.regions[0].blocks[0].operations
            if o.operation.name == op_name]
    return op


def problem(pipeline, plugin):
    [found] = [p for p in pipeline.problems if p.plugin == plugin]
    return found.error


FAKE_PLUGIN_SOURCE = '''
import smalti

SMALTI_HOOK_VERSION = 1


def fake_rule(op, b):
    b.variable(*b.layout_sites())


@smalti.hookimpl
def smalti_register_constraint_rules(registry):
    registry.constraint_rule("fake.op")(fake_rule)
'''


@pytest.fixture
def fake_dist(tmp_path, monkeypatch):
    """An installed distribution ``fakeplugin`` 1.2 publishing entry point ``fake``."""
    info = tmp_path / "fakeplugin-1.2.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fakeplugin\nVersion: 1.2\n")
    (info / "entry_points.txt").write_text("[smalti]\nfake = fake_smalti_plugin\n")
    (tmp_path / "fake_smalti_plugin.py").write_text(FAKE_PLUGIN_SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    sys.modules.pop("fake_smalti_plugin", None)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    monkeypatch.delenv(AUTOLOAD_ENV, raising=False)
    monkeypatch.delenv(BLOCK_ENV, raising=False)


# --- discovery ----------------------------------------------------------------------


def test_builtin_plugins_are_found_through_entry_points():
    pipeline = smalti.build_pipeline()
    infos = {p.name: p for p in pipeline.plugins}
    for name in BUILTINS:
        assert name in infos, f"{name} not discovered"
        # Three plugins of one distribution, its metadata read once for all.
        assert infos[name].source == "entry point (smalti)"
        assert infos[name].version == smalti.__version__
    assert pipeline.problems == []
    assert constraint_table(pipeline)["arith.addf"].plugin == "smalti.plugins"


def test_third_party_plugin_is_found_through_its_entry_point(fake_dist):
    pipeline = smalti.build_pipeline()
    infos = {p.name: p for p in pipeline.plugins}
    assert "fake" in infos
    assert infos["fake"].version == "1.2"
    assert infos["fake"].source.startswith("entry point")
    assert "fakeplugin" in infos["fake"].source
    record = constraint_table(pipeline)["fake.op"]
    assert record.plugin == "fake"
    assert record.function.__name__ == "fake_rule"
    # It joins the built-ins, it does not replace them.
    assert set(BUILTINS) <= set(infos)


def test_autoload_off_finds_no_entry_point(fake_dist):
    pipeline = smalti.build_pipeline(autoload=False)
    assert pipeline.plugins == []
    assert "fake.op" not in constraint_table(pipeline)
    assert "arith.addf" not in constraint_table(pipeline)


@pytest.mark.parametrize("value", ["1", "true", "yes"])
def test_autoload_off_through_the_environment(fake_dist, monkeypatch, value):
    monkeypatch.setenv(AUTOLOAD_ENV, value)
    pipeline = smalti.build_pipeline()
    assert pipeline.plugins == []
    assert constraint_table(pipeline) == {}


@pytest.mark.parametrize("value", ["", "0", "false"])
def test_autoload_env_set_to_false_keeps_autoloading(monkeypatch, value):
    monkeypatch.setenv(AUTOLOAD_ENV, value)
    assert set(BUILTINS) <= set(names(smalti.build_pipeline()))


def test_explicit_plugins_work_with_autoload_off(fake_dist, monkeypatch):
    import fake_smalti_plugin

    monkeypatch.setenv(AUTOLOAD_ENV, "1")
    pipeline = smalti.build_pipeline(plugins=[fake_smalti_plugin])
    assert names(pipeline) == ["fake_smalti_plugin"]
    [info] = pipeline.plugins
    assert info.source == "explicit"
    assert constraint_table(pipeline)["fake.op"].plugin == "fake_smalti_plugin"


def test_explicit_plugins_by_name(fake_dist):
    import fake_smalti_plugin

    pipeline = smalti.build_pipeline(plugins={"mine": fake_smalti_plugin}, autoload=False)
    assert names(pipeline) == ["mine"]
    assert constraint_table(pipeline)["fake.op"].plugin == "mine"


# --- blocking -----------------------------------------------------------------------


def test_block_argument_excludes_a_plugin(fake_dist):
    pipeline = smalti.build_pipeline(block=["fake"])
    assert "fake" not in names(pipeline)
    assert "fake.op" not in constraint_table(pipeline)
    assert set(BUILTINS) <= set(names(pipeline))


def test_block_environment_excludes_plugins(fake_dist, monkeypatch):
    monkeypatch.setenv(BLOCK_ENV, "fake, smalti.hopper")
    pipeline = smalti.build_pipeline()
    assert "fake" not in names(pipeline)
    assert "smalti.hopper" not in names(pipeline)
    assert "smalti.plugins" in names(pipeline)
    assert "fake.op" not in constraint_table(pipeline)


def test_blocking_applies_to_explicit_plugins_too():
    pipeline = smalti.build_pipeline(plugins={"mine": constraint_plugin("fake.op")},
                                     autoload=False, block=["mine"])
    assert pipeline.plugins == []


def test_blocking_the_builtin_plugin_removes_its_rules():
    pipeline = smalti.build_pipeline(block=["smalti.plugins"])
    assert "smalti.plugins" not in names(pipeline)
    assert "arith.addf" not in constraint_table(pipeline)


# --- conflicts ----------------------------------------------------------------------


def test_two_plugins_claiming_one_op_is_an_error_naming_both():
    with pytest.raises(smalti.PluginError) as info:
        smalti.build_pipeline(
            plugins={"a": constraint_plugin("arith.addf"), "b": constraint_plugin("arith.addf")},
            autoload=False,
        )
    error = info.value
    assert error.code == "SM001"
    assert "'a'" in error.message and "'b'" in error.message
    assert "arith.addf" in error.message
    assert isinstance(error, ValueError)
    # The fix tells how to resolve it.
    assert any("SMALTI_BLOCK_PLUGINS" in fix for fix in error.fixes)
    assert any("overrides=" in fix for fix in error.fixes)


def test_claiming_an_op_of_the_builtin_plugin_is_an_error():
    with pytest.raises(smalti.PluginError) as info:
        smalti.build_pipeline(plugins={"mine": constraint_plugin("arith.addf")})
    error = info.value
    assert error.code == "SM001"
    assert "'smalti.plugins'" in error.message and "'mine'" in error.message
    assert "arith.addf" in error.message


def test_rules_on_disjoint_architectures_do_not_conflict():
    pipeline = smalti.build_pipeline(
        plugins={
            "old": constraint_plugin("fake.op", archs=smalti.Architectures(maximum=(9, 0))),
            "new": constraint_plugin("fake.op", archs=smalti.BLACKWELL_AND_LATER),
        },
        autoload=False,
    )
    assert constraint_table(pipeline, HOPPER)["fake.op"].plugin == "old"
    assert constraint_table(pipeline, BLACKWELL)["fake.op"].plugin == "new"


def test_rules_on_overlapping_architectures_conflict():
    with pytest.raises(smalti.PluginError) as info:
        smalti.build_pipeline(
            plugins={
                "a": constraint_plugin("fake.op", archs=smalti.HOPPER_AND_LATER),
                "b": constraint_plugin("fake.op", archs=smalti.BLACKWELL_AND_LATER),
            },
            autoload=False,
        )
    assert info.value.code == "SM001"
    assert "fake.op" in info.value.message


# --- overrides ----------------------------------------------------------------------


def custom_addf(op, b):
    b.variable(*b.layout_sites())


def test_an_override_wins_over_the_builtin_rule():
    mine = constraint_plugin("arith.addf", rule=custom_addf, overrides="smalti.plugins")
    pipeline = smalti.build_pipeline(plugins={"mine": mine})
    record = constraint_table(pipeline)["arith.addf"]
    assert record.plugin == "mine"
    assert record.function is custom_addf
    # (Installed third-party plugins may override other rules: look at mine.)
    [(winner, loser)] = [o for o in pipeline.overridden if o[0].plugin == "mine"]
    assert (winner.plugin, winner.key) == ("mine", "arith.addf")
    assert (loser.plugin, loser.key) == ("smalti.plugins", "arith.addf")
    # Other ops keep the built-in rules.
    assert constraint_table(pipeline)["arith.mulf"].plugin == "smalti.plugins"


def test_inference_uses_the_overriding_rule():
    calls = []

    def spy(op, b):
        calls.append(op.operation.name)
        b.variable(*b.layout_sites())

    pipeline = smalti.build_pipeline(
        plugins={"mine": constraint_plugin("arith.addf", rule=spy, overrides="smalti.plugins")})
    module = parse("""
        %a = arith.constant dense<1.0> : vector<128xf32>
        %0 = arith.addf %a, %a : vector<128xf32>
    """)
    report = smalti.infer_layouts(module, pipeline=pipeline)
    assert calls == ["arith.addf"]
    assert report.ops_per_plugin["mine"] == 1
    assert "out_layouts" in find_op(module, "arith.addf").attributes


def test_blocking_the_overriding_plugin_restores_the_builtin_rule():
    mine = constraint_plugin("arith.addf", rule=custom_addf, overrides="smalti.plugins")
    pipeline = smalti.build_pipeline(plugins={"mine": mine}, block=["mine"])
    assert constraint_table(pipeline)["arith.addf"].plugin == "smalti.plugins"
    assert not [o for o in pipeline.overridden if o[0].plugin == "mine"]


def test_override_of_an_op_the_other_plugin_lacks_is_an_error():
    stale = constraint_plugin("fake.op", overrides="smalti.plugins")
    with pytest.raises(smalti.PluginError) as info:
        smalti.build_pipeline(plugins={"stale": stale})
    error = info.value
    assert error.code == "SM008"
    assert "'stale'" in error.message
    assert "'smalti.plugins'" in error.message
    assert "fake.op" in error.message


def test_override_of_an_absent_plugin_is_inert():
    mine = constraint_plugin("arith.addf", rule=custom_addf, overrides="smalti.plugins")
    pipeline = smalti.build_pipeline(plugins={"mine": mine}, autoload=False)
    assert constraint_table(pipeline)["arith.addf"].plugin == "mine"
    assert pipeline.overridden == []

    pipeline = smalti.build_pipeline(plugins={"mine": mine}, block=["smalti.plugins"])
    assert constraint_table(pipeline)["arith.addf"].plugin == "mine"
    assert pipeline.overridden == []


def test_an_override_limited_to_some_architectures_keeps_the_other_rule_elsewhere():
    mine = constraint_plugin("arith.addf", rule=custom_addf, overrides="smalti.plugins",
                             archs=smalti.BLACKWELL_AND_LATER)
    pipeline = smalti.build_pipeline(plugins={"mine": mine})
    assert constraint_table(pipeline, BLACKWELL)["arith.addf"].plugin == "mine"
    assert constraint_table(pipeline, HOPPER)["arith.addf"].plugin == "smalti.plugins"


# --- architectures ------------------------------------------------------------------


@pytest.fixture
def blackwell_only():
    return smalti.build_pipeline(
        plugins={"tc": constraint_plugin("fake.tc", archs=smalti.BLACKWELL_AND_LATER)})


@pytest.mark.parametrize("how", ["argument", "environment"])
def test_strict_policy_refuses_an_op_on_an_unsupported_architecture(blackwell_only, monkeypatch,
                                                                      how):
    module = module_with("fake.tc")
    before = str(module.body)
    strict = {"strict_arch": True} if how == "argument" else {}
    if how == "environment":
        monkeypatch.setenv("SMALTI_STRICT_ARCH", "1")
    with pytest.raises(smalti.SmaltiNotImplementedError) as info:
        smalti.infer_layouts(module, arch=HOPPER, pipeline=blackwell_only, **strict)
    error = info.value
    assert error.code == "SM002"
    assert isinstance(error, NotImplementedError)
    assert "fake.tc" in error.message
    assert "sm_90" in error.message
    assert error.op.startswith("fake.tc")
    assert "tc (archs >=sm_100)" in error.values["handled by"]
    assert error.values["architecture"] == "(9, 0)"
    assert str(module.body) == before  # transactional: no layout written


def test_lenient_policy_uses_the_nearest_rule_and_warns(blackwell_only, monkeypatch):
    monkeypatch.setenv("SMALTI_STRICT_ARCH", "0")
    on_blackwell = module_with("fake.tc")
    smalti.infer_layouts(on_blackwell, arch=BLACKWELL, pipeline=blackwell_only)
    module = module_with("fake.tc")
    with pytest.warns(smalti.ArchitectureWarning) as warned:
        report = smalti.infer_layouts(module, arch=HOPPER, pipeline=blackwell_only)
    [warning] = [w.message for w in warned]
    assert warning.code == "SM002"
    assert warning.op.startswith("fake.tc")
    text = str(warning)
    assert text.startswith("[SM002] fake.tc is not supported on sm_90: using the constraint rule")
    assert "of tc (archs >=sm_100)" in text
    assert "SMALTI_STRICT_ARCH=1" in text  # how to make it an error
    assert report.arch_fallbacks == [text]
    assert report.ops_per_plugin["tc"] == 1
    # the rule ran as on its own architecture
    assert str(find_op(module, "fake.tc")) == str(find_op(on_blackwell, "fake.tc"))


def test_nearest_rule_is_the_one_whose_range_comes_closest():
    pipeline = smalti.build_pipeline(plugins={
        "old": constraint_plugin("fake.tc", archs=smalti.Architectures(maximum=(8, 9))),
        "new": constraint_plugin("fake.tc", archs=smalti.Architectures(minimum=(12, 0))),
    })
    table, fallbacks = pipeline.table_with_fallbacks(RuleKind.CONSTRAINT, (10, 0))
    assert "fake.tc" in fallbacks
    assert table["fake.tc"].plugin == "old"  # sm_89 is nearer sm_100 than sm_120 is
    table, _ = pipeline.table_with_fallbacks(RuleKind.CONSTRAINT, (11, 0))
    assert table["fake.tc"].plugin == "new"
    table, fallbacks = pipeline.table_with_fallbacks(RuleKind.CONSTRAINT, (12, 1))
    assert table["fake.tc"].plugin == "new" and "fake.tc" not in fallbacks


def test_op_used_on_a_supported_architecture(blackwell_only):
    module = module_with("fake.tc")
    report = smalti.infer_layouts(module, arch=BLACKWELL, pipeline=blackwell_only)
    assert report.ops_per_plugin["tc"] == 1
    op = find_op(module, "fake.tc")
    assert len(ir.ArrayAttr(op.attributes["out_layouts"])) == 1
    assert len(ir.ArrayAttr(op.attributes["in_layouts"])) == 1


def test_op_without_any_rule():
    module = module_with("fake.unknown")
    with pytest.raises(smalti.SmaltiNotImplementedError) as info:
        smalti.infer_layouts(module, pipeline=smalti.build_pipeline())
    assert info.value.code == "SM003"
    assert "fake.unknown" in info.value.message
    assert info.value.op.startswith("fake.unknown")


def test_op_of_a_blocked_plugin_has_no_rule(fake_dist):
    module = module_with("fake.op")
    assert smalti.infer_layouts(module, pipeline=smalti.build_pipeline()).ops == 2
    with pytest.raises(smalti.SmaltiNotImplementedError) as info:
        smalti.infer_layouts(module_with("fake.op"),
                             pipeline=smalti.build_pipeline(block=["fake"]))
    assert info.value.code == "SM003"


# --- plugins that cannot take part --------------------------------------------------


def test_plugin_for_a_newer_hook_version_is_skipped():
    future = constraint_plugin("fake.op")
    future.SMALTI_HOOK_VERSION = 99
    current = constraint_plugin("fake.other")
    pipeline = smalti.build_pipeline(plugins={"future": future, "current": current},
                                     autoload=False)
    assert names(pipeline) == ["current"]
    error = problem(pipeline, "future")
    assert error.code == "SM009"
    assert "'future'" in error.message and "99" in error.message
    assert "fake.op" not in constraint_table(pipeline)


def test_plugin_whose_hook_raises_is_reported_and_the_others_load():
    @smalti.hookimpl
    def smalti_register_constraint_rules(registry):
        raise RuntimeError("plugin is broken")

    broken = SimpleNamespace(smalti_register_constraint_rules=smalti_register_constraint_rules)
    pipeline = smalti.build_pipeline(plugins={"broken": broken})
    assert "broken" not in names(pipeline)
    assert set(BUILTINS) <= set(names(pipeline))
    error = problem(pipeline, "broken")
    assert error.code == "SM007"
    assert "'broken'" in error.message
    assert "smalti_register_constraint_rules" in error.message
    assert "plugin is broken" in error.message
    assert "arith.addf" in constraint_table(pipeline)


def test_entry_point_that_fails_to_import_is_reported(fake_dist):
    (fake_dist / "fake_smalti_plugin.py").write_text("raise ImportError('missing dependency')\n")
    pipeline = smalti.build_pipeline()
    error = problem(pipeline, "fake")
    assert error.code == "SM007"
    assert "'fake'" in error.message and "missing dependency" in error.message
    assert set(BUILTINS) <= set(names(pipeline))


def test_plugin_with_an_unknown_hook_is_reported():
    """A misspelt hook would otherwise register nothing, silently."""
    @smalti.hookimpl
    def smalti_register_everything(registry):
        pass

    pipeline = smalti.build_pipeline(
        plugins={"odd": SimpleNamespace(smalti_register_everything=smalti_register_everything)},
        autoload=False)
    assert pipeline.plugins == []
    error = problem(pipeline, "odd")
    assert error.code == "SM007"
    assert "'odd'" in error.message
    assert "smalti_register_everything" in error.message


def test_plugin_registering_a_non_callable_rule_is_reported():
    @smalti.hookimpl
    def smalti_register_constraint_rules(registry):
        registry.add("fake.op", 42)

    bad = SimpleNamespace(smalti_register_constraint_rules=smalti_register_constraint_rules)
    pipeline = smalti.build_pipeline(plugins={"bad": bad, "good": constraint_plugin("fake.ok")},
                                     autoload=False)
    assert names(pipeline) == ["good"]
    error = problem(pipeline, "bad")
    assert error.code == "SM006"
    assert "'bad'" in error.message and "not callable" in error.message


# --- fault isolation at inference time ----------------------------------------------


def test_rule_raising_is_reported_with_plugin_rule_and_op():
    def exploding_rule(op, b):
        raise RuntimeError("boom")

    pipeline = smalti.build_pipeline(
        plugins={"crashy": constraint_plugin("fake.op", rule=exploding_rule)})
    module = module_with("fake.op")
    before = str(module.body)
    with pytest.raises(smalti.PluginError) as info:
        smalti.infer_layouts(module, pipeline=pipeline)
    error = info.value
    assert error.code == "SM005"
    assert "'crashy'" in error.message
    assert "exploding_rule" in error.message
    assert "RuntimeError: boom" in error.message
    assert error.op.startswith("fake.op")
    assert error.location is not None  # the op's source location
    assert isinstance(error.__cause__, RuntimeError)
    assert str(module.body) == before


def test_rule_leaving_a_site_without_a_variable():
    def lazy_rule(op, b):
        b.variable(b.result(0))  # forgets the operand

    pipeline = smalti.build_pipeline(plugins={"lazy": constraint_plugin("fake.op", rule=lazy_rule)})
    with pytest.raises(smalti.PluginError) as info:
        smalti.infer_layouts(module_with("fake.op"), pipeline=pipeline)
    error = info.value
    assert error.code == "SM006"
    assert "'lazy'" in error.message
    assert "lazy_rule" in error.message
    assert "fake.op operand #0" in error.message
    assert error.op.startswith("fake.op")


# --- cost ---------------------------------------------------------------------------


def test_default_pipeline_is_cached(monkeypatch):
    assert smalti.default_pipeline() is smalti.default_pipeline()
    monkeypatch.setenv(BLOCK_ENV, "smalti.hopper")
    blocked = smalti.default_pipeline()
    assert "smalti.hopper" not in names(blocked)
    assert blocked is smalti.default_pipeline()
    monkeypatch.delenv(BLOCK_ENV)
    assert "smalti.hopper" in names(smalti.default_pipeline())


def test_building_a_pipeline_is_cheap():
    smalti.build_pipeline()  # imports the plugins once
    runs = 5
    start = time.perf_counter()
    for _ in range(runs):
        smalti.build_pipeline()
    assert (time.perf_counter() - start) / runs < 0.25


def test_dispatch_tables_are_built_once_per_architecture():
    pipeline = smalti.build_pipeline()
    assert constraint_table(pipeline, HOPPER) is constraint_table(pipeline, HOPPER)
    assert constraint_table(pipeline, HOPPER) is not constraint_table(pipeline, BLACKWELL)


# --- jax versions -------------------------------------------------------------------------


def lowering_plugin(op_name, function, **options):
    @smalti.hookimpl
    def smalti_register_lowering_rules(registry):
        registry.lowering_rule(op_name, **options)(function)

    return SimpleNamespace(smalti_register_lowering_rules=smalti_register_lowering_rules)


def lower_old(ctx, op):
    return []


def lower_new(ctx, op):
    return []


@pytest.mark.parametrize("installed, chosen", [((0, 11, 2), lower_old), ((0, 12, 0, 1), lower_new),
                                               ((0, 13), lower_new)])
def test_each_jax_version_gets_its_rule_when_the_pipeline_is_built(monkeypatch, installed,
                                                                    chosen):
    from smalti import pipeline as pipeline_module

    monkeypatch.setattr(pipeline_module, "installed_jax", lambda: installed)
    both = {"old": lowering_plugin("fake.op", lower_old,
                                   jax=smalti.JaxVersions(before="0.12")),
            "new": lowering_plugin("fake.op", lower_new, jax=smalti.JaxVersions(since="0.12"))}
    pipeline = smalti.build_pipeline(plugins=both, autoload=False)
    [record] = pipeline.rules[RuleKind.LOWERING]["fake.op"]
    assert record.function is chosen
    [left_out] = [r for r in pipeline.other_jax if r.key == "fake.op"]
    assert left_out.function is not chosen


def test_rules_for_overlapping_jax_versions_conflict(monkeypatch):
    both = {"a": lowering_plugin("fake.op", lower_old, jax=smalti.JaxVersions(before="0.13")),
            "b": lowering_plugin("fake.op", lower_new, jax=smalti.JaxVersions(since="0.11"))}
    with pytest.raises(smalti.PluginError, match="SM001"):
        smalti.build_pipeline(plugins=both, autoload=False)


def test_jax_versions_are_checked_when_registered():
    with pytest.raises(ValueError, match="a jax version is like '0.12'"):
        smalti.JaxVersions(since="twelve")
    bad = {"bad": lowering_plugin("fake.op", lower_old, jax="0.12")}
    pipeline = smalti.build_pipeline(plugins=bad, autoload=False)
    [problem] = pipeline.problems
    assert "jax='0.12' is not a smalti.registry.JaxVersions" in str(problem.error)


def test_jax_versions_read_as_ranges():
    assert str(smalti.JaxVersions(since="0.12", before=(0, 13))) == "jax >=0.12,<0.13"
    assert smalti.JaxVersions(before="0.12").supports((0, 11, 2))
    assert not smalti.JaxVersions(before="0.12").supports((0, 12, 0, 1))
    assert smalti.JaxVersions(since="0.12").supports((0, 12, 0, 1))


def test_a_lowering_rules_check_must_be_callable():
    bad = {"bad": lowering_plugin("fake.op", lower_old, check="not a function")}
    [problem] = smalti.build_pipeline(plugins=bad, autoload=False).problems
    assert "check='not a function' is not callable" in str(problem.error)
    good = {"good": lowering_plugin("fake.op", lower_old, check=lambda op: None)}
    [record] = smalti.build_pipeline(plugins=good, autoload=False).rules[RuleKind.LOWERING][
        "fake.op"]
    assert callable(record.check)
