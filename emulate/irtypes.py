"""MLIR types as the emulator sees them: numpy dtypes, vector shapes, memory
spaces, byte sizes. Parsed once per distinct type (cached by its text)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache

import ml_dtypes
import numpy as np

from .errors import Unsupported

SCALARS: dict[str, np.dtype] = {
    "i1": np.dtype(np.bool_), "i8": np.dtype(np.int8), "i16": np.dtype(np.int16),
    "i32": np.dtype(np.int32), "i64": np.dtype(np.int64), "index": np.dtype(np.int64),
    "f16": np.dtype(np.float16), "bf16": np.dtype(ml_dtypes.bfloat16),
    "f32": np.dtype(np.float32), "f64": np.dtype(np.float64),
    "f8E4M3FN": np.dtype(ml_dtypes.float8_e4m3fn), "f8E5M2": np.dtype(ml_dtypes.float8_e5m2),
    "f8E8M0FNU": np.dtype(ml_dtypes.float8_e8m0fnu),
    # FNUZ: no infinities, no negative zero; 0x80 (the sign bit alone) is the one NaN
    "f8E5M2FNUZ": np.dtype(ml_dtypes.float8_e5m2fnuz),
    "f8E4M3FNUZ": np.dtype(ml_dtypes.float8_e4m3fnuz),
    "f8E4M3B11FNUZ": np.dtype(ml_dtypes.float8_e4m3b11fnuz),
    "i4": np.dtype(ml_dtypes.int4), "f4E2M1FN": np.dtype(ml_dtypes.float4_e2m1fn),
    "i2": np.dtype(ml_dtypes.int2),
    "!mosaic_gpu.barrier": np.dtype(np.int64),  # an mbarrier is 8 bytes of SMEM
}
BITS = {"i1": 1, "i2": 2, "i4": 4, "f4E2M1FN": 4}
# a memref/pointer element that is itself a vector (vector<2xi4>: one byte) is
# held in memory as the unsigned integer of its width; loads and stores unpack it
PACKED_VECTOR: dict[int, np.dtype] = {8: np.dtype(np.uint8), 16: np.dtype(np.uint16),
                                      32: np.dtype(np.uint32), 64: np.dtype(np.uint64)}
UNSIGNED = {1: np.bool_, 8: np.uint8, 16: np.uint16, 32: np.uint32, 64: np.uint64}
SIGNED = {1: np.bool_, 8: np.int8, 16: np.int16, 32: np.int32, 64: np.int64}


@dataclass(frozen=True)
class T:
    """One MLIR type. ``kind`` is one of scalar, vector, memref, ptr, struct,
    array, token, none, other."""

    text: str
    kind: str
    dtype: np.dtype | None = None  # element dtype (scalar, vector, memref)
    elem: str = ""  # element type text
    shape: tuple[int, ...] = ()  # vector / memref shape (-1 for dynamic)
    space: str = "global"  # memref / ptr: 'global', 'shared', 'cluster' (shared::cluster)

    @property
    def bits(self) -> int:
        if self.elem in BITS:
            return BITS[self.elem]
        return 0 if self.dtype is None else self.dtype.itemsize * 8

    @property
    def is_float(self) -> bool:
        return self.dtype is not None and self.dtype.kind in "fV" and self.elem[0] in "fb"

    @property
    def packed_vector(self) -> T | None:
        """For a memref of vector elements (``memref<4xvector<2xi4>>``), the
        element's vector type; else None."""
        return parse(self.elem) if self.elem.startswith("vector<") else None

    @property
    def vrank(self) -> int:
        return len(self.shape) if self.kind == "vector" else 0


def _space(text: str) -> str:
    if "workgroup" in text or "ptr<3>" in text or re.search(r", 3 ?>", text):
        return "shared"
    if "tensor_memory" in text or "ptr<6>" in text or "mosaic_gpu.tmem" in text:
        return "tmem"
    if "ptr<7>" in text or re.search(r", 7( : i\d+)? ?>$", text):
        return "cluster"  # shared::cluster
    m = re.search(r"ptr<(\d+)>", text)
    if m and m.group(1) not in ("0", "1", "4", "5"):
        return "addrspace" + m.group(1)
    return "global"


