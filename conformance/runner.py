"""Running jax's test files in-process under the drop-in, and counting.

:func:`run` preloads the helper modules the tests import under jax's names
(when the installed jax lacks them), runs the files with pytest inside a
:class:`smalti.conformance.drop_in.DropIn`, records each test's outcome, and
compares them with the list of tests expected to pass.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import signal
import sys
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from pytest import hookimpl as pytest_hookimpl

from smalti.records import Fields

#: Helper files of jax's test tree, and the module names the tests import them as.
HELPERS = {
    "hypothesis_test_util.py": "jax._src.hypothesis_test_util",
    "mgpu_test_util.py": "jax.experimental.mosaic.gpu.test_util",
}

#: pytest options for a run: no cache written into jax's tree, none of the
#: options of an enclosing project, and smalti's architecture warnings
#: counted by the runner rather than listed by pytest.
PYTEST_OPTIONS = ("-q", "-p", "no:cacheprovider", "-o", "addopts=", "--tb=no", "-rN",
                  "-W", "ignore::smalti.arch_policy.ArchitectureWarning",
                  "-W", "ignore::pytest.PytestAssertRewriteWarning")


class Outcome(Fields):
    """How one test ended: ``passed``, ``failed``, ``skipped`` (an error in
    setup or teardown counts as ``failed``), with the first line of why."""

    __slots__ = ("test", "outcome", "reason", "arch_fallbacks", "seconds", "races")

    def __init__(self, test: str, outcome: str, reason: str = "",
                 arch_fallbacks: int = 0, seconds: float = 0.0,
                 races: Sequence[str] = ()) -> None:
        self.test = test
        self.outcome = outcome
        self.reason = reason
        #: calls of smalti in the test that used a rule for another architecture
        self.arch_fallbacks = arch_fallbacks
        #: how long the test's call ran
        self.seconds = seconds
        #: the data races its kernels reported as warnings (``on_race="warn"``),
        #: each by its first line
        self.races = list(races)


class FileCount(Fields):
    """One test file's figures."""

    __slots__ = ("file", "expected", "passed_expected", "passed_other", "failed", "skipped")

    def __init__(self, file: str, expected: int = 0, passed_expected: int = 0,
                 passed_other: int = 0, failed: int = 0, skipped: int = 0) -> None:
        self.file = file
        self.expected = expected
        self.passed_expected = passed_expected
        self.passed_other = passed_other
        self.failed = failed
        self.skipped = skipped


class Result(Fields):
    """What a run found: each test's outcome, and the tests expected to pass."""

    __slots__ = ("outcomes", "expected", "exit_status")

    def __init__(self, outcomes: dict[str, Outcome], expected: list[str] | None,
                 exit_status: int) -> None:
        self.outcomes = outcomes
        #: test ids expected to pass (``None``: no list given)
        self.expected = expected
        #: pytest's exit status
        self.exit_status = exit_status

    @property
    def expected_passing(self) -> list[str]:
        return [t for t in self.expected or () if self._passed(t)]

    @property
    def expected_not_passing(self) -> list[str]:
        """Expected tests that did not pass (or did not run at all)."""
        return [t for t in self.expected or () if not self._passed(t)]

    def _passed(self, test: str) -> bool:
        outcome = self.outcomes.get(test)
        return outcome is not None and outcome.outcome == "passed"

    def per_file(self) -> list[FileCount]:
        counts: dict[str, FileCount] = {}
        expected = set(self.expected or ())
        for test in expected:
            file = _file_of(test)
            counts.setdefault(file, FileCount(file)).expected += 1
        for test, outcome in self.outcomes.items():
            count = counts.setdefault(_file_of(test), FileCount(_file_of(test)))
            if outcome.outcome == "passed":
                if test in expected:
                    count.passed_expected += 1
                else:
                    count.passed_other += 1
            elif outcome.outcome == "failed":
                count.failed += 1
            else:
                count.skipped += 1
        return [counts[f] for f in sorted(counts)]


def _file_of(test: str) -> str:
    return test.split("::", 1)[0]


def read_expected(path: Path) -> list[str]:
    """Test ids, one per line (blank lines and ``#`` comments ignored)."""
    lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    return [line for line in lines if line]


def test_files(paths: Iterable[Path]) -> list[Path]:
    """The test files among ``paths`` (a directory: its ``*_test.py`` and
    ``test_*.py`` files)."""
    files = []
    for path in paths:
        if path.is_dir():
            files += sorted({*path.glob("*_test.py"), *path.glob("test_*.py")})
        else:
            files.append(path)
    return files


