"""Tracing: which plugin and rule handled each op, the layouts chosen and why."""

from __future__ import annotations

import pytest

import smalti
from smalti import kernels
from smalti.inference import TRACE_ENV
from smalti.registry import installed_jax

#: The layout_cast rule for the installed jax (jax 0.11 has its own: its
#: casts have no `strict` attribute).
CAST_RULE = "layout_cast" if installed_jax() >= (0, 12) else "layout_cast_jax_0_11"


@pytest.mark.parametrize("value", ["1", "yes", "true"])
def test_smalti_trace_env_turns_tracing_on(monkeypatch, value):
    monkeypatch.setenv(TRACE_ENV, value)
    kernel = kernels.example_kernel()
    report = smalti.infer_layouts(kernel.module)
    assert [e.op for e in report.trace][:3] == [
        "arith.constant", "mosaic_gpu.vector_load", "mosaic_gpu.layout_cast"]
    for entry in report.trace:
        assert entry.plugin == "smalti.plugins" and entry.rule
        assert entry.layouts and entry.summary.keys() == entry.layouts.keys()
        assert entry.why.keys() == entry.layouts.keys()
    by_op = {e.op: e for e in report.trace}
    cast = by_op["mosaic_gpu.layout_cast"]
    assert cast.rule == CAST_RULE and cast.summary["out_layouts"] == "[WGMMA]"
    assert cast.why["out_layouts"] == [
        f"forced by mosaic_gpu.layout_cast (rule {CAST_RULE} of plugin smalti.plugins)"]
    # Its neighbours' layouts follow from the cast; the other load's is searched for.
    assert by_op["math.exp"].why["in_layouts"][0].startswith("forced by mosaic_gpu.layout_cast")
    assert any(w == ["chosen by the search"] for e in report.trace for w in e.why.values())


@pytest.mark.parametrize("value", ["", "0", "false", "no"])
def test_smalti_trace_env_off(monkeypatch, value):
    monkeypatch.setenv(TRACE_ENV, value)
    assert smalti.infer_layouts(kernels.example_kernel().module).trace == []


def test_explicit_trace_argument_wins_over_the_environment(monkeypatch):
    monkeypatch.setenv(TRACE_ENV, "1")
    assert smalti.infer_layouts(kernels.example_kernel().module, trace=False).trace == []
    monkeypatch.setenv(TRACE_ENV, "0")
    assert smalti.infer_layouts(kernels.example_kernel().module, trace=True).trace
