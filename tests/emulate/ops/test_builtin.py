"""``builtin.unrealized_conversion_cast`` in each form Mosaic GPU leaves
(LLVM struct <-> memref descriptor, pointer <-> memref, a by-value parameter
block -> pointer, tokens, registers <-> a Warpgroup-level vector) and
``func.call @mosaic_gpu_init_tma_desc``, the one host call modelled."""

from __future__ import annotations

import numpy as np
import pytest

from smalti.emulate.errors import Unsupported
from smalti.emulate.machine import TMA_MAGIC

from .harness import assert_same_bits, covers, run

DESC = "!llvm.struct<(ptr, ptr, i64, array<2 x i64>, array<2 x i64>)>"
X = np.arange(12, dtype=np.float32).reshape(3, 4) - 5


@covers("builtin.unrealized_conversion_cast", "llvm.insertvalue", "memref.load")
def test_struct_to_memref_and_back():
    """A descriptor built field by field (a transposed (4, 3) view of a (3, 4)
    buffer, offset 0) reads as that view; cast back, its fields are the same."""
    got = run(f"""
      %c0 = llvm.mlir.constant(0 : i64) : i64
      %c1 = llvm.mlir.constant(1 : i64) : i64
      %c3 = llvm.mlir.constant(3 : i64) : i64
      %c4 = llvm.mlir.constant(4 : i64) : i64
      %u = llvm.mlir.undef : {DESC}
      %d0 = llvm.insertvalue %p, %u[0] : {DESC}
      %d1 = llvm.insertvalue %p, %d0[1] : {DESC}
      %d2 = llvm.insertvalue %c0, %d1[2] : {DESC}
      %d3 = llvm.insertvalue %c4, %d2[3, 0] : {DESC}
      %d4 = llvm.insertvalue %c3, %d3[3, 1] : {DESC}
      %d5 = llvm.insertvalue %c1, %d4[4, 0] : {DESC}
      %d6 = llvm.insertvalue %c4, %d5[4, 1] : {DESC}
      %m = builtin.unrealized_conversion_cast %d6 : {DESC} to memref<4x3xf32, strided<[1, 4]>>
      %i = arith.constant 3 : index
      %j = arith.constant 2 : index
      %v = memref.load %m[%i, %j] : memref<4x3xf32, strided<[1, 4]>>
      %back = builtin.unrealized_conversion_cast %m : memref<4x3xf32, strided<[1, 4]>> to {DESC}
      %stride = llvm.extractvalue %back[4, 1] : {DESC}""",
              {"p": ("!llvm.ptr", X)}, {"v": "f32", "stride": "i64"})
    assert got["v"] == X.T[3, 2] and got["stride"] == 4


@covers("builtin.unrealized_conversion_cast", "vector.load")
def test_pointer_and_memref_casts():
    got = run("""
      %m = builtin.unrealized_conversion_cast %p : !llvm.ptr to memref<3x4xf32>
      %c1 = arith.constant 1 : index
      %c0 = arith.constant 0 : index
      %row = vector.load %m[%c1, %c0] : memref<3x4xf32>, vector<4xf32>
      %s = memref.subview %m[1, 1] [2, 2] [1, 1] : memref<3x4xf32> to memref<2x2xf32, strided<[4, 1], offset: 5>>
      %q = builtin.unrealized_conversion_cast %s : memref<2x2xf32, strided<[4, 1], offset: 5>> to !llvm.ptr
      %v = llvm.load %q : !llvm.ptr -> f32
      %i = builtin.unrealized_conversion_cast %m : memref<3x4xf32> to memref<3x4xi32>
      %bits = memref.load %i[%c1, %c0] : memref<3x4xi32>
      %tok = builtin.unrealized_conversion_cast %p : !llvm.ptr to !gpu.async.token""",  # noqa: E501 -- MLIR text, one op a line
              {"p": ("!llvm.ptr", X)}, {"row": "vector<4xf32>", "v": "f32", "bits": "i32"})
    assert_same_bits(got["row"], X[1])
    assert got["v"] == X[1, 1]  # the subview's offset, in bytes, is in the pointer
    assert got["bits"] == X[1, 0].view(np.int32)


