"""``memref``: descriptors (:class:`..values.MemRef`) and element accesses.
View-like ops (subview, expand/collapse_shape, transpose, reinterpret_cast,
view, cast) only compute a new descriptor, as MLIR's own lowering to LLVM
does; ``load``/``store``/``atomic_rmw`` touch memory."""

from __future__ import annotations

import functools
import re

import numpy as np

from .. import generic, irtypes, subbyte
from ..compiler import Op, Step, rule
from ..errors import Unsupported
from ..machine import Frame
from ..values import MemRef

DYNAMIC = -9223372036854775808


def memref_of(fr: Frame, slot: int) -> MemRef:
    m = fr.regs[slot]
    if not isinstance(m, MemRef):
        raise Unsupported(f"memref value of kind {type(m).__name__}")
    return m


def element_addresses(m: MemRef, idx: list, vshape: tuple = ()) -> np.ndarray:
    """Byte addresses of element ``idx`` (plus a vector's trailing extent)."""
    off = m.offset
    for i, s in zip(idx, m.strides):
        off = off + np.asarray(i, np.int64) * s
    addr = np.asarray(m.aligned, np.int64) + np.asarray(off, np.int64) * m.itemsize
    if vshape:
        k = len(vshape)
        strides = m.strides[-k:]
        if all(np.ndim(s) == 0 for s in strides):  # the usual static strides: made once
            grid = _vector_offsets(vshape, tuple(int(s) for s in strides), m.itemsize)
        else:
            grid = _vector_offsets.__wrapped__(vshape, strides, m.itemsize)
        addr = plus_offsets(addr, grid)
    return addr


