"""jax's official Pallas Hopper kernels (matmul, mixed-type matmul, attention
forward, backward and pipelined, ragged dot; the smallest configurations of
``benchmarks/emulate.py``) run on the emulator race-free, with no read of
SMEM nothing wrote, and the matmul computes numpy's product."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import smalti.emulate as emu
from benchmarks.emulate import official_kernels
from smalti.emulate.capture import lower_for_cuda

KERNELS = {name: (fn, args, per_kernel) for name, fn, args, per_kernel in official_kernels()}


@pytest.mark.parametrize("name", list(KERNELS))
def test_official_hopper_kernel_is_race_free(name):
    fn, args, per_kernel = KERNELS[name]
    with warnings.catch_warnings():
        warnings.simplefilter("error", emu.UninitializedReadWarning)
        if per_kernel is None:
            outs = emu.run(fn, *args, on_race="raise")
        else:  # several kernels: each on the inputs it is given
            modules, _ = lower_for_cuda(fn, args)
            assert len(modules) == len(per_kernel)
            outs = [o for m, ins in zip(modules, per_kernel)
                    for o in emu.run_module(m, ins, on_race="raise")]
    assert all(np.all(np.isfinite(np.asarray(o, np.float32))) for o in outs)
    if name.startswith("hopper_matmul"):
        a, b = (np.asarray(x, np.float32) for x in args)
        np.testing.assert_allclose(np.asarray(outs[0], np.float32), a @ b, rtol=2e-2, atol=0.1)
