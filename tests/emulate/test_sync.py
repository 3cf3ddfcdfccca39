"""The synchronization checker's other reports and policies: uninitialized
reads, out-of-bounds accesses, races between blocks, barrier divergence,
mbarrier over-arrival, the policies and the report's text (the catalogue of
racy and clean kernels is tests/emulate/test_races.py)."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

import smalti.emulate as emu
from smalti.emulate.machine import Frame, Launch, MBarrier
from smalti.emulate.memory import Space
from smalti.emulate.ops.gpu import full_block_barrier
from smalti.emulate.sync.reports import primitive_name, source_line
from tests.emulate.kernels import wgmma_two_warpgroups_kernel

WG = plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup)
S = jax.ShapeDtypeStruct
X = np.random.default_rng(34).standard_normal((128, 128)).astype(np.float32)


def _line(fn, marker: str) -> int:
    """The line of this file holding ``# marker``."""
    import inspect

    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, text in enumerate(lines) if f"# {marker}" in text)


def uninitialized_kernel(write_first: bool):
    def body(x_ref, o_ref, smem):
        if write_first:
            smem[...] = x_ref[...]
        o_ref[...] = smem[...] + 1  # uninitialized read
    return plgpu.kernel(body, out_type=S((128, 128), jnp.float32), compiler_params=WG,
                        scratch_types=[plgpu.SMEM((128, 128), jnp.float32)])


def test_a_read_of_smem_nothing_wrote_warns_by_default():
    with pytest.warns(emu.UninitializedReadWarning) as record:
        emu.run(uninitialized_kernel(False), X)
    report = record[0].message.report
    assert isinstance(report, emu.UninitializedRead) and report.space == "smem"
    line = _line(uninitialized_kernel, "uninitialized read")
    assert report.location.endswith(f"test_sync.py:{line}")
    assert "no write of this launch initialized" in str(report) and "fix:" in str(report)


def test_uninitialized_policy_raise_and_ignore():
    with pytest.raises(emu.UninitializedRead):
        emu.run(uninitialized_kernel(False), X, on_uninitialized="raise")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        emu.run(uninitialized_kernel(False), X, on_uninitialized="ignore")


def test_smem_written_first_is_not_an_uninitialized_read():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        (got,) = emu.run(uninitialized_kernel(True), X, on_uninitialized="raise")
    np.testing.assert_array_equal(got, X + 1)


def blocks_kernel(overlap: bool):
    """Two blocks of a grid each write 64 rows: the same ones, or their own."""
    def body(x_ref, o_ref):
        i = lax.axis_index("i")
        row = 0 if overlap else i * 64
        o_ref[pl.ds(row, 64)] = x_ref[pl.ds(i * 64, 64)] * 2  # block store
    return plgpu.kernel(body, out_type=S((128, 128), jnp.float32), compiler_params=WG,
                        grid=(2,), grid_names=("i",))


def test_two_blocks_writing_the_same_gmem_race():
    with pytest.raises(emu.RaceError) as err:
        emu.run(blocks_kernel(True), X)
    (race,) = err.value.races
    line = _line(blocks_kernel, "block store")
    assert race.kind == "write-after-write" and race.space == "gmem"
    assert race.first.location.endswith(f":{line}") and race.second.location.endswith(f":{line}")
    assert race.first.agent.startswith("block (0, 0, 0)")
    assert race.second.agent.startswith("block (1, 0, 0)")
    assert race.first.allocation == "kernel argument 1" and race.first.is_write
    assert "through a semaphore" in race.fix and "disjoint bytes" in race.fix


def test_blocks_writing_their_own_rows_do_not_race():
    (got,) = emu.run(blocks_kernel(False), X)
    np.testing.assert_array_equal(got, X * 2)


