"""The plugin author guide (docs/writing-plugins.md) stays in step with the code.

Every hook spec is documented under a heading of its own and has a docstring
worth reading, every Python snippet parses, and the complete files the guide
marks ``# file: NAME.py`` run: the plugins work and the guide's tests pass.
"""

from __future__ import annotations

import ast
import inspect
import re
import sys
import types
import typing
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import smalti
import smalti.plugins
import smalti.registry
from smalti import hookspec
from smalti.kernels import example_kernel
from smalti.registry import RuleKind

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "writing-plugins.md"
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
_FILE = re.compile(r"^# file: (\w+)\.py$")


def _hook_specs() -> dict[str, Callable[..., None]]:
    return {name: fn for name, fn in inspect.getmembers(hookspec, inspect.isfunction)
            if name.startswith("smalti_")}


def _headings(text: str) -> list[str]:
    """Markdown headings, not counting lines that start with '#' inside code blocks."""
    prose = _FENCE.sub("", text)
    return [line.lstrip("#").strip().replace("`", "")
            for line in prose.splitlines() if re.match(r"^#{1,6} ", line)]


def _python_blocks(text: str) -> list[str]:
    return [body for lang, body in _FENCE.findall(text) if lang == "python"]


def _files(text: str) -> dict[str, str]:
    """The guide's complete files: python blocks whose first line is ``# file: NAME.py``."""
    files = {}
    for block in _python_blocks(text):
        match = _FILE.match(block.splitlines()[0])
        if match:
            files[match[1]] = block
    return files


@pytest.fixture(scope="module")
def guide() -> str:
    return GUIDE.read_text()


def test_there_are_hook_specs():
    assert len(_hook_specs()) >= 3


@pytest.mark.parametrize("name", sorted(_hook_specs()))
def test_hook_has_a_section_in_the_guide(guide, name):
    headings = _headings(guide)
    assert any(name in heading for heading in headings), (
        f"hook {name} is not documented: docs/writing-plugins.md needs a section whose "
        f"heading names it (headings: {headings})")


@pytest.mark.parametrize("name", sorted(_hook_specs()))
def test_hook_has_a_docstring_for_plugin_authors(name):
    doc = inspect.getdoc(_hook_specs()[name]) or ""
    summary, _, body = doc.partition("\n\n")
    assert summary.strip().endswith("."), f"{name}: the docstring needs a one-line summary"
    assert len(body.split()) >= 30, f"{name}: the docstring should explain the hook"
    assert ":param registry:" in doc, f"{name}: the docstring should describe its registry"


def test_hook_specs_take_a_registry():
    # The guide tells plugin authors to name the parameter `registry`.
    for name, fn in _hook_specs().items():
        assert list(inspect.signature(fn).parameters) == ["registry"], name


def test_every_option_of_each_hooks_registry_is_documented_in_the_hook():
    # pytest documents every parameter a hook receives; a registry's
    # options are what a plugin author passes it.
    from smalti.registry import DEFAULT_OPTIONS, RuleRecord

    for name, fn in _hook_specs().items():
        registry = typing.get_type_hints(fn, vars(smalti.registry))["registry"]
        doc = inspect.getdoc(fn) or ""
        for option in registry.options.__annotations__:
            assert f"``{option}``" in doc, f"{name}: option {option!r} is not documented"
    # Every option is stored in the rule's record, left out as its default.
    record = RuleRecord(RuleKind.LOWERING, "my.op", print, "mine")
    assert {option: getattr(record, option) for option in DEFAULT_OPTIONS} == DEFAULT_OPTIONS


def test_python_snippets_parse(guide):
    blocks = _python_blocks(guide)
    assert blocks
    for block in blocks:
        ast.parse(block)


@pytest.fixture
def guide_modules(guide, monkeypatch) -> dict[str, types.ModuleType]:
    """Imports the guide's complete files as modules (the tests one last)."""
    modules = {}
    for name, source in sorted(_files(guide).items(), key=lambda f: f[0].startswith("test_")):
        module = types.ModuleType(name)
        module.__file__ = f"{GUIDE}:{name}.py"
        monkeypatch.setitem(sys.modules, name, module)
        exec(compile(source, module.__file__, "exec"), module.__dict__)
        modules[name] = module
    return modules


def test_the_guide_has_its_example_files(guide):
    assert {"my_smalti_ops", "strided_exp", "test_my_smalti_ops"} <= set(_files(guide))


def test_the_guides_own_tests_pass(guide_modules):
    tests = guide_modules["test_my_smalti_ops"]
    names = [n for n in vars(tests) if n.startswith("test_")]
    assert names
    for name in names:
        getattr(tests, name)()


def test_the_custom_constraint_plugin_overrides_math_exp(guide_modules):
    strided_exp = guide_modules["strided_exp"]
    pipeline = smalti.build_pipeline(plugins=[smalti.plugins, strided_exp], autoload=False)
    [(winner, loser)] = pipeline.overridden
    assert (winner.plugin, loser.plugin) == ("strided_exp", "smalti.plugins")
    assert winner.key == "math.exp"
    kernel = example_kernel(cast_to=None)
    report = smalti.infer_layouts(kernel.module, pipeline=pipeline, trace=True)
    [exp] = [e for e in report.trace if e.op == "math.exp"]
    assert exp.plugin == "strided_exp"
    assert "WGStridedFragLayout" in exp.layouts["out_layouts"]
    smalti.lower(kernel.module, kernel.launch_context, pipeline=pipeline)


