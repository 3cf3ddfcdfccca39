"""``llvm``: aggregates (tuples), pointers (int64 byte addresses; the pointer
type's address space picks the memory space), loads/stores, GEPs, allocas and
integer arithmetic on the LLVM dialect's own ops."""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import generic, irtypes, subbyte
from ..compiler import MOVES, Op, Step, rule
from ..errors import Unsupported
from ..fusion import VectorAccess
from ..machine import Frame
from ..values import UNDEF, extract, insert
from . import arith
from ._util import binary, unary
from .memref import access_space, plus_offsets

GEP_DYNAMIC = -2147483648


@rule("llvm.mlir.undef", "llvm.mlir.poison", "llvm.mlir.zero")
def undef(o: Op) -> Step:
    t = o.out_types[0]
    (out,) = o.outs
    if t.kind in ("scalar", "vector"):
        val = np.zeros(t.shape if t.kind == "vector" else (), t.dtype)
    elif t.kind == "ptr":
        val = np.asarray(0, np.int64)
    else:
        val = UNDEF
    return lambda fr: fr.regs.__setitem__(out, val)


@rule("llvm.insertvalue", accumulators=MOVES)
def insertvalue(o: Op) -> Step:
    pos = tuple(int(p) for p in o.attr("position"))
    (agg, val), (out,) = o.ins, o.outs
    return lambda fr: fr.regs.__setitem__(out, insert(fr.regs[agg], pos, fr.regs[val]))


@rule("llvm.extractvalue", accumulators=MOVES)
def extractvalue(o: Op) -> Step:
    pos = tuple(int(p) for p in o.attr("position"))
    (agg,), (out,) = o.ins, o.outs
    loc = o.loc

    def step(fr: Frame) -> None:
        v = extract(fr.regs[agg], pos)
        if v is UNDEF:
            raise Unsupported("llvm.extractvalue of an undefined field", loc)
        fr.regs[out] = v
    return step


def _type_text(attr) -> str:
    from jax._src.lib.mlir import ir
    return str(ir.TypeAttr(attr).value)


def _array_elem(text: str) -> str:
    import re
    m = re.fullmatch(r"!llvm\.array<\d+ x (.+)>", text)
    if not m:
        raise Unsupported(f"llvm.getelementptr into {text}")
    return m.group(1)


@rule("llvm.getelementptr")
def gep(o: Op) -> Step:
    elem = _type_text(o.attr("elem_type"))
    raw = [int(i) for i in o.attr("rawConstantIndices")]
    base, *dyn = o.ins
    (out,) = o.outs
    scales, t = [], elem
    for k in range(len(raw)):
        if k > 0:
            t = _array_elem(t)
        scales.append(irtypes.byte_size(t))

    def step(fr: Frame) -> None:
        r = fr.regs
        addr = np.asarray(r[base], np.int64)
        it = iter(dyn)
        for idx, scale in zip(raw, scales):
            i = np.asarray(r[next(it)], np.int64) if idx == GEP_DYNAMIC else idx
            addr = addr + i * scale
        r[out] = addr
    return step


def _space(t: irtypes.T) -> str:
    return t.space


@rule("llvm.load")
def load(o: Op) -> Step:
    (p,), (out,) = o.ins, o.outs
    space = _space(o.in_types[0])
    t = o.out_types[0]
    loc = o.loc
    if t.kind == "array":
        n = irtypes.byte_size(t.text)

        def load_bytes(fr: Frame) -> None:
            addr = np.asarray(fr.regs[p])
            if addr.ndim:
                raise Unsupported("per-thread load of an aggregate", loc)
            ((name, a, _),) = generic.spaces(fr, space, addr, 0, loc, "llvm.load")
            fr.regs[out] = fr.mem[name].read_bytes(int(a), n, loc).copy()
        return load_bytes
    dt = t.dtype
    if t.kind not in ("scalar", "vector", "ptr") or dt is None:
        raise o.unsupported(f"llvm.load of {t.text}")
    vshape = t.shape if t.kind == "vector" else ()
    site = o.site()

    if subbyte.bits_of(dt):
        def packed_load(fr: Frame) -> None:
            got = None
            for name, ptr, mask in generic.spaces(fr, space, fr.regs[p], 0, loc, site.op):
                addr = _element_addresses(ptr, vshape, dt)
                part = subbyte.load(fr.mem[name], addr, dt, mask, loc)
                got = generic.merge(got, part, mask)
                if fr.sync is not None:
                    fr.sync.thread_access(fr, name, subbyte.written_bytes(addr), len(vshape), 1,
                                          False, site, mask=mask)
            fr.regs[out] = got
        return packed_load

    def step(fr: Frame) -> None:
        addr = _element_addresses(fr.regs[p], vshape, dt)
        fr.regs[out] = access_space(fr, space, dt, addr, len(vshape), site, loc)
    step.fusable = _fusable(False, p, out, space, dt, vshape, site, loc)  # type: ignore
    return step


