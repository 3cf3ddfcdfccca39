"""Comparing emulated outputs with references, and the test-kit hook.

``emulate_pipeline(f, *args, pipeline=None)`` runs ``f`` on the emulator
through smalti's pipeline (``pipeline`` as ``smalti.jax.installed`` takes it,
or jax's own when ``jax_pipeline=True``); ``assert_close_ulp`` compares in
units in the last place. A pytest fixture can be a one-liner over these."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from . import profile as emulate_profile
from . import run


def ulp_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """|a - b| in units in the last place of their (common float) dtype,
    counting representable values between them; NaN == NaN."""
    a, b = np.asarray(a), np.asarray(b)
    bits = a.dtype.itemsize * 8
    it = {16: np.int16, 32: np.int32, 64: np.int64}[bits]
    ia = a.view(it).astype(np.int64)
    ib = b.astype(a.dtype).view(it).astype(np.int64)
    top = np.int64(1) << (bits - 1)
    # map sign-magnitude to a monotone integer line
    ia = np.where(ia < 0, -(ia + top), ia)
    ib = np.where(ib < 0, -(ib + top), ib)
    d = np.abs(ia - ib)
    both_nan = np.isnan(a.astype(np.float32)) & np.isnan(b.astype(a.dtype).astype(np.float32))
    return np.where(both_nan, 0, d)


def assert_close_ulp(got: np.ndarray, want: np.ndarray, ulp: int) -> None:
    """Bit-exact (``ulp == 0`` or integer dtypes) or within ``ulp`` ulp."""
    got, want = np.ascontiguousarray(got), np.ascontiguousarray(want)
    if got.shape != want.shape:
        raise AssertionError(f"shapes differ: got {got.shape}, want {want.shape}")
    if got.dtype.kind in "iub" or ulp == 0:
        want_bytes = np.asarray(want, got.dtype).view(np.uint8).reshape(-1)
        same = got.view(np.uint8).reshape(-1) == want_bytes
        if not same.all():
            bad = np.flatnonzero(np.asarray(want, got.dtype).reshape(-1) != got.reshape(-1))
            k = bad[:5] if bad.size else np.flatnonzero(~same)[:5]
            raise AssertionError(f"{bad.size} elements differ (want exact), e.g. at flat {k}: "
                                 f"got {got.reshape(-1)[k]}, want {want.reshape(-1)[k]}")
        return
    d = ulp_distance(got, want)
    if d.max() > ulp:
        k = np.argmax(d)
        raise AssertionError(f"{int((d > ulp).sum())} elements beyond {ulp} ulp; worst "
                             f"{int(d.max())} ulp at flat {k}: got {got.reshape(-1)[k]}, "
                             f"want {want.reshape(-1)[k]}")


def emulate_pipeline(f: Callable, *args: np.ndarray, pipeline: Any = None,
                     jax_pipeline: bool = False, arch: tuple[int, int] = (9, 0),
                     on_race: str | None = None, on_uninitialized: str | None = None,
                     profile: bool = False):
    """Runs ``f`` on the emulator through smalti's pipeline (or jax's), with
    the synchronization checker's policies as :func:`smalti.emulate.run` takes
    them; with ``profile``, returns :func:`smalti.emulate.profile`'s
    :class:`~smalti.emulate.Profile` (outputs and counters) instead."""
    policies = dict(on_race=on_race, on_uninitialized=on_uninitialized)
    go = emulate_profile if profile else run
    if jax_pipeline:
        return go(f, *args, arch=arch, **policies)
    import smalti.jax

    with smalti.jax.installed(pipeline):  # None: the installed plugins
        return go(f, *args, arch=arch, **policies)


def emulate_kernel(body: Callable, in_shapes, out_shapes, *args: np.ndarray,
                   pipeline: Any = None, jax_pipeline: bool = False, on_race: str | None = None,
                   on_uninitialized: str | None = None, **build: Any):
    """Builds a Warpgroup-semantics kernel from a dialect-level ``body``
    (``body(launch_ctx, *refs, smem)``, as :func:`smalti.kernels.build_kernel`
    takes it, with its keyword arguments ``build``), infers layouts and lowers
    it with smalti (``pipeline``: default the installed plugins) or jax's own
    middle-end, and runs the result on ``args``."""
    from smalti import kernels
    from smalti.testing import lower_with, lower_with_jax

    from . import run_module

    kernel = kernels.build_kernel(body, in_shapes, out_shapes, **build)
    if jax_pipeline:
        lower_with_jax(kernel)
    else:
        lower_with(kernel, pipeline)
    outs = [(tuple(o.shape), np.dtype(o.dtype)) for o in out_shapes]
    return run_module(kernel.module, [np.asarray(a) for a in args], outs, on_race=on_race,
                      on_uninitialized=on_uninitialized)
