"""``memref`` rules: every view op is checked by reading each element of the
view (one per thread) and comparing with the same view taken by numpy;
metadata ops against the strides and offsets MLIR's layout gives; allocas
are private to each thread."""

from __future__ import annotations

import numpy as np
import pytest

from smalti.emulate.errors import Unsupported

from .harness import assert_same_bits, covers, run

X = np.arange(32, dtype=np.float32).reshape(4, 8) * 0.5 - 3


def _read_all(ops: str, view: str, view_type: str, shape: tuple[int, ...],
              src: np.ndarray = X, src_type: str = "memref<4x8xf32>",
              elem: str = "f32") -> np.ndarray:
    """Thread t loads element t (row-major) of ``view`` (made by ``ops`` from
    ``%m``); returns what each thread loaded, in ``shape``."""
    n = int(np.prod(shape))
    lines = ["%t = gpu.thread_id x"]
    idx, rest = [], "%t"
    for d in reversed(range(len(shape))):
        lines += [f"%n{d} = arith.constant {shape[d]} : index",
                  f"%i{d} = arith.remui {rest}, %n{d} : index",
                  f"%q{d} = arith.divui {rest}, %n{d} : index"]
        idx.insert(0, f"%i{d}")
        rest = f"%q{d}"
    lines.append(f"%v = memref.load {view}[{', '.join(idx)}] : {view_type}")
    got = run(ops + "\n" + "\n".join(lines), {"m": (src_type, src)}, {"v": elem}, threads=n)
    return got["v"].reshape(shape)


VIEWS = [  # op, MLIR, view type, numpy view of X
    ("memref.subview",
     "%w = memref.subview %m[1, 2] [2, 3] [1, 2] : memref<4x8xf32> to "
     "memref<2x3xf32, strided<[8, 2], offset: 10>>",
     "memref<2x3xf32, strided<[8, 2], offset: 10>>", X[1:3, 2:8:2]),
    ("memref.subview",
     "%w = memref.subview %m[2, 0] [1, 8] [1, 1] : memref<4x8xf32> to "
     "memref<8xf32, strided<[1], offset: 16>>",
     "memref<8xf32, strided<[1], offset: 16>>", X[2]),
    ("memref.collapse_shape",
     "%w = memref.collapse_shape %m [[0, 1]] : memref<4x8xf32> into memref<32xf32>",
     "memref<32xf32>", X.reshape(32)),
    ("memref.expand_shape",
     "%w = memref.expand_shape %m [[0, 1], [2]] output_shape [2, 2, 8] : memref<4x8xf32> "
     "into memref<2x2x8xf32>", "memref<2x2x8xf32>", X.reshape(2, 2, 8)),
    ("memref.transpose",
     "%w = memref.transpose %m (i, j) -> (j, i) : memref<4x8xf32> to "
     "memref<8x4xf32, strided<[1, 8]>>", "memref<8x4xf32, strided<[1, 8]>>", X.T),
    ("memref.reinterpret_cast",
     "%w = memref.reinterpret_cast %m to offset: [4], sizes: [7, 4], strides: [4, 1] : "
     "memref<4x8xf32> to memref<7x4xf32, strided<[4, 1], offset: 4>>",
     "memref<7x4xf32, strided<[4, 1], offset: 4>>", X.reshape(-1)[4:32].reshape(7, 4)),
    ("memref.cast", "%w = memref.cast %m : memref<4x8xf32> to memref<?x8xf32>",
     "memref<?x8xf32>", X),
]


@covers("memref.load", *sorted({v[0] for v in VIEWS}))
def test_views_read_what_numpy_views_read():
    for _, ops, vt, want in VIEWS:
        got = _read_all(ops, "%w", vt, want.shape)
        assert_same_bits(got, np.ascontiguousarray(want)), ops


@covers("memref.subview", "memref.collapse_shape")
def test_a_view_of_a_view():
    ops = ("%s = memref.subview %m[1, 0] [2, 8] [1, 1] : memref<4x8xf32> to "
           "memref<2x8xf32, strided<[8, 1], offset: 8>>\n"
           "%w = memref.collapse_shape %s [[0, 1]] : memref<2x8xf32, strided<[8, 1], offset: 8>> "
           "into memref<16xf32, strided<[1], offset: 8>>")
    assert_same_bits(_read_all(ops, "%w", "memref<16xf32, strided<[1], offset: 8>>", (16,)),
                     X[1:3].reshape(16))