@contextlib.contextmanager
def helpers_preloaded(directories: Iterable[Path]) -> Iterator[list[str]]:
    """Loads the helper files found in ``directories`` under the names the
    tests import them as, unless the installed jax has those modules; yields
    the names loaded and removes them afterwards."""
    loaded = []
    try:
        for file_name, module_name in HELPERS.items():
            if _importable(module_name):
                continue
            for directory in directories:
                path = directory / file_name
                if path.is_file():
                    _load(module_name, path)
                    loaded.append(module_name)
                    break
        yield loaded
    finally:
        for module_name in loaded:
            sys.modules.pop(module_name, None)
            parent, _, child = module_name.rpartition(".")
            if parent in sys.modules and hasattr(sys.modules[parent], child):
                delattr(sys.modules[parent], child)


def _importable(module_name: str) -> bool:
    if module_name in sys.modules:
        return True
    try:
        return importlib.util.find_spec(module_name) is not None
    except ImportError:
        return False


def _load(module_name: str, path: Path) -> None:
    spec = importlib.util.spec_from_file_location(module_name, path)
    assert spec is not None and spec.loader is not None  # a .py file always has both
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    parent, _, child = module_name.rpartition(".")
    setattr(importlib.import_module(parent), child, module)


class _Collector:
    """A pytest plugin: refreshes the drop-in before each test and records
    how each test ended."""

    def __init__(self, drop_in: Any | None) -> None:
        self.drop_in = drop_in
        self.outcomes: dict[str, Outcome] = {}
        #: tests stopped by the per-test timeout, with it
        self.timed_out: dict[str, float] = {}
        self._fallbacks = 0
        #: per test, the first lines of the RaceWarnings its kernels issued
        #: before the test's report
        self._races: dict[str, list[str]] = {}
        if drop_in is not None:
            drop_in.on_fallbacks = self._count_fallbacks

    def _count_fallbacks(self, texts: list[str]) -> None:
        self._fallbacks += 1

    def pytest_runtest_setup(self, item: Any) -> None:
        self._fallbacks = 0

    def pytest_runtest_call(self, item: Any) -> None:
        # After setUpClass / setUp have registered their rules.
        if self.drop_in is not None:
            self.drop_in.refresh()

    def pytest_warning_recorded(self, warning_message: Any, when: str, nodeid: str,
                                location: Any) -> None:
        from smalti.emulate import RaceWarning

        if when == "runtest" and issubclass(warning_message.category, RaceWarning):
            # (pytest hands a test's warnings over when the test is done, after its report)
            test, first = _test_id(nodeid), str(warning_message.message).splitlines()[0]
            outcome = self.outcomes.get(test)
            (outcome.races if outcome is not None else
             self._races.setdefault(test, [])).append(first)

    def pytest_runtest_logreport(self, report: Any) -> None:
        test = _test_id(report.nodeid)
        if report.when == "call" or report.failed or (report.skipped and report.when == "setup"):
            previous = self.outcomes.get(test)
            if previous is not None and previous.outcome == "failed":
                return  # the first failure is the one to report
            reason = ""
            if report.failed:
                crash = getattr(report.longrepr, "reprcrash", None)
                reason = crash.message if crash is not None else str(report.longrepr)
                reason = _kernel_error(reason) or reason
                if test in self.timed_out:
                    reason = f"timed out after {self.timed_out[test]:g} s"
            elif report.skipped and isinstance(report.longrepr, tuple):
                reason = str(report.longrepr[2])
            self.outcomes[test] = Outcome(test, report.outcome, reason.splitlines()[0]
                                          if reason else "", self._fallbacks,
                                          report.duration if report.when == "call" else 0.0,
                                          self._races.pop(test, ()))


class _Shard:
    """A pytest plugin: keeps every ``count``-th collected test from the
    ``index``-th (collection order, 0-based), deselecting the rest -- so
    ``count`` runs with indices 0 to ``count`` - 1 run every test once
    (on several cores, or as a sample of a long suite)."""

    def __init__(self, index: int, count: int) -> None:
        self.index, self.count = index, count

    def pytest_collection_modifyitems(self, config: Any, items: list[Any]) -> None:
        kept = items[self.index::self.count]
        dropped = [item for k, item in enumerate(items) if k % self.count != self.index]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
        items[:] = kept


def parse_shard(text: str) -> tuple[int, int]:
    """``K/N`` (1 <= K <= N) as the 0-based (index, count) of a shard."""
    k, sep, n = text.partition("/")
    try:
        index, count = int(k), int(n)
    except ValueError:
        index = count = 0
    if not sep or not 1 <= index <= count:
        raise ValueError(f"a shard is K/N with 1 <= K <= N (e.g. 1/4), not {text!r}")
    return index - 1, count


class TimedOut(Exception):
    """A test ran past the runner's per-test timeout."""


