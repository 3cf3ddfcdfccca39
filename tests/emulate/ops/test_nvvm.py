"""``nvvm`` rules: special registers against the block and cluster the
harness runs, warp collectives (vote, redux, shfl, elect, ldmatrix/stmatrix)
against the PTX ISA's definitions written out per lane, barriers, ``mapa``,
and a small host + kernel module that moves a tile with the nvvm TMA ops
under mbarriers, with the synchronization checker watching (each ordering op
shown necessary by the race its absence causes)."""

from __future__ import annotations

import numpy as np
import pytest

from smalti.emulate.errors import EmulationError, Unsupported
from smalti.emulate.sched import WarpSplit
from smalti.emulate.sync.reports import Deadlock, MBarrierOverArrival, RaceError

from .harness import assert_same_bits, covers, run
from .test_builtin import INIT, init_tma_desc, tma_inputs

T = 64
BLOCK, GRID, CLUSTER, RANK = (3, 1, 0), (4, 2, 1), (2, 1, 1), 1
t = np.arange(T)
SREGS = {  # name -> what it reads in a block (3, 1, 0) of a (4, 2, 1) grid, clusters of 2
    "tid.x": t, "tid.y": 0 * t, "tid.z": 0 * t, "ctaid.x": 3, "ctaid.y": 1, "ctaid.z": 0,
    "ntid.x": T, "ntid.y": 1, "ntid.z": 1, "nctaid.x": 4, "nctaid.y": 2, "nctaid.z": 1,
    "laneid": t % 32, "warpid": t // 32, "cluster.ctarank": 1, "cluster.nctarank": 2,
    "cluster.ctaid.x": 1, "cluster.ctaid.y": 0, "cluster.ctaid.z": 0,
    "cluster.nctaid.x": 2, "cluster.nctaid.y": 1, "cluster.nctaid.z": 1,
    "clusterid.x": 1, "clusterid.y": 1, "clusterid.z": 0,
    "nclusterid.x": 2, "nclusterid.y": 2, "nclusterid.z": 1,
}


@covers(*(f"nvvm.read.ptx.sreg.{n}" for n in SREGS))
def test_special_registers():
    names = list(SREGS)
    body = "\n".join(f"%r{k} = nvvm.read.ptx.sreg.{n} : i32" for k, n in enumerate(names))
    got = run(body, {}, {f"r{k}": "i32" for k in range(len(names))}, threads=T,
              block_id=BLOCK, grid=GRID, cluster=CLUSTER, rank=RANK)
    for k, n in enumerate(names):
        assert np.all(got[f"r{k}"] == SREGS[n]), n
        assert got[f"r{k}"].dtype == np.int32, n


P = (t % 3 == 0) | (t == 40)


