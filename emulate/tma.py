"""TMA bulk tensor copies, executed when issued.

A descriptor (:class:`.machine.TmaDescriptor`) describes a row-major global
tensor (sizes, element strides) and a box (``window``). A copy moves the box
whose first element sits at the given coordinates (PTX order: innermost
first). SMEM holds the box densely in row-major order, each byte address
passed through the descriptor's swizzle (:func:`.memory.swizzle`). Loads fill
elements outside the tensor with zeros and count the whole box toward the
mbarrier's transaction bytes; stores skip them."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from .errors import EmulationError, Unsupported
from .machine import TMA_MAGIC, Frame, TmaDescriptor
from .memory import swizzle


def descriptor(fr: Frame, ptr: int, where: str) -> TmaDescriptor:
    raw = fr.mem["global"].read_bytes(int(ptr), 16, where).view(np.int64)
    if int(raw[0]) != TMA_MAGIC or int(raw[1]) not in fr.launch.tma:
        raise EmulationError(
            f"TMA copy through {int(ptr):#x}, which holds no tensor map, at {where}")
    return fr.launch.tma[int(raw[1])]


def _box(desc: TmaDescriptor, coords_innermost_first: list[int]):
    """The global byte address of each element of the box at the given
    coordinates (row-major), and which are inside the tensor: None when all
    are (the common case, which needs no mask)."""
    rank = len(desc.sizes)
    if len(coords_innermost_first) != rank:
        raise Unsupported(f"TMA copy with {len(coords_innermost_first)} coordinates for a "
                          f"rank-{rank} tensor map")
    coords_innermost_first = list(coords_innermost_first)
    if desc.per_byte > 1:  # packed sub-byte elements: the map is in bytes
        if coords_innermost_first[0] % desc.per_byte:
            raise Unsupported(f"TMA copy of packed {8 // desc.per_byte}-bit elements at innermost "
                              f"coordinate {coords_innermost_first[0]}, inside a byte")
        coords_innermost_first[0] //= desc.per_byte
    start = [int(c) for c in reversed(coords_innermost_first)]
    it = desc.dtype.itemsize
    first = desc.base + sum(s * c for s, c in zip(desc.strides, start)) * it
    gaddr = first + _box_offsets(desc.strides, desc.window, it)
    if all(0 <= c and c + w <= n for c, w, n in zip(start, desc.window, desc.sizes)):
        return gaddr, None
    inside = np.ones((), bool)  # per dimension, combined as the offsets are
    for c, w, n in zip(start, desc.window, desc.sizes):
        r = c + np.arange(w)
        inside = inside[..., None] & ((r >= 0) & (r < n))
    return gaddr, inside.reshape(-1)


@functools.lru_cache(maxsize=64)
def _box_offsets(strides: tuple[int, ...], window: tuple[int, ...], itemsize: int) -> np.ndarray:
    """Byte offsets of a box's elements from its first, row-major: an outer
    sum of each dimension's (read-only: kept for every copy of this shape)."""
    off: np.ndarray = np.zeros((), np.int64)
    for stride, w in zip(strides, window):
        off = off[..., None] + np.arange(w, dtype=np.int64) * (stride * itemsize)
    off = off.reshape(-1)
    off.setflags(write=False)
    return off


def _smem_addresses(desc: TmaDescriptor, smem: int) -> np.ndarray:
    it = desc.dtype.itemsize
    if desc.swizzle not in (0, 16):
        row = desc.window[-1] * it
        if row != desc.swizzle:
            raise Unsupported(f"TMA box rows of {row} bytes under a {desc.swizzle}-byte swizzle")
    return _dense_smem(smem, int(np.prod(desc.window)), it, desc.swizzle)


@functools.lru_cache(maxsize=256)
def _dense_smem(smem: int, n: int, itemsize: int, swizzle_bytes: int) -> np.ndarray:
    """The SMEM byte addresses of ``n`` elements held densely from ``smem``
    through the swizzle (read-only: kept, as a kernel copies to the same
    buffers launch after launch)."""
    addrs = swizzle(smem + np.arange(n, dtype=np.int64) * itemsize, swizzle_bytes)
    addrs.setflags(write=False)
    return addrs


Check = Callable[[Any, np.ndarray, int, bool], None] | None
"""The synchronization checker's hook: ``check(space, element addresses,
itemsize, is_write)`` for each side of a transfer (None: checker off)."""


def load(fr: Frame, desc: TmaDescriptor, smem: int, coords: list[int], where: str,
         smem_space=None, check: Check = None) -> int:
    """Global -> SMEM (this block's, or ``smem_space``: a multicast
    destination); returns the bytes transferred (for complete_tx)."""
    gaddr, inside = _box(desc, coords)
    it = desc.dtype.itemsize
    if inside is None:
        vals = fr.mem["global"].load(gaddr, desc.dtype, None, where)
    else:
        vals = np.zeros(gaddr.shape, desc.dtype)
        if inside.any():
            vals[inside] = fr.mem["global"].load(gaddr[inside], desc.dtype, None, where)
        gaddr = gaddr[inside]
    space = fr.mem["shared"] if smem_space is None else smem_space
    saddr = _smem_addresses(desc, smem)
    space.store(saddr, vals, desc.dtype, None, where)
    if check is not None:
        check(fr.mem["global"], gaddr, it, False)
        check(space, saddr, it, True)
    if fr.prof is not None:
        fr.prof.tma(where, vals.size * it, store=False)
    return vals.size * it