class _Timeout:
    """A pytest plugin: stops a test's call after ``seconds``, recording it
    in the collector -- by SIGALRM in the main thread, and by the emulator's
    deadline (:mod:`smalti.emulate.deadline`) in a kernel's host callback,
    which runs on a thread of XLA's while the main thread waits where no
    signal handler can run."""

    def __init__(self, seconds: float, collector: _Collector) -> None:
        self.seconds = seconds
        self.collector = collector

    @pytest_hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: Any) -> Any:
        test = _test_id(item.nodeid)

        def expire(signum: int, frame: Any) -> None:
            self.collector.timed_out[test] = self.seconds
            raise TimedOut(f"{test} ran past {self.seconds:g} s")

        from smalti.emulate.deadline import deadline

        previous = signal.signal(signal.SIGALRM, expire)
        signal.setitimer(signal.ITIMER_REAL, self.seconds)
        try:
            with deadline(self.seconds):
                return (yield)
        except BaseException as e:
            if _timed_out(e):
                self.collector.timed_out[test] = self.seconds
            raise
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
            if test in self.collector.timed_out:
                _stop_abandoned_work()


def _stop_abandoned_work() -> None:
    """After a test that timed out: the jax computations it dispatched and
    left running (a kernel, or a reference dot, still in an XLA host
    callback) stop at the emulator's next deadline check, and are waited
    for here -- not left to run on into the next test's time, or into the
    interpreter's shutdown, where their callbacks fail or crash."""
    import jax

    from smalti.emulate.deadline import deadline

    with deadline(1e-9):  # already past: every check raises
        try:
            jax.effects_barrier()
        except Exception:  # noqa: BLE001 -- the abandoned work's own error; the test failed
            # a failed wait keeps the failed computations' tokens, which jax's
            # exit handler would wait for (and report) again
            from jax._src import dispatch

            dispatch.runtime_tokens.clear()


def _timed_out(error: BaseException) -> bool:
    """Whether ``error`` is the emulator's deadline, raised directly or
    (inside a kernel's host callback) as the message of jax's runtime error."""
    from smalti.emulate.deadline import DeadlineExceeded

    return isinstance(error, DeadlineExceeded) or "DeadlineExceeded" in str(error)


def _kernel_error(message: str) -> str | None:
    """The emulator's error in the message of a kernel's failed callback."""
    if "CpuCallback error" not in message:
        return None
    from smalti.emulate.cpu_mode import kernel_error

    return kernel_error(message)


def _test_id(nodeid: str) -> str:
    """``file.py::Class::test`` whatever directory pytest ran from."""
    file, sep, rest = nodeid.partition("::")
    return Path(file).name + sep + rest


def run(paths: Sequence[Path], *, expected: list[str] | None = None,
        pytest_args: Sequence[str] = (), reference: bool = False,
        emulate: tuple[int, int] | None = None, timeout: float | None = None,
        shard: tuple[int, int] | None = None, on_race: str | None = None) -> Result:
    """Runs the jax test files in ``paths`` with smalti in place of jax's
    middle-end (``reference``: with jax's own, to see what that jax passes);
    ``expected``: the test ids that should pass. ``emulate``: the process
    pretends to have that GPU and runs the tests' kernels on the emulator
    (:mod:`smalti.emulate.pretend`); ``timeout``: seconds a test may run;
    ``shard``: (index, count), only every count-th test from the index-th;
    ``on_race``: what an emulated kernel's data race does (the emulator's
    policy: ``"raise"``, the default, fails the test; ``"warn"`` records it in
    the test's :attr:`Outcome.races` and lets the test's assertions decide)."""
    import pytest

    from smalti.conformance.drop_in import DropIn

    files = test_files(paths)
    # The helpers sit beside the test files (jax's tests/mosaic) or one level up
    # (jax's tests/pallas beside tests/mosaic share them).
    directories = list(dict.fromkeys(d for f in files for d in (f.parent, f.parent.parent)))
    gpu: Any = contextlib.nullcontext()
    if emulate is not None:
        from smalti.emulate.pretend import pretend_gpu

        gpu = pretend_gpu(emulate, on_race=on_race)
    with gpu, helpers_preloaded(directories), (
            contextlib.nullcontext() if reference else DropIn()) as drop_in:
        collector = _Collector(drop_in)
        plugins: list[Any] = [collector]
        if timeout:
            plugins.append(_Timeout(timeout, collector))
        if shard is not None:
            plugins.append(_Shard(*shard))
        # every race reported, not once per place in the emulator that warns
        every_race = ["-W", "always::smalti.emulate.RaceWarning"] if emulate is not None else []
        status = pytest.main([*PYTEST_OPTIONS, *every_race, *pytest_args, *map(str, files)],
                             plugins=plugins)
    return Result(collector.outcomes, expected, int(status))
