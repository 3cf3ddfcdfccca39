"""Short fuzz runs (the long one is scripts/fuzz_campaign.py).

Random well-formed kernels: smalti agrees with jax where jax succeeds, and
raises a smalti error or succeeds where jax fails. Random ill-formed ones:
only smalti errors come out, and a failed step leaves the module unchanged.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import smalti
from tests.fuzz.kernels import well_formed
from tests.fuzz.oracle import _unknown_op, check_error, check_ill_formed, check_well_formed

SHORT = settings(max_examples=6, deadline=None, derandomize=True, database=None,
                 suppress_health_check=[HealthCheck.too_slow])
SEEDS = st.integers(min_value=0, max_value=2**32 - 1)


@SHORT
@given(SEEDS)
def test_random_well_formed_kernels_agree_with_jax(seed):
    check_well_formed(well_formed(seed))


@SHORT
@given(SEEDS)
def test_random_ill_formed_kernels_raise_only_smalti_errors(seed):
    check_ill_formed(seed)


@pytest.mark.parametrize("seed, outcome", [
    (0, "unknown_op_infer: SM003"),
    (2, "lower_without_infer: SM201"),
    (3, "deleted_attribute: SM201"),
    (5, "unknown_op_lower: SM201"),
    (7, "extra_entry: SM201"),
    (19, "shape_mismatch_attribute: SM201"),
])
def test_each_way_of_breaking_a_kernel(seed, outcome):
    assert check_ill_formed(seed) == outcome


def test_many_failed_inferences_leave_the_module_unchanged():
    failed = 0
    for seed in range(40):
        kernel = well_formed(seed).build()
        if random.Random(seed).random() < 0.3:
            _unknown_op(kernel, random.Random(seed))
        before = str(kernel.module)
        try:
            smalti.infer_layouts(kernel.module)
        except smalti.SmaltiError as e:
            check_error(e)
            assert str(kernel.module) == before, f"seed {seed}: {e.code} changed the module"
            failed += 1
    assert failed >= 8  # the generator makes enough failing kernels to mean something


def test_many_failed_lowerings_are_detected_before_rewriting():
    codes = set()
    for seed in range(20):
        kernel = well_formed(seed).build()
        before = str(kernel.module)
        try:  # no inference: every op with vectors lacks its layouts
            smalti.lower(kernel.module, kernel.launch_context)
        except smalti.SmaltiError as e:
            check_error(e)
            codes.add(e.code)
            assert str(kernel.module) == before, f"seed {seed}: {e.code} changed the module"
        else:
            raise AssertionError(f"seed {seed}: lowered without layouts")
    assert codes == {"SM201"}
