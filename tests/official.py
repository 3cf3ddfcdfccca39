"""Lowering jax's official Pallas kernels on the CPU, through jax and through smalti."""

from __future__ import annotations

import contextlib
import difflib
import types
from collections.abc import Callable, Iterator

import jax
from jax.experimental.mosaic.gpu import core as mgpu_core
from jax.experimental.mosaic.gpu import utils as mgpu_utils

import smalti.jax
from tests.differential import assert_same_refusal, normalized, refusal

NUM_SMS = 132  # an H100/H200: the kernels size their grids by it


def capture_modules(fn: Callable, *args) -> list[str]:
    """Lowers ``fn`` for CUDA on the CPU; returns the Mosaic GPU modules it
    produced, after layout inference and dialect lowering."""
    captured: list[str] = []
    current = mgpu_core.lower_mgpu_module

    def spy(module, *a, **k):
        current(module, *a, **k)
        captured.append(normalized(module))

    mgpu_core.lower_mgpu_module = spy
    jax.clear_caches()  # jax caches lowerings: make it lower again
    try:
        jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",))
    finally:
        mgpu_core.lower_mgpu_module = current
    return captured


@contextlib.contextmanager
def gpu_facts(monkeypatch, arch: tuple[int, int] = (9, 0)) -> Iterator[None]:
    """What the kernels ask of the (absent) GPU: its SM count and architecture."""
    from jax.extend import backend

    device = types.SimpleNamespace(core_count=NUM_SMS)
    monkeypatch.setattr(backend, "get_default_device", lambda: device)
    monkeypatch.setattr(mgpu_utils, "_infer_arch", lambda: arch)
    yield


def assert_same_modules(fn: Callable, *args) -> str:
    """The modules smalti produces for ``fn`` equal jax's; returns smalti's.
    Where the installed jax refuses to lower ``fn``, smalti must refuse it the
    same way; then returns ''."""
    by_jax: list[str] = []
    theirs = refusal(lambda: by_jax.extend(capture_modules(fn, *args)))
    if theirs is not None:
        with smalti.jax.installed():
            assert_same_refusal(theirs, refusal(lambda: capture_modules(fn, *args)))
        return ""
    with smalti.jax.installed():
        by_smalti = capture_modules(fn, *args)
    assert len(by_jax) == len(by_smalti) >= 1
    for ours, theirs in zip(by_smalti, by_jax):
        assert "mosaic_gpu.wgmma" not in ours and "mosaic_gpu.vector_load" not in ours
        if ours != theirs:
            diff = difflib.unified_diff(theirs.splitlines(), ours.splitlines(), "jax",
                                        "smalti", lineterm="", n=1)
            raise AssertionError("modules differ:\n" + "\n".join(list(diff)[:60]))
    return by_smalti[0]
