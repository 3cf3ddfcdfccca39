"""benchmarks/emulate.py: its quick mode runs and prints all five timings."""

from __future__ import annotations

import re

import numpy as np

from benchmarks import emulate


def test_quick_mode_prints_the_five_timings_and_their_ratios_per_kernel(capsys):
    emulate.main(["--quick", "--repeat", "1"])
    lines = capsys.readouterr().out.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("kernel"))
    for title in ("ops", "lower s", "emulate s", "(1) emu", "(2) +check", "(2)/(1)",
                  "(3) jax", "(4) +races", "(4)/(2)", "(5) on_cpu", "(4)/(5)"):
        assert title in lines[head]
    rows = {name: line[len(name):].split() for line in lines[head + 1:]
            for name in emulate.QUICK if line.startswith(name)}
    assert set(rows) == set(emulate.QUICK)

    figure = r"\d+\.\d{3}!?"
    # A kernel every column runs (jax's figures or, in a jax that cannot, its error).
    cells = rows["elementwise f32 (128, 128)"]
    assert re.fullmatch(r"\d+", cells[0])
    for cell in cells[1:5]:  # lower s, emulate s, (1), (2)
        assert re.fullmatch(figure, cell) or (cell == "n/a" and not emulate.HAS_CHECKER)
    assert re.fullmatch(r"\d+\.\dx|-", cells[5])  # (2)/(1)
    assert cells[6].startswith("jax:") or (re.fullmatch(figure, cells[6])
                                            and re.fullmatch(figure, cells[7]))
    if not cells[6].startswith("jax:"):  # (4)/(2), then the execution mode's warm call
        assert re.fullmatch(figure, cells[9]) and re.fullmatch(r"\d+\.\dx", cells[10])
    # A kernel only smalti lowers: nothing for jax to interpret.
    assert " ".join(rows["smalti: keep_dims mean (128, 128)"]).endswith("n/a (no jax function)")


def test_an_interpret_mode_failure_is_shown_by_its_innermost_error():
    wrapped = RuntimeError(
        "INTERNAL: CpuCallback error calling callback: Traceback (most recent call last):\n"
        '  File "x.py", line 1, in f\n'
        "RuntimeError: Computation failed on Warpgroup(device_id=0) with exception:\n"
        "Traceback (most recent call last):\n"
        "NotImplementedError: predicate not supported\n")
    assert emulate.short_error(wrapped) == "predicate not supported"
    effects = ValueError("Cannot lower jaxpr with effects: {<jax.IOEffect object at 0x1>}")
    assert emulate.short_error(effects) == "Cannot lower jaxpr with effects"
    assert emulate.short_error(AttributeError()) == "AttributeError"
    assert len(emulate.short_error(ValueError("x" * 200))) == 60


def test_a_sample_of_clusters_runs_only_the_first_ones_and_counts_the_grid():
    """first_clusters (the at-scale lines' sampling): the first n clusters
    run, the rest are not launched, the grid's count is reported; 0 runs all."""
    from smalti.emulate import run_module

    name, fn, (x,) = next(k for k in emulate.kernels() if k[0].startswith("8 blocks"))
    module, avals = emulate.lower(fn, x)
    outs = [(tuple(a.shape), a.dtype) for a in avals]
    with emulate.first_clusters(3) as counts:
        (got,) = run_module(module, [x], outs)
    assert counts == [8]
    rows = (got != 0).any(axis=1)
    assert rows[:3 * 128].all() and not rows[3 * 128:].any()  # blocks 0-2 of 8 wrote
    with emulate.first_clusters(0) as counts:
        (whole,) = run_module(module, [x], outs)
    assert counts == [8]
    np.testing.assert_array_equal(whole, x * 3 + 1)
