"""Ampere ``cp.async`` (:mod:`smalti.emulate.ops.cp_async`): the nvvm ops jax
emits (``nvvm.cp.async.shared.global``, ``commit.group``, ``wait.group N``,
``cp.async.mbarrier.arrive[.noinc]``) and the inline-PTX spellings, in a block
of two warps copying GMEM words into SMEM; values against numpy (every
cp-size, src-size zero-fill from 0 to the cp-size), and the checker both ways:
each ordering op shown necessary by the race its absence causes."""

from __future__ import annotations

import re

import numpy as np
import pytest

from smalti.emulate.errors import EmulationError
from smalti.emulate.sync.reports import Deadlock, RaceError

from .harness import covers, run
from .test_ptx import form, side

T = 64
SMEM = "#gpu.address_space<workgroup>"
COPY16 = "nvvm.cp.async.shared.global %dst, %src, 16, cache = cg : !llvm.ptr<3>, !llvm.ptr<1>"
COMMIT = "nvvm.cp.async.commit.group"
WAIT0 = "nvvm.cp.async.wait.group 0"
BARRIER = "nvvm.barrier"


def _kernel(copy: str = COPY16, sync: str = f"{COMMIT}\n{WAIT0}\n{BARRIER}", size: int = 16,
            partner: str = "%other", before: str = "", smem_off: int = 64) -> str:
    """64 threads: thread t copies ``size`` bytes of ``x`` at 16 t into SMEM
    byte ``smem_off`` + 16 t, runs ``sync``, then reads the 4-byte word of
    thread ``partner`` (default: the same lane of the other warp) and stores
    it to out[t]."""
    return f"""
  %c1 = arith.constant 1 : index
  %cT = arith.constant {T} : index
  %bytes = arith.constant 4096 : i32
  gpu.launch blocks(%bx, %by, %bz) in (%gx = %c1, %gy = %c1, %gz = %c1)
             threads(%tx, %ty, %tz) in (%sx = %cT, %sy = %c1, %sz = %c1)
             dynamic_shared_memory_size %bytes {{
    %raw = gpu.dynamic_shared_memory : memref<?xi8, {SMEM}>
    %base = memref.extract_aligned_pointer_as_index %raw : memref<?xi8, {SMEM}> -> index
    %b64 = arith.index_cast %base : index to i64
    %smem = llvm.inttoptr %b64 : i64 to !llvm.ptr<3>
    %t = nvvm.read.ptx.sreg.tid.x : i32
    %z = llvm.mlir.constant(0 : i32) : i32
    %one = llvm.mlir.constant(1 : i32) : i32
    %c16 = llvm.mlir.constant(16 : i32) : i32
    %c32 = llvm.mlir.constant(32 : i32) : i32
    %c63 = llvm.mlir.constant(63 : i32) : i32
    %first = arith.cmpi eq, %t, %z : i32
    %t32 = llvm.add %t, %c32 : i32
    %other = llvm.and %t32, %c63 : i32
    %off = llvm.mul %t, %c16 : i32
    %tile = llvm.getelementptr %smem[{smem_off}] : (!llvm.ptr<3>) -> !llvm.ptr<3>, i8
    %dst = llvm.getelementptr %tile[%off] : (!llvm.ptr<3>, i32) -> !llvm.ptr<3>, i8
    %gsrc = llvm.getelementptr %x[%off] : (!llvm.ptr, i32) -> !llvm.ptr, i8
    %src = llvm.addrspacecast %gsrc : !llvm.ptr to !llvm.ptr<1>
    {before}
    {copy}
    {sync}
    %poff = llvm.mul {partner}, %c16 : i32
    %p = llvm.getelementptr %tile[%poff] : (!llvm.ptr<3>, i32) -> !llvm.ptr<3>, i8
    %got = llvm.load %p : !llvm.ptr<3> -> vector<4xi32>
    %i = arith.index_cast %t : i32 to index
    %c0 = arith.constant 0 : index
    vector.store %got, %out[%i, %c0] : memref<{T}x4xi32>, vector<4xi32>
    gpu.terminator
  }}"""


