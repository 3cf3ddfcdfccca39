"""Generic pointers (:mod:`smalti.emulate.generic`): ``llvm.addrspacecast``
between the generic space and its global, local, shared::cta and
shared::cluster windows, and loads and stores (``llvm``, ``memref``) through
generic pointers into SMEM, a peer block's SMEM and GMEM -- values against
numpy, what lies outside a window as the emulator's error naming the op and
its location, and the checker seeing an access through a generic pointer as
the access to the real location: a race found with both lines, its twin with
a barrier clean."""

from __future__ import annotations

import re

import numpy as np
import pytest

from smalti.emulate.errors import EmulationError, Unsupported
from smalti.emulate.generic import SHARED_WINDOW
from smalti.emulate.sync.reports import OutOfBounds, RaceError

from .harness import assert_same_bits, covers, run
from .test_ptx import LAUNCH, cluster_launch, form, side

P3, P7 = "!llvm.ptr<3>", "!llvm.ptr<7>"
CLUSTER_SYNC = side("barrier.cluster.arrive;") + "\n" + side("barrier.cluster.wait;")
# the two sides of the races below, each at a line of its own
STORE_LOC, LOAD_LOC = 'loc("kernel.py":10:1)', 'loc("kernel.py":20:1)'
BOTH_LINES = (r"llvm\.store at kernel\.py:10\b", r"llvm\.load at kernel\.py:20\b")
# atomics that name no state space: generic addresses
RED = "red.relaxed.gpu.add.u32 [$0], $1;"
ATOM = "atom.add.u32 $0, [$1], $2;"
LD = "ld.acquire.sys.u32 $0,[$1];"


@covers("llvm.addrspacecast")
def test_casts_round_trip_and_smem_lands_in_the_shared_window():
    """3 -> 0 -> 3, 7 -> 0 -> 7, 1 -> 0 -> 1 and 5 -> 0 -> 5 give the address
    back; a generic SMEM address is the block's shared::cluster address
    (rank 0 here: 1 << 40 over the SMEM address), a global one is itself."""
    got = run(f"""
      %g = llvm.addrspacecast %s : {P3} to !llvm.ptr
      %s2 = llvm.addrspacecast %g : !llvm.ptr to {P3}
      %c = llvm.addrspacecast %s : {P3} to {P7}
      %gc = llvm.addrspacecast %c : {P7} to !llvm.ptr
      %c2 = llvm.addrspacecast %gc : !llvm.ptr to {P7}
      %s3 = llvm.addrspacecast %c2 : {P7} to {P3}
      %q = llvm.addrspacecast %x : !llvm.ptr to !llvm.ptr<1>
      %x2 = llvm.addrspacecast %q : !llvm.ptr<1> to !llvm.ptr
      %l = llvm.addrspacecast %x : !llvm.ptr to !llvm.ptr<5>
      %x3 = llvm.addrspacecast %l : !llvm.ptr<5> to !llvm.ptr
      %si = llvm.ptrtoint %s : {P3} to i64""",
              {"s": (P3, np.zeros(4, np.int32)), "x": ("!llvm.ptr", np.zeros(4, np.int32))},
              {"g": "!llvm.ptr", "s2": P3, "gc": "!llvm.ptr", "c2": P7, "s3": P3,
               "x2": "!llvm.ptr", "x3": "!llvm.ptr", "si": "i64"})
    smem = int(got["si"])
    assert 0 < smem < SHARED_WINDOW
    assert int(got["g"]) == SHARED_WINDOW | smem == int(got["gc"]) == int(got["c2"])
    assert int(got["s2"]) == int(got["s3"]) == smem
    assert int(got["x2"]) == int(got["x3"]) < SHARED_WINDOW


