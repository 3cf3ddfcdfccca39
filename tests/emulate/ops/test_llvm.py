"""``llvm`` dialect rules: integer and float arithmetic on edge values (the
same references as ``arith``'s, as the rules share them), aggregates,
pointers, loads and stores through global and shared memory, allocas, the
one intrinsic call jax writes (``tcgen05.commit``, arriving on mbarriers), and
what is refused (globals, other intrinsics). Generic pointers
(``addrspacecast``) are ``test_generic.py``'s."""

from __future__ import annotations

import numpy as np
import pytest

from smalti.emulate.errors import Unsupported
from smalti.emulate.sync.reports import Deadlock

from .harness import assert_same_bits, covers, float_edges, pairs, run
from .test_arith import INT_OPS, check_int_binary

LLVM_INT = {
    "llvm.add": "arith.addi", "llvm.sub": "arith.subi", "llvm.mul": "arith.muli",
    "llvm.and": "arith.andi", "llvm.or": "arith.ori", "llvm.xor": "arith.xori",
    "llvm.shl": "arith.shli", "llvm.lshr": "arith.shrui", "llvm.ashr": "arith.shrsi",
    "llvm.udiv": "arith.divui", "llvm.sdiv": "arith.divsi", "llvm.urem": "arith.remui",
    "llvm.srem": "arith.remsi",
}


@pytest.mark.parametrize("ty", ["i8", "i32", "i64"])
@covers(*LLVM_INT)
def test_integer_ops(ty):
    """INT_MIN / -1 wraps, shifts past the width clamp (PTX); x / 0 is not asserted."""
    for op, same in LLVM_INT.items():
        check_int_binary(op, INT_OPS[same], ty)


@covers("llvm.fadd", "llvm.fsub", "llvm.fmul")
def test_float_ops_round_once():
    a, b = pairs(float_edges("f32"))
    vt = f"vector<{a.size}xf32>"
    for op, fn in [("llvm.fadd", np.add), ("llvm.fsub", np.subtract), ("llvm.fmul", np.multiply)]:
        got = run(f"%r = {op} %a, %b : {vt}", {"a": (vt, a), "b": (vt, b)}, {"r": vt})["r"]
        with np.errstate(all="ignore"):
            assert_same_bits(got, fn(a.astype(np.float64), b.astype(np.float64)).astype(np.float32))


STRUCT = "!llvm.struct<(i32, array<2 x f32>)>"


@covers("llvm.mlir.undef", "llvm.mlir.poison", "llvm.mlir.zero", "llvm.insertvalue",
        "llvm.extractvalue")
def test_aggregates_and_undefined_values():
    got = run(f"""
      %u = llvm.mlir.undef : {STRUCT}
      %s1 = llvm.insertvalue %a, %u[0] : {STRUCT}
      %s2 = llvm.insertvalue %f, %s1[1, 1] : {STRUCT}
      %x = llvm.extractvalue %s2[0] : {STRUCT}
      %y = llvm.extractvalue %s2[1, 1] : {STRUCT}
      %p = llvm.mlir.poison : vector<2xi16>
      %z = llvm.mlir.zero : !llvm.ptr
      %c = llvm.mlir.undef : f32""", {"a": ("i32", -7), "f": ("f32", np.float32(2.5))},
              {"x": "i32", "y": "f32", "p": "vector<2xi16>", "z": "!llvm.ptr", "c": "f32"})
    assert got["x"] == -7 and got["y"] == np.float32(2.5)
    assert got["p"].shape == (2,) and got["p"].dtype == np.int16 and got["z"] == 0
    with pytest.raises(Unsupported, match="extractvalue of an undefined field"):
        run(f"""
          %u = llvm.mlir.undef : {STRUCT}
          %s1 = llvm.insertvalue %a, %u[0] : {STRUCT}
          %y = llvm.extractvalue %s1[1, 0] : {STRUCT}""", {"a": ("i32", 1)}, {"y": "f32"})


