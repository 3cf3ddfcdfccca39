"""Races in code jax's own Pallas lowering generates, found by the checker
on the generated code (docs/emulator.md, "Findings"), each with its twin.

**A reduction to a scalar in a kernel of several Pallas warpgroups.**
Pallas lowers ``jnp.min`` of a whole block (``vector.reduction`` across the
warpgroup's warps) through the kernel's reduction scratch: each warp stores
its partial result to SMEM, a warpgroup barrier, and every thread reads
them back. The scratch is one for the kernel, not one per warpgroup, and
the barrier is the warpgroup's: two Pallas warpgroups (``num_threads=2``)
write and read the same bytes unordered. jax's interpret mode, which runs
the jaxpr, cannot see it. The twin with one warpgroup is clean. smalti's
own f32 sort screens its blocks with such a reduction only in kernels of
one Pallas warpgroup for this reason.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import mosaic_gpu as plgpu

import smalti.emulate

X = np.random.default_rng(0).standard_normal((2, 64, 128)).astype(np.float32)


def _kernel(reduce, warpgroups: int):
    def body(x_ref, o_ref):
        wg = jax.lax.axis_index("wg") if warpgroups > 1 else 0
        v = x_ref[wg]
        o_ref[wg] = v + reduce(v)
    kw = dict(num_threads=warpgroups, thread_name="wg") if warpgroups > 1 else {}
    return plgpu.kernel(body, out_type=jax.ShapeDtypeStruct(X.shape, jnp.float32), **kw)


def _whole(v):
    return jnp.min(v)  # the reduction's line


def test_a_reduction_to_a_scalar_in_two_warpgroups_races_on_the_shared_scratch():
    with pytest.raises(smalti.emulate.RaceError) as caught:
        smalti.emulate.run(_kernel(_whole, 2), X)
    races = caught.value.races
    assert {r.kind for r in races} <= {"write-after-write", "write-after-read",
                                       "read-after-write"}
    for race in races:
        assert race.space == "smem"
        assert "warpgroup 0" in race.first.agent + race.second.agent
        assert "warpgroup 1" in race.first.agent + race.second.agent
        for access in (race.first, race.second):
            assert access.location == f"{__file__}:{_LINE}"
            assert access.primitive == "reduce_min"
    assert any(r.first.is_write and r.second.is_write for r in races)


def test_the_same_reduction_in_one_warpgroup_is_clean():
    for wg in range(2):
        (got,) = smalti.emulate.run(_kernel(_whole, 1), X[wg:wg + 1].repeat(2, 0))
        np.testing.assert_array_equal(got[0], X[wg] + X[wg].min())


_LINE = next(i for i, line in enumerate(open(__file__), 1)
             if line.strip() == "return jnp.min(v)  # the reduction's line")