@covers("llvm.addrspacecast", "llvm.load", "llvm.store", "llvm.select")
def test_per_thread_generic_pointers_reach_smem_and_gmem():
    """Even threads hold a generic pointer to SMEM word t, odd ones to GMEM
    word t: each loads its word, stores it doubled, and reads it back."""
    s = np.arange(32, dtype=np.int32) * 3 - 40
    x = np.arange(32, dtype=np.int32) + 1000
    got = run(f"""
      %t = nvvm.read.ptx.sreg.tid.x : i32
      %one = llvm.mlir.constant(1 : i32) : i32
      %bit = llvm.and %t, %one : i32
      %odd = llvm.trunc %bit : i32 to i1
      %gs = llvm.addrspacecast %s : {P3} to !llvm.ptr
      %base = llvm.select %odd, %x, %gs : i1, !llvm.ptr
      %p = llvm.getelementptr %base[%t] : (!llvm.ptr, i32) -> !llvm.ptr, i32
      %v = llvm.load %p : !llvm.ptr -> i32
      %w = llvm.add %v, %v : i32
      llvm.store %w, %p : i32, !llvm.ptr
      %r = llvm.load %p : !llvm.ptr -> i32""",
              {"s": (P3, s), "x": ("!llvm.ptr", x)}, {"v": "i32", "r": "i32"})
    odd = np.arange(32) % 2 == 1
    assert_same_bits(got["v"], np.where(odd, x, s))
    assert_same_bits(got["r"], 2 * np.where(odd, x, s))
    assert_same_bits(got["s"], np.where(odd, s, 2 * s))  # each buffer: only its threads' words
    assert_same_bits(got["x"], np.where(odd, 2 * x, x))


@covers("llvm.addrspacecast", "memref.load", "vector.load", "builtin.unrealized_conversion_cast")
def test_a_memref_without_memory_space_over_a_generic_smem_pointer():
    """jax's ``get_cluster_ref`` shape: a memref with no memory space whose
    pointer is generic reads SMEM, element by element and as vectors."""
    s = np.array([1.5, -0.0, np.inf, np.nan, -7.25, 3.0, 1e-45, -1e38], np.float32)
    got = run(f"""
      %g = llvm.addrspacecast %s : {P3} to !llvm.ptr
      %m = builtin.unrealized_conversion_cast %g : !llvm.ptr to memref<8xf32>
      %c5 = arith.constant 5 : index
      %c4 = arith.constant 4 : index
      %e = memref.load %m[%c5] : memref<8xf32>
      %v = vector.load %m[%c4] : memref<8xf32>, vector<4xf32>""",
              {"s": (P3, s)}, {"e": "f32", "v": "vector<4xf32>"})
    assert_same_bits(got["e"], s[5])
    assert_same_bits(got["v"], s[4:])


def _peer_kernel(sync: str) -> dict:
    """Each block of a cluster of 2 stores rank * 100 + t into word t of its
    peer's SMEM through a generic pointer (mapa, then a cast to generic),
    runs ``sync`` and reads its own word t through ``ptr<3>`` (each first
    zeroes its own words, before a cluster barrier)."""
    return run(cluster_launch(f"""
      %c100 = llvm.mlir.constant(100 : i32) : i32
      %w0 = llvm.getelementptr %smem[64] : ({P3}) -> {P3}, i8
      %w = llvm.getelementptr %w0[%t] : ({P3}, i32) -> {P3}, i32
      llvm.store %z, %w : i32, {P3}
      {CLUSTER_SYNC}
      %wp = nvvm.mapa %w, %peer : {P3} -> {P7}
      %gp = llvm.addrspacecast %wp : {P7} to !llvm.ptr
      %r100 = llvm.mul %rank, %c100 : i32
      %val = llvm.add %r100, %t : i32
      llvm.store %val, %gp : i32, !llvm.ptr {STORE_LOC}
      {sync}
      %got = llvm.load %w : {P3} -> i32 {LOAD_LOC}
      %i = arith.index_cast %t : i32 to index
      %rk = arith.index_cast %rank : i32 to index
      %c32i = arith.constant 32 : index
      %row = arith.muli %rk, %c32i : index
      %at = arith.addi %row, %i : index
      memref.store %got, %out[%at] : memref<64xi32>"""),
               {"out": ("memref<64xi32>", np.zeros(64, np.int32))}, host=True, sanitize=True)


@covers("llvm.addrspacecast", "llvm.store", "nvvm.mapa")
def test_a_generic_pointer_from_mapa_writes_the_peer_blocks_smem():
    got = _peer_kernel(CLUSTER_SYNC)
    t = np.arange(32)
    assert got["out"].tolist() == [*(100 + t), *t]  # each block holds its peer's words


@covers("llvm.addrspacecast", "llvm.store")
def test_without_the_cluster_barrier_the_peer_write_is_a_race():
    """Block 1's generic store into block 0's word and block 0's plain read
    of it are unordered: a race, with both lines."""
    with pytest.raises(RaceError) as e:
        _peer_kernel("")
    text = str(e.value)
    assert re.search(r"data race \((read-after-write|write-after-read), smem\)", text)
    assert all(re.search(line, text) for line in BOTH_LINES)