@rule("llvm.store")
def store(o: Op) -> Step:
    (v, p) = o.ins
    t = o.in_types[0]
    space = _space(o.in_types[1])
    loc = o.loc
    dt = t.dtype
    if t.kind not in ("scalar", "vector", "ptr") or dt is None:
        raise o.unsupported(f"llvm.store of {t.text}")
    vshape = t.shape if t.kind == "vector" else ()
    site = o.site()

    if subbyte.bits_of(dt):
        if int(np.prod(vshape, dtype=np.int64)) * subbyte.bits_of(dt) % 8:
            # LLVM leaves the rest of the last byte unspecified
            raise o.unsupported(f"llvm.store of {t.text}, which does not fill whole bytes")

        def packed_store(fr: Frame) -> None:
            for name, ptr, mask in generic.spaces(fr, space, fr.regs[p], 0, loc, site.op):
                addr = _element_addresses(ptr, vshape, dt)
                subbyte.store(fr.mem[name], addr, fr.regs[v], dt, mask, loc)
                if fr.sync is not None:
                    fr.sync.thread_access(fr, name, subbyte.written_bytes(addr), len(vshape), 1,
                                          True, site, mask=mask,
                                          values=subbyte.raw(fr.regs[v], dt))
        return packed_store

    def step(fr: Frame) -> None:
        addr = _element_addresses(fr.regs[p], vshape, dt)
        access_space(fr, space, dt, addr, len(vshape), site, loc, values=fr.regs[v])
    step.fusable = _fusable(True, p, v, space, dt, vshape, site, loc)  # type: ignore
    return step


def _fusable(is_store: bool, pointer: int, value: int, space: str, dt: np.dtype,
             vshape: tuple[int, ...], site, loc: str) -> VectorAccess:
    """What :mod:`..fusion` needs to run this access with its neighbours'
    (a stack of pointers: one more vector dimension)."""
    def addresses(fr: Frame, indices: list, uniform: bool = False) -> np.ndarray:
        (pointers,) = indices  # (uniform or not: the pointers say)
        return _element_addresses(pointers, vshape, dt)

    def run(fr: Frame, addrs: np.ndarray, values):
        return access_space(fr, space, dt, addrs, len(vshape) + 1, site, loc, values=values)
    return VectorAccess(is_store, ("pointer", space, dt.str), (pointer,), tuple(vshape), value,
                        site, loc, run, addresses)


def _element_addresses(pointer: Any, vshape: tuple[int, ...], dt: np.dtype) -> np.ndarray:
    """The address of each element a load or store of a ``vshape`` vector (or
    of a scalar, ``()``) at ``pointer`` touches, per thread; bit addresses
    for a sub-byte element type (:mod:`..subbyte`)."""
    addr = np.asarray(pointer, np.int64)
    if subbyte.bits_of(dt):
        lanes = np.arange(vshape[0]) if vshape else 0
        return subbyte.bit_addresses(addr.reshape(addr.shape + (1,)) if vshape else addr,
                                     lanes, dt)
    if vshape:
        addr = plus_offsets(addr, np.arange(vshape[0]) * dt.itemsize)
    return addr


