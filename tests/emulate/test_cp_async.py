"""jax's ``AsyncCopyImplementation.CP_ASYNC`` copies (Ampere ``cp.async``) on
the emulator: the values, and the checker both ways -- a kernel that reads
the destination without ``ctx.await_cp_async_copy`` raises the race naming
the copy and the read with their source lines; its twins (the await, or jax's
``cp.async.mbarrier.arrive`` + barrier wait) run clean."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import smalti.emulate as emu
from smalti.emulate import profiling as P
from smalti.emulate.sync.reports import RaceError

SHAPE = (4, 128)
COPY_LINE, READ_LINE = 1001, 1002  # the source lines the kernel's ops carry


def _kernel(sync: str):
    """128 threads: CP_ASYNC copy of ``x`` into SMEM, ``sync``, SMEM -> out
    (each thread reading what other threads copied)."""
    from jax._src.interpreters import mlir
    from jax._src.lib.mlir import ir
    from jax.experimental.mosaic import gpu as mgpu

    def body(ctx, src, dst, scratch):
        tmp, barrier = scratch
        with ir.Location.file(__file__, COPY_LINE, 1):
            ctx.async_copy(src_ref=src, dst_ref=tmp,
                           implementation=mgpu.AsyncCopyImplementation.CP_ASYNC,
                           barrier=barrier if sync == "barrier" else None)
        if sync == "barrier":
            barrier.wait()
        elif sync == "await":
            ctx.await_cp_async_copy(0)
        mgpu.warpgroup_barrier()  # the other threads' copies
        with ir.Location.file(__file__, READ_LINE, 1):
            copied = mgpu.FragmentedArray.load_strided(tmp)
        copied.store_untiled(dst)

    sds = jax.ShapeDtypeStruct(SHAPE, jnp.float32)
    with mlir.make_ir_context(), ir.Location.unknown():
        return mgpu.as_gpu_kernel(body, (1, 1, 1), (128, 1, 1), (sds,), sds,
                                  (sds, mgpu.Barrier(arrival_count=1)))


X = np.arange(np.prod(SHAPE), dtype=np.float32).reshape(SHAPE) - 100


@pytest.mark.parametrize("sync", ["await", "barrier"])
def test_the_copy_lands_after_the_wait(sync):
    (out,) = emu.run(_kernel(sync), X)
    np.testing.assert_array_equal(out, X)


def test_reading_without_the_wait_is_a_race_naming_the_copy_and_the_read():
    with pytest.raises(RaceError) as e:
        emu.run(_kernel("none"), X)
    (race,) = [r for r in e.value.races if r.first.agent.startswith("cp.async issued by")]
    assert race.kind == "read-after-write" and race.space == "smem"
    assert race.first.op == "cp.async" and race.second.op.endswith(".load")
    assert race.first.location.endswith(f"test_cp_async.py:{COPY_LINE}")
    assert race.second.location.endswith(f"test_cp_async.py:{READ_LINE}")
    assert "cp.async.wait_group" in race.fix


def test_the_profiler_counts_the_copies_as_ldgsts_not_as_plain_loads():
    p = emu.profile(_kernel("await"), X)
    np.testing.assert_array_equal(p.outputs[0], X)
    warps, transfer = 4, 8  # jax copies this untiled ref in 8-byte cp.asyncs
    assert p[P.LDGSTS] == X.nbytes // (32 * transfer)  # per warp: 32 transfers
    assert p[P.LDGSTS] % warps == 0
    assert p[P.GLOBAL_BYTES + "ldgsts"] == X.nbytes
    assert p[P.SECTORS + "ldgsts"] == X.nbytes // 32  # contiguous: each sector once
    assert p[P.GLOBAL_LD] == 0 and p[P.SHARED_ST] == 0  # neither a load nor a store
    copy_line = f"{__file__}:{COPY_LINE}"
    assert p.by_line[copy_line][P.LDGSTS] == p[P.LDGSTS]