def store(fr: Frame, desc: TmaDescriptor, smem: int, coords: list[int], where: str,
          check: Check = None) -> None:
    """SMEM -> global; elements outside the tensor are not written."""
    gaddr, saddr, vals = _outgoing(fr, desc, smem, coords, where)
    if gaddr.size:
        fr.mem["global"].store(gaddr, vals, desc.dtype, None, where)
    if check is not None:
        check(fr.mem["shared"], saddr, desc.dtype.itemsize, False)
        check(fr.mem["global"], gaddr, desc.dtype.itemsize, True)
    if fr.prof is not None:
        fr.prof.tma(where, gaddr.size * desc.dtype.itemsize, store=True)


def _outgoing(fr: Frame, desc: TmaDescriptor, smem: int, coords: list[int], where: str):
    """An SMEM -> global copy's global addresses inside the tensor, the SMEM
    addresses of the whole box, and the SMEM values bound for the former."""
    gaddr, inside = _box(desc, coords)
    saddr = _smem_addresses(desc, smem)
    vals = fr.mem["shared"].load(saddr, desc.dtype, None, where)
    if inside is not None:
        gaddr, vals = gaddr[inside], vals[inside]
    return gaddr, saddr, vals


def reduce(fr: Frame, desc: TmaDescriptor, smem: int, coords: list[int], fn, dt: np.dtype,
           where: str, check: Check = None) -> None:
    """SMEM -> global, combining: each element of the box inside the tensor
    becomes ``fn(global, smem)`` in ``dt`` (a TMA reduction: atomic per
    element, a write of GMEM to the checker that races with no other atomic)."""
    gaddr, saddr, vals = _outgoing(fr, desc, smem, coords, where)
    vals = vals.view(dt)
    if gaddr.size:
        glob = fr.mem["global"]
        with np.errstate(over="ignore"):
            glob.store(gaddr, np.asarray(fn(glob.load(gaddr, dt, None, where), vals), dt), dt,
                       None, where)
    if check is not None:
        check(fr.mem["shared"], saddr, desc.dtype.itemsize, False)
        check(fr.mem["global"], gaddr, desc.dtype.itemsize, True, atomic=True)


def _gather4_box(desc: TmaDescriptor, col: int, rows, where: str):
    """The (4, w) elements a ``tile::gather4``/``scatter4`` moves: four rows
    (any row coordinates) of a rank-2 tensor map whose box is (1, w), each
    starting at column ``col``."""
    if desc.per_byte > 1:
        raise Unsupported(f"tile::gather4/scatter4 of packed {8 // desc.per_byte}-bit elements")
    if len(desc.sizes) != 2 or desc.window[0] != 1:
        raise Unsupported(f"tile::gather4/scatter4 through a tensor map of box {desc.window} "
                          "(a rank-2 map with a (1, w) box is modelled)", where)
    w = desc.window[1]
    r = np.asarray(rows, np.int64).reshape(4, 1)
    c = int(col) + np.arange(w, dtype=np.int64).reshape(1, w)
    inside = (r >= 0) & (r < desc.sizes[0]) & (c >= 0) & (c < desc.sizes[1])
    gaddr = desc.base + (r * desc.strides[0] + c * desc.strides[1]) * desc.dtype.itemsize
    return gaddr.reshape(-1), inside.reshape(-1)


def _gather4_smem(desc: TmaDescriptor, smem: int, where: str) -> np.ndarray:
    """SMEM holds the four rows densely, one after the other (each ``w``
    elements), through the swizzle as a box of 4 rows would be."""
    w, it = desc.window[1], desc.dtype.itemsize
    if desc.swizzle not in (0, 16) and w * it != desc.swizzle:
        raise Unsupported(f"tile::gather4 rows of {w * it} bytes under a {desc.swizzle}-byte "
                          "swizzle", where)
    return _dense_smem(smem, 4 * w, it, desc.swizzle)


def gather4(fr: Frame, desc: TmaDescriptor, smem: int, col: int, rows, where: str,
            check: Check = None) -> int:
    """Global -> SMEM, four gathered rows; returns the bytes transferred.
    Elements outside the tensor read as zero (and still count)."""
    gaddr, inside = _gather4_box(desc, col, rows, where)
    vals = np.zeros(gaddr.shape, desc.dtype)
    if inside.any():
        vals[inside] = fr.mem["global"].load(gaddr[inside], desc.dtype, None, where)
    saddr = _gather4_smem(desc, smem, where)
    fr.mem["shared"].store(saddr, vals, desc.dtype, None, where)
    if check is not None:
        check(fr.mem["global"], gaddr[inside], desc.dtype.itemsize, False)
        check(fr.mem["shared"], saddr, desc.dtype.itemsize, True)
    if fr.prof is not None:
        fr.prof.tma(where, vals.size * desc.dtype.itemsize, store=False)
    return vals.size * desc.dtype.itemsize


def scatter4(fr: Frame, desc: TmaDescriptor, smem: int, col: int, rows, where: str,
             check: Check = None) -> None:
    """SMEM -> global, four scattered rows; elements outside are not written."""
    gaddr, inside = _gather4_box(desc, col, rows, where)
    saddr = _gather4_smem(desc, smem, where)
    vals = fr.mem["shared"].load(saddr, desc.dtype, None, where)
    if inside.any():
        fr.mem["global"].store(gaddr[inside], vals[inside], desc.dtype, None, where)
    if check is not None:
        check(fr.mem["shared"], saddr, desc.dtype.itemsize, False)
        check(fr.mem["global"], gaddr[inside], desc.dtype.itemsize, True)
    if fr.prof is not None:
        fr.prof.tma(where, int(inside.sum()) * desc.dtype.itemsize, store=True)