def _two_warps(writer: str, reader: str, sync: str) -> dict:
    """64 threads: thread t writes t + 1 to SMEM word t through ``writer``
    (``generic`` or ``shared``; ``red``: a generic ``red.add`` onto the zero
    each thread first stores there, before a barrier), runs ``sync``, then
    reads the word of the same lane of the other warp through ``reader``
    into out[t]."""
    ptrs = {"generic": "!llvm.ptr", "shared": P3, "red": "!llvm.ptr"}
    if writer == "red":
        write = (f"llvm.store %z, %wp : i32, !llvm.ptr\n      nvvm.barrier\n      "
                 f'llvm.inline_asm has_side_effects "{RED}", "l,r" %wp, %val : '
                 f"(!llvm.ptr, i32) -> () {STORE_LOC}")
    else:
        write = f"llvm.store %val, %wp : i32, {ptrs[writer]} {STORE_LOC}"

    def word(kind: str, name: str, idx: str) -> str:
        base = "%smem" if kind == "shared" else "%gs"
        return (f"%{name}0 = llvm.getelementptr {base}[64] : ({ptrs[kind]}) -> {ptrs[kind]}, i8\n"
                f"      %{name} = llvm.getelementptr %{name}0[{idx}] : ({ptrs[kind]}, i32) -> "
                f"{ptrs[kind]}, i32")
    return run(LAUNCH.format(threads=64, smem=512, body=f"""
      %one = llvm.mlir.constant(1 : i32) : i32
      %c32 = llvm.mlir.constant(32 : i32) : i32
      %c63 = llvm.mlir.constant(63 : i32) : i32
      %t32 = llvm.add %t, %c32 : i32
      %other = llvm.and %t32, %c63 : i32
      %gs = llvm.addrspacecast %smem : {P3} to !llvm.ptr
      {word(writer, "wp", "%t")}
      {word(reader, "rp", "%other")}
      %val = llvm.add %t, %one : i32
      {write}
      {sync}
      %got = llvm.load %rp : {ptrs[reader]} -> i32 {LOAD_LOC}
      %i = arith.index_cast %t : i32 to index
      memref.store %got, %out[%i] : memref<64xi32>"""),
               {"out": ("memref<64xi32>", np.zeros(64, np.int32))}, host=True, sanitize=True)


@pytest.mark.parametrize("writer, reader", [("generic", "shared"), ("shared", "generic"),
                                            ("generic", "generic"), ("red", "shared")])
@covers("llvm.addrspacecast", "llvm.load", "nvvm.barrier")
def test_the_checker_sees_generic_smem_accesses_as_the_smem_they_reach(writer, reader):
    """Without a barrier the other warp's read of the word is a race, whichever
    of the two goes through a generic pointer (a store, or an atomic ``red``),
    with both lines; with one the same kernel is clean and reads the other
    warp's values."""
    with pytest.raises(RaceError) as e:
        _two_warps(writer, reader, "")
    text = str(e.value)
    assert "data race (read-after-write, smem)" in text
    store, load = BOTH_LINES
    if writer == "red":
        store = store.replace(r"llvm\.store", re.escape(RED.split()[0]))
    assert re.search(store, text) and re.search(load, text)
    got = _two_warps(writer, reader, "nvvm.barrier")
    assert got["out"].tolist() == [(t + 32) % 64 + 1 for t in range(64)]