def test_blocks_writing_equal_bytes_to_the_same_gmem_do_not_race():
    """The racy twin above with every block storing the same rows: whichever
    store lands last, memory holds the same bytes (a benign race)."""
    def body(x_ref, o_ref):
        o_ref[pl.ds(0, 64)] = x_ref[pl.ds(0, 64)] * 2
    kernel = plgpu.kernel(body, out_type=S((128, 128), jnp.float32), compiler_params=WG,
                          grid=(2,), grid_names=("i",))
    (got,) = emu.run(kernel, X, on_race="raise")
    np.testing.assert_array_equal(got[:64], X[:64] * 2)


def rewrite_kernel():
    """Each block stores x, then x + its index: block 1's first store
    leaves the bytes block 0 left, its second changes them."""
    def body(x_ref, o_ref):
        i = lax.axis_index("i")
        o_ref[...] = x_ref[...]  # equal store
        o_ref[...] = x_ref[...] + i.astype(jnp.float32)  # changing store
    return plgpu.kernel(body, out_type=S((128, 128), jnp.float32), compiler_params=WG,
                        grid=(2,), grid_names=("i",))


def test_a_write_after_unordered_equal_writes_races_with_the_other_block():
    """The equal writes' group orders before a write only once all of them
    do: block 1's changing store races with block 0's last store."""
    with pytest.raises(emu.RaceError) as err:
        emu.run(rewrite_kernel(), X)
    (race,) = err.value.races
    line = _line(rewrite_kernel, "changing store")
    assert race.kind == "write-after-write" and race.space == "gmem"
    assert race.first.location.endswith(f":{line}") and race.second.location.endswith(f":{line}")
    assert race.first.agent.startswith("block (0, 0, 0)")
    assert race.second.agent.startswith("block (1, 0, 0)")


def test_an_unordered_write_of_equal_bytes_in_smem_is_not_a_race_but_one_of_others_is():
    """Two warpgroups store to one SMEM buffer without a barrier: the same
    values (benign), or each its own (a write-after-write race)."""
    def kernel(equal: bool):
        def body(x_ref, o_ref, smem):
            wg = lax.axis_index("wg")
            val = x_ref[...] if equal else x_ref[...] + wg.astype(jnp.float32)
            smem[...] = val  # unordered store
        return plgpu.kernel(body, out_type=S((128, 128), jnp.float32), compiler_params=WG,
                            num_threads=2, thread_name="wg",
                            scratch_types=[plgpu.SMEM((128, 128), jnp.float32)])
    emu.run(kernel(True), X, on_race="raise")
    with pytest.raises(emu.RaceError) as err:
        emu.run(kernel(False), X)
    (race,) = err.value.races
    line = _line(kernel, "unordered store")
    assert race.kind == "write-after-write" and race.space == "smem"
    assert race.first.location.endswith(f":{line}") and race.second.location.endswith(f":{line}")
    assert "warpgroup 0" in race.first.agent and "warpgroup 1" in race.second.agent


def test_the_race_report_says_both_sides_and_the_fix():
    with pytest.raises(emu.RaceError) as err:
        emu.run(blocks_kernel(True), X)
    text = str(err.value.races[0])
    lines = text.splitlines()
    assert len(lines) == 3 and lines[2].startswith("  fix: ")
    assert "write-after-write, gmem" in lines[0] and "block (1, 0, 0)" in lines[0]
    assert "conflicts with the unordered write" in lines[1] and "block (0, 0, 0)" in lines[1]
    assert "kernel argument 1 bytes [" in lines[0] and "test_sync.py:" in lines[1]


def test_race_policies(monkeypatch):
    with pytest.warns(emu.RaceWarning) as record:
        (got,) = emu.run(blocks_kernel(True), X, on_race="warn")
    assert record[0].message.race.kind == "write-after-write"
    assert got.shape == (128, 128)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        emu.run(blocks_kernel(True), X, on_race="ignore")
        emu.run(blocks_kernel(True), X, sanitize=False)
    monkeypatch.setenv("SMALTI_EMULATE_ON_RACE", "ignore")
    emu.run(blocks_kernel(True), X)
    monkeypatch.setenv("SMALTI_EMULATE_ON_RACE", "raise")
    with pytest.raises(emu.RaceError):
        emu.run(blocks_kernel(True), X)
    assert issubclass(emu.RaceError, emu.EmulationError)
    assert issubclass(emu.RaceWarning, UserWarning)


