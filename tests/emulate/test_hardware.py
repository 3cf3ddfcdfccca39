"""The emulator against an H200: kernels whose exact answer depends on the
hardware (WGMMA rounding, fp8 conversions), recorded on the GPU by
``python -m benchmarks.hardware record`` into ``benchmarks/data/h200_bits.npz``
and emulated here, bit for bit."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from benchmarks import hardware
from smalti import emulate

RECORDING = Path(hardware.__file__).parent / "data" / "h200_bits.npz"
CASES = {case.name: case for case in hardware.cases()}


RECORDED = set(np.load(RECORDING).files)


@pytest.fixture(scope="module")
def recorded():
    return np.load(RECORDING)


def test_every_recorded_case_is_defined():
    assert RECORDED <= set(CASES), RECORDED - set(CASES)


@pytest.mark.parametrize("name", sorted(RECORDED))
def test_emulator_equals_the_h200_bit_for_bit(name, recorded):
    case = CASES[name]
    out = emulate.run(case.fn, *case.args, on_race="raise")
    out = np.asarray(out[0] if isinstance(out, (tuple, list)) else out)
    hw = recorded[name].view(out.dtype).reshape(out.shape)
    bits = f"u{out.dtype.itemsize}"
    differ = out.view(bits) != hw.view(bits)
    with np.errstate(invalid="ignore"):  # any NaN payload matches a NaN
        differ &= ~(np.isnan(out.astype(np.float32)) & np.isnan(hw.astype(np.float32)))
    assert not differ.any(), (
        f"{int(differ.sum())} of {differ.size} differ, e.g. at {np.argwhere(differ)[:3].tolist()}: "
        f"emulator {out[differ][:3]}, H200 {hw[differ][:3]}")