def test_the_pallas_plugin_lowers_square_through_smalti(guide_modules, monkeypatch):
    import jax
    import jax.numpy as jnp
    from jax.experimental.pallas import mosaic_gpu as plgpu

    import smalti.jax as smalti_jax

    ops, pallas = guide_modules["my_smalti_ops"], guide_modules["my_smalti_pallas"]
    calls, contexts = [], []
    lower_square, lower_primitive = ops.lower_square, pallas.lower_square_primitive

    def spy_square(ctx, op):
        calls.append(op.operation.name)
        return lower_square(ctx, op)

    def spy_primitive(ctx, x):
        contexts.append((x.context, x.context.allow_unregistered_dialects))
        return lower_primitive(ctx, x)

    # The hooks look the rules up when the pipeline is built: spy on them.
    monkeypatch.setattr(ops, "lower_square", spy_square)
    monkeypatch.setattr(pallas, "lower_square_primitive", spy_primitive)
    pipeline = smalti.build_pipeline(plugins=[smalti.plugins, ops, pallas], autoload=False)

    def body(x_ref, out_ref):
        out_ref[...] = pallas.square(x_ref[...])

    kernel = plgpu.kernel(
        body, out_type=jax.ShapeDtypeStruct((128, 128), jnp.float32),
        compiler_params=plgpu.CompilerParams(
            lowering_semantics=plgpu.LoweringSemantics.Warpgroup))
    x = jax.ShapeDtypeStruct((128, 128), jnp.float32)
    try:
        with smalti_jax.installed(pipeline):
            jax.jit(kernel).trace(x).lower(lowering_platforms=("cuda",))
    finally:
        for context, allowed in contexts:  # the context may be jax's shared one
            context.allow_unregistered_dialects = allowed
    assert contexts, "the plugin's Pallas lowering was not used"
    assert calls == ["my_ops.square"]


# --- the README ---------------------------------------------------------------------------

README = Path(__file__).parents[2] / "README.md"


def test_the_readme_lists_every_command():
    from smalti import cli

    parser = cli.make_parser()
    [subparsers] = [a for a in parser._actions if a.dest == "command"]
    text = README.read_text()
    for command in subparsers.choices:
        assert f"| `smalti {command}" in text, f"README's command table lacks {command}"


def environment_variables() -> set[str]:
    """The environment variables smalti reads: its ``*_ENV`` constants."""
    root = Path(__file__).parents[2]
    found = set()
    for path in [*(root / "core").glob("*.py"), *(root / "emulate").rglob("*.py")]:
        found |= set(re.findall(r'^[A-Z_]+_ENV = "(SMALTI_[A-Z_]+)"', path.read_text(), re.M))
    return found


def test_the_readme_explains_every_environment_variable():
    variables = environment_variables()
    assert "SMALTI_STRICT_ARCH" in variables and "SMALTI_TRACE" in variables
    assert "SMALTI_EMULATE_ON_RACE" in variables
    text = README.read_text()
    assert [v for v in sorted(variables) if v not in text] == []


def test_the_readmes_emulator_example_runs_as_shown():
    text = README.read_text()
    section = text[text.index("## Run kernels and their tests on the CPU"):]
    code = section[section.index("```python") + len("```python"):]
    code = code[:code.index("```")]
    scope: dict = {}
    exec(compile(code, "README.md", "exec"), scope)
    x, y, z = scope["x"], scope["y"], scope["z"]
    np.testing.assert_array_equal(y, z)  # both pipelines compute the same
    np.testing.assert_allclose(y, np.exp(x) * 2, rtol=1e-6)


EMULATOR_DOC = Path(__file__).resolve().parents[2] / "docs" / "emulator.md"


def ptx_table_markdown() -> str:
    """docs/emulator.md's table of the PTX the emulator models, as
    ``smalti.emulate.modelled_ptx()`` lists it (exact instructions by name,
    families and whole strings by their description)."""
    import smalti.emulate

    rows = ["| PTX | modelled as |", "|---|---|"]
    for form, what in smalti.emulate.modelled_ptx():
        exact = re.fullmatch(r"[\w.:]+", form) is not None
        name = f"`{form}`" if exact else ("(empty string)" if not form else "(family)")
        rows.append(f"| {name} | {what.replace('|', chr(92) + '|')} |")
    return "\n".join(rows)


def test_the_emulator_doc_lists_exactly_the_ptx_it_models():
    text = EMULATOR_DOC.read_text()
    start, end = "<!-- ptx-table -->\n", "\n<!-- /ptx-table -->"
    table = text[text.index(start) + len(start):text.index(end)]
    assert table == ptx_table_markdown(), (
        "docs/emulator.md's PTX table is out of date; replace it with:\n" + ptx_table_markdown())