@covers("memref.view")
def test_view_of_bytes_at_a_shift():
    raw = np.arange(64, dtype=np.int32).view(np.int8)
    got = _read_all("%c16 = arith.constant 16 : index\n"
                    "%w = memref.view %m[%c16][] : memref<256xi8> to memref<4x4xi32>",
                    "%w", "memref<4x4xi32>", (4, 4), src=raw, src_type="memref<256xi8>",
                    elem="i32")
    assert_same_bits(got, np.arange(4, 20, dtype=np.int32).reshape(4, 4))


@covers("memref.extract_strided_metadata", "memref.extract_aligned_pointer_as_index",
        "memref.dim")
def test_metadata():
    got = run("""
      %w = memref.subview %m[1, 2] [2, 3] [1, 2] : memref<4x8xf32> to memref<2x3xf32, strided<[8, 2], offset: 10>>
      %base, %off, %sz:2, %st:2 = memref.extract_strided_metadata %w : memref<2x3xf32, strided<[8, 2], offset: 10>> -> memref<f32>, index, index, index, index, index
      %p = memref.extract_aligned_pointer_as_index %m : memref<4x8xf32> -> index
      %pb = memref.extract_aligned_pointer_as_index %base : memref<f32> -> index
      %c1 = arith.constant 1 : index
      %d = memref.dim %w, %c1 : memref<2x3xf32, strided<[8, 2], offset: 10>>
      %s0 = arith.addi %sz#0, %st#0 : index
      %s1 = arith.addi %sz#1, %st#1 : index""", {"m": ("memref<4x8xf32>", X)},  # noqa: E501 -- MLIR text, one op a line
              {"off": "index", "s0": "index", "s1": "index", "p": "index", "pb": "index",
               "d": "index"})
    assert got["off"] == 10 and got["s0"] == 2 + 8 and got["s1"] == 3 + 2 and got["d"] == 3
    assert got["p"] == got["pb"] and got["p"] % 1024 == 0


@covers("memref.alloca", "memref.alloc", "memref.store", "memref.load")
def test_allocas_are_private_to_each_thread():
    for op in ("memref.alloca", "memref.alloc"):
        got = run(f"""
          %a = {op}() : memref<2xindex>
          %t = gpu.thread_id x
          %c0 = arith.constant 0 : index
          %c1 = arith.constant 1 : index
          memref.store %t, %a[%c1] : memref<2xindex>
          %v = memref.load %a[%c1] : memref<2xindex>""", {}, {"v": "index"})
        assert got["v"].tolist() == list(range(32)), op


@covers("memref.alloca", "memref.memory_space_cast")
def test_what_is_not_modelled_is_unsupported():
    with pytest.raises(Unsupported, match="memref.alloca in memory space shared"):
        run("%a = memref.alloca() : memref<2xf32, #gpu.address_space<workgroup>>")
    with pytest.raises(Unsupported, match="memref.alloca of dynamic shape"):
        run("%a = memref.alloca(%n) : memref<?xf32>", {"n": ("index", 4)})
    with pytest.raises(Unsupported, match=r"memref.memory_space_cast of memref<4x8xf32, 4> "
                       r"\(no generic window"):  # constant memory (the rest: test_generic.py)
        run("%w = memref.memory_space_cast %m : memref<4x8xf32> to memref<4x8xf32, 4>",
            {"m": ("memref<4x8xf32>", X)})


def _nibbles(byte: int) -> list[int]:
    """The two signed 4-bit elements of a byte, element 0 in the low nibble."""
    return [((byte >> s) & 0xF) - (16 if (byte >> s) & 0x8 else 0) for s in (0, 4)]