def _run(body: str, x: np.ndarray | None = None) -> np.ndarray:
    x = np.arange(T * 4, dtype=np.int32) * 7 - 99 if x is None else x
    got = run(body, {"x": ("!llvm.ptr", x),
                     "out": (f"memref<{T}x4xi32>", np.zeros((T, 4), np.int32))},
              host=True, sanitize=True)
    return got["out"]


X = np.arange(T * 4, dtype=np.int32) * 7 - 99
PARTNER = (np.arange(T) + 32) % T


@covers("nvvm.cp.async.shared.global", "nvvm.cp.async.commit.group", "nvvm.cp.async.wait.group",
        "nvvm.barrier", "gpu.launch")
@pytest.mark.parametrize("size", [4, 8, 16])
def test_each_thread_copies_its_bytes_and_the_other_warp_reads_them_after_wait_and_barrier(size):
    """16 / size copies of ``size`` bytes fill each thread's 16."""
    cache = "cg" if size == 16 else "ca"
    copies = []
    for k in range(16 // size):
        copies.append(
            f"%d{k} = llvm.getelementptr %dst[{k * size}] : (!llvm.ptr<3>) -> !llvm.ptr<3>, i8\n"  # noqa: E501
            f"    %s{k} = llvm.getelementptr %src[{k * size}] : (!llvm.ptr<1>) -> !llvm.ptr<1>, i8\n"  # noqa: E501
            f"    nvvm.cp.async.shared.global %d{k}, %s{k}, {size}, cache = {cache} : "
            "!llvm.ptr<3>, !llvm.ptr<1>")
    got = _run(_kernel("\n    ".join(copies)))
    np.testing.assert_array_equal(got, X.reshape(T, 4)[PARTNER])


@covers("nvvm.cp.async.shared.global")
def test_src_size_reads_that_many_bytes_and_zero_fills_the_rest():
    # thread t reads t % 17 bytes (0 and 16 included); sources hold no zero byte
    x = np.frombuffer(np.arange(1, T * 16 + 1, dtype=np.uint8).tobytes() * 1, np.uint8).copy()
    x[x == 0] = 0xAB
    copy = ("%c17 = llvm.mlir.constant(17 : i32) : i32\n    %n = llvm.urem %t, %c17 : i32\n    "
            "nvvm.cp.async.shared.global %dst, %src, 16, cache = cg, %n : "
            "!llvm.ptr<3>, !llvm.ptr<1>, i32")
    got = _run(_kernel(copy, partner="%t"), x.view(np.int32)).view(np.uint8).reshape(T, 16)
    src = x.reshape(T, 16)
    for t in range(T):
        n = t % 17
        np.testing.assert_array_equal(got[t, :n], src[t, :n])
        assert not got[t, n:].any(), t


@covers("nvvm.cp.async.shared.global")
def test_a_src_size_larger_than_the_copy_is_an_error():
    copy = ("%n = llvm.mlir.constant(17 : i32) : i32\n    nvvm.cp.async.shared.global %dst, "
            "%src, 16, cache = cg, %n : !llvm.ptr<3>, !llvm.ptr<1>, i32")
    with pytest.raises(EmulationError, match="src-size 17 of thread 0 outside 0..16"):
        _run(_kernel(copy))


@covers("nvvm.cp.async.shared.global")
def test_a_misaligned_destination_is_an_error_naming_thread_and_address():
    with pytest.raises(EmulationError, match="destination address .* is not 16-byte aligned"):
        _run(_kernel(smem_off=68))


def _race(body: str) -> str:
    with pytest.raises(RaceError) as e:
        _run(body)
    return str(e.value)


@covers("nvvm.cp.async.shared.global")
def test_reading_the_destination_without_the_wait_is_a_race_with_both_lines():
    text = _race(_kernel(sync=f"{COMMIT}\n{BARRIER}"))
    assert "read-after-write" in text and "cp.async issued by" in text
    assert re.search(r"by cp\.async issued by .*warp 0: cp\.async at -:\d+", text)
    assert re.search(r"warp 1: llvm\.load at -:\d+", text)
    assert "cp.async.wait_group" in text  # the fix names the wait


@covers("nvvm.cp.async.shared.global")
def test_even_the_issuing_thread_must_wait_for_its_own_copy():
    text = _race(_kernel(sync=COMMIT, partner="%t"))
    assert "read-after-write" in text and "cp.async issued by" in text


@covers("nvvm.cp.async.wait.group")
def test_the_other_warp_needs_a_barrier_after_the_wait():
    text = _race(_kernel(sync=f"{COMMIT}\n{WAIT0}"))
    assert "read-after-write" in text and "cp.async issued by" in text
    # ...while each thread reading its own copy needs only the wait
    got = _run(_kernel(sync=f"{COMMIT}\n{WAIT0}", partner="%t"))
    np.testing.assert_array_equal(got, X.reshape(T, 4))


def test_wait_group_n_leaves_the_newest_n_groups_pending():
    """Two groups (the first copy to SMEM 64.., the second to 1088..); wait 1
    completes the first only: reading its bytes is fine, the second's a race."""
    second = ("%tile2 = llvm.getelementptr %dst[1024] : (!llvm.ptr<3>) -> !llvm.ptr<3>, i8\n    "
              "nvvm.cp.async.shared.global %tile2, %src, 16, cache = cg : "
              "!llvm.ptr<3>, !llvm.ptr<1>")
    sync = f"{COMMIT}\n    {second}\n    {COMMIT}\n    nvvm.cp.async.wait.group 1\n    {BARRIER}"
    got = _run(_kernel(sync=sync))
    np.testing.assert_array_equal(got, X.reshape(T, 4)[PARTNER])
    late = _kernel(sync=sync).replace("%tile[%poff]", "%tile[%poff2]").replace(
        "%p = llvm", "%poff2 = llvm.add %poff, %c1024 : i32\n    %p = llvm").replace(
        "%c63 =", "%c1024 = llvm.mlir.constant(1024 : i32) : i32\n    %c63 =")
    assert "read-after-write" in _race(late)
    # wait.group 0 completes both
    np.testing.assert_array_equal(_run(late.replace("wait.group 1", "wait.group 0")),
                                  X.reshape(T, 4)[PARTNER])


def test_overwriting_the_destination_before_issuing_needs_ordering():
    """Another warp's earlier write of the destination, not ordered before the
    copy's issue: write-after-write (the fix points at the copy's issue)."""
    before = ("%pre = llvm.mul %other, %c16 : i32\n    "
              "%pp = llvm.getelementptr %smem[%pre] : (!llvm.ptr<3>, i32) -> !llvm.ptr<3>, i8\n    "
              "%pp64 = llvm.getelementptr %pp[64] : (!llvm.ptr<3>) -> !llvm.ptr<3>, i8\n    "
              "llvm.store %t, %pp64 : i32, !llvm.ptr<3>")
    text = _race(_kernel(before=before))
    assert "write-after-write" in text and "before issuing the copy" in text
    _run(_kernel(before=before + f"\n    {BARRIER}"))  # with a barrier: no report


# --- cp.async.mbarrier.arrive: the copies complete the barrier's phase ----------

BAR = """
    %bar = llvm.getelementptr %smem[0] : (!llvm.ptr<3>) -> !llvm.ptr<3>, i8
    %count = llvm.mlir.constant({count} : i32) : i32
    nvvm.mbarrier.init %bar, %count, predicate = %first : !llvm.ptr<3>, i32, i1
    nvvm.barrier"""


def _with_barrier(arrive: str, count: int, leader_arrives: bool) -> str:
    lead = ("nvvm.barrier\n    nvvm.mbarrier.arrive.expect_tx %bar, %z, predicate = %first : "
            "!llvm.ptr<3>, i32, i1" if leader_arrives else "")
    sync = f"{arrive}\n    {lead}\n    nvvm.mbarrier.try_wait.parity %bar, %z, %z : " \
           "!llvm.ptr<3>, i32, i32"
    return _kernel(sync=sync, before=BAR.format(count=count))


@covers("nvvm.cp.async.mbarrier.arrive", "nvvm.mbarrier.try_wait.parity")
def test_cp_async_mbarrier_arrive_orders_the_copies_before_the_phase_as_jax_uses_it():
    """jax: every thread's net-zero cp.async.mbarrier.arrive, a warpgroup
    barrier, one arrival by the leader; the wait then sees every copy."""
    arrive = "nvvm.cp.async.mbarrier.arrive %bar : !llvm.ptr<3>"
    got = _run(_with_barrier(arrive, 1, True))
    np.testing.assert_array_equal(got, X.reshape(T, 4)[PARTNER])
    # without it the barrier's phase holds only the threads' own accesses
    assert "read-after-write" in _race(_with_barrier("", 1, True))


@covers("nvvm.cp.async.mbarrier.arrive")
def test_noinc_counts_one_arrival_per_thread():
    arrive = "nvvm.cp.async.mbarrier.arrive %bar noinc = true : !llvm.ptr<3>"
    got = _run(_with_barrier(arrive, T, False))
    np.testing.assert_array_equal(got, X.reshape(T, 4)[PARTNER])
    # one arrival short: the phase never completes (the block is one warpgroup)
    with pytest.raises(Deadlock, match="has not completed"):
        _run(_with_barrier(arrive, T + 1, False))


# --- the same as inline PTX --------------------------------------------------------

PTX_COPY = "cp.async.cg.shared.global [$0], [$1], 16;"
PTX_COPY_ZFILL = "cp.async.ca.shared::cta.global [$0], [$1], 16, $2;"
PTX_COMMIT = "cp.async.commit_group;"
PTX_WAIT = "cp.async.wait_group 0;"
PTX_WAIT_ALL = "cp.async.wait_all;"


@covers(form(PTX_COPY), form(PTX_COMMIT), form(PTX_WAIT), form(PTX_WAIT_ALL))
def test_the_inline_ptx_spellings():
    copy = side(PTX_COPY, "r,l", ("%dst", "!llvm.ptr<3>"), ("%src", "!llvm.ptr<1>"))
    got = _run(_kernel(copy, sync=f"{side(PTX_COMMIT)}\n{side(PTX_WAIT)}\n{BARRIER}"))
    np.testing.assert_array_equal(got, X.reshape(T, 4)[PARTNER])
    # wait_all also waits for copies no commit_group closed
    got = _run(_kernel(copy, sync=f"{side(PTX_WAIT_ALL)}\n{BARRIER}"))
    np.testing.assert_array_equal(got, X.reshape(T, 4)[PARTNER])
    # wait_group 0 does not: an uncommitted copy is in no group
    assert "read-after-write" in _race(_kernel(copy, sync=f"{side(PTX_WAIT)}\n{BARRIER}"))


@covers(form(PTX_COPY_ZFILL))
def test_inline_ptx_src_size_zero_fills():
    copy = ("%c5 = llvm.mlir.constant(5 : i32) : i32\n    " +
            side(PTX_COPY_ZFILL, "r,l,r", ("%dst", "!llvm.ptr<3>"), ("%src", "!llvm.ptr<1>"),
                 ("%c5", "i32")))
    got = _run(_kernel(copy, sync=f"{side(PTX_WAIT_ALL)}", partner="%t")).view(np.uint8)
    src = X.view(np.uint8).reshape(T, 16)
    np.testing.assert_array_equal(got.reshape(T, 16)[:, :5], src[:, :5])
    assert not got.reshape(T, 16)[:, 5:].any()