@covers("builtin.unrealized_conversion_cast")
def test_a_warpgroup_vector_is_only_its_registers():
    """Registers cast to a Warpgroup-level vector come back as they were; a
    reshaping memref cast (a Warpgroup-level view) cannot be read."""
    a = np.arange(32 * 2, dtype=np.float32).reshape(32, 2)
    got = run("""
      %big = builtin.unrealized_conversion_cast %a, %b : vector<2xf32>, vector<2xf32> to vector<64x2xf32> {layout = #mosaic_gpu.WGStridedFragLayout<[64, 2], 2>}
      %x, %y = builtin.unrealized_conversion_cast %big : vector<64x2xf32> to vector<2xf32>, vector<2xf32>
      %s = builtin.unrealized_conversion_cast %c : f32 to vector<64x2xf32> {layout = #mosaic_gpu.WGSplatFragLayout<[64, 2]>}
      %z = builtin.unrealized_conversion_cast %s : vector<64x2xf32> to f32""",  # noqa: E501 -- MLIR text, one op a line
              {"a": ("vector<2xf32>", a), "b": ("vector<2xf32>", -a), "c": ("f32", 7.0)},
              {"x": "vector<2xf32>", "y": "vector<2xf32>", "z": "f32"})
    assert_same_bits(got["x"], a)
    assert_same_bits(got["y"], -a)
    assert got["z"] == 7.0
    with pytest.raises(Unsupported, match="of a value not built from them"):
        run("""
          %big = arith.constant dense<1.0> : vector<64x2xf32>
          %x, %y = builtin.unrealized_conversion_cast %big : vector<64x2xf32> to vector<2xf32>, vector<2xf32>""")  # noqa: E501 -- MLIR text, one op a line


@covers("builtin.unrealized_conversion_cast", "llvm.load")
def test_a_parameter_block_gets_an_address():
    raw = np.arange(16, dtype=np.uint8)
    got = run("""
      %arr = llvm.load %p : !llvm.ptr -> !llvm.array<16 x i8>
      %q = builtin.unrealized_conversion_cast %arr : !llvm.array<16 x i8> to !llvm.ptr
      %v = llvm.load %q : !llvm.ptr -> i32""", {"p": ("!llvm.ptr", raw)}, {"v": "i32"}, host=True)
    assert got["v"] == raw[:4].view(np.int32)[0]


INIT = ("func.func private @mosaic_gpu_init_tma_desc(!llvm.ptr, !llvm.ptr, i64, i64, !llvm.ptr, "
        "!llvm.ptr, i64, !llvm.ptr)")


def init_tma_desc(desc: str = "%desc", base: str = "%x", dtype_code: int = 6,
                  swizzle: int = 16, rank: int = 2) -> str:
    """MLIR calling the runtime's TMA descriptor setup for a tensor of
    ``rank`` (default: (rows, cols)) and box given as the ``%sizes``,
    ``%strides``, ``%box`` buffers."""
    return f"""
      %code = llvm.mlir.constant({dtype_code} : i64) : i64
      %tma_rank = llvm.mlir.constant({rank} : i64) : i64
      %swz = llvm.mlir.constant({swizzle} : i64) : i64
      func.call @mosaic_gpu_init_tma_desc({desc}, {base}, %code, %tma_rank, %sizes, %strides, %swz, %box) : (!llvm.ptr, !llvm.ptr, i64, i64, !llvm.ptr, !llvm.ptr, i64, !llvm.ptr) -> ()"""  # noqa: E501 -- MLIR text, one op a line


def tma_inputs(x: np.ndarray, box: tuple[int, ...]) -> dict:
    """The buffers :func:`init_tma_desc` reads, for a row-major ``x``."""
    strides = np.cumprod((x.shape[1:] + (1,))[::-1])[::-1]  # in elements, outermost first
    return {"desc": ("!llvm.ptr", np.zeros(128, np.uint8)), "x": ("!llvm.ptr", x),
            "sizes": ("!llvm.ptr", np.array(x.shape, np.int64)),
            "strides": ("!llvm.ptr", np.array(strides, np.int64)),
            "box": ("!llvm.ptr", np.array(box, np.int64))}


@covers("func.call")
def test_init_tma_desc_tags_the_descriptor():
    x = np.zeros((8, 16), np.float32)
    got = run(init_tma_desc(), tma_inputs(x, (4, 8)), host=True, prelude=INIT)
    assert got["desc"][:16].view(np.int64).tolist() == [TMA_MAGIC, 1]


@covers("func.call")
def test_other_calls_and_a_call_inside_the_kernel_are_unsupported():
    x = np.zeros((8, 16), np.float32)
    with pytest.raises(Unsupported, match="mosaic_gpu_init_tma_desc inside the kernel"):
        run(init_tma_desc(), tma_inputs(x, (4, 8)), prelude=INIT)
    with pytest.raises(Unsupported, match="func.call @other"):
        run("func.call @other() : () -> ()", prelude="func.func private @other()")