@pytest.mark.parametrize("space", ["!llvm.ptr", "!llvm.ptr<3>"])
@covers("llvm.getelementptr", "llvm.load", "llvm.store", "nvvm.read.ptx.sreg.tid.x",
        "llvm.sext")
def test_per_thread_loads_and_stores_through_gep(space):
    """Thread t copies src[t] to dst[31 - t] (global, then shared memory)."""
    src = np.arange(32, dtype=np.float32) * 1.5 - 3
    got = run(f"""
      %t = nvvm.read.ptx.sreg.tid.x : i32
      %c31 = llvm.mlir.constant(31 : i32) : i32
      %r = llvm.sub %c31, %t : i32
      %r64 = llvm.sext %r : i32 to i64
      %ps = llvm.getelementptr %src[%t] : ({space}, i32) -> {space}, f32
      %pd = llvm.getelementptr %dst[%r64] : ({space}, i64) -> {space}, f32
      %v = llvm.load %ps : {space} -> f32
      llvm.store %v, %pd : f32, {space}""",
              {"src": (space, src), "dst": (space, np.zeros(32, np.float32))})
    assert_same_bits(got["dst"], src[::-1].copy())
    assert_same_bits(got["src"], src)


@covers("llvm.getelementptr", "llvm.load", "llvm.store")
def test_constant_gep_into_arrays_and_vector_loads():
    """getelementptr %p[1, 2] over array<4 x i32> is 4 * (4 * 1 + 2) bytes on."""
    buf = np.arange(16, dtype=np.int32)
    got = run("""
      %q = llvm.getelementptr %p[1, 2] : (!llvm.ptr) -> !llvm.ptr, !llvm.array<4 x i32>
      %v = llvm.load %q : !llvm.ptr -> vector<2xi32>
      %w = llvm.add %v, %v : vector<2xi32>
      %q2 = llvm.getelementptr %p[3, 0] : (!llvm.ptr) -> !llvm.ptr, !llvm.array<4 x i32>
      llvm.store %w, %q2 : vector<2xi32>, !llvm.ptr""", {"p": ("!llvm.ptr", buf)},
              {"v": "vector<2xi32>"})
    assert got["v"].tolist() == [6, 7]
    want = buf.copy()
    want[12:14] = [12, 14]
    assert_same_bits(got["p"], want)


@covers("llvm.alloca", "llvm.store", "llvm.load")
def test_alloca_is_private_to_each_thread():
    got = run("""
      %one = llvm.mlir.constant(1 : i32) : i32
      %a = llvm.alloca %one x i32 : (i32) -> !llvm.ptr
      %t = nvvm.read.ptx.sreg.tid.x : i32
      llvm.store %t, %a : i32, !llvm.ptr
      %v = llvm.load %a : !llvm.ptr -> i32""", {}, {"v": "i32"})
    assert got["v"].tolist() == list(range(32))


@covers("llvm.ptrtoint", "llvm.inttoptr", "llvm.load")
def test_pointer_integer_round_trip():
    got = run("""
      %i = llvm.ptrtoint %p : !llvm.ptr to i64
      %c8 = llvm.mlir.constant(8 : i64) : i64
      %j = llvm.add %i, %c8 : i64
      %q = llvm.inttoptr %j : i64 to !llvm.ptr
      %v = llvm.load %q : !llvm.ptr -> i64""",
              {"p": ("!llvm.ptr", np.array([5, -9], np.int64))}, {"v": "i64", "i": "i64"})
    assert got["v"] == -9 and got["i"] % 1024 == 0


@covers("llvm.extractelement", "llvm.insertelement")
def test_vector_elements():
    v = np.array([1.0, -0.0, np.nan, 4.0], np.float32)
    got = run("""
      %c2 = llvm.mlir.constant(2 : i32) : i32
      %e = llvm.extractelement %v[%c2 : i32] : vector<4xf32>
      %w = llvm.insertelement %x, %v[%c2 : i32] : vector<4xf32>""",
              {"v": ("vector<4xf32>", v), "x": ("f32", np.arange(32, dtype=np.float32))},
              {"e": "f32", "w": "vector<4xf32>"})
    assert np.isnan(got["e"])
    want = np.broadcast_to(v, (32, 4)).copy()
    want[:, 2] = np.arange(32)
    assert_same_bits(got["w"], want)  # a per-thread element makes a per-thread vector
    with pytest.raises(Unsupported, match="extractelement at a per-thread index"):
        run("""
          %t = nvvm.read.ptx.sreg.tid.x : i32
          %e = llvm.extractelement %v[%t : i32] : vector<4xf32>""",
            {"v": ("vector<4xf32>", v)}, {"e": "f32"})


