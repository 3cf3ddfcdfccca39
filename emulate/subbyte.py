"""Sub-byte element types (``i4``, ``i2``, ``f4E2M1FN``) packed in memory as
the GPU packs them.

A register holds one element per numpy item (ml_dtypes ``int4``/``uint4``/
``int2``/``uint2``/``float4_e2m1fn``: the element's bits in the low bits of a
byte). Memory holds them bit-packed: element ``i`` of a buffer occupies bits
``[i b, (i + 1) b)`` counted from bit 0 of byte 0, little-endian within the
byte (element 0 in the low nibble): jax's packed ``int4`` arrays, the
pointers ``utils.memref_ptr`` computes (``offset * bits / 8``), ``!llvm.ptr``
loads and stores of ``vector<Nxi4>`` (LLVM's vectors are bit-packed; a store
must fill whole bytes) and TMA. (Indexed memref/vector accesses of sub-byte
elements are not: MLIR's lowering puts those a byte apart, which jax avoids;
the emulator refuses them.) Accesses here take *bit* addresses (byte address
times 8 plus the element's bit offset); they touch the bytes that hold the
elements, reading and rewriting only the element's own bits.

The synchronization checker sees such an access as one of the bytes holding
the elements (a byte is the smallest unit a store can write)."""

from __future__ import annotations

import ml_dtypes
import numpy as np

from .errors import EmulationError

BITS: dict[np.dtype, int] = {
    np.dtype(ml_dtypes.int4): 4, np.dtype(ml_dtypes.uint4): 4,
    np.dtype(ml_dtypes.float4_e2m1fn): 4,
    np.dtype(ml_dtypes.int2): 2, np.dtype(ml_dtypes.uint2): 2,
}


def bits_of(dtype) -> int:
    """The element's width in bits if it is packed below a byte, else 0."""
    return BITS.get(np.dtype(dtype), 0)


def raw(values, dtype: np.dtype) -> np.ndarray:
    """The elements' bits, as uint8 (low bits)."""
    b = bits_of(dtype)
    return np.asarray(values, dtype).view(np.uint8) & np.uint8((1 << b) - 1)


