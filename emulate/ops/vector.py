"""``vector``: per-thread register vectors. A value of type vector<S> is an
array of shape ``S`` (uniform) or ``(T, *S)`` (per thread); loads and stores
go through :mod:`..memory` with the addresses the memref descriptor gives."""

from __future__ import annotations

import numpy as np

from .. import irtypes, subbyte
from ..compiler import MOVES, Op, Step, rule
from ..fusion import VectorAccess
from ..machine import Frame
from ..values import lead
from . import arith
from ._util import unary
from .memref import access, element_addresses, memref_of


def _static(o: Op, name: str) -> list[int]:
    return [int(v) for v in o.attr(name)]


DYNAMIC = -9223372036854775808


def _positions(o: Op, first_dynamic: int):
    static = _static(o, "static_position")
    dyn = o.ins[first_dynamic:]
    return static, dyn


def _index(fr: Frame, static, dyn, lead_axes: int):
    pos, k = [], 0
    for s in static:
        if s == DYNAMIC:
            v = np.asarray(fr.regs[dyn[k]])
            k += 1
            if v.ndim:
                raise _dyn_err
            pos.append(int(v))
        else:
            pos.append(s)
    return (slice(None),) * lead_axes + tuple(pos)


class _DynErr(Exception):
    pass


_dyn_err = _DynErr()


@rule("vector.extract", accumulators=MOVES)
def extract(o: Op) -> Step:
    vr = o.in_types[0].vrank
    static, dyn = _positions(o, 1)
    src, out = o.ins[0], o.outs[0]
    if not dyn:
        pos = tuple(static)

        def step(fr: Frame) -> None:
            x = fr.regs[src]
            fr.regs[out] = x[pos] if np.ndim(x) == vr else x[(slice(None),) + pos]
        return step

    def step_dyn(fr: Frame) -> None:
        x = fr.regs[src]
        try:
            fr.regs[out] = x[_index(fr, static, dyn, lead(x, vr))]
        except _DynErr:
            raise o.unsupported("vector.extract at a per-thread position") from None
    return step_dyn


@rule("vector.insert", accumulators=MOVES)
def insert(o: Op) -> Step:
    vt = o.out_types[0]
    vr = vt.vrank
    static, dyn = _positions(o, 2)
    val, dst, out = o.ins[0], o.ins[1], o.outs[0]

    def step(fr: Frame) -> None:
        r = fr.regs
        v, d = np.asarray(r[val]), r[dst]
        per_thread = lead(d, vr) or np.ndim(v) > len(vt.shape) - len(static)
        if d is None or isinstance(d, type(None)):
            d = np.zeros(vt.shape, vt.dtype)
        d = np.asarray(d)
        if per_thread and d.ndim == vr:
            d = np.broadcast_to(d, (fr.T,) + d.shape)
        res = np.array(d)
        try:
            idx = _index(fr, static, dyn, 1 if per_thread else 0)
        except _DynErr:
            raise o.unsupported("vector.insert at a per-thread position") from None
        res[idx] = v
        r[out] = res
    return step


@rule("vector.broadcast", accumulators=MOVES)  # (vector.splat: gone from MLIR)
def broadcast(o: Op) -> Step:
    src_t, dst_t = o.in_types[0], o.out_types[0]
    svr, shape = src_t.vrank, dst_t.shape
    (src,), (out,) = o.ins, o.outs

    size = int(np.prod(shape))

    def step(fr: Frame) -> None:
        x = np.asarray(fr.regs[src])
        if np.ndim(x) > svr:  # per thread
            xs = x.reshape((x.shape[0],) + (1,) * (len(shape) - svr) + x.shape[1:])
            target = (x.shape[0],) + shape
            # (a scalar per thread into vector<1x...>: the reshape is the result)
            fr.regs[out] = xs if xs.shape == target else np.broadcast_to(xs, target)
        else:
            fr.regs[out] = x.reshape(shape) if x.size == size else np.broadcast_to(x, shape)
    return step


