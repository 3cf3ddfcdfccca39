"""A block reduced to a scalar on its warpgroup's own scratch
(:mod:`smalti.vocabulary.block_reduce`) on the emulator.

Each kernel brings a block into SMEM by TMA, reduces it and broadcasts the
scalar back over a block, stored the same way; results are jnp's on the
CPU (NaN for NaN: PTX's maximum and minimum give the canonical NaN), for
every operation and type on each type's extremes. The profiler shows what
it costs against Pallas' reduction; the synchronization checker runs on
every kernel with one and two Pallas warpgroups (each its own scratch
slice), and without the rule's barriers finds the race.
"""

from __future__ import annotations

import types

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import smalti
import smalti.emulate
import smalti.jax
import smalti.vocabulary
from benchmarks.vocabulary import kernel as tma_kernel
from smalti.emulate.profiling import INST, WAVEFRONTS
from smalti.vocabulary import block_reduce
from tests.vocabulary.warpgroups import per_warpgroup_kernel

F32, I32, U32 = np.dtype(np.float32), np.dtype(np.int32), np.dtype(np.uint32)
BF16, F16 = np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16)
CASES = [(op, dtype) for op, dtypes in block_reduce.OPERATIONS.items() for dtype in dtypes]


def _block(dtype, seed=0, *, special: str | None = None) -> np.ndarray:
    """Ordinary values with the type's extremes in them (integers: both ends
    of the range, so that a sum wraps); ``special`` adds a NaN, or signed
    zeros and infinities, to a float block."""
    rng = np.random.default_rng(seed)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        x = rng.integers(info.min, int(info.max) + 1, size=(64, 128), dtype=np.int64)
        x[3, :2] = info.min, info.max
        return x.astype(dtype)
    x = (rng.standard_normal((64, 128)) * 100).astype(dtype)
    if special == "nan":
        x[17, 33] = np.nan
    elif special == "edges":
        x[0, :4] = [-0.0, 0.0, np.inf, -np.inf]
    return x


def _broadcast(op):
    return lambda v: jnp.zeros_like(v) + block_reduce.block_reduce(v, op)


def _run(pipeline, fn, x, **kwargs):
    with smalti.jax.installed(pipeline):
        return smalti.emulate.run(tma_kernel(fn, [x]), x, **kwargs)


@pytest.mark.parametrize("op, dtype", CASES, ids=lambda c: str(c))
def test_each_operation_and_type(pipeline, op, dtype):
    for special in (None, "edges") if dtype.kind == "f" else (None,):
        x = _block(dtype, special=special)
        (got,) = _run(pipeline, _broadcast(op), x)
        np.testing.assert_array_equal(got, np.asarray(jax.jit(_broadcast(op))(x)))


@pytest.mark.parametrize("op", ["max", "min"])
@pytest.mark.parametrize("dtype", [F32, BF16], ids=lambda d: d.name)
def test_a_nan_anywhere_is_the_result(pipeline, op, dtype):
    x = _block(dtype, seed=1, special="nan")
    (got,) = _run(pipeline, _broadcast(op), x)
    assert np.isnan(got.astype(np.float32)).all()


def test_cheaper_than_pallas_reduction(pipeline):
    """Beyond the kernel that only broadcasts: an operation per element and
    little else (the warps' shuffles, a store per warp, one load), where
    Pallas' reduction spends about one more per element on the warps'
    partial results; a wavefront per warp's store and per phase of its load
    (the same 16 bytes in every lane)."""
    x = _block(F32, seed=2)
    with smalti.jax.installed(pipeline):  # v - v: the block read and broadcast alike
        base = smalti.emulate.profile(tma_kernel(lambda v: v - v + 2.0, [x]), x)
        ours = smalti.emulate.profile(
            tma_kernel(lambda v: v - v + block_reduce.block_reduce(v, "max"), [x]), x)
        pallas = smalti.emulate.profile(tma_kernel(lambda v: v - v + jnp.max(v), [x]), x)
    np.testing.assert_array_equal(ours.outputs[0], pallas.outputs[0])
    extra = (ours[INST] - base[INST]) * 32 / x.size
    assert 1 <= extra <= 1.7, extra
    assert (pallas[INST] - ours[INST]) * 32 / x.size > 0.5
    # a store per warp, and its 16-byte load in four quarter-warp phases
    assert ours[WAVEFRONTS] - base[WAVEFRONTS] == 4 + 4 * 4


@pytest.mark.parametrize("warpgroups", [1, 2])
def test_warpgroups_reduce_their_own_blocks(pipeline, warpgroups):
    """Clean under the checker: each warpgroup reduces its own block on its
    own scratch slice, at the same time."""
    x = np.stack([_block(F32, seed=3 + w) for w in range(warpgroups)])
    with smalti.jax.installed(pipeline):
        (got,) = smalti.emulate.run(per_warpgroup_kernel(_broadcast("min"), [x]), x)
    np.testing.assert_array_equal(got, np.stack([np.full_like(b, b.min()) for b in x]))


def test_without_its_barriers_the_checker_finds_the_race(pipeline, monkeypatch):
    """The twin of the clean runs above: the rule's barriers removed, warps
    read the scratch while others still write it."""
    utils = types.SimpleNamespace(**vars(block_reduce.mgpu_utils))
    utils.warpgroup_barrier = lambda: None
    monkeypatch.setattr(block_reduce, "mgpu_utils", utils)
    x = _block(F32, seed=4)
    with pytest.raises(smalti.emulate.RaceError) as err:
        _run(pipeline, _broadcast("max"), x)
    assert any(r.kind == "read-after-write" and r.space == "smem" for r in err.value.races)


def test_a_plain_load_takes_jnps_reduction(pipeline):
    """A block loaded plainly from GMEM is not in WGMMA's layout: jnp's
    reduction, the same answer."""
    from tests.vocabulary.test_movement import plain_kernel

    x = _block(I32, seed=5)
    with smalti.jax.installed(pipeline):
        (got,) = smalti.emulate.run(plain_kernel(_broadcast("sum"), [x]), x)
    np.testing.assert_array_equal(got, np.asarray(jax.jit(_broadcast("sum"))(x)))


def test_on_the_cpu_outside_a_kernel():
    x = _block(U32, seed=6)
    assert block_reduce.block_reduce(jnp.asarray(x), "max") == x.max()


@pytest.mark.parametrize("op, dtype", [("sum", F32), ("sum", U32), ("max", np.dtype(np.int8)),
                                       ("mean", F32), ("max", np.dtype(np.bool_))], ids=str)
def test_refuses_other_operations_and_types(op, dtype):
    with pytest.raises(ValueError, match=f"block_reduce: '{op}' of"):
        block_reduce.block_reduce(jnp.zeros((64, 128), dtype), op)