def cook(bits: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Elements of ``dtype`` from their bits."""
    b = bits_of(dtype)
    return (np.asarray(bits, np.uint8) & np.uint8((1 << b) - 1)).view(dtype)


def pack(arr: np.ndarray) -> np.ndarray:
    """A sub-byte array's bytes as the GPU lays it out (row-major, packed)."""
    b = bits_of(arr.dtype)
    per = 8 // b
    flat = raw(np.ascontiguousarray(arr).reshape(-1), arr.dtype).astype(np.uint8)
    pad = (-flat.size) % per
    flat = np.concatenate([flat, np.zeros(pad, np.uint8)]).reshape(-1, per)
    shifts = (np.arange(per, dtype=np.uint8) * b).astype(np.uint8)
    return np.bitwise_or.reduce(flat << shifts, axis=1).astype(np.uint8)


def unpack(data: np.ndarray, dtype: np.dtype, shape: tuple) -> np.ndarray:
    """The inverse of :func:`pack`."""
    b = bits_of(dtype)
    per = 8 // b
    n = int(np.prod(shape, dtype=np.int64))
    shifts = (np.arange(per, dtype=np.uint8) * b).astype(np.uint8)
    bits = (np.asarray(data, np.uint8)[:, None] >> shifts).reshape(-1)[:n]
    return cook(bits, dtype).reshape(shape)


def nbytes(shape, dtype) -> int:
    n = int(np.prod(shape, dtype=np.int64))
    return -(-n * bits_of(dtype) // 8)


def byte_offset(offset, dtype, where: str):
    """The byte offset of element ``offset`` (a sub-byte element must start
    a byte for a pointer to address it)."""
    b = bits_of(dtype)
    if not b:
        return np.asarray(offset, np.int64) * np.dtype(dtype).itemsize
    bit = np.asarray(offset, np.int64) * b
    if np.any(bit % 8):
        raise EmulationError(f"a pointer to element {offset} of a {b}-bit array, which does not "
                             f"start a byte, at {where}")
    return bit >> 3


def bit_addresses(byte_addr, elem_index, dtype) -> np.ndarray:
    """Bit addresses of elements ``elem_index`` of an array at ``byte_addr``."""
    return (np.asarray(byte_addr, np.int64) * 8
            + np.asarray(elem_index, np.int64) * bits_of(dtype))


def _active(bit_addrs, mask):
    a = np.asarray(bit_addrs, np.int64)
    if mask is None or a.ndim == 0:
        return a, None
    from .memory import _full_mask

    m = _full_mask(mask, a.shape)
    return a, m


def _aligned(a: np.ndarray, b: int, where: str) -> None:
    if np.any(a % b):
        raise EmulationError(f"sub-byte access not at a multiple of its {b} bits at {where}")


def load(space, bit_addrs, dtype: np.dtype, mask=None, where: str = "") -> np.ndarray:
    """Elements of ``dtype`` at ``bit_addrs`` of ``space`` (a memory space:
    ``load(byte_addrs, uint8, mask, where)``)."""
    b = bits_of(dtype)
    a, m = _active(bit_addrs, mask)
    _aligned(a if m is None else a[m], b, where)
    byte = space.load(a >> 3, np.dtype(np.uint8), m, where)
    return cook(np.right_shift(byte, (a & 7).astype(np.uint8)), dtype)


def store(space, bit_addrs, values, dtype: np.dtype, mask=None, where: str = "") -> None:
    """Writes the elements' bits into the bytes holding them, leaving the
    other bits of each byte as they were. Where several active threads store
    the same element the last one's value stays."""
    from .memory import per_thread

    b = bits_of(dtype)
    a, v = per_thread(bit_addrs, values, dtype)
    v = np.broadcast_to(v, a.shape)
    if mask is not None and a.ndim:
        from .memory import _full_mask

        m = _full_mask(mask, a.shape)
        a, v = a[m], v[m]
    a, v = a.reshape(-1), raw(v.reshape(-1), dtype)
    if a.size == 0:
        return
    _aligned(a, b, where)
    # the last write of each element (numpy's order, as among full-byte stores)
    _, rev_i = np.unique(a[::-1], return_index=True)
    keep = a.size - 1 - rev_i
    a, v = a[keep], v[keep]
    byte_addr = a >> 3
    shift = (a & 7).astype(np.uint8)
    ubytes, inv = np.unique(byte_addr, return_inverse=True)
    cur = space.load(ubytes, np.dtype(np.uint8), None, where).astype(np.uint8)
    clear = np.full(ubytes.size, 0xFF, np.uint8)
    np.bitwise_and.at(clear, inv, ~(np.uint8((1 << b) - 1) << shift))
    setb = np.zeros(ubytes.size, np.uint8)
    np.bitwise_or.at(setb, inv, (v << shift).astype(np.uint8))
    space.store(ubytes, (cur & clear) | setb, np.dtype(np.uint8), None, where)


def written_bytes(bit_addrs) -> np.ndarray:
    """The byte address of each element (for the checker)."""
    return np.asarray(bit_addrs, np.int64) >> 3


def to_bytes(x: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """The bytes of vectors ``x`` (last axis) as the GPU holds them in a
    register: element 0 in the lowest bits."""
    x = np.ascontiguousarray(np.asarray(x, dtype))
    b = bits_of(dtype)
    if not b:
        return x.view(np.uint8)
    per = 8 // b
    bits = raw(x, dtype).reshape(x.shape[:-1] + (x.shape[-1] // per, per))
    shifts = (np.arange(per, dtype=np.uint8) * b).astype(np.uint8)
    return np.bitwise_or.reduce(bits << shifts, axis=-1).astype(np.uint8)


def from_bytes(data: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """The inverse of :func:`to_bytes`."""
    data = np.ascontiguousarray(data, np.uint8)
    b = bits_of(dtype)
    if not b:
        return data.view(dtype)
    per = 8 // b
    shifts = (np.arange(per, dtype=np.uint8) * b).astype(np.uint8)
    bits = (data[..., None] >> shifts).reshape(data.shape[:-1] + (data.shape[-1] * per,))
    return cook(bits, dtype)