def test_an_unknown_policy_is_a_value_error():
    with pytest.raises(ValueError, match="on_race='loud': expected one of 'raise', 'warn'"):
        emu.run(blocks_kernel(False), X, on_race="loud")


def test_a_store_past_the_end_of_the_output_is_out_of_bounds():
    def body(x_ref, o_ref):
        i = lax.axis_index("i")
        o_ref[pl.ds(i * 64, 128)] = x_ref[...]  # block 1 runs 64 rows past the end
    call = plgpu.kernel(body, out_type=S((128, 128), jnp.float32), compiler_params=WG,
                        grid=(2,), grid_names=("i",))
    with pytest.raises(emu.OutOfBounds, match="runs past the end of kernel argument 1"):
        emu.run(call, X)


def test_an_access_outside_every_buffer_is_out_of_bounds():
    space = Space("shared", 1024)
    region = space.alloc(100, "block (0, 0, 0) SMEM")
    with pytest.raises(emu.OutOfBounds, match=r"runs past the end .* \(by 4 bytes\) at here"):
        space.find(region.base + 96, region.base + 104, "here")
    with pytest.raises(emu.OutOfBounds, match="outside every buffer"):
        space.find(0, 4, "here")
    assert issubclass(emu.OutOfBounds, emu.EmulationError)


def test_an_arrival_beyond_the_count_is_an_error():
    bar = MBarrier(2, 2)
    bar.arrive(1, "x.py:1")
    with pytest.raises(emu.MBarrierOverArrival,
                       match=r"arrived at 3 times .* count of 2 at x.py:2"):
        bar.arrive(2, "x.py:2")


def test_a_block_barrier_part_of_a_warpgroup_reaches_is_divergence():
    from smalti.emulate.machine import Block

    launch = Launch()
    block = Block(launch, (0, 0, 0), (1, 1, 1), (128, 1, 1), 0)
    fr = Frame([], launch, block)
    fr.mask = np.arange(128) < 64
    with pytest.raises(emu.BarrierDivergence, match="reached by 64 of the 128 threads"):
        full_block_barrier(fr, "bar.sync 0", "k.py:3")
    fr.mask = None
    full_block_barrier(fr, "bar.sync 0", "k.py:3")  # every thread: completes at once


def test_locations_name_the_kernel_line_and_primitive():
    loc = 'loc("swap:"("swap"("/k/kernel.py":10:4)))'
    assert source_line(loc) == "/k/kernel.py:10" and primitive_name(loc) == "swap"
    assert source_line("loc(unknown)") == "loc(unknown)" and primitive_name("loc(unknown)") == ""


def test_the_two_warpgroup_wgmma_test_kernel_races_as_written():
    """tests/hopper/test_pallas_kernels.py::test_wgmma_two_warpgroups_split_m's
    kernel (a lowering test: its text is what it checks) races as written;
    the validation set's twin, with an mbarrier both arrive on, does not."""
    rng = np.random.default_rng(1)
    a = rng.standard_normal((128, 64)).astype(np.float16)
    b = rng.standard_normal((64, 128)).astype(np.float16)
    with pytest.raises(emu.RaceError) as err:
        emu.run(wgmma_two_warpgroups_kernel(block_sync=False), a, b, on_uninitialized="ignore")
    # warpgroup 0 runs first here: its copy reads the rows before warpgroup 1 writes them
    race = next(r for r in err.value.races if "warpgroup 1" in r.second.agent)
    assert race.kind == "write-after-read" and race.space == "smem"
    kernel_source = wgmma_two_warpgroups_kernel
    assert race.first.location.endswith(f"kernels.py:{_line(kernel_source, 'copy out')}")
    assert race.second.location.endswith(f"kernels.py:{_line(kernel_source, 'wgmma result store')}")
    assert race.first.agent.startswith("TMA")
    (got,) = emu.run(wgmma_two_warpgroups_kernel(block_sync=True), a, b)
    want = (a.astype(np.float32) @ b.astype(np.float32)).astype(np.float16)
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=2e-2,
                               atol=2e-2)


