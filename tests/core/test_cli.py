"""The ``smalti`` command line, called in-process through ``smalti.cli.main``."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest
from jax._src.lib.mlir import ir

import smalti
import smalti.plugins
from smalti import cli, codes
from smalti.kernels import example_kernel, make_context
from smalti.registry import ANY_ARCH, HOPPER_AND_LATER, Architectures

UNREGISTERED_OP = """\
module {
  func.func @f(%arg0: vector<128xf32>) -> vector<128xf32> {
    %0 = "mydialect.fancy"(%arg0) : (vector<128xf32>) -> vector<128xf32>
    return %0 : vector<128xf32>
  }
}
"""


@pytest.fixture(scope="module")
def example_text() -> str:
    return example_kernel().text()


@pytest.fixture
def example_file(tmp_path: Path, example_text: str) -> Path:
    path = tmp_path / "example.mlir"
    path.write_text(example_text)
    return path


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# --- top level ---------------------------------------------------------------------------


def test_version(capsys):
    code, out, _ = run(capsys, "--version")
    assert code == 0
    assert smalti.__version__ in out


def test_no_command_prints_usage(capsys):
    code, _, err = run(capsys)
    assert code == 2
    assert "usage: smalti" in err


def test_unknown_command_is_a_usage_error(capsys):
    code, _, err = run(capsys, "frobnicate")
    assert code == 2
    assert "invalid choice" in err


# --- smalti plugins ----------------------------------------------------------------------


def test_plugins_lists_the_builtin_plugin(capsys):
    code, out, _ = run(capsys, "plugins")
    assert code == 0
    header, *rows = out.splitlines()
    assert header.split() == ["plugin", "version", "ops", "architectures", "source"]
    [row] = [r for r in rows if r.startswith("smalti.plugins ")]
    assert "constraint" in row and "lowering" in row
    assert "any" in row
    assert "entry point" in row
    assert "arith.addf" not in out  # op names only with --verbose


def test_plugins_verbose_lists_ops(capsys):
    code, out, _ = run(capsys, "plugins", "-v")
    assert code == 0
    assert "smalti.plugins: constraint rules for any" in out
    assert "arith.addf" in out and "mosaic_gpu.vector_load" in out


def ops_listed_under(out: str, heading: str) -> str:
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(heading))
    body = []
    for line in lines[start + 1:]:
        if not line.startswith("    "):
            break
        body.append(line)
    return " ".join(body)


def test_plugins_verbose_scopes_ops_by_architecture(capsys, monkeypatch):
    monkeypatch.delenv("SMALTI_STRICT_ARCH", raising=False)
    code, out, _ = run(capsys, "plugins", "-v")
    assert code == 0
    blackwell = ops_listed_under(out, "  smalti.blackwell: constraint rules for sm_100..sm_110")
    assert "mosaic_gpu.tcgen05_mma" in blackwell and "arith.addf" not in blackwell
    assert "architecture policy: lenient" in out and "SMALTI_STRICT_ARCH=1" in out
    monkeypatch.setenv("SMALTI_STRICT_ARCH", "1")
    code, out, _ = run(capsys, "plugins")
    assert "architecture policy: strict" in out


def _plugin(name: str, **hooks) -> types.ModuleType:
    module = types.ModuleType(name)
    for hook_name, function in hooks.items():
        setattr(module, hook_name, smalti.hookimpl(function))
    return module


def test_plugins_shows_overrides_and_problems(capsys, monkeypatch):
    def override_exp(registry):
        registry.constraint_rule("math.exp", overrides="smalti.plugins")(lambda op, b: None)

    overriding = _plugin("overriding", smalti_register_constraint_rules=override_exp)
    too_new = _plugin("too_new")
    too_new.SMALTI_HOOK_VERSION = smalti.HOOK_VERSION + 1
    pipeline = smalti.build_pipeline(plugins=[smalti.plugins, overriding, too_new],
                                     autoload=False)
    monkeypatch.setattr(cli, "default_pipeline", lambda: pipeline)
    code, out, _ = run(capsys, "plugins")
    assert code == 0
    assert "overriding overrides smalti.plugins for math.exp (constraint rule)" in out
    assert "problems" in out
    assert "too_new:" in out and "SM009" in out
    assert "explicit" in out


def test_plugins_table_gives_the_architectures_of_op_rules_only(capsys, monkeypatch):
    # A Pallas rule has no architecture range (the op rules of what it emits
    # decide): it must not widen the plugin's to "any".
    def lowering(registry):
        registry.lowering_rule("mine.op", archs=HOPPER_AND_LATER)(lambda ctx, op: [])

    def pallas(primitive):
        return lambda registry: registry.pallas_lowering(primitive)(lambda ctx, x: x)

    mine = _plugin("mine", smalti_register_lowering_rules=lowering,
                   smalti_register_pallas_lowerings=pallas("mine:op_p"))
    only_pallas = _plugin("only_pallas",
                          smalti_register_pallas_lowerings=pallas("theirs:other_p"))
    monkeypatch.setattr(cli, "default_pipeline", lambda: smalti.build_pipeline(
        plugins=[mine, only_pallas], autoload=False))
    code, out, _ = run(capsys, "plugins")
    assert code == 0
    rows = {line.split()[0]: line.split() for line in out.splitlines()[1:3]}
    assert rows["mine"][-2:] == [">=sm_90", "explicit"]
    assert rows["only_pallas"][-2:] == ["-", "explicit"]


def test_plugins_reports_a_conflict(capsys, monkeypatch):
    def claim_addf(registry):
        registry.constraint_rule("arith.addf")(lambda op, b: None)

    rival = _plugin("rival", smalti_register_constraint_rules=claim_addf)
    monkeypatch.setattr(cli, "default_pipeline", lambda: smalti.build_pipeline(
        plugins=[smalti.plugins, rival], autoload=False))
    code, _, err = run(capsys, "plugins")
    assert code == 1
    assert "SM001" in err and "rival" in err and "smalti.plugins" in err


def test_plugins_lists_blocked_entry_points(capsys, monkeypatch):
    monkeypatch.setenv("SMALTI_BLOCK_PLUGINS", "smalti.hopper")
    code, out, _ = run(capsys, "plugins")
    assert code == 0
    assert "smalti.hopper: blocked by SMALTI_BLOCK_PLUGINS" in out


@pytest.mark.parametrize(
    ("archs", "expected"),
    [
        ([], "-"),
        ([ANY_ARCH, HOPPER_AND_LATER], "any"),
        ([HOPPER_AND_LATER, HOPPER_AND_LATER], ">=sm_90"),
        ([Architectures((9, 0), (9, 0)), Architectures((10, 0))], "sm_90, >=sm_100"),
        ([Architectures((9, 0), (10, 0)), Architectures((10, 0))], ">=sm_90"),
    ],
)
def test_describe_archs(archs, expected):
    assert cli.describe_archs(archs) == expected


# --- smalti infer ------------------------------------------------------------------------


def test_infer_prints_the_annotated_module(capsys, example_file):
    code, out, err = run(capsys, "infer", str(example_file))
    assert code == 0, err
    assert "out_layouts" in out and "in_layouts" in out
    assert "smalti.plugins" not in out  # no trace without --explain
    # The output is the module itself: it parses back, annotated.
    module = ir.Module.parse(out, make_context())
    assert "#mosaic_gpu.TiledLayout" in str(module)


def test_infer_explain_prints_the_trace(capsys, example_file):
    code, out, _ = run(capsys, "infer", str(example_file), "--explain")
    assert code == 0
    trace = [line for line in out.splitlines() if line.startswith("// ")]
    trace = trace[:trace.index("// ")]  # the table, before the reasons
    assert trace[0].startswith("// inference on sm_90:")
    assert trace[1].split() == ["//", "op", "location", "plugin", "rule", "layouts"]
    [exp] = [line for line in trace if " math.exp " in line]
    assert "smalti.plugins" in exp and "same_layout" in exp and "out_layouts=" in exp
    assert f"{example_file}:" in exp  # locations name the file
    ir.Module.parse(out, make_context())  # the trace is made of MLIR comments


def test_infer_arch_option(capsys, example_file):
    code, out, _ = run(capsys, "infer", str(example_file), "--arch", "sm_100a", "--explain")
    assert code == 0
    assert "// inference on sm_100:" in out


@pytest.mark.parametrize(("text", "arch"), [("9.0", (9, 0)), ("10.0", (10, 0)),
                                            ("sm_90a", (9, 0)), ("sm_100", (10, 0))])
def test_parse_arch(text, arch):
    assert cli.parse_arch(text) == arch


def test_infer_bad_arch_is_a_usage_error(capsys, example_file):
    code, _, err = run(capsys, "infer", str(example_file), "--arch", "hopper")
    assert code == 2
    assert "invalid architecture" in err


def test_infer_missing_file(capsys, tmp_path):
    missing = tmp_path / "missing.mlir"
    code, out, err = run(capsys, "infer", str(missing))
    assert code == 2
    assert out == ""
    assert "[SM301]" in err and str(missing) in err and "does not exist" in err


def test_infer_unparsable_file(capsys, tmp_path):
    bad = tmp_path / "bad.mlir"
    bad.write_text("module {\n  this is not mlir\n}\n")
    code, out, err = run(capsys, "infer", str(bad))
    assert code == 2
    assert out == ""
    assert "[SM301]" in err and "cannot parse" in err
    assert f"{bad}\":2" in err  # the parser's diagnostic, with its line


def test_infer_unregistered_op_needs_the_flag(capsys, tmp_path):
    path = tmp_path / "fancy.mlir"
    path.write_text(UNREGISTERED_OP)
    code, _, err = run(capsys, "infer", str(path))
    assert code == 2
    assert "[SM301]" in err and "--allow-unregistered-dialect" in err


def test_infer_error_during_inference(capsys, tmp_path):
    path = tmp_path / "fancy.mlir"
    path.write_text(UNREGISTERED_OP)
    context = make_context()
    before = context.allow_unregistered_dialects
    code, out, err = run(capsys, "infer", str(path), "--allow-unregistered-dialect")
    assert code == 1
    assert out == ""
    assert "[SM003]" in err and "mydialect.fancy" in err
    assert make_context().allow_unregistered_dialects == before  # jax's context restored


def test_infer_reads_stdin(capsys, monkeypatch, example_text):
    monkeypatch.setattr(sys, "stdin", types.SimpleNamespace(read=lambda: example_text))
    code, out, _ = run(capsys, "infer", "-")
    assert code == 0
    assert "out_layouts" in out


# --- smalti lower ------------------------------------------------------------------------


def test_lower_runs_the_example(capsys):
    code, out, err = run(capsys, "lower")
    assert code == 0, err
    assert re.search(r"^layout inference on sm_\d+: 8 ops in [\d.]+ ms$", out, re.MULTILINE)
    assert re.search(r"^lowering on sm_\d+: 8 ops in [\d.]+ ms$", out, re.MULTILINE)
    assert "smalti.plugins" in out
    assert " ms" in out
    [exp] = [line for line in out.splitlines() if line.strip().startswith("math.exp ")]
    assert "out_layouts=" in exp
    assert "gpu.launch" not in out  # the IR only with --print-ir


def test_lower_print_ir(capsys):
    code, out, _ = run(capsys, "lower", "--print-ir")
    assert code == 0
    ir_text = out[out.index("module @"):]
    assert "gpu.launch" in ir_text
    assert "mosaic_gpu.vector_load" not in ir_text  # lowered away


def test_lower_file_is_refused_honestly(capsys, example_file):
    code, out, err = run(capsys, "lower", str(example_file))
    assert code == 2
    assert out == ""
    assert "[SM301]" in err and "launch context" in err
    assert f"smalti infer {example_file}" in err


# --- smalti explain ----------------------------------------------------------------------


def test_explain_a_code(capsys):
    code, out, _ = run(capsys, "explain", "SM101")
    assert code == 0
    assert out == codes.CATALOGUE["SM101"].long_form()


def test_explain_is_case_insensitive(capsys):
    code, out, _ = run(capsys, "explain", "sm001")
    assert code == 0
    assert out.startswith("SM001: ")


def test_explain_unknown_code(capsys):
    code, out, err = run(capsys, "explain", "SM999")
    assert code == 2
    assert out == ""
    assert "[SM302]" in err and "SM999" in err


def test_explain_lists_every_code(capsys):
    code, out, _ = run(capsys, "explain")
    assert code == 0
    for entry in codes.CATALOGUE.values():
        assert f"{entry.code}  {entry.title}" in out


# --- the installed command -----------------------------------------------------------------


def _command() -> list[str]:
    script = Path(sys.executable).with_name("smalti")
    return [str(script)] if script.exists() else [sys.executable, "-m", "smalti.cli"]


def test_console_script(tmp_path):
    env = {**os.environ, "SMALTI_BLOCK_PLUGINS": ""}
    result = subprocess.run([*_command(), "explain", "SM301"], capture_output=True, text=True,
                            env=env, cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("SM301: ")
    result = subprocess.run([*_command(), "explain", "nope"], capture_output=True, text=True,
                            env=env, cwd=tmp_path, timeout=300)
    assert result.returncode == 2
    assert "[SM302]" in result.stderr


def test_infer_explain_says_why_each_layout_was_chosen(capsys, tmp_path):
    from smalti import kernels

    path = tmp_path / "kernel.mlir"
    path.write_text(str(kernels.example_kernel().module))
    code, out, _ = run(capsys, "infer", str(path), "--explain")
    assert code == 0
    assert "// why each layout was chosen:" in out
    assert "forced by mosaic_gpu.layout_cast" in out


def test_plugins_lists_the_rules_left_out_for_other_jax_versions(capsys, monkeypatch):
    def register(registry):
        registry.lowering_rule("fake.op", jax=smalti.JaxVersions(since="99.0"))(
            lambda ctx, op: [])

    future = _plugin("future", smalti_register_lowering_rules=register)
    pipeline = smalti.build_pipeline(plugins=[smalti.plugins, future], autoload=False)
    monkeypatch.setattr(cli, "default_pipeline", lambda: pipeline)
    code, out, _ = run(capsys, "plugins")
    assert code == 0
    assert "left out, for other jax versions than the installed" in out
    assert "future: lowering rule" in out and "for fake.op (jax >=99.0)" in out