@covers("memref.load", "memref.store")
def test_memrefs_of_packed_vectors_hold_one_vector_per_element():
    """``memref<Nxvector<2xi4>>`` (jax's tests copy i4 data so): element ``i``
    is byte ``i``, its vector element 0 the low nibble. Thread t loads
    element t and stores it to element 7 - t of the output."""
    src = np.array([0x00, 0x0F, 0xF0, 0x78, 0x87, 0x19, 0xA5, 0xFF], np.uint8)
    got = run("""
      %t = gpu.thread_id x
      %c7 = arith.constant 7 : index
      %r = arith.subi %c7, %t : index
      %v = memref.load %a[%t] : memref<8xvector<2xi4>, #gpu.address_space<workgroup>>
      memref.store %v, %b[%r] : memref<8xvector<2xi4>>""",
              {"a": ("memref<8xvector<2xi4>, #gpu.address_space<workgroup>>", src),
               "b": ("memref<8xvector<2xi4>>", np.zeros(8, np.uint8))},
              {"v": "vector<2xi4>"}, threads=8)
    assert got["v"].astype(int).tolist() == [_nibbles(int(b)) for b in src]
    assert got["b"].tolist() == src[::-1].tolist()


@covers("memref.load", "memref.store")
def test_memrefs_of_wider_vectors_are_little_endian_words():
    """A ``vector<2xf16>`` element is 4 bytes, element 0 first; a
    ``vector<4xi2>`` element one byte, element 0 in the lowest two bits."""
    halves = np.array([1.5, -0.0, np.inf, 65504.0, -2.0, 0.1], np.float16)
    got = run("""
      %c1 = arith.constant 1 : index
      %c2 = arith.constant 2 : index
      %v = memref.load %a[%c1] : memref<3xvector<2xf16>>
      memref.store %v, %a[%c2] : memref<3xvector<2xf16>>
      %q = memref.load %b[%c1] : memref<2xvector<4xi2>>""",
              {"a": ("memref<3xvector<2xf16>>", halves.view(np.uint32)),
               "b": ("memref<2xvector<4xi2>>", np.array([0, 0b11_10_01_00], np.uint8))},
              {"v": "vector<2xf16>", "q": "vector<4xi2>"})
    assert_same_bits(got["v"], halves[2:4])
    assert_same_bits(got["a"].view(np.float16), np.concatenate([halves[:4], halves[2:4]]))
    assert got["q"].astype(int).tolist() == [0, 1, -2, -1]  # 2-bit two's complement


@covers("vector.load")
def test_vector_elements_not_modelled_are_unsupported():
    for elem in ("vector<3xi4>", "vector<2x2xi4>", "vector<8xi1>"):
        with pytest.raises(Unsupported, match=f"element type {elem}"):
            run(f"%c0 = arith.constant 0 : index\n"
                f"%v = memref.load %a[%c0] : memref<4x{elem}>", {"a": (f"memref<4x{elem}>",
                                                                     np.zeros(8, np.uint8))})
    with pytest.raises(Unsupported, match="vector.load of a memref of vectors"):
        run("%c0 = arith.constant 0 : index\n"
            "%v = vector.load %a[%c0] : memref<4xvector<2xi4>>, vector<2xi4>",
            {"a": ("memref<4xvector<2xi4>>", np.zeros(4, np.uint8))}, {"v": "vector<2xi4>"})


@pytest.mark.parametrize("addr_shape", [(), (3,), (128, 64), (4, 32, 8)])
@pytest.mark.parametrize("vshape", [(1,), (2,), (4,), (2, 4), (8,), (32,)])
def test_vector_element_addresses_are_each_address_plus_each_offset(addr_shape, vshape):
    """plus_offsets (a vector access's element addresses, one add per
    offset where addresses are many) is numpy's broadcast add, shape and
    values, for every mix of address shape and vector shape."""
    from smalti.emulate.ops.memref import plus_offsets
    rng = np.random.default_rng(len(addr_shape) * 10 + len(vshape))
    addr = rng.integers(-2**40, 2**40, addr_shape, dtype=np.int64)
    offsets = rng.integers(0, 2**20, vshape, dtype=np.int64)
    got = plus_offsets(addr, offsets)
    assert got.dtype == np.int64 and got.shape == addr_shape + vshape
    np.testing.assert_array_equal(got, np.reshape(addr, addr_shape + (1,) * len(vshape)) + offsets)