@covers("llvm.addrspacecast", "llvm.load")
def test_what_lies_outside_a_window_is_an_error_naming_the_op_and_place():
    s = (P3, np.zeros(8, np.int32))
    # a global address cast into the shared::cta window: undefined in PTX
    with pytest.raises(EmulationError, match=r"llvm.addrspacecast from !llvm.ptr to "
                       r"!llvm.ptr<3>: generic address 0x[0-9a-f]+ is outside the shared::cta"):
        run(f"%q = llvm.addrspacecast %x : !llvm.ptr to {P3}",
            {"x": ("!llvm.ptr", np.zeros(4, np.int32))}, {"q": P3})
    # an SMEM address cast to global
    with pytest.raises(EmulationError, match="outside the global window"):
        run(f"""%g = llvm.addrspacecast %s : {P3} to !llvm.ptr
                %q = llvm.addrspacecast %g : !llvm.ptr to !llvm.ptr<1>""",
            {"s": s}, {"q": "!llvm.ptr<1>"})
    # the shared window of a CTA rank this cluster (of one) does not have
    far = (3 << 40) | 1024
    with pytest.raises(OutOfBounds, match=r"llvm.load through a generic pointer into the shared "
                       r"window of CTA rank 2, in no window: the cluster has 1 block.* at "
                       r'loc\("kernel.py":20:1\)'):
        run(f"""%q = llvm.inttoptr %a : i64 to !llvm.ptr
               %v = llvm.load %q : !llvm.ptr -> i32 {LOAD_LOC}""", {"a": ("i64", far)},
            {"v": "i32"})
    # in a window but in no buffer of it: the space's own error, as for a typed pointer
    with pytest.raises(OutOfBounds, match="global memory access at 0x8 is outside every buffer"):
        run("""%q = llvm.inttoptr %a : i64 to !llvm.ptr
               %v = llvm.load %q : !llvm.ptr -> i32""", {"a": ("i64", 8)}, {"v": "i32"})
    with pytest.raises(OutOfBounds, match="shared memory access .* runs past the end"):
        run(f"""%g = llvm.addrspacecast %s : {P3} to !llvm.ptr
                %p = llvm.getelementptr %g[8] : (!llvm.ptr) -> !llvm.ptr, i32
                %v = llvm.load %p : !llvm.ptr -> i32""", {"s": s}, {"v": "i32"})


@covers("llvm.addrspacecast")
def test_address_spaces_without_a_generic_window_are_unsupported():
    with pytest.raises(Unsupported, match=r"llvm.addrspacecast from !llvm.ptr<4> to !llvm.ptr "
                       r"\(no generic window is modelled for address space 4\)"):
        run("""%q = llvm.addrspacecast %p : !llvm.ptr<4> to !llvm.ptr""",
            {"p": ("!llvm.ptr<4>", np.zeros(4, np.int32))}, {"q": "!llvm.ptr"})



@covers(form(RED), form(ATOM), form(LD))
def test_atomics_naming_no_state_space_go_through_the_generic_window():
    """``red``/``atom``/``ld.acquire`` without ``.shared::cta``/``.global``
    take generic addresses: even threads add t + 1 to SMEM word t % 4, odd
    ones to GMEM word t % 4, with red then atom (each finding what the
    threads before it left, in thread order), then read their word back."""
    s = np.array([7, 0, 0xFFFFFFF0, 5], np.uint32).view(np.int32)
    x = np.array([1, 0xFFFFFFFF, 2, 0x7FFFFFFF], np.uint32).view(np.int32)
    got = run(f"""
      %t = nvvm.read.ptx.sreg.tid.x : i32
      %one = llvm.mlir.constant(1 : i32) : i32
      %c3 = llvm.mlir.constant(3 : i32) : i32
      %bit = llvm.and %t, %one : i32
      %odd = llvm.trunc %bit : i32 to i1
      %gs = llvm.addrspacecast %s : {P3} to !llvm.ptr
      %base = llvm.select %odd, %x, %gs : i1, !llvm.ptr
      %slot = llvm.and %t, %c3 : i32
      %p = llvm.getelementptr %base[%slot] : (!llvm.ptr, i32) -> !llvm.ptr, i32
      %v = llvm.add %t, %one : i32
      llvm.inline_asm has_side_effects "{RED}", "l,r" %p, %v : (!llvm.ptr, i32) -> ()
      %old = llvm.inline_asm has_side_effects "{ATOM}", "=r,l,r" %p, %v : (!llvm.ptr, i32) -> i32
      %seen = llvm.inline_asm has_side_effects "{LD}", "=r,l" %p : (!llvm.ptr) -> i32""",
              {"s": (P3, s), "x": ("!llvm.ptr", x)}, {"old": "i32", "seen": "i32"})
    mem = {"s": s.view(np.uint32).astype(np.int64), "x": x.view(np.uint32).astype(np.int64)}
    t = np.arange(32)
    buf = np.where(t % 2 == 1, "x", "s")
    for k in t:  # red
        mem[buf[k]][k % 4] += k + 1
    old = np.zeros(32, np.int64)
    for k in t:  # atom, in thread order
        old[k] = mem[buf[k]][k % 4] % (1 << 32)
        mem[buf[k]][k % 4] += k + 1
    final = {b: (m % (1 << 32)).astype(np.uint32) for b, m in mem.items()}
    assert_same_bits(got["s"].view(np.uint32), final["s"])
    assert_same_bits(got["x"].view(np.uint32), final["x"])
    assert_same_bits(np.asarray(got["old"]).view(np.uint32), old.astype(np.uint32))
    seen = np.array([final[buf[k]][k % 4] for k in t], np.uint32)
    assert_same_bits(np.asarray(got["seen"]).view(np.uint32), seen)