def _elem(text: str) -> tuple[str, np.dtype]:
    if text.startswith("!mosaic_gpu.barrier<"):  # orders_tensor_core: still an mbarrier
        text = "!mosaic_gpu.barrier"
    if text.startswith("vector<"):
        return text, _packed_vector_storage(text)
    if text not in SCALARS:
        raise Unsupported(f"element type {text}")
    return text, SCALARS[text]


def _packed_vector_storage(text: str) -> np.dtype:
    """The unsigned integer holding a vector element (LLVM stores a vector
    bit-packed, element 0 in the lowest bits)."""
    v = parse(text)
    width = int(np.prod(v.shape)) * v.bits
    if v.vrank != 1 or v.dtype == np.bool_ or width not in PACKED_VECTOR:
        raise Unsupported(f"element type {text} (a vector element is modelled when it is "
                          "1-D, not of i1, and 8, 16, 32 or 64 bits wide)")
    return PACKED_VECTOR[width]


def _dims_and_elem(body: str) -> list[str]:
    """``4x?x8xindex`` -> ["4", "?", "8", "index"] (an element type may hold
    an "x" itself: index, f8E4M3FN...)."""
    m = re.fullmatch(r"((?:(?:\d+|\?|\[\d+\])x)*)(.+)", body)
    dims = m.group(1).split("x")[:-1] if m else []
    return [*dims, m.group(2) if m else body]


@cache
def parse(text: str) -> T:
    if text in SCALARS:
        return T(text, "scalar", SCALARS[text], text)
    if text.startswith("vector<"):
        body = text[len("vector<"):-1]
        *dims, el = _dims_and_elem(body)
        if any(not d.isdigit() for d in dims):
            raise Unsupported(f"vector type {text} (scalable or 0-d)")
        e, dt = _elem(el)
        return T(text, "vector", dt, e, tuple(int(d) for d in dims))
    if text.startswith("memref<"):
        body = text[len("memref<"):-1]
        head = re.split(r", (?=strided|affine|#|\d+ ?>|\d+$|\d+ : i\d+$)", body)[0]
        *dims, el = _dims_and_elem(head)
        e, dt = _elem(el)
        return T(text, "memref", dt, e, tuple(-1 if d == "?" else int(d) for d in dims),
                 _space(text))
    if text.startswith("!llvm.ptr"):
        return T(text, "ptr", np.dtype(np.int64), space=_space(text))
    if text.startswith("!llvm.struct"):
        return T(text, "struct")
    if text.startswith("!llvm.array"):
        return T(text, "array")
    if text == "!gpu.async.token":
        return T(text, "token")
    if text == "!llvm.void" or text == "none":
        return T(text, "none")
    return T(text, "other")


def of(value_or_type) -> T:
    t = getattr(value_or_type, "type", value_or_type)
    return parse(str(t))


def unsigned(x: np.ndarray) -> np.ndarray:
    """The same bits, read as unsigned."""
    x = np.asarray(x)
    if x.dtype == np.bool_:
        return x
    return x.view(UNSIGNED[x.dtype.itemsize * 8])


def byte_size(text: str) -> int:
    """The size in bytes of an LLVM/builtin type as GEP and alloca use it."""
    if text in SCALARS:
        return max(1, SCALARS[text].itemsize) if text != "i1" else 1
    if text.startswith("!llvm.ptr"):
        return 8
    m = re.fullmatch(r"!llvm\.array<(\d+) x (.+)>", text)
    if m:
        return int(m.group(1)) * byte_size(m.group(2))
    if text.startswith("vector<"):  # packed, as LLVM stores vectors: whole bytes
        t = parse(text)
        return max(1, -(-int(np.prod(t.shape)) * t.bits // 8))
    raise Unsupported(f"size of type {text}")
