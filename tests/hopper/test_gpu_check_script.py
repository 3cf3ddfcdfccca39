"""scripts/gpu_check.py (run by hand on a Hopper GPU) stays in working order:
each of its kernels lowers through smalti to jax's module."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import jax

from tests.official import assert_same_modules, gpu_facts

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_check.py"


def test_every_case_of_the_gpu_check_lowers_like_jax(monkeypatch):
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    with gpu_facts(monkeypatch):
        found = gpu_check.cases(size=512)
        assert len(found) >= 5
        for _, fn, inputs in found:
            shapes = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in inputs]
            assert_same_modules(fn, *shapes)
