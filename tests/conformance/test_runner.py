"""The conformance runner, on small test files written the way jax's are.

The runner itself is run on jax's own tests by ``.ci/run``; here each of its
mechanisms is shown on its own: the drop-in, the bridge of rules registered
through jax's private registry, the helpers loaded under jax's names, and
the counting against a list.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

#: A jax-style test file: registers a rule for llvm.mlir.undef through jax's
#: private registry in setUpClass, withdraws it in tearDownClass.
JAX_STYLE_TESTS = '''
import unittest

import jax.experimental.mosaic.gpu as mgpu
from jax._src.lib.mlir import ir
from jax._src.lib.mlir.dialects import arith, llvm
from jax.experimental.mosaic.gpu import constraints as cs
from jax.experimental.mosaic.gpu import fragmented_array as fa
from jax.experimental.mosaic.gpu import layout_inference
from jax.experimental.mosaic.gpu import layouts
from jax.experimental.mosaic.gpu import test_util  # loaded from beside this file

WGMMA = cs.RegisterLayout(fa.WGMMA_LAYOUT)


def undef_rule(ctx, op):
    result = layout_inference.ValueSite(op, layout_inference.VariableType.RESULT, 0)
    return cs.ConstraintSystem(), {cs.Variable(result): [result]}


def pinned_rule(ctx, op):
    result = layout_inference.ValueSite(op, layout_inference.VariableType.RESULT, 0)
    variable = cs.Variable(result)
    return cs.ConstraintSystem(assignments={variable: WGMMA}), {variable: [result]}


def relayout_rule(ctx, op):
    result = layout_inference.ValueSite(op, layout_inference.VariableType.RESULT, 0)
    variable = cs.Variable(result)
    system = cs.ConstraintSystem(constraints=[cs.Relayout(variable, variable, 16)])
    return system, {variable: [result]}


class Base(unittest.TestCase):
    def setUp(self):
        self.context = ir.Context()
        self.context.load_all_available_dialects()
        mgpu.dialect.register_dialect(self.context)
        self.enterContext(self.context)
        self.enterContext(ir.Location.unknown())
        self.module = ir.Module.create()

    def add_of_undefs(self):
        ty = ir.VectorType.get((128, 128), ir.F32Type.get())
        with ir.InsertionPoint(self.module.body):
            x = llvm.mlir_undef(ty)
            return x.owner, arith.addf(x, x).owner


class RegisteringRule(Base):
    """Registers ``rule`` for llvm.mlir.undef as jax's tests do, and withdraws it."""
    rule = None

    @classmethod
    def setUpClass(cls):
        layout_inference._add_constraint_system_derivation_rule(llvm.UndefOp)(cls.rule)

    @classmethod
    def tearDownClass(cls):
        del layout_inference._constraint_system_derivation_rules[
            llvm.UndefOp.OPERATION_NAME]


class WithUndefRule(RegisteringRule):
    rule = staticmethod(undef_rule)

    def test_helper_module_is_loaded(self):
        self.assertEqual(test_util.MARK, "beside the tests")

    def test_undef_result_gets_the_default_layout(self):
        undef, add = self.add_of_undefs()
        mgpu.infer_layout(self.module)
        strided = layouts.to_layout_attr(
            fa.WGStridedFragLayout.from_shaped_type(undef.result.type))
        self.assertEqual(list(ir.ArrayAttr(undef.attributes["out_layouts"])), [strided])

    def test_smalti_is_in_place(self):
        undef, add = self.add_of_undefs()
        with ir.InsertionPoint(self.module.body):
            mgpu.dialect.layout_cast(add.result, layouts.to_layout_attr(fa.WGMMA_LAYOUT))
            mgpu.dialect.layout_cast(
                add.result, layouts.to_layout_attr(fa.WGStridedFragLayout((128, 128), 1)))
        with self.assertRaisesRegex(ValueError, "user-provided layout casts are unsatisfiable"):
            mgpu.infer_layout(self.module)
        with self.assertRaisesRegex(ValueError, "SM101"):  # only smalti's error has a code
            mgpu.infer_layout(self.module)