@covers("nvvm.vote.sync")
def test_vote_ballot_any_all_per_warp():
    all_set = np.ones(T, bool)
    for pred in (P, all_set, ~all_set):
        got = run("""
          %m = llvm.mlir.constant(-1 : i32) : i32
          %b = nvvm.vote.sync ballot %m, %p -> i32
          %a = nvvm.vote.sync any %m, %p -> i1
          %l = nvvm.vote.sync all %m, %p -> i1""", {"p": ("i1", pred)},
                  {"b": "i32", "a": "i1", "l": "i1"}, threads=T)
        for w in range(T // 32):
            lanes = pred[32 * w:32 * w + 32]
            bits = sum(1 << k for k in range(32) if lanes[k])
            warp = slice(32 * w, 32 * w + 32)
            assert np.all(got["b"][warp].view(np.uint32) == bits)
            assert np.all(got["a"][warp] == lanes.any()) and np.all(got["l"][warp] == lanes.all())


V = np.array([0, 1, -1, 2 ** 31 - 1, -2 ** 31, 7, -7, 12345] * 8, np.int32)
def _wrap32(x: int) -> np.int32:
    return np.int32((x + 2 ** 31) % 2 ** 32 - 2 ** 31)


REDUX = {"add": lambda v: _wrap32(sum(int(a) for a in v)),
         "and": np.bitwise_and.reduce, "or": np.bitwise_or.reduce, "xor": np.bitwise_xor.reduce,
         "min": np.min, "max": np.max,
         "umin": lambda v: _wrap32(int(v.view(np.uint32).min())),
         "umax": lambda v: _wrap32(int(v.view(np.uint32).max()))}


@covers("nvvm.redux.sync")
def test_redux_integer_kinds_over_each_warp():
    vals = np.concatenate([V[:32], np.roll(V, 3)[:32]])
    for kind, ref in REDUX.items():
        got = run(f"""
          %m = llvm.mlir.constant(-1 : i32) : i32
          %r = nvvm.redux.sync {kind} %v, %m : i32 -> i32""", {"v": ("i32", vals)},
                  {"r": "i32"}, threads=T)["r"]
        for w in range(2):
            assert np.all(got[32 * w:32 * w + 32] == np.int32(ref(vals[32 * w:32 * w + 32]))), kind
    with pytest.raises(Unsupported, match="partial member mask"):
        run("""
          %m = llvm.mlir.constant(65535 : i32) : i32
          %r = nvvm.redux.sync add %v, %m : i32 -> i32""", {"v": ("i32", vals)}, {"r": "i32"},
            threads=T)


@covers("nvvm.redux.sync")
def test_redux_fmax_fmin_with_and_without_nan_propagation():
    x = np.linspace(-3, 3, T).astype(np.float32)
    x[5] = np.nan  # warp 0 holds a NaN, warp 1 none
    for kind, nan, fn in [("fmax", False, np.fmax), ("fmin", False, np.fmin),
                          ("fmax", True, np.maximum), ("fmin", True, np.minimum)]:
        got = run(f"""
          %m = llvm.mlir.constant(-1 : i32) : i32
          %r = "nvvm.redux.sync"(%v, %m) <{{abs = false, kind = #nvvm.reduction_kind<{kind}>, nan = {str(nan).lower()}}}> : (f32, i32) -> f32""",  # noqa: E501 -- MLIR text, one op a line
                  {"v": ("f32", x)}, {"r": "f32"}, threads=T)["r"]
        for w in range(2):
            want = fn.reduce(x[32 * w:32 * w + 32])
            assert_same_bits(got[32 * w:32 * w + 32], np.full(32, want, np.float32))


@pytest.mark.parametrize("nan", [False, True])
def test_redux_fmax_fmin_order_the_zeros(nan):
    """+0.0 > -0.0, as PTX max/min order them, whatever the lanes' order."""
    x = np.where(np.arange(T) % 3 == 0, np.float32(-0.0), np.float32(0.0))
    for kind, negative in [("fmax", False), ("fmin", True)]:
        got = run(f"""
          %m = llvm.mlir.constant(-1 : i32) : i32
          %r = "nvvm.redux.sync"(%v, %m) <{{abs = false, kind = #nvvm.reduction_kind<{kind}>, nan = {str(nan).lower()}}}> : (f32, i32) -> f32""",  # noqa: E501 -- MLIR text, one op a line
                  {"v": ("f32", x)}, {"r": "f32"}, threads=T)["r"]
        assert (got == 0).all() and (np.signbit(got) == negative).all(), kind


def _shfl(mode: str, v: np.ndarray, b: int, c: int) -> tuple[np.ndarray, np.ndarray]:
    """shfl.sync as the PTX ISA's pseudo-code says, lane by lane."""
    out, ok = v.copy(), np.zeros(v.size, bool)
    for i in range(v.size):
        lane, warp = i % 32, i - i % 32
        seg = (c >> 8) & 0x1F
        max_lane = (lane & seg) | (c & 0x1F & ~seg)
        min_lane = lane & seg
        j, p = {"up": (lane - b, lane - b >= max_lane), "down": (lane + b, lane + b <= max_lane),
                "bfly": (lane ^ b, (lane ^ b) <= max_lane),
                "idx": (min_lane | (b & ~seg & 0x1F), (min_lane | (b & ~seg & 0x1F)) <= max_lane)
                }[mode]
        out[i], ok[i] = (v[warp + j], True) if p else (v[i], False)
    return out, ok


@pytest.mark.parametrize("mode,b,c", [("idx", 5, 0x1F), ("idx", 3, (24 << 8) | 0x1F),
                                      ("up", 1, 0), ("up", 4, 0x1800), ("down", 2, 0x1F),
                                      ("down", 1, 0x181F), ("bfly", 16, 0x1F), ("bfly", 3, 0x181F)])
@covers("nvvm.shfl.sync", "llvm.extractvalue")
def test_shfl_sync_modes_and_segments(mode, b, c):
    v = (np.arange(T) * 7 - 100).astype(np.int32)
    got = run(f"""
      %m = llvm.mlir.constant(-1 : i32) : i32
      %r = nvvm.shfl.sync {mode} %m, %v, %b, %c : i32 -> i32
      %s = "nvvm.shfl.sync"(%m, %v, %b, %c) <{{kind = #nvvm.shfl_kind<{mode}>, return_value_and_is_valid}}> : (i32, i32, i32, i32) -> !llvm.struct<(i32, i1)>
      %ok = llvm.extractvalue %s[1] : !llvm.struct<(i32, i1)>""",  # noqa: E501 -- MLIR text, one op a line
              {"v": ("i32", v), "b": ("i32", b), "c": ("i32", c)}, {"r": "i32", "ok": "i1"},
              threads=T)
    want, ok = _shfl(mode, v, b, c)
    assert_same_bits(got["r"], want)
    assert got["ok"].tolist() == ok.tolist()


@pytest.mark.parametrize("mode", ["idx", "up", "down", "bfly"])
@covers("nvvm.shfl.sync")
def test_shfl_sync_with_a_lane_operand_per_thread(mode):
    """Each thread's own lane operand (uniform ones are kept per form): the
    PTX ISA's pseudo-code thread by thread."""
    v = (np.arange(T) * 5 + 11).astype(np.int32)
    b = (np.arange(T) * 7 % 32).astype(np.int32)
    c = 0x1F if mode != "up" else 0
    got = run(f"""
      %m = llvm.mlir.constant(-1 : i32) : i32
      %r = nvvm.shfl.sync {mode} %m, %v, %b, %c : i32 -> i32""",
              {"v": ("i32", v), "b": ("i32", b), "c": ("i32", c)}, {"r": "i32"}, threads=T)
    want = np.array([_shfl(mode, v, int(b[i]), c)[0][i] for i in range(T)], np.int32)
    assert_same_bits(got["r"], want)


@covers("nvvm.elect.sync")
def test_elect_with_every_thread_active_picks_each_warps_lane_0():
    got = run("""
      %e = nvvm.elect.sync -> i1""", {}, {"e": "i1"}, threads=T)
    assert np.flatnonzero(got["e"]).tolist() == list(range(0, T, 32))


@covers("nvvm.elect.sync", "scf.if")
def test_elect_picks_the_first_active_lane_of_each_warp():
    active = (t % 3 == 1) & (t != 1)
    got = run("""
      %r = scf.if %p -> (i1) {
        %e = nvvm.elect.sync -> i1
        scf.yield %e : i1
      } else {
        %f = arith.constant false
        scf.yield %f : i1
      }""", {"p": ("i1", active)}, {"r": "i1"}, threads=T)
    want = np.zeros(T, bool)
    for w in range(2):
        want[32 * w + np.flatnonzero(active[32 * w:32 * w + 32])[0]] = True
    assert got["r"].tolist() == want.tolist()


def _row_pointer(num: int) -> str:
    """Lane l points at row l % 8 of matrix l // 8 (8 x 8 b16 matrices, one
    after another in %s): the addresses ldmatrix/stmatrix .x{num} read."""
    return """
      %l = nvvm.read.ptx.sreg.laneid : i32
      %c8 = llvm.mlir.constant(8 : i32) : i32
      %row = llvm.urem %l, %c8 : i32
      %mat = llvm.udiv %l, %c8 : i32
      %r8 = llvm.mul %row, %c8 : i32
      %c64 = llvm.mlir.constant(64 : i32) : i32
      %m64 = llvm.mul %mat, %c64 : i32
      %off = llvm.add %r8, %m64 : i32
      %p = llvm.getelementptr %s[%off] : (!llvm.ptr<3>, i32) -> !llvm.ptr<3>, i16"""


def _fragment(mats: np.ndarray, trans: bool) -> np.ndarray:
    """What lane l holds of each 8 x 8 matrix, per the PTX ISA's ldmatrix
    fragment: row l // 4, columns 2 (l % 4) and 2 (l % 4) + 1 (of the transpose)."""
    lane = np.arange(32)
    m = np.swapaxes(mats, -1, -2) if trans else mats
    lo = m[:, lane // 4, 2 * (lane % 4)].astype(np.uint32)
    hi = m[:, lane // 4, 2 * (lane % 4) + 1].astype(np.uint32)
    return (lo | hi << 16).view(np.int32).T  # (32 lanes, num)


@pytest.mark.parametrize("layout", ["row", "col"])
@covers("nvvm.ldmatrix", "nvvm.stmatrix")
def test_ldmatrix_fragments_and_stmatrix_stores_them_back(layout):
    mats = (np.arange(4 * 64, dtype=np.uint16) * 37 + 11).reshape(4, 8, 8)
    got = run(_row_pointer(4) + f"""
      %f = nvvm.ldmatrix %p, num = 4, layout = <{layout}>, shape = <m = 8, n = 8>, element_type = <b16> : (!llvm.ptr<3>) -> !llvm.struct<(i32, i32, i32, i32)>
      %f0 = llvm.extractvalue %f[0] : !llvm.struct<(i32, i32, i32, i32)>
      %f1 = llvm.extractvalue %f[1] : !llvm.struct<(i32, i32, i32, i32)>
      %f2 = llvm.extractvalue %f[2] : !llvm.struct<(i32, i32, i32, i32)>
      %f3 = llvm.extractvalue %f[3] : !llvm.struct<(i32, i32, i32, i32)>
      %one = nvvm.ldmatrix %p, num = 1, layout = <{layout}>, shape = <m = 8, n = 8>, element_type = <b16> : (!llvm.ptr<3>) -> i32
      %q = llvm.getelementptr %p[256] : (!llvm.ptr<3>) -> !llvm.ptr<3>, i16
      nvvm.stmatrix %q, %f3, %f2, %f1, %f0 layout = <{layout}>, shape = <m = 8, n = 8>, element_type = <b16> : !llvm.ptr<3>, i32, i32, i32, i32""",  # noqa: E501 -- MLIR text, one op a line
              {"s": ("!llvm.ptr<3>", np.concatenate([mats.reshape(-1), np.zeros(256, np.uint16)]))},
              {"f0": "i32", "f1": "i32", "f2": "i32", "f3": "i32", "one": "i32"}, threads=32)
    want = _fragment(mats, layout == "col")
    for k in range(4):
        assert_same_bits(got[f"f{k}"], want[:, k])
    assert_same_bits(got["one"], want[:, 0])
    stored = got["s"][256:].reshape(4, 8, 8)
    assert_same_bits(stored, mats[::-1].copy())  # matrix k of the store is register 3 - k


@covers("nvvm.barrier")
def test_named_and_block_barriers():
    run("""
      %id = llvm.mlir.constant(1 : i32) : i32
      %n = llvm.mlir.constant(64 : i32) : i32
      nvvm.barrier id = %id number_of_threads = %n
      nvvm.barrier
      nvvm.barrier id = %id""", threads=T)
    # one warp of four arrives at a barrier for two: in lockstep the others,
    # masked off, might be the second; the run goes on with warps as tasks
    # (tests/emulate/test_warp_tasks.py: there, it is a deadlock)
    with pytest.raises(WarpSplit, match="warpgroup 0 waits for nvvm.barrier"):
        run("""
          %w = nvvm.read.ptx.sreg.warpid : i32
          %z = llvm.mlir.constant(0 : i32) : i32
          %first = arith.cmpi eq, %w, %z : i32
          scf.if %first {
            %id = llvm.mlir.constant(1 : i32) : i32
            %n = llvm.mlir.constant(64 : i32) : i32
            nvvm.barrier id = %id number_of_threads = %n
          }""", threads=T)


def _mapa_reaches_the_ranks_smem(mapa: str, rank: int) -> None:
    """``mapa`` (the op line defining ``%q`` from ``%s`` and ``%r``): a store
    through the shared::cluster address of the block's own rank lands in its
    SMEM; a rank outside the cluster of 2 is refused."""
    got = run(f"""
      %r = nvvm.read.ptx.sreg.cluster.ctarank : i32
      %q = {mapa}
      %v = llvm.mlir.constant(-5 : i32) : i32
      llvm.store %v, %q : i32, !llvm.ptr<7>
      %back = llvm.load %s : !llvm.ptr<3> -> i32""",
              {"s": ("!llvm.ptr<3>", np.zeros(1, np.int32))}, {"back": "i32"},
              cluster=(2, 1, 1), grid=(2, 1, 1), rank=rank)
    assert np.all(got["back"] == -5)
    with pytest.raises(EmulationError, match="mapa to CTA rank 2 in a cluster of 2"):
        run(f"""
          %r = llvm.mlir.constant(2 : i32) : i32
          %q = {mapa}""",
            {"s": ("!llvm.ptr<3>", np.zeros(1, np.int32))}, cluster=(2, 1, 1), grid=(2, 1, 1))


@covers("nvvm.mapa", "llvm.store", "llvm.load")
def test_mapa_to_the_own_rank_reaches_the_own_smem():
    _mapa_reaches_the_ranks_smem("nvvm.mapa %s, %r : !llvm.ptr<3> -> !llvm.ptr<7>", rank=0)


@covers("mapa.shared::cluster.u32", "nvvm.read.ptx.sreg.cluster.ctarank", "llvm.store")
def test_mapa_as_inline_ptx_reaches_the_ranks_smem():
    """jax 0.12's form of ``nvvm.mapa`` (``mapa.shared::cluster.u32 $0, $1,
    $2;``) maps as nvvm.mapa does (a peer's SMEM in test_cluster.py's kernel)."""
    _mapa_reaches_the_ranks_smem(
        'llvm.inline_asm "mapa.shared::cluster.u32 $0, $1, $2;", "=r,r,r" %s, %r '
        ': (!llvm.ptr<3>, i32) -> !llvm.ptr<7>', rank=1)


BAR = {"b": ("!llvm.ptr<3>", np.zeros(1, np.int64))}


@covers("nvvm.mbarrier.init", "nvvm.mbarrier.arrive", "nvvm.mbarrier.try_wait.parity",
        "nvvm.mbarrier.arrive.nocomplete", "nvvm.fence.mbarrier.init")
def test_mbarrier_phases():
    """32 arrivals complete phase 0 (a wait on parity 0 returns); a wait on
    parity 1 before its phase completes can never return in one warpgroup."""
    body = """
      %n = llvm.mlir.constant(32 : i32) : i32
      %z = llvm.mlir.constant(0 : i32) : i32
      %c5 = llvm.mlir.constant(5 : i32) : i32
      %t = nvvm.read.ptx.sreg.tid.x : i32
      %first = arith.cmpi eq, %t, %z : i32
      nvvm.mbarrier.init %b, %n, predicate = %first : !llvm.ptr<3>, i32, i1
      nvvm.fence.mbarrier.init
      %s = nvvm.mbarrier.arrive %b : !llvm.ptr<3> -> i64
      nvvm.mbarrier.try_wait.parity %b, %z, %z : !llvm.ptr<3>, i32, i32"""
    run(body, BAR)
    with pytest.raises(Deadlock, match="parity 1, 27 arrivals"):
        run(body + """
          %one = llvm.mlir.constant(1 : i32) : i32
          scf.if %first {
            %nc = nvvm.mbarrier.arrive.nocomplete %b, %c5 : !llvm.ptr<3>, i32 -> i64
          }
          nvvm.mbarrier.try_wait.parity %b, %one, %z : !llvm.ptr<3>, i32, i32""", BAR)
    with pytest.raises(MBarrierOverArrival,
                       match="arrived at 32 times in phase 0 but initialized with a count of 31"):
        run(body.replace("%n = llvm.mlir.constant(32", "%n = llvm.mlir.constant(31"), BAR)


# --- a TMA round trip under mbarriers, with the checker ----------------------

SMEM = "#gpu.address_space<workgroup>"
KERNEL = """
  %c1 = arith.constant 1 : index
  %c32 = arith.constant 32 : index
  %bytes = arith.constant 4096 : i32
  gpu.launch blocks(%bx, %by, %bz) in (%gx = %c1, %gy = %c1, %gz = %c1)
             threads(%tx, %ty, %tz) in (%sx = %c32, %sy = %c1, %sz = %c1)
             dynamic_shared_memory_size %bytes {{
    %raw = gpu.dynamic_shared_memory : memref<?xi8, {smem}>
    %base = memref.extract_aligned_pointer_as_index %raw : memref<?xi8, {smem}> -> index
    %b64 = arith.index_cast %base : index to i64
    %bar = llvm.inttoptr %b64 : i64 to !llvm.ptr<3>
    %c64 = llvm.mlir.constant(64 : i64) : i64
    %t64 = llvm.add %b64, %c64 : i64
    %tile = llvm.inttoptr %t64 : i64 to !llvm.ptr<3>
    %z = llvm.mlir.constant(0 : i32) : i32
    %one = llvm.mlir.constant(1 : i32) : i32
    %col = llvm.mlir.constant(8 : i32) : i32
    %row = llvm.mlir.constant(4 : i32) : i32
    %tid = nvvm.read.ptx.sreg.tid.x : i32
    %first = arith.cmpi eq, %tid, %z : i32
    nvvm.mbarrier.init %bar, %one, predicate = %first : !llvm.ptr<3>, i32, i1
    nvvm.fence.mbarrier.init
    nvvm.barrier
    %nbytes = llvm.mlir.constant(128 : i32) : i32
    nvvm.mbarrier.arrive.expect_tx %bar, %nbytes, predicate = %first : !llvm.ptr<3>, i32, i1
    nvvm.cp.async.bulk.tensor.shared.cluster.global %tile, %desc, %bar, box[%col, %row] predicate = %first : !llvm.ptr<3>, !llvm.ptr
    nvvm.mbarrier.try_wait.parity %bar, %z, %z : !llvm.ptr<3>, i32, i32
    %v = llvm.getelementptr %tile[%tid] : (!llvm.ptr<3>, i32) -> !llvm.ptr<3>, f32
    %e = llvm.load %v : !llvm.ptr<3> -> f32
    %y = llvm.fadd %e, %e : f32
    llvm.store %y, %v : f32, !llvm.ptr<3>
    {fence}
    nvvm.barrier
    nvvm.cp.async.bulk.tensor.global.shared.cta %desc, %tile, box[%col, %row] predicate = %first : !llvm.ptr, <3>
    nvvm.cp.async.bulk.commit.group
    {wait}
    llvm.store %e, %v : f32, !llvm.ptr<3>
    nvvm.cp.async.bulk.wait_group 0
    gpu.terminator
  }}"""  # noqa: E501 -- MLIR text, one op a line
FENCE = "nvvm.fence.proxy <async.shared>, space = <cta>"
WAIT_READ = '"nvvm.cp.async.bulk.wait_group"() <{group = 0 : i32, read}> : () -> ()'


def _tma_kernel(fence: str = FENCE, wait: str = WAIT_READ):
    x = np.arange(16 * 16, dtype=np.float32).reshape(16, 16) - 7
    body = init_tma_desc() + KERNEL.format(smem=SMEM, fence=fence, wait=wait)
    return x, run(body, tma_inputs(x, (4, 8)), host=True, prelude=INIT, sanitize=True)


@covers("nvvm.cp.async.bulk.tensor.shared.cluster.global",
        "nvvm.cp.async.bulk.tensor.global.shared.cta", "nvvm.mbarrier.arrive.expect_tx",
        "nvvm.fence.proxy", "nvvm.cp.async.bulk.commit.group", "nvvm.cp.async.bulk.wait_group",
        "nvvm.barrier", "func.call", "gpu.launch")
def test_tma_round_trip_doubles_the_box():
    """Box (4, 8) at column 8, row 4 is loaded, doubled by the threads and
    stored back in place."""
    x, got = _tma_kernel()
    want = x.copy()
    want[4:8, 8:16] *= 2
    assert_same_bits(got["x"], want)


@covers("nvvm.fence.proxy", "nvvm.cp.async.bulk.wait_group")
def test_without_the_proxy_fence_or_the_read_wait_the_checker_reports_a_race():
    with pytest.raises(RaceError, match="read-after-write"):
        _tma_kernel(fence="")  # the TMA store's read of the threads' writes
    with pytest.raises(RaceError, match="write-after-read"):
        _tma_kernel(wait="")  # the threads' overwrite of what the store reads


@covers("nvvm.fence.proxy")
def test_a_fence_of_another_proxy_orders_nothing():
    with pytest.raises(RaceError, match="read-after-write"):
        _tma_kernel(fence="nvvm.fence.proxy <alias>")


NO_OPS = ["nvvm.fence.proxy.acquire", "nvvm.fence.proxy.release", "nvvm.setmaxregister",
          "nvvm.bar.warp.sync", "nvvm.cp.async.bulk.tensor.prefetch", "nvvm.wgmma.fence.aligned",
          "nvvm.wgmma.commit.group.sync.aligned", "nvvm.wgmma.wait.group.sync.aligned"]


@covers(*NO_OPS)
def test_ops_with_nothing_to_model_change_nothing():
    """Fences of the tensormap proxy, register allocation, warp syncs,
    prefetches, and WGMMA group ops with no WGMMA: a kernel with them between
    a store and a load still computes the same, and the checker is content."""
    x = np.arange(32, dtype=np.float32)
    body = """
      %c1 = arith.constant 1 : index
      %c32 = arith.constant 32 : index
      gpu.launch blocks(%bx, %by, %bz) in (%gx = %c1, %gy = %c1, %gz = %c1)
                 threads(%tx, %ty, %tz) in (%sx = %c32, %sy = %c1, %sz = %c1) {
        %m = llvm.mlir.constant(-1 : i32) : i32
        %z = llvm.mlir.constant(0 : i32) : i32
        %c128 = llvm.mlir.constant(128 : i32) : i32
        %v = memref.load %x[%tx] : memref<32xf32>
        nvvm.fence.proxy.acquire cta %d, %c128
        nvvm.fence.proxy.release cta
        nvvm.setmaxregister increase 240
        nvvm.bar.warp.sync %m : i32
        nvvm.cp.async.bulk.tensor.prefetch %d, box[%z, %z] : !llvm.ptr
        nvvm.wgmma.fence.aligned
        nvvm.wgmma.commit.group.sync.aligned
        nvvm.wgmma.wait.group.sync.aligned 0
        %w = arith.mulf %v, %v : f32
        memref.store %w, %x[%tx] : memref<32xf32>
        gpu.terminator
      }"""
    got = run(body, {"x": ("memref<32xf32>", x), "d": ("!llvm.ptr", np.zeros(128, np.uint8))},
              host=True, sanitize=True)
    assert_same_bits(got["x"], x * x)