SMEM_REF = "memref<8xi32, #gpu.address_space<workgroup>>"


@covers("memref.memory_space_cast", "memref.load", "memref.store")
def test_memory_space_cast_casts_the_descriptors_pointers():
    """An SMEM memref cast to one with no memory space (generic) reads and
    writes the same SMEM, and casts back; a GMEM memref cast to SMEM is the
    cast's error, naming it."""
    s = np.arange(8, dtype=np.int32) * -3
    got = run(f"""
      %g = memref.memory_space_cast %s : {SMEM_REF} to memref<8xi32>
      %c2 = arith.constant 2 : index
      %c6 = arith.constant 6 : index
      %e = memref.load %g[%c2] : memref<8xi32>
      memref.store %e, %g[%c6] : memref<8xi32>
      %b = memref.memory_space_cast %g : memref<8xi32> to {SMEM_REF}
      %c7 = arith.constant 7 : index
      %f = memref.load %b[%c6] : {SMEM_REF}
      memref.store %f, %b[%c7] : {SMEM_REF}""", {"s": (SMEM_REF, s)}, {"e": "i32"})
    want = s.copy()
    want[6] = want[7] = s[2]
    assert got["e"] == s[2]
    assert_same_bits(got["s"], want)
    got = run("""
      %q = memref.memory_space_cast %x : memref<8xi32> to memref<8xi32, 1>
      %c3 = arith.constant 3 : index
      %e = memref.load %q[%c3] : memref<8xi32, 1>""", {"x": ("memref<8xi32>", s)}, {"e": "i32"})
    assert got["e"] == s[3]  # generic -> global: the same address
    with pytest.raises(EmulationError, match=r"memref.memory_space_cast from memref<8xi32> to "
                       r"memref<8xi32, #gpu.address_space<workgroup>>: generic address "
                       r"0x[0-9a-f]+ is outside the shared::cta window"):
        run(f"%b = memref.memory_space_cast %x : memref<8xi32> to {SMEM_REF}",
            {"x": ("memref<8xi32>", s)})


@covers("llvm.addrspacecast", "llvm.load", "llvm.store")
def test_packed_int4_through_a_generic_smem_pointer():
    """Thread t loads the two nibbles of SMEM byte t (element 0 in the low
    nibble) through a generic pointer and stores them swapped into byte t of
    a second SMEM buffer, through a generic pointer too."""
    src = np.array([0x00, 0x7F, 0x80, 0xF1, 0x18, 0x88, 0xFF, 0x3C] * 4, np.uint8)
    got = run(f"""
      %t = nvvm.read.ptx.sreg.tid.x : i32
      %ga = llvm.addrspacecast %a : {P3} to !llvm.ptr
      %gb = llvm.addrspacecast %b : {P3} to !llvm.ptr
      %pa = llvm.getelementptr %ga[%t] : (!llvm.ptr, i32) -> !llvm.ptr, i8
      %pb = llvm.getelementptr %gb[%t] : (!llvm.ptr, i32) -> !llvm.ptr, i8
      %v = llvm.load %pa : !llvm.ptr -> vector<2xi4>
      %w = vector.shuffle %v, %v [1, 0] : vector<2xi4>, vector<2xi4>
      llvm.store %w, %pb : vector<2xi4>, !llvm.ptr""",
              {"a": (P3, src), "b": (P3, np.zeros(32, np.uint8))}, {"v": "vector<2xi4>"})
    lo = (src & 0xF).astype(np.int8)
    hi = (src >> 4).astype(np.int8)
    signed = [np.where(x > 7, x - 16, x) for x in (lo, hi)]
    assert np.asarray(got["v"]).astype(np.int8).tolist() == np.stack(signed, 1).tolist()
    assert got["b"].tolist() == ((src >> 4) | ((src & 0xF) << 4)).astype(np.uint8).tolist()