def _wgmma_through_smem(scope):
    """A kernel that brings a (64, 128) and a (128, 128) f16 operand into
    swizzled SMEM with TMA and stores what ``scope(acc_ref, a_smem, b_smem)``
    returns (run in the scope of a (64, 128) f32 accumulator)."""
    from tests.pallas_kit import kernel, swizzled

    def body(a_gmem, b_gmem, o_gmem, a_smem, b_smem, bar):
        plgpu.copy_gmem_to_smem(a_gmem, a_smem, bar.at[0])
        plgpu.copy_gmem_to_smem(b_gmem, b_smem, bar.at[1])
        plgpu.barrier_wait(bar.at[0])
        plgpu.barrier_wait(bar.at[1])
        got = pl.run_scoped(lambda acc_ref: scope(acc_ref, a_smem, b_smem),
                            plgpu.ACC((64, 128), jnp.float32))
        o_gmem[...] = got  # accumulator read

    return kernel(body, S((64, 128), jnp.float32),
                  [swizzled((64, 128)), swizzled((128, 128)), plgpu.Barrier(num_barriers=2)])


def wgmma_kernel():
    """A (64, 128) x (128, 128) f16 WGMMA through swizzled SMEM, read back
    after its wait (Pallas waits before reading the accumulator)."""
    def scope(acc_ref, a_smem, b_smem):
        plgpu.wgmma(acc_ref, a_smem, b_smem)
        return acc_ref[...]
    return _wgmma_through_smem(scope)


def _drop_wgmma_waits(module) -> int:
    """Erases every ``wgmma.wait_group`` of a lowered module (a lowering that
    forgot them); returns how many."""
    from jax._src.lib.mlir import ir

    doomed = []

    def walk(op) -> None:
        for region in op.regions:
            for block in region.blocks:
                for o in block.operations:
                    o = o.operation
                    if (o.name == "llvm.inline_asm" and "wgmma.wait_group" in
                            ir.StringAttr(o.attributes["asm_string"]).value) or \
                            o.name == "nvvm.wgmma.wait.group.sync.aligned":
                        doomed.append(o)
                    walk(o)
    walk(module.operation)
    for o in doomed:
        o.erase()
    return len(doomed)


def test_reading_a_wgmma_accumulator_before_its_wait_is_a_register_race():
    rng = np.random.default_rng(2)
    a = rng.standard_normal((64, 128)).astype(np.float16)
    b = rng.standard_normal((128, 128)).astype(np.float16)
    module, avals = emu.lower(wgmma_kernel(), a, b)
    outs = [((64, 128), np.dtype(np.float32))]
    (clean,) = emu.run_module(module, [a, b], outs)  # with its wait: race-free
    np.testing.assert_allclose(clean, a.astype(np.float32) @ b.astype(np.float32),
                               rtol=1e-3, atol=1e-2)
    assert _drop_wgmma_waits(module) >= 1
    with pytest.raises(emu.RaceError) as err:
        emu.run_module(module, [a, b], outs)
    (race,) = [r for r in err.value.races if r.space == "registers"]
    line = _line(_wgmma_through_smem, "accumulator read")
    assert race.kind == "read-after-write" and race.first.agent.startswith("WGMMA")
    assert race.first.op.startswith("wgmma.mma_async") and race.first.is_write
    assert race.second.location.endswith(f":{line}") and not race.second.is_write
    assert "plgpu.wgmma_wait" in race.fix


def _checked_block():
    """A frame of one warpgroup of a block, with the checker on."""
    from smalti.emulate.machine import Block
    from smalti.emulate.sync.checker import Checker

    launch = Launch()
    launch.sync = Checker("raise", "warn")
    block = Block(launch, (0, 0, 0), (1, 1, 1), (128, 1, 1), 0)
    launch.sync.begin_cluster([block])
    return Frame({}, launch, block), launch.sync


