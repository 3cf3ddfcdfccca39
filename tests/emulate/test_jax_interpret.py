"""The race catalogue (tests/emulate/race_kernels.py) side by side with
jax's own GPU interpret mode and its happens-before race detector.

Each kernel runs as ``jax.jit(kernel)(*args)`` under
``plgpu.force_gpu_interpret_mode(plgpu.InterpretGPUParams(detect_races=True))``;
jax's verdict is the ``races_found`` flag of its race-detection state
(``interpret_pallas_call.get_races()``; jax also prints each race to stdout,
which is not read here). The state is reset before every run, so a verdict
never carries over from an earlier kernel.

:data:`JAX_CANNOT_RUN` lists the entries jax 0.11.2's interpreter refuses,
with its error; :data:`JAX_DIFFERS` the entries where its verdict is not the
catalogue's, with the reason. The test asserts both tables: a refused entry
must still be refused with that error, a differing verdict must still
differ, and every other verdict must equal the catalogue's. A clean entry
that jax runs must also compute the catalogue's reference.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from jax._src.pallas.mosaic_gpu.interpret import interpret_pallas_call as jax_interpret
from jax.experimental.pallas import mosaic_gpu as plgpu

from tests.emulate.race_kernels import entries

ENTRIES = {e.name: e for e in entries()}

CLUSTER_REF = (jax.errors.JaxRuntimeError, "Unsupported transform: ClusterRefTransform",
               "jax's interpreter has no distributed shared memory: a read through "
               "plgpu.cluster_ref fails in its SMEM access callback (_validate_transforms)")
ASYNC_STORE_SMEM = (TypeError, "ref must be a reference, got int32",
                    "jax's interpreter has no case for async_store_smem (st.async): it binds "
                    "the primitive like an arithmetic one, on its stand-in for the SMEM ref "
                    "(an int32 allocation key), which the primitive's abstract eval refuses")

# name -> (the exception jax raises, a phrase of its message, why)
JAX_CANNOT_RUN = {
    "cluster_peer_smem_read_without_cluster_barrier": CLUSTER_REF,
    "cluster_peer_smem_read_after_cluster_barrier": CLUSTER_REF,
    "cluster_peer_store_read_before_barrier_wait": ASYNC_STORE_SMEM,
    "cluster_peer_store_read_after_barrier_wait": ASYNC_STORE_SMEM,
}

# name -> why jax's verdict is not the catalogue's
JAX_DIFFERS = {
    "wgmma_operand_overwritten_before_wgmma_wait":
        "jax's interpreter runs plgpu.wgmma synchronously and without race checks "
        "(its wgmma callback has 'TODO: Vector clocks' and 'TODO: Async wgmma'; "
        "wgmma_wait is a no-op), so an operand overwritten before wgmma_wait is "
        "never seen to race",
    "producer_refills_slot_after_consumer_release":
        "jax orders a TMA (async proxy) access only after the issuing thread's "
        "async-proxy clock, which moves on commit_smem alone; the consumer's "
        "release (barrier_arrive) carries no commit, so jax calls the producer's "
        "refill racy against the consumer's read. CUTLASS's TMA pipelines and "
        "jax's own emit_pipeline_warp_specialized release slots the same way "
        "(jax's interpreter flags tests/emulate/kernels.py's "
        "ws_emit_pipeline_carry_* too); the _fenced_ twin, with commit_smem "
        "before the arrival, is clean for jax",
}


def run_under_jax_interpret(entry) -> tuple[bool, tuple[np.ndarray, ...]]:
    """(jax's races_found, the outputs) of ``entry`` under GPU interpret mode."""
    jax_interpret.reset_gpu_interpret_mode_state()
    params = plgpu.InterpretGPUParams(detect_races=True)
    try:
        with plgpu.force_gpu_interpret_mode(params):
            out = jax.block_until_ready(jax.jit(entry.fn)(*entry.args))
        races_found = jax_interpret.get_races().races_found
    finally:
        jax_interpret.reset_gpu_interpret_mode_state()  # also after a failure
    out = out if isinstance(out, (tuple, list)) else (out,)
    return races_found, tuple(np.asarray(o) for o in out)


def test_tables_name_catalogue_entries():
    assert set(JAX_CANNOT_RUN) <= set(ENTRIES)
    assert set(JAX_DIFFERS) <= set(ENTRIES)
    assert not set(JAX_CANNOT_RUN) & set(JAX_DIFFERS)


@pytest.mark.parametrize("name", sorted(JAX_CANNOT_RUN))
def test_jax_cannot_run(name):
    error, phrase, _ = JAX_CANNOT_RUN[name]
    with pytest.raises(error, match=phrase):
        run_under_jax_interpret(ENTRIES[name])


@pytest.mark.parametrize("name", sorted(set(ENTRIES) - set(JAX_CANNOT_RUN)))
def test_jax_verdict(name):
    entry = ENTRIES[name]
    races_found, got = run_under_jax_interpret(entry)
    expected_race = entry.verdict == "race"
    if name in JAX_DIFFERS:
        assert races_found != expected_race, f"jax now agrees: drop {name} from JAX_DIFFERS"
    else:
        assert races_found == expected_race
    if entry.verdict == "clean":
        want = entry.ref(*entry.args)
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert g.shape == w.shape and g.dtype == w.dtype
            np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64),
                                       rtol=entry.rtol, atol=entry.rtol)