class WithPinningRule(RegisteringRule):
    rule = staticmethod(pinned_rule)

    def test_assignment_is_translated(self):
        undef, add = self.add_of_undefs()
        mgpu.infer_layout(self.module)
        wgmma = layouts.to_layout_attr(fa.WGMMA_LAYOUT)
        self.assertEqual(list(ir.ArrayAttr(add.attributes["out_layouts"])), [wgmma])


class WithUntranslatableRule(RegisteringRule):
    rule = staticmethod(relayout_rule)

    def test_untranslatable_constraint_is_refused_by_name(self):
        self.add_of_undefs()
        with self.assertRaisesRegex(ValueError, "SM006.*states a Relayout constraint"):
            mgpu.infer_layout(self.module)


class WithoutRule(Base):
    def test_withdrawn_rule_is_gone(self):
        self.add_of_undefs()
        with self.assertRaisesRegex(NotImplementedError, "No layout inference rule defined"):
            mgpu.infer_layout(self.module)
'''

#: What passes only under smalti: its errors have codes, jax's do not.
SMALTI_ONLY = {"fake_test.py::WithUndefRule::test_smalti_is_in_place",
               "fake_test.py::WithUntranslatableRule::"
               "test_untranslatable_constraint_is_refused_by_name"}


@pytest.fixture
def test_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "mosaic"
    directory.mkdir()
    (directory / "fake_test.py").write_text(JAX_STYLE_TESTS)
    (directory / "mgpu_test_util.py").write_text('MARK = "beside the tests"\n')
    return directory


def every_test() -> list[str]:
    names = []
    for line in JAX_STYLE_TESTS.splitlines():
        line = line.strip()
        if line.startswith("class "):
            cls = line.split()[1].split("(")[0]
        elif line.startswith("def test_"):
            names.append(f"fake_test.py::{cls}::{line.split()[1].split('(')[0]}")
    return names


def conformance(*args: str) -> subprocess.CompletedProcess:
    """``smalti conformance ARGS`` in a fresh process (it runs pytest in-process)."""
    return subprocess.run([sys.executable, "-m", "smalti.cli", "conformance", *args],
                          capture_output=True, text=True, timeout=300)


def outcome_table(stdout: str) -> dict[str, list[str]]:
    rows = {}
    for line in stdout.splitlines():
        parts = line.split()
        if parts and parts[0] in ("fake_test.py", "total"):
            rows[parts[0]] = parts[1:]
    return rows


def test_every_test_passes_under_smalti_and_is_counted_against_the_list(test_dir, tmp_path):
    expected = tmp_path / "expected.txt"
    expected.write_text("# the tests that must pass\n" + "\n".join(every_test()) + "\n")
    done = conformance(str(test_dir), "--expected", str(expected))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "under smalti's inference and lowering" in done.stdout
    # expected, passed, failed, skipped, passed but not listed
    assert outcome_table(done.stdout)["fake_test.py"] == ["6", "6", "0", "0", "0"]
    assert "ok: 6 of 6 expected tests pass (required: 6)" in done.stdout


def test_reference_run_under_jax_shows_what_only_smalti_passes(test_dir, tmp_path):
    passing = tmp_path / "passing.txt"
    done = conformance(str(test_dir), "--jax", "--write-passing", str(passing))
    assert "under jax's own inference and lowering" in done.stdout
    assert done.returncode == 1  # smalti's own error codes are not jax's
    assert set(passing.read_text().split()) == set(every_test()) - SMALTI_ONLY


def test_below_the_required_count_fails_naming_the_tests(test_dir, tmp_path):
    expected = tmp_path / "expected.txt"
    missing = "fake_test.py::WithUndefRule::test_that_does_not_exist"
    expected.write_text("\n".join([*every_test(), missing]) + "\n")
    done = conformance(str(test_dir), "--expected", str(expected))
    assert done.returncode == 1
    assert "FAILED: 6 of 7 expected tests pass (required: 7)" in done.stdout
    assert f"{missing}\n      did not run" in done.stdout
    done = conformance(str(test_dir), "--expected", str(expected), "--require", "6")
    assert done.returncode == 0


def test_a_missing_path_is_a_usage_error(tmp_path):
    done = conformance(str(tmp_path / "nowhere"))
    assert done.returncode == 2
    assert "[SM301] no such file or directory" in done.stderr


def test_an_unquoted_pytest_option_value_is_explained(test_dir):
    """``--pytest-args=-k not slow`` unquoted: the shell hands ``not`` and
    ``slow`` over as paths; the error says to quote the whole value."""
    done = conformance(str(test_dir), "--pytest-args=-k", "not", "slow")
    assert done.returncode == 2
    assert "[SM301] unrecognized arguments: not slow" in done.stderr
    assert "quote --pytest-args's whole value" in done.stderr
    assert "(here -k lost its value to arguments nobody takes)" in done.stderr
    done = conformance("--pytest-args=-k", "not", "slow", str(test_dir))
    assert done.returncode == 2
    assert "[SM301] no such file or directory: not" in done.stderr
    assert "(here -k lost its value to the paths)" in done.stderr
    done = conformance(str(test_dir), "--pytest-args=-x", "--bogus")
    assert done.returncode == 2  # argparse's own error: nothing was split off an option
    assert "unrecognized arguments: --bogus" in done.stderr and "quote" not in done.stderr


def test_jax_is_restored_after_a_run(test_dir):
    script = textwrap.dedent(f"""
        import sys
        from pathlib import Path
        import jax.experimental.mosaic.gpu as mgpu
        from jax.experimental.mosaic.gpu import core, layout_inference
        before = (mgpu.infer_layout, mgpu.lower_mgpu_dialect, core.lower_mgpu_module,
                  layout_inference.infer_layout,
                  dict(layout_inference._constraint_system_derivation_rules))
        from smalti import conformance
        result = conformance.run([Path({str(test_dir)!r})])
        after = (mgpu.infer_layout, mgpu.lower_mgpu_dialect, core.lower_mgpu_module,
                 layout_inference.infer_layout,
                 dict(layout_inference._constraint_system_derivation_rules))
        assert len(result.outcomes) == 6, result.outcomes
        assert before == after
        assert "jax.experimental.mosaic.gpu.test_util" not in sys.modules
        assert not hasattr(mgpu, "test_util")
        print("restored")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300)
    assert done.stdout.strip().endswith("restored"), done.stdout + done.stderr


def test_shards_split_the_tests_and_outcomes_are_written(test_dir, tmp_path):
    """Shards 1/2 and 2/2 run disjoint halves that together are every test;
    --write-outcomes records each with its outcome and seconds."""
    ran = []
    for k in (1, 2):
        outcomes = tmp_path / f"outcomes{k}.tsv"
        done = conformance(str(test_dir), "--shard", f"{k}/2", "--write-outcomes", str(outcomes))
        assert done.returncode == 0, done.stdout + done.stderr
        rows = [line.split("\t") for line in outcomes.read_text().splitlines()]
        assert {r[1] for r in rows} == {"passed"} and all(float(r[2]) >= 0 for r in rows)
        ran.append({r[0] for r in rows})
    assert len(ran[0]) == 3 and len(ran[1]) == 3 and not ran[0] & ran[1]
    assert ran[0] | ran[1] == set(every_test())


@pytest.mark.parametrize("shard", ["0/2", "3/2", "2", "a/b"])
def test_a_shard_outside_one_to_n_is_a_usage_error(test_dir, shard):
    done = conformance(str(test_dir), "--shard", shard)
    assert done.returncode == 2
    assert "a shard is K/N with 1 <= K <= N" in done.stderr


def test_work_a_timed_out_test_left_running_is_stopped_and_forgotten():
    """After a timeout the runner stops what the test dispatched and left
    running -- here a reference dot waiting for its operand, as a test's
    reference waits for its inputs while the kernel times out -- at its next
    deadline check, and jax no longer waits for it (at the next test, or at
    the interpreter's exit, where its callback would fail)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax import lax

    from smalti import emulate
    from smalti.conformance.runner import _stop_abandoned_work

    @jax.jit
    def operand(x):  # about a second of XLA:CPU's work: the dot is dispatched before it ends
        return (x @ x @ x)[:, :1024].astype(jnp.float16)

    a = operand(jnp.full((4096, 4096), 1 / 64, jnp.float32))
    with emulate.on_cpu((9, 0)):
        reference = jnp.dot(a, a.T, precision=lax.DotAlgorithmPreset.F16_F16_F32)
    _stop_abandoned_work()  # returns once the dot has stopped
    with pytest.raises(Exception, match="DeadlineExceeded"):
        np.asarray(reference)
    jax.effects_barrier()  # nothing failed is left to wait for