def _inline_steps(*texts: str):
    from smalti.emulate.ops import inline_asm
    from tests.emulate.test_ptx_table import _inline_asm_ops

    ops, module = _inline_asm_ops(*(f'llvm.inline_asm has_side_effects "{t}", "" : () -> ()'
                                    for t in texts))
    return [inline_asm.inline_asm(o) for o in ops], module


def test_inline_proxy_fence_makes_each_warps_earlier_writes_visible_to_the_async_proxy():
    (fence,), _module = _inline_steps("fence.proxy.async.shared::cta;")
    fr, sync = _checked_block()
    before = sync.clocks.matrix.diagonal()[:4].copy()
    fence(fr)
    assert [f[-1] for f in sync.clocks.fences[:4]] == [(t, frozenset({"smem"}))
                                                        for t in before.tolist()]
    np.testing.assert_array_equal(sync.clocks.matrix.diagonal()[:4], before + 1)


def test_inline_bulk_group_waits_complete_all_but_the_newest_groups():
    steps, _module = _inline_steps("cp.async.bulk.commit_group;",
                                   "cp.async.bulk.wait_group.read 1;",
                                   "cp.async.bulk.wait_group 0;")
    commit, wait_read, wait_all = steps
    fr, sync = _checked_block()
    reads, writes, stamp = sync.bulk_issue(fr.block, 0)  # thread 0's first bulk copy
    assert stamp == 1
    commit(fr)
    commit(fr)  # two groups in flight
    wait_read(fr)  # reads of all but the newest: group 1
    assert sync.clocks.matrix[0, reads] == 1 and sync.clocks.matrix[0, writes] == 0
    wait_all(fr)
    assert sync.clocks.matrix[0, reads] == 2 and sync.clocks.matrix[0, writes] == 2
    assert sync.clocks.matrix[1, reads] == 0  # thread 0's groups: warp 0 knows, not warp 1


def test_inline_wgmma_group_waits_complete_all_but_the_newest_groups():
    steps, _module = _inline_steps("wgmma.commit_group.sync.aligned;",
                                   "wgmma.wait_group.sync.aligned 1;",
                                   "wgmma.wait_group.sync.aligned 0;")
    commit, wait_one, wait_all = steps
    fr, sync = _checked_block()
    comp, stamp, agent = sync.wgmma_issue(fr)
    assert stamp == 1 and agent.startswith("WGMMA")
    commit(fr)
    commit(fr)
    wait_one(fr)
    np.testing.assert_array_equal(sync.clocks.matrix[:4, comp], 1)
    wait_all(fr)
    np.testing.assert_array_equal(sync.clocks.matrix[:4, comp], 2)


def global_then_tma_kernel(fence: str | None):
    """Every warp writes ``2x`` to a GMEM buffer with generic stores, then
    ``fence`` (the nvvm proxy kind: "async.shared" as plgpu.commit_smem
    emits, "async.global", "async", or none) and a warpgroup barrier; a TMA
    load brings the buffer into SMEM and a TMA store copies it out."""
    from jax._src.interpreters import mlir
    from jax._src.lib.mlir import ir
    from jax._src.lib.mlir.dialects import nvvm
    from jax.experimental.mosaic import gpu as mgpu
    from jax.experimental.mosaic.gpu import utils as mgpu_utils

    write_line = _line(global_then_tma_kernel, "generic writes")
    load_line = _line(global_then_tma_kernel, "tma load")
    kinds = {"async.shared": nvvm.ProxyKind.async_shared,
             "async.global": nvvm.ProxyKind.async_global, "async": nvvm.ProxyKind.async_}

    def kernel(ctx, x_ref, tmp_ref, o_ref, smem):
        tile, bar = smem
        with ir.Location.file(__file__, write_line, 0):
            doubled = mgpu.FragmentedArray.load_strided(x_ref) * 2
            doubled.store_untiled(tmp_ref)  # generic writes
        if fence == "async.shared":
            nvvm.fence_proxy(kinds[fence], space=nvvm.SharedSpace.shared_cta)
        elif fence:
            nvvm.fence_proxy(kinds[fence])
        mgpu_utils.warpgroup_barrier()
        with ir.Location.file(__file__, load_line, 0):
            ctx.async_copy(src_ref=tmp_ref, dst_ref=tile, barrier=bar[0])  # tma load
        bar[0].wait()
        ctx.async_copy(src_ref=tile, dst_ref=o_ref)
        ctx.await_async_copy(0)

    row = S((128,), jnp.float32)
    with mlir.make_ir_context(), ir.Location.unknown():
        return mgpu.as_gpu_kernel(kernel, (1, 1, 1), (128, 1, 1), (row, row), row,
                                  (row, mgpu.Barrier(1)))


