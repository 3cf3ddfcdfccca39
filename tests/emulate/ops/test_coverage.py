"""Every emulator rule and every inline-PTX table form is run by a test.

Each test in this folder declares, with ``@covers(...)``, the op names and
PTX forms it runs, and fails if one of them is never reached while it runs
(:mod:`.harness`). Here the declarations of all the test modules of this
folder are gathered (by importing them, so it holds under ``-k``, ``-x`` or
xdist, whatever ran) and must name every key of ``emulate.compiler.RULES``
and every form of ``emulate.ops.inline_asm``'s table. A rule or form added
without a test fails this test, as does a declaration of a name that no
longer exists."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

from smalti.emulate import runner  # noqa: F401  (registers every rule)
from smalti.emulate.compiler import RULES
from smalti.emulate.ops import inline_asm as ptx

from . import __name__ as PACKAGE
from . import __path__ as PATH
from .harness import covers, run

# Names no test here can run, each with why. Keep it short.
NOT_RUN = {
    # Spellings of older MLIR: jax 0.11.2's MLIR has no such op (it names them
    # nvvm.mbarrier.init, .arrive, ..., nvvm.barrier, nvvm.prefetch), so no
    # module here can contain one; the rules stay for modules that do.
    "nvvm.mbarrier.init.shared": "not an op of jax 0.11.2's MLIR",
    "nvvm.mbarrier.arrive.expect_tx.shared": "not an op of jax 0.11.2's MLIR",
    "nvvm.mbarrier.arrive.shared": "not an op of jax 0.11.2's MLIR",
    "nvvm.mbarrier.arrive.nocomplete.shared": "not an op of jax 0.11.2's MLIR",
    "nvvm.mbarrier.try_wait.parity.shared": "not an op of jax 0.11.2's MLIR",
    "nvvm.prefetch.tensormap": "not an op of jax 0.11.2's MLIR",
    "nvvm.barrier0": "not an op of jax 0.11.2's MLIR",
}

def declared() -> dict[str, list[str]]:
    """Name -> the tests declaring it, over every test module of this folder."""
    found: dict[str, list[str]] = {}
    for info in pkgutil.iter_modules(PATH):
        if not info.name.startswith("test_"):
            continue
        module = importlib.import_module(f"{PACKAGE}.{info.name}")
        for attr, fn in vars(module).items():
            for name in getattr(fn, "covers", ()):
                found.setdefault(name, []).append(f"{info.name}.{attr}")
    return found


def required() -> set[str]:
    forms = {form for form, _ in ptx.modelled_ptx()}
    return (set(RULES) | forms) - set(NOT_RUN)


def test_every_rule_and_ptx_form_is_run_by_a_declaring_test():
    missing = sorted(required() - set(declared()))
    assert not missing, f"no test runs (declares @covers) these rules or PTX forms: {missing}"


def test_declarations_name_only_rules_and_forms_that_exist():
    known = set(RULES) | {form for form, _ in ptx.modelled_ptx()}
    stale = sorted(set(declared()) - known)
    assert not stale, f"tests declare names that are neither a rule nor a PTX form: {stale}"


def test_the_exceptions_are_still_rules_and_still_unparsable():
    """Each name left out is a registered rule that jax's MLIR cannot build
    (once it can, it must be tested instead)."""
    from smalti.kernels import make_context

    context = make_context()
    for name in NOT_RUN:
        assert name in RULES, name
        assert not context.is_registered_operation(name), f"{name} can be built now: test it"


def test_a_rule_added_without_a_test_is_found(monkeypatch):
    monkeypatch.setitem(RULES, "test.untested", RULES["arith.addi"])
    assert "test.untested" in required() - set(declared())


def test_a_test_that_does_not_run_what_it_declares_fails():
    @covers("arith.addi", "arith.subi")
    def adds_only():
        run("%r = arith.addi %a, %a : i32", {"a": ("i32", 1)}, {"r": "i32"})

    @covers("arith.addi")
    def adds():
        run("%r = arith.addi %a, %a : i32", {"a": ("i32", 1)}, {"r": "i32"})

    with pytest.raises(AssertionError, match=r"adds_only declares but never ran \['arith.subi'\]"):
        adds_only()
    adds()