@covers("llvm.mlir.addressof")
def test_globals_are_unsupported():
    with pytest.raises(Unsupported, match="llvm.mlir.addressof @g"):
        run("%q = llvm.mlir.addressof @g : !llvm.ptr", {}, {"q": "!llvm.ptr"},
            prelude="llvm.mlir.global internal @g(0 : i32) : i32")


COMMIT = '"llvm.nvvm.tcgen05.commit{}"({}) : ({}) -> ()'


@covers("llvm.call_intrinsic", "nvvm.mbarrier.try_wait.parity")
def test_a_tcgen05_commit_arrives_once_on_its_mbarrier():
    """``llvm.nvvm.tcgen05.commit.cg1`` (jax's tcgen05_commit_arrive) by thread
    0: one arrival, so a barrier for 1 completes phase 0 and the wait returns;
    a barrier for 2 does not, and the wait is reported."""
    from .test_ptx import LAUNCH, side

    def kernel(count: int) -> str:
        return LAUNCH.format(threads=32, smem=64, body=f"""
          %n = llvm.mlir.constant({count} : i32) : i32
          {side("@$2 mbarrier.init.shared::cta.b64 [$0], $1;", "l,r,b", ("%smem", "!llvm.ptr<3>"),
                ("%n", "i32"), ("%first", "i1"))}
          scf.if %first {{
            llvm.call_intrinsic {COMMIT.format(".cg1", "%smem", "!llvm.ptr<3>")}
          }}
          nvvm.mbarrier.try_wait.parity %smem, %z, %z : !llvm.ptr<3>, i32, i32""")
    run(kernel(1), host=True, sanitize=True)
    with pytest.raises(Deadlock, match="1 arrivals and 0 transaction bytes outstanding"):
        run(kernel(2), host=True)


@covers("llvm.call_intrinsic")
def test_a_multicast_commit_arrives_on_the_barrier_of_each_cta_of_its_mask():
    """``.mc.cg2`` from block 0 of a cluster of 2 with mask 0b11 completes both
    blocks' barriers; with mask 0b01 block 1 waits forever."""
    from smalti.emulate.sync.reports import Deadlock

    from .test_ptx import cluster_launch, side

    def kernel(mask: int) -> str:
        return cluster_launch(f"""
          %mask = llvm.mlir.constant({mask} : i16) : i16
          {side("@$2 mbarrier.init.shared::cta.b64 [$0], $1;", "l,r,b", ("%smem", "!llvm.ptr<3>"),
                ("%one", "i32"), ("%first", "i1"))}
          {side("barrier.cluster.arrive;")}
          {side("barrier.cluster.wait;")}
          %r0 = arith.cmpi eq, %rank, %z : i32
          %issuer = arith.andi %first, %r0 : i1
          scf.if %issuer {{
            llvm.call_intrinsic {COMMIT.format(".mc.cg2", "%smem, %mask", "!llvm.ptr<3>, i16")}
          }}
          nvvm.mbarrier.try_wait.parity %smem, %z, %z : !llvm.ptr<3>, i32, i32""")
    run(kernel(3), host=True, sanitize=True)
    with pytest.raises(Deadlock, match="mbarrier"):
        run(kernel(1), host=True)


@covers("llvm.call_intrinsic")
def test_other_intrinsics_are_unsupported():
    with pytest.raises(Unsupported, match="LLVM intrinsic llvm.nvvm.other"):
        run('llvm.call_intrinsic "llvm.nvvm.other"(%a) : (i32) -> ()', {"a": ("i32", 1)})
