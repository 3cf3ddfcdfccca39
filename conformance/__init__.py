"""The conformance runner: jax's own Mosaic GPU tests, run with smalti in jax's place.

Is smalti a drop-in for the jax you have? Point the runner at jax's
deviceless middle-end tests (a jax checkout's ``tests/mosaic/``, e.g.
``gpu_layout_inference_test.py`` and ``gpu_dialect_test.py``) and at the
list of tests that pass under that jax itself::

    smalti conformance path/to/jax/tests/mosaic --expected PASSING.txt --require 449

How it works:

1. The helper modules jax's tests import (``jax._src.hypothesis_test_util``,
   ``jax.experimental.mosaic.gpu.test_util``) are loaded from beside the test
   files when the installed jax lacks them (:mod:`.runner`).
2. jax's inference and lowering are replaced by smalti's everywhere jax
   references them: ``mgpu.infer_layout``, ``mgpu.lower_mgpu_dialect``, and
   the Warpgroup pipeline behind ``mgpu.as_gpu_kernel`` and Pallas
   (:mod:`.drop_in`).
3. Rules the tests register through jax's private registry are given to
   smalti as a plugin, translated into smalti's constraint language, and
   withdrawn when the tests withdraw them (:mod:`.bridge`).
4. pytest runs the files in this process; the runner prints each file's
   figures against the expected list and the expected tests that did not
   pass, with why.

With ``--emulate[=ARCH]`` the runner takes jax's GPU tests (tests that run
kernels and check their numbers, e.g. ``tests/mosaic/gpu_test.py``) to the
CPU: the process pretends to have that GPU (:mod:`smalti.emulate.pretend`)
and every kernel the tests launch runs on smalti's emulator; ``--timeout``
stops a test that runs too long (the emulator is slow on large shapes).

With smalti's default settings: no test-specific code exists in smalti; the
runner's only knowledge of the tests is the three facts above. This package
is the one place outside the tests where smalti references jax's
``layout_inference``, ``dialect_lowering`` and ``constraints`` — to replace
them and to read the tests' rules; none of smalti's rules or drivers use
them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from smalti.conformance.runner import Result, read_expected, run

__all__ = ["Result", "format_result", "read_expected", "run"]


def format_result(result: Result, *, out: TextIO, shown: int = 40) -> None:
    """Prints ``result``: per file, how many expected tests passed."""
    counts = result.per_file()
    width = max([len(c.file) for c in counts] + [5])
    has_list = result.expected is not None
    header = f"{'file':<{width}}  {'expected':>8}  {'passed':>6}  {'failed':>6}  {'skipped':>7}"
    if has_list:
        header += f"  {'passed, not listed':>18}"
    print(header, file=out)
    total = [0, 0, 0, 0, 0]
    for c in counts:
        passed = c.passed_expected if has_list else c.passed_other
        row = [c.expected, passed, c.failed, c.skipped, c.passed_other]
        total = [a + b for a, b in zip(total, row)]
        line = f"{c.file:<{width}}  {row[0]:>8}  {row[1]:>6}  {row[2]:>6}  {row[3]:>7}"
        print(line + (f"  {row[4]:>18}" if has_list else ""), file=out)
    line = f"{'total':<{width}}  {total[0]:>8}  {total[1]:>6}  {total[2]:>6}  {total[3]:>7}"
    print(line + (f"  {total[4]:>18}" if has_list else ""), file=out)
    fallbacks = sum(1 for o in result.outcomes.values() if o.arch_fallbacks)
    if fallbacks:
        print(f"\n{fallbacks} tests used a rule outside its architecture range "
              "(SM002 warnings, as jax does not check the architecture)", file=out)
    _print_races(result, out=out, shown=shown)
    if not has_list:
        _print_failure_reasons(result, out=out, shown=shown)
    missing = result.expected_not_passing
    if has_list and missing:
        print(f"\nexpected to pass, did not ({len(missing)}):", file=out)
        for test in missing[:shown]:
            outcome = result.outcomes.get(test)
            why = "did not run" if outcome is None else f"{outcome.outcome}: {outcome.reason}"
            print(f"  {test}\n      {why[:300]}", file=out)
        if len(missing) > shown:
            print(f"  ... and {len(missing) - shown} more", file=out)


_WHERE = re.compile(r" at (loc\(.*?\)|\S+:\d+)|0x[0-9a-f]+")


def _print_races(result: Result, *, out: TextIO, shown: int) -> None:
    """The tests whose kernels raced (races reported as warnings,
    ``--on-race warn``), with their outcome and first race."""
    racy = sorted((o for o in result.outcomes.values() if o.races), key=lambda o: o.test)
    if not racy:
        return
    passed = sum(1 for o in racy if o.outcome == "passed")
    print(f"\n{len(racy)} tests' kernels have data races ({passed} of them passed their "
          "assertions on the emulator's one interleaving; a GPU may compute otherwise):",
          file=out)
    for o in racy[:shown]:
        print(f"  {o.test} ({o.outcome}, {len(o.races)} races)\n      {o.races[0][:300]}",
              file=out)
    if len(racy) > shown:
        print(f"  ... and {len(racy) - shown} more", file=out)


def _print_failure_reasons(result: Result, *, out: TextIO, shown: int) -> None:
    """Without a list of expected tests: the failures grouped by why (the
    reason's first line, without source locations), most frequent first."""
    reasons: dict[str, int] = {}
    for outcome in result.outcomes.values():
        if outcome.outcome == "failed":
            why = _WHERE.sub("", outcome.reason)[:160]
            reasons[why] = reasons.get(why, 0) + 1
    if not reasons:
        return
    print(f"\nwhy tests failed ({sum(reasons.values())}):", file=out)
    for why, count in sorted(reasons.items(), key=lambda kv: -kv[1])[:shown]:
        print(f"  {count:>5}  {why}", file=out)
    if len(reasons) > shown:
        print(f"  ... and {len(reasons) - shown} more reasons", file=out)


def main(paths: Sequence[str], expected_file: str | None, require: int | None,
         pytest_args: Sequence[str], out: TextIO, *, reference: bool = False,
         write_passing: str | None = None, emulate: tuple[int, int] | None = None,
         timeout: float | None = None, shard: tuple[int, int] | None = None,
         write_outcomes: str | None = None, on_race: str | None = None) -> int:
    """``smalti conformance``: 0 if at least ``require`` expected tests passed
    (default: all of them; without a list, if pytest found no failure).
    ``reference``: run under jax's own middle-end; ``write_passing``: write
    the ids of the tests that passed there (a list for a later run);
    ``emulate``: run jax's GPU tests on the CPU, their kernels on the
    emulator as that architecture; ``timeout``: seconds each test may run;
    ``shard``: run only that share of the tests; ``write_outcomes``: write
    every test's outcome, seconds, why and races reported (tab-separated);
    ``on_race``: the emulator's race policy (``"warn"``: races are listed,
    not failures)."""
    expected = read_expected(Path(expected_file)) if expected_file else None
    result = run([Path(p) for p in paths], expected=expected, pytest_args=pytest_args,
                 reference=reference, emulate=emulate, timeout=timeout, shard=shard,
                 on_race=on_race)
    print(file=out)
    print("under jax's own inference and lowering (the reference)" if reference else
          "under smalti's inference and lowering", file=out)
    if emulate is not None:
        print(f"on the CPU: kernels run on smalti's emulator as sm_{emulate[0]}{emulate[1]}",
              file=out)
    format_result(result, out=out)
    if write_passing:
        passed = sorted(t for t, o in result.outcomes.items() if o.outcome == "passed")
        Path(write_passing).write_text("".join(t + "\n" for t in passed))
        print(f"\nwrote the {len(passed)} passing tests to {write_passing}", file=out)
    if write_outcomes:
        rows = [f"{o.test}\t{o.outcome}\t{o.seconds:.2f}\t{o.reason}\t{len(o.races)}\n"
                for o in sorted(result.outcomes.values(), key=lambda o: o.test)]
        Path(write_outcomes).write_text("".join(rows))
        print(f"\nwrote the outcomes of {len(rows)} tests to {write_outcomes}", file=out)
    if expected is None:
        return 0 if result.exit_status == 0 else 1
    passed = len(result.expected_passing)
    needed = len(expected) if require is None else require
    verdict = "ok" if passed >= needed else "FAILED"
    print(f"\n{verdict}: {passed} of {len(expected)} expected tests pass "
          f"(required: {needed})", file=out)
    return 0 if passed >= needed else 1
