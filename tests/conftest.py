"""Suite-wide checks.

Every error code in ``smalti.codes.CATALOGUE`` must be raised by at least one
test: every ``SmaltiError`` constructed during the session is recorded, and
when the whole suite ran (no path, ``-k``, ``-m`` or deselection narrowing it)
and passed, the session fails listing the codes no test raised. Under
pytest-xdist (``-n N``) each worker records its own and hands them to the
controller as it shuts down, which checks their union.
"""

from __future__ import annotations

from pathlib import Path

import pytest

_TESTS = Path(__file__).resolve().parent
_RAISED = pytest.StashKey[set]()
_NARROWED = pytest.StashKey[bool]()
# The key under which an xdist worker hands its codes to the controller.
_WORKER_CODES = "smalti_raised_codes"


def raised_codes(config: pytest.Config) -> set[str]:
    """Codes of the smalti errors constructed so far in this session."""
    return config.stash[_RAISED]


def pytest_configure(config: pytest.Config) -> None:
    from smalti.diagnostics import SmaltiError

    raised: set[str] = set()
    config.stash[_RAISED] = raised
    config.stash[_NARROWED] = False
    original = SmaltiError.__init__

    def recording_init(self, code, *args, **kwargs):
        raised.add(code)
        original(self, code, *args, **kwargs)

    # Subclasses reach it through super(), so patching the base records all.
    SmaltiError.__init__ = recording_init
    config.add_cleanup(lambda: setattr(SmaltiError, "__init__", original))


def _whole_suite_selected(config: pytest.Config) -> bool:
    """Whether the run covers all of tests/ (other test paths may come along)."""
    if config.option.keyword or config.option.markexpr or config.option.collectonly:
        return False
    covered = False
    for arg in config.args:
        if "::" in arg:
            return False
        path = Path(config.invocation_params.dir, arg).resolve()
        # The tests folder itself, or a folder above it (the repository root).
        covered = covered or path == _TESTS or path in _TESTS.parents
    return covered


def pytest_deselected(items: list[pytest.Item]) -> None:
    if items:
        items[0].config.stash[_NARROWED] = True


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """xdist's controller: a worker finished; add the codes its tests raised."""
    codes = getattr(node, "workeroutput", {}).get(_WORKER_CODES, ())
    node.config.stash[_RAISED].update(codes)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    if hasattr(config, "workerinput"):
        config.workeroutput[_WORKER_CODES] = sorted(raised_codes(config))
        return
    if exitstatus != 0 or config.stash[_NARROWED] or not _whole_suite_selected(config):
        return
    from smalti.codes import CATALOGUE

    never = sorted(set(CATALOGUE) - raised_codes(config))
    if never:
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        message = ("error codes no test raised (add a test that makes smalti raise each): "
                   + ", ".join(never))
        if reporter is not None:
            reporter.write_sep("=", "smalti error-code coverage", red=True)
            reporter.write_line(message)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(autouse=True)
def _emulator_compiles_afresh():
    """Each test compiles the modules it runs: a program kept from an
    earlier test (``smalti.emulate.runner.compiled``) would hide what a test
    patches into compiling."""
    from smalti.emulate.runner import forget_compiled

    forget_compiled()