@rule("vector.bitcast", accumulators=MOVES)
def bitcast(o: Op) -> Step:
    src_t, dst_t = o.in_types[0], o.out_types[0]
    if (src_t.dtype == np.bool_ or dst_t.dtype == np.bool_
            or src_t.shape[-1] * src_t.bits % 8):
        raise o.unsupported(f"vector.bitcast {src_t.text} -> {dst_t.text}")
    st, dt = src_t.dtype, dst_t.dtype
    if src_t.bits < 8 or dst_t.bits < 8:  # packed: element 0 in the lowest bits
        return unary(o, lambda x: subbyte.from_bytes(subbyte.to_bytes(x, st), dt))
    return unary(o, lambda x: np.ascontiguousarray(x).view(dt))


@rule("vector.shape_cast", accumulators=MOVES)
def shape_cast(o: Op) -> Step:
    svr, shape = o.in_types[0].vrank, o.out_types[0].shape

    def f(x):
        x = np.asarray(x)
        return x.reshape(shape) if x.ndim == svr else x.reshape((x.shape[0],) + shape)
    return unary(o, f)


@rule("vector.extract_strided_slice", accumulators=MOVES)
def extract_strided_slice(o: Op) -> Step:
    offs, sizes = _static(o, "offsets"), _static(o, "sizes")
    strides = _static(o, "strides")
    vr = o.in_types[0].vrank
    sl = tuple(slice(a, a + s * st, st) for a, s, st in zip(offs, sizes, strides))

    def f(x):
        return x[sl] if np.ndim(x) == vr else x[(slice(None),) + sl]
    return unary(o, f)


@rule("vector.insert_strided_slice", accumulators=MOVES)
def insert_strided_slice(o: Op) -> Step:
    offs, strides = _static(o, "offsets"), _static(o, "strides")
    src_t, dst_t = o.in_types[0], o.out_types[0]
    (src, dst), (out,) = o.ins, o.outs
    lead_skip = dst_t.vrank - src_t.vrank

    def step(fr: Frame) -> None:
        s, d = np.asarray(fr.regs[src]), np.asarray(fr.regs[dst])
        pt = lead(s, src_t.vrank) or lead(d, dst_t.vrank)
        if pt:
            s = np.broadcast_to(s, (fr.T,) + src_t.shape) if s.ndim == src_t.vrank else s
            d = np.broadcast_to(d, (fr.T,) + dst_t.shape) if d.ndim == dst_t.vrank else d
        res = np.array(d)
        sl = tuple(offs[:lead_skip]) + tuple(
            slice(a, a + n * st, st) for a, n, st in zip(offs[lead_skip:], src_t.shape, strides))
        res[(slice(None),) * pt + sl] = s
        fr.regs[out] = res
    return step


@rule("vector.from_elements")
def from_elements(o: Op) -> Step:
    shape = o.out_types[0].shape
    dt = o.out_types[0].dtype
    ins, (out,) = o.ins, o.outs

    def step(fr: Frame) -> None:
        xs = [np.asarray(fr.regs[i]) for i in ins]
        if any(x.ndim for x in xs):
            xs = [np.broadcast_to(x, (fr.T,)) for x in xs]
            fr.regs[out] = np.stack(xs, axis=-1).astype(dt).reshape((fr.T,) + shape)
        else:
            fr.regs[out] = np.array(xs, dt).reshape(shape)
    return step


