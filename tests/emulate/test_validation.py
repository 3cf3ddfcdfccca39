"""The emulator against numpy on kernels jax 0.11.2 itself lowers (jax's own
pipeline): exact for data movement and integers, within a stated ulp bound
for floating point (the bound covers the reference's own rounding order)."""

from __future__ import annotations

import numpy as np
import pytest

import smalti.emulate as emu
from smalti.emulate.testing import assert_close_ulp
from tests.emulate.kernels import cases

CASES = {c.name: c for c in cases()}


@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_numpy(name):
    case = CASES[name]
    got = emu.run(case.fn, *case.args, arch=case.arch)
    want = case.ref(*case.args)
    want = want if isinstance(want, tuple) else (want,)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == np.asarray(w).dtype
        if case.abs_bound is not None:
            bound = case.abs_bound(*case.args)
            assert np.all(np.abs(g.astype(np.float64) - w.astype(np.float64)) <= bound)
        else:
            assert_close_ulp(g, w, case.ulp)