def plus_offsets(addr: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """``addr + offsets`` for every address and offset: shape ``addr.shape +
    offsets.shape`` (int64). A vector's offsets are few (2 to 8): numpy's
    broadcast add then runs a short inner loop per address (about 5 ns
    each), where one add over all the addresses per offset costs about 1 ns
    an element and 1 us a call -- which this does where that is faster (on
    this machine: 512 addresses or more per offset, at most 8 offsets)."""
    addr = np.asarray(addr, np.int64)
    flat = offsets.reshape(-1)
    if addr.size < 512 * flat.size or flat.size > 8:
        return addr.reshape(addr.shape + (1,) * offsets.ndim) + offsets
    out = np.empty(addr.shape + offsets.shape, np.int64)
    columns = out.reshape(addr.shape + (flat.size,))
    for j, d in enumerate(flat.tolist()):
        np.add(addr, d, out=columns[..., j])
    return out


@functools.cache
def _vector_offsets(vshape: tuple, strides: tuple, itemsize: int) -> np.ndarray:
    """Byte offsets of a vector's elements from its first (cached for static
    strides: every vector access of a kernel asks again)."""
    grid = np.zeros(vshape, np.int64)
    for d, (n, s) in enumerate(zip(vshape, strides)):
        shape = [1] * len(vshape)
        shape[d] = n
        grid = grid + np.arange(n, dtype=np.int64).reshape(shape) * s
    grid = grid * itemsize
    grid.flags.writeable = False
    return grid


def access(fr: Frame, m: MemRef, addrs, vrank: int, site, loc: str, values=None):
    """Loads (``values`` None) or stores the elements at ``addrs`` (from
    :func:`element_addresses`) of ``m``'s space -- a generic memref's in the
    space each address's window maps to (:func:`..generic.spaces`) -- and
    tells the profiler and the checker.

    Elements of a sub-byte type are not reached this way: MLIR's lowering of
    memref/vector accesses to LLVM addresses ``i4`` elements one *byte* apart
    (LLVM's size of ``i4``) while the data is packed, so jax loads and stores
    them through pointers (``llvm.load`` of ``vector<Nxi4>``, modelled in
    :mod:`..subbyte`) -- an indexed access is :class:`Unsupported`, not guessed."""
    if subbyte.bits_of(m.dtype):
        raise Unsupported(f"{site.op} of a memref of {m.dtype} elements (MLIR's lowering "
                          "addresses sub-byte elements a byte apart over packed data; load "
                          "and store them through pointers, as jax does)", loc)
    return access_space(fr, m.space, m.dtype, addrs, vrank, site, loc, values)


def access_space(fr: Frame, space_name: str, dt: np.dtype, addrs, vrank: int, site, loc: str,
                 values=None):
    """:func:`access` of elements of ``dt`` in space ``space_name`` (also
    ``llvm.load``/``llvm.store``'s)."""
    out = None
    for name, a, mask in generic.spaces(fr, space_name, addrs, vrank, loc, site.op):
        space = fr.mem[name]
        overwritten = None
        if values is None:
            out = generic.merge(out, space.load(a, dt, mask, loc), mask)
        else:  # the checker tells an unordered write of equal bytes: it needs the old ones
            overwritten = space.store(a, values, dt, mask, loc, keep_old=fr.sync is not None)
        if fr.prof is not None:
            fr.prof.access(fr, name, a, vrank, dt.itemsize, values is not None, site, mask=mask)
        if fr.sync is not None:
            written = None if values is None else np.asarray(values, dt)
            fr.sync.thread_access(fr, name, a, vrank, dt.itemsize, values is not None, site,
                                  mask=mask, values=written, overwritten=overwritten)
    return None if values is not None else out


def _mixed(o: Op, static_name: str, dyn_slots: list[int]):
    static = [int(v) for v in o.attr(static_name)]
    dyn = list(dyn_slots)

    def get(fr: Frame) -> list:
        out, k = [], 0
        for s in static:
            if s == DYNAMIC:
                out.append(np.asarray(fr.regs[dyn[k]], np.int64))
                k += 1
            else:
                out.append(s)
        return out
    return get


def _contiguous_strides(shape) -> tuple:
    strides, acc = [], 1
    for n in reversed(shape):
        strides.append(acc)
        acc = acc * n
    return tuple(reversed(strides))


def unpack_vector(words: np.ndarray, vt: irtypes.T) -> np.ndarray:
    """The vectors (last axis) held bit-packed in ``words`` (unsigned ints of
    the vector's width; element 0 in the lowest bits, as LLVM stores vectors)."""
    w = np.ascontiguousarray(np.asarray(words)[..., None])  # (0-d words stay 0-d)
    return subbyte.from_bytes(w.view(np.uint8), vt.dtype)


def pack_vector(x, vt: irtypes.T, storage: np.dtype) -> np.ndarray:
    """The inverse of :func:`unpack_vector`."""
    return np.ascontiguousarray(subbyte.to_bytes(x, vt.dtype)).view(storage)[..., 0]


@rule("memref.load")
def load(o: Op) -> Step:
    ref, *idx = o.ins
    (out,) = o.outs
    loc = o.loc
    site = o.site()
    vt = o.in_types[0].packed_vector  # a memref of vectors: each element one word

    def step(fr: Frame) -> None:
        m = memref_of(fr, ref)
        a = element_addresses(m, [fr.regs[i] for i in idx])
        got = access(fr, m, a, 0, site, loc)
        fr.regs[out] = got if vt is None else unpack_vector(got, vt)
    return step


@rule("memref.store")
def store(o: Op) -> Step:
    val, ref, *idx = o.ins
    loc = o.loc
    site = o.site()
    ref_t = o.in_types[1]
    vt = ref_t.packed_vector

    def step(fr: Frame) -> None:
        m = memref_of(fr, ref)
        a = element_addresses(m, [fr.regs[i] for i in idx])
        v = fr.regs[val] if vt is None else pack_vector(fr.regs[val], vt, ref_t.dtype)
        access(fr, m, a, 0, site, loc, values=v)
    return step


@rule("memref.alloca", "memref.alloc")
def alloca(o: Op) -> Step:
    t = o.out_types[0]
    if any(d < 0 for d in t.shape) or o.ins:
        raise o.unsupported(f"{o.name} of dynamic shape")
    if t.space != "global":
        raise o.unsupported(f"{o.name} in memory space {t.space}")
    n = int(np.prod(t.shape, dtype=np.int64)) * t.dtype.itemsize
    strides = _contiguous_strides(t.shape)
    (out,) = o.outs

    def step(fr: Frame) -> None:
        threads = fr.T
        region = fr.mem["global"].alloc(n * threads, f"{o.name} at {o.loc}", align=16)
        if fr.block is not None:
            fr.block.scratch.append(region)
            base = region.base + np.arange(threads, dtype=np.int64) * n  # private to each thread
        else:
            base = region.base
        fr.regs[out] = MemRef("global", t.dtype, base, base, 0, t.shape, strides)
    return step


@rule("memref.subview")
def subview(o: Op) -> Step:
    src = o.ins[0]
    n_off, n_size, n_str = (list(o.attr("operandSegmentSizes")) + [0, 0, 0, 0])[1:4]
    dyn = o.ins[1:]
    offs = _mixed(o, "static_offsets", dyn[:n_off])
    sizes = _mixed(o, "static_sizes", dyn[n_off:n_off + n_size])
    steps = _mixed(o, "static_strides", dyn[n_off + n_size:])
    out_t = o.out_types[0]
    (out,) = o.outs

    def step(fr: Frame) -> None:
        m = memref_of(fr, src)
        off, sz, st = offs(fr), sizes(fr), steps(fr)
        offset = m.offset
        for a, s in zip(off, m.strides):
            offset = offset + a * s
        new_sizes = list(sz)
        new_strides = [s * k for s, k in zip(m.strides, st)]
        if len(new_sizes) > len(out_t.shape):  # rank-reducing: drop unit dims
            new_sizes, new_strides = _drop_unit_dims(new_sizes, new_strides, out_t.shape)
        fr.regs[out] = m.with_(offset=offset, sizes=tuple(new_sizes), strides=tuple(new_strides),
                               dtype=out_t.dtype)
    return step


def _drop_unit_dims(sizes: list, strides: list, want: tuple) -> tuple[list, list]:
    """Drops unit dims so the shape matches ``want``. A unit dim's index is
    always 0, so which ones go never changes an address."""
    drops = len(sizes) - len(want)
    out_sizes, out_strides, j = [], [], 0
    for i, (n, s) in enumerate(zip(sizes, strides)):
        unit = isinstance(n, (int, np.integer)) and int(n) == 1
        src_units = sum(1 for x in sizes[i:] if isinstance(x, (int, np.integer)) and int(x) == 1)
        dst_units = sum(1 for x in want[j:] if x == 1)
        if drops and unit and (j >= len(want) or want[j] != 1 or src_units > dst_units):
            drops -= 1
            continue
        out_sizes.append(n)
        out_strides.append(s)
        j += 1
    return out_sizes, out_strides


def _reassociation(o: Op) -> list[list[int]]:
    return [[int(x) for x in group] for group in o.attr("reassociation")]


@rule("memref.collapse_shape")
def collapse_shape(o: Op) -> Step:
    groups = _reassociation(o)
    (src,), (out,) = o.ins, o.outs

    def step(fr: Frame) -> None:
        m = memref_of(fr, src)
        sizes, strides = [], []
        for g in groups:
            n = 1
            for d in g:
                n = n * m.sizes[d]
            sizes.append(n)
            strides.append(m.strides[g[-1]] if g else 1)
        fr.regs[out] = m.with_(sizes=tuple(sizes), strides=tuple(strides))
    return step


@rule("memref.expand_shape")
def expand_shape(o: Op) -> Step:
    groups = _reassociation(o)
    out_shape = _mixed(o, "static_output_shape", o.ins[1:])
    src, (out,) = o.ins[0], o.outs

    def step(fr: Frame) -> None:
        m = memref_of(fr, src)
        shape = out_shape(fr)
        sizes, strides = list(shape), [0] * len(shape)
        for d, g in enumerate(groups):
            acc = m.strides[d]
            for k in reversed(g):
                strides[k] = acc
                acc = acc * shape[k]
        fr.regs[out] = m.with_(sizes=tuple(sizes), strides=tuple(strides))
    return step


@rule("memref.transpose")
def transpose(o: Op) -> Step:
    from jax._src.lib.mlir import ir

    amap = ir.AffineMapAttr(o.attr("permutation")).value
    perm = [ir.AffineDimExpr(e).position for e in amap.results]
    (src,), (out,) = o.ins, o.outs

    def step(fr: Frame) -> None:
        m = memref_of(fr, src)
        fr.regs[out] = m.with_(sizes=tuple(m.sizes[p] for p in perm),
                               strides=tuple(m.strides[p] for p in perm))
    return step


@rule("memref.reinterpret_cast")
def reinterpret_cast(o: Op) -> Step:
    n_off, n_size, n_str = list(o.attr("operandSegmentSizes"))[1:4]
    dyn = o.ins[1:]
    offs = _mixed(o, "static_offsets", dyn[:n_off])
    sizes = _mixed(o, "static_sizes", dyn[n_off:n_off + n_size])
    strides = _mixed(o, "static_strides", dyn[n_off + n_size:])
    src, (out,) = o.ins[0], o.outs
    dt = o.out_types[0].dtype

    def step(fr: Frame) -> None:
        m = memref_of(fr, src)
        fr.regs[out] = m.with_(offset=offs(fr)[0], sizes=tuple(sizes(fr)),
                               strides=tuple(strides(fr)), dtype=dt)
    return step


@rule("memref.view")
def view(o: Op) -> Step:
    t = o.out_types[0]
    src, shift, *dyn_sizes = o.ins
    (out,) = o.outs

    def step(fr: Frame) -> None:
        m = memref_of(fr, src)
        it = iter(dyn_sizes)
        shape = tuple(np.asarray(fr.regs[next(it)], np.int64) if d < 0 else d for d in t.shape)
        base = m.aligned + (m.offset * m.itemsize) + np.asarray(fr.regs[shift], np.int64)
        fr.regs[out] = MemRef(m.space, t.dtype, m.allocated, base, 0, shape,
                              _contiguous_strides(shape))
    return step


@rule("memref.cast")
def cast(o: Op) -> Step:
    t = o.out_types[0]
    (src,), (out,) = o.ins, o.outs

    def step(fr: Frame) -> None:
        fr.regs[out] = memref_of(fr, src).with_(dtype=t.dtype)
    return step


def _llvm_space(o: Op, t: irtypes.T) -> int:
    """The LLVM address space a memref type's memory space lowers to (none:
    generic); one without a generic window is Unsupported."""
    m = re.search(r", (\d+)(?: : i\d+)? ?>$", t.text)
    if m:
        n = int(m.group(1))
    elif "address_space<workgroup>" in t.text:
        n = generic.SHARED
    elif "address_space<global>" in t.text:
        n = generic.GLOBAL
    elif t.space == "global" and "address_space<" not in t.text and "#mosaic_gpu" not in t.text:
        n = generic.GENERIC
    else:
        n = -1
    if n != generic.GENERIC and n not in generic.WINDOWS:
        raise o.unsupported(f"{o.name} of {t.text} (no generic window is modelled for its "
                            "memory space)")
    return n


@rule("memref.memory_space_cast")
def memory_space_cast(o: Op) -> Step:
    """The descriptor's pointers cast as ``llvm.addrspacecast`` casts them
    (:func:`..generic.cast`), as MLIR lowers the op."""
    a, b = o.in_types[0], o.out_types[0]
    s, d = _llvm_space(o, a), _llvm_space(o, b)
    (src,), (out,) = o.ins, o.outs
    loc = o.loc
    what = f"memref.memory_space_cast from {a.text} to {b.text}"

    def step(fr: Frame) -> None:
        m = memref_of(fr, src)
        fr.regs[out] = m.with_(space=b.space,
                               allocated=generic.cast(fr, m.allocated, s, d, what, loc),
                               aligned=generic.cast(fr, m.aligned, s, d, what, loc))
    return step


@rule("memref.extract_strided_metadata")
def extract_strided_metadata(o: Op) -> Step:
    (src,) = o.ins
    base, offset, *rest = o.outs
    rank = len(rest) // 2
    dt = o.out_types[0].dtype

    def step(fr: Frame) -> None:
        m = memref_of(fr, src)
        r = fr.regs
        r[base] = MemRef(m.space, dt, m.allocated, m.aligned, 0, (), ())
        r[offset] = np.asarray(m.offset, np.int64)
        for k in range(rank):
            r[rest[k]] = np.asarray(m.sizes[k], np.int64)
            r[rest[rank + k]] = np.asarray(m.strides[k], np.int64)
    return step


@rule("memref.extract_aligned_pointer_as_index")
def extract_aligned_pointer(o: Op) -> Step:
    (src,), (out,) = o.ins, o.outs

    def step(fr: Frame) -> None:
        fr.regs[out] = np.asarray(memref_of(fr, src).aligned, np.int64)
    return step


@rule("memref.dim")
def dim(o: Op) -> Step:
    (src, d), (out,) = o.ins, o.outs

    def step(fr: Frame) -> None:
        fr.regs[out] = np.asarray(memref_of(fr, src).sizes[int(fr.regs[d])], np.int64)
    return step