@pytest.mark.parametrize("fence", ["async.global", "async"])
def test_a_tma_load_of_gmem_written_by_threads_after_a_global_proxy_fence_is_clean(fence):
    x = np.arange(128, dtype=np.float32)
    (out,) = emu.run(global_then_tma_kernel(fence), x, np.zeros(128, np.float32))
    np.testing.assert_array_equal(out, 2 * x)


@pytest.mark.parametrize("fence", [None, "async.shared"])
def test_a_tma_load_of_gmem_written_by_threads_needs_a_fence_of_global_memory(fence):
    """plgpu.commit_smem()'s fence (``.shared::cta``) orders SMEM only: the
    TMA load still reads the generic GMEM writes unfenced."""
    with pytest.raises(emu.RaceError) as err:
        emu.run(global_then_tma_kernel(fence), np.arange(128, dtype=np.float32),
                np.zeros(128, np.float32))
    (race,) = err.value.races
    assert race.kind == "read-after-write" and race.space == "gmem"
    assert race.first.location.endswith(f":{_line(global_then_tma_kernel, 'generic writes')}")
    assert race.second.location.endswith(f":{_line(global_then_tma_kernel, 'tma load')}")
    assert "fence.proxy.async.global" in race.fix and "SMEM only" in race.fix


def wgmma_loop_kernel():
    """Two WGMMAs into one accumulator in a ``fori_loop`` (the accumulator is
    the loop's carried value), read back after the loop; Pallas waits before
    the read."""
    def scope(acc_ref, a_smem, b_smem):
        def step(i, carry):
            plgpu.wgmma(acc_ref, a_smem, b_smem)
            return carry
        lax.fori_loop(0, 2, step, None)
        return acc_ref[...]
    return _wgmma_through_smem(scope)


def test_an_accumulator_carried_out_of_a_loop_is_followed_to_its_read():
    """The WGMMAs run inside an ``scf.for`` whose result is the accumulator:
    with the waits gone, its read after the loop is still a register race
    (the pending state follows the loop's carried values and results)."""
    rng = np.random.default_rng(3)
    a = rng.standard_normal((64, 128)).astype(np.float16)
    b = rng.standard_normal((128, 128)).astype(np.float16)
    module, _ = emu.lower(wgmma_loop_kernel(), a, b)
    assert "scf.for" in str(module)
    outs = [((64, 128), np.dtype(np.float32))]
    (clean,) = emu.run_module(module, [a, b], outs)
    np.testing.assert_allclose(clean, 2 * (a.astype(np.float32) @ b.astype(np.float32)),
                               rtol=1e-3, atol=2e-2)
    assert _drop_wgmma_waits(module) >= 1
    with pytest.raises(emu.RaceError) as err:
        emu.run_module(module, [a, b], outs)
    (race,) = [r for r in err.value.races if r.space == "registers"]
    assert race.first.op.startswith("wgmma.mma_async")
    assert race.second.location.endswith(f":{_line(_wgmma_through_smem, 'accumulator read')}")