REDUCE = {"add": np.add, "mul": np.multiply, "maxsi": np.maximum, "minsi": np.minimum,
          "maximumf": arith.maximumf, "minimumf": arith.minimumf, "maxnumf": np.fmax,
          "minnumf": np.fmin, "and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor}


@rule("vector.reduction")
def reduction(o: Op) -> Step:
    kind = str(o.attr("kind")).split("<")[-1].rstrip(">")
    if kind not in REDUCE or len(o.ins) != 1:
        raise o.unsupported(f"vector.reduction <{kind}>")
    fn = REDUCE[kind]
    # Sequential (left to right) order, as LLVM's non-reassociative reduction.
    def f(x):
        x = np.asarray(x)
        acc = x[..., 0]
        for i in range(1, x.shape[-1]):
            acc = fn(acc, x[..., i])
        return acc
    return unary(o, f)


@rule("vector.fma")
def vfma(o: Op) -> Step:
    from .math import fma
    return fma(o)


def _load_store_common(o: Op, ref_index: int, vec_t: irtypes.T):
    if o.in_types[ref_index].packed_vector is not None:
        raise o.unsupported(f"{o.name} of a memref of vectors ({o.in_types[ref_index].text}; "
                            "memref.load and memref.store of its elements are modelled)")
    ref = o.ins[ref_index]
    idx = o.ins[ref_index + 1:]
    return ref, idx, vec_t.shape


@rule("vector.load")
def load(o: Op) -> Step:
    vt = o.out_types[0]
    ref, idx, vshape = _load_store_common(o, 0, vt)
    (out,) = o.outs
    loc = o.loc
    site = o.site()

    def step(fr: Frame) -> None:
        m = memref_of(fr, ref)
        addrs = element_addresses(m, [fr.regs[i] for i in idx], vshape)
        fr.regs[out] = access(fr, m, addrs, len(vshape), site, loc)
    step.fusable = _fusable(False, ref, idx, vshape, out, site, loc)  # type: ignore
    return step


@rule("vector.store")
def store(o: Op) -> Step:
    vt = o.in_types[0]
    val = o.ins[0]
    ref, idx, vshape = _load_store_common(o, 1, vt)
    loc = o.loc
    site = o.site()

    def step(fr: Frame) -> None:
        m = memref_of(fr, ref)
        addrs = element_addresses(m, [fr.regs[i] for i in idx], vshape)
        access(fr, m, addrs, len(vshape), site, loc, values=fr.regs[val])
    step.fusable = _fusable(True, ref, idx, vshape, val, site, loc)  # type: ignore
    return step


def _fusable(is_store: bool, ref: int, idx: list[int], vshape: tuple, value: int, site,
             loc: str) -> VectorAccess:
    """What :mod:`..fusion` needs to run this access with its neighbours':
    the addresses it would access, and the access of a stack of such (one
    more vector dimension)."""
    def addresses(fr: Frame, indices: list, uniform: bool = False) -> np.ndarray | None:
        m = memref_of(fr, ref)
        per_thread = any(np.ndim(f) for f in (m.aligned, m.offset, *m.strides))
        if uniform:  # the same in every thread, unless the view is a thread's own
            return None if per_thread else element_addresses(m, indices, vshape)
        if per_thread:
            # a view per thread (T,) broadcasts against a run axis first:
            # computed run-major, then made thread-major
            run_major = [np.swapaxes(i, 0, 1) if np.ndim(i) == 2 else i for i in indices]
            return np.moveaxis(element_addresses(m, run_major, vshape), 0, 1)
        return element_addresses(m, indices, vshape)

    def run(fr: Frame, addrs: np.ndarray, values):
        return access(fr, memref_of(fr, ref), addrs, len(vshape) + 1, site, loc, values=values)
    return VectorAccess(is_store, ("memref", ref), tuple(idx), tuple(vshape), value, site, loc,
                        run, addresses)




@rule("vector.shuffle", accumulators=MOVES)
def shuffle(o: Op) -> Step:
    """``vector.shuffle %a, %b [m...]``: element ``i`` of the result is element
    ``m[i]`` of ``a`` and ``b`` concatenated along their leading dim."""
    mask = np.asarray(_static(o, "mask"), np.int64)
    ta, tb = o.in_types
    if ta.vrank != 1 or tb.vrank != 1:
        raise o.unsupported(f"vector.shuffle of {ta.text}")
    if np.any(mask < 0):
        raise o.unsupported("vector.shuffle with poison (-1) positions")
    (a, b), (out,) = o.ins, o.outs

    def step(fr: Frame) -> None:
        x, y = np.asarray(fr.regs[a]), np.asarray(fr.regs[b])
        if x.ndim != y.ndim:
            x = np.broadcast_to(x, (fr.T,) + x.shape[-1:]) if x.ndim == 1 else x
            y = np.broadcast_to(y, (fr.T,) + y.shape[-1:]) if y.ndim == 1 else y
        both = np.concatenate([x, y], axis=-1)
        fr.regs[out] = both[..., mask]
    return step