@rule("llvm.alloca")
def alloca(o: Op) -> Step:
    elem = _type_text(o.attr("elem_type"))
    size = irtypes.byte_size(elem)
    (n,), (out,) = o.ins, o.outs
    loc = o.loc
    if o.out_types[0].space != "global":
        raise o.unsupported("llvm.alloca outside the generic address space")

    def step(fr: Frame) -> None:
        count = int(np.asarray(fr.regs[n]).max())
        total = max(count * size, 1)
        region = fr.mem["global"].alloc(total * fr.T, f"llvm.alloca at {loc}", align=64)
        if fr.block is not None:
            fr.block.scratch.append(region)
            fr.regs[out] = region.base + np.arange(fr.T, dtype=np.int64) * total  # per thread
        else:
            fr.regs[out] = np.asarray(region.base, np.int64)
    return step


@rule("llvm.inttoptr", "llvm.ptrtoint")
def int_ptr(o: Op) -> Step:
    dt = o.out_types[0].dtype
    return unary(o, lambda x: np.asarray(x).astype(dt))


@rule("llvm.addrspacecast")
def addrspacecast(o: Op) -> Step:
    """Between the generic space and a window of it (:mod:`..generic`):
    ``cvta``/``cvta.to`` for global, local, shared::cta and shared::cluster
    pointers, checked for the active threads."""
    src = generic.address_space(o.in_types[0].text)
    dst = generic.address_space(o.out_types[0].text)
    (x,), (out,) = o.ins, o.outs
    loc = o.loc
    what = f"llvm.addrspacecast from {o.in_types[0].text} to {o.out_types[0].text}"
    for s in (src, dst):
        if s != generic.GENERIC and s not in generic.WINDOWS:
            raise o.unsupported(f"{what} (no generic window is modelled for address space {s})")

    def step(fr: Frame) -> None:
        fr.regs[out] = generic.cast(fr, fr.regs[x], src, dst, what, loc)
    return step


LLVM_INT = {
    "llvm.add": "arith.addi", "llvm.sub": "arith.subi", "llvm.mul": "arith.muli",
    "llvm.and": "arith.andi", "llvm.or": "arith.ori", "llvm.xor": "arith.xori",
    "llvm.shl": "arith.shli", "llvm.lshr": "arith.shrui", "llvm.ashr": "arith.shrsi",
    "llvm.udiv": "arith.divui", "llvm.sdiv": "arith.divsi", "llvm.urem": "arith.remui",
    "llvm.srem": "arith.remsi",
}
for _l, _a in LLVM_INT.items():
    rule(_l)(lambda o, a=_a: binary(o, arith.INT_BINARY[a]))

rule("llvm.fadd")(lambda o: binary(o, np.add))
rule("llvm.fmul")(lambda o: binary(o, np.multiply))
rule("llvm.fsub")(lambda o: binary(o, np.subtract))
rule("llvm.zext")(arith.int_unsigned_cast)
rule("llvm.sext", "llvm.trunc")(arith.int_signed_cast)
rule("llvm.bitcast", accumulators=MOVES)(arith.bitcast)
rule("llvm.select")(arith.select)


@rule("llvm.extractelement", accumulators=MOVES)
def extractelement(o: Op) -> Step:
    (v, i), (out,) = o.ins, o.outs
    loc = o.loc

    def step(fr: Frame) -> None:
        idx = np.asarray(fr.regs[i])
        x = np.asarray(fr.regs[v])
        if idx.ndim:
            raise Unsupported("llvm.extractelement at a per-thread index", loc)
        fr.regs[out] = x[..., int(idx)]
    return step


@rule("llvm.insertelement", accumulators=MOVES)
def insertelement(o: Op) -> Step:
    (vec, val, i), (out,) = o.ins, o.outs
    loc = o.loc

    def step(fr: Frame) -> None:
        idx = np.asarray(fr.regs[i])
        if idx.ndim:
            raise Unsupported("llvm.insertelement at a per-thread index", loc)
        x, y = np.asarray(fr.regs[vec]), np.asarray(fr.regs[val])
        if y.ndim and x.ndim == 1:
            x = np.broadcast_to(x, (y.shape[0],) + x.shape)
        res = np.array(x)
        res[..., int(idx)] = y
        fr.regs[out] = res
    return step


@rule("llvm.mlir.addressof")
def addressof(o: Op) -> Step:
    name = str(o.attr("global_name"))
    raise o.unsupported(f"llvm.mlir.addressof {name} (globals are not modelled)")
