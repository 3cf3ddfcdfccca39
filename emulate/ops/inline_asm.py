"""``llvm.inline_asm``: the PTX strings Mosaic GPU's code generators emit,
dispatched through a table; any other string raises :class:`Unsupported`
naming it.

The table has three kinds of entries, registered by decorators on the
handlers at the end of this module (as :func:`..compiler.rule` registers op
rules):

* :func:`ptx` -- exact opcodes of one-instruction strings (after an optional
  ``@$N`` predicate), e.g. ``fence.proxy.async.shared::cta``;
* :func:`ptx_pattern` -- a regular expression over the opcode, for families
  (TMA tile copies of any rank, ``st.async`` of any width, value instructions
  such as ``ex2.approx.ftz.f32``);
* :func:`ptx_text` -- a regular expression over the whole string (whitespace
  collapsed), for strings that are not one instruction: WGMMA blocks, jax's
  remote mbarrier arrival, the empty optimization barrier.

:func:`lookup` tries the whole-string entries in order, then the exact
opcode, then the patterns in order. A handler takes the parsed :class:`Instr`
and returns the op's step, or raises :class:`Unsupported`. Value
instructions (``value=True``) are those whose first operand is the result
``$0``; an entry of the other kind never handles them, nor any ``@!$N``
(negated) predicate. :func:`modelled_ptx` lists the table.

Approximate instructions (``ex2.approx``, ``lg2.approx``, ``tanh.approx``,
``sin/cos.approx``, ``rsqrt.approx``, ``sqrt.approx``) are modelled by the
exact function, rounded once; the PTX ISA bounds the hardware's distance from
it: ex2.approx.f32 2 ulp, lg2.approx.f32 2^-22 absolute/relative, sin/cos
2^-20.9 absolute in [-pi, pi], rsqrt.approx/sqrt.approx 2^-23 relative-ish
(1 ulp-ish), tanh.approx.f32 2^-10.987 relative (~2^13 ulp of f32!).
``.ftz`` flushes subnormal inputs and outputs to zero as the hardware does."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

from .. import irtypes
from ..compiler import MOVES, Op, Step, accumulator_use, rule
from ..errors import Unsupported
from ..machine import Frame, uniform
from . import arith, mma_sync, ptx_block, wgmma
from .gpu import cluster_arrive, cluster_wait, full_block_barrier, named_barrier
from .nvvm import (
    bulk_commit,
    bulk_wait,
    effective,
    mapa_step,
    mbarrier_arrive,
    mbarrier_init,
    per_thread,
    proxy_fence,
    tma_load_check,
    tma_store_check,
    wgmma_commit,
    wgmma_wait,
)

if TYPE_CHECKING:
    from ..sync.shadow import OpSite

# --- the table ---------------------------------------------------------------

Handler = Callable[["Instr"], Step]


@dataclass(frozen=True)
class PtxForm:
    """One entry of the table: an exact opcode, or a regular expression over
    the opcode (``kind`` "pattern") or over the whole string ("text")."""

    form: str
    description: str
    handler: Handler
    kind: str  # "opcode", "pattern" or "text"
    value: bool = False  # a value instruction: `$0` is its result
    regex: re.Pattern | None = None  # the compiled form, but for an exact opcode
    #: a whole-string entry's further test of the (raw) string, beyond its regex
    accepts: Callable[[str], bool] | None = None


OPCODES: dict[str, PtxForm] = {}
PATTERNS: list[PtxForm] = []
TEXTS: list[PtxForm] = []


def _summary(fn: Handler) -> str:
    """A handler's description: the first paragraph of its docstring."""
    doc = (fn.__doc__ or "").strip().split("\n\n")[0]
    if not doc:
        raise TypeError(f"PTX handler {fn.__name__} has neither a description nor a docstring")
    return " ".join(doc.split())


def ptx(*opcodes: str, description: str | None = None,
        value: bool = False) -> Callable[[Handler], Handler]:
    """Registers a handler for exact opcodes (described by its docstring unless
    ``description`` is given)."""
    def register(fn: Handler) -> Handler:
        desc = description or _summary(fn)
        for opcode in opcodes:
            if opcode in OPCODES:
                raise ValueError(f"PTX opcode {opcode!r} registered twice")
            OPCODES[opcode] = PtxForm(opcode, desc, fn, "opcode", value)
        return fn
    return register


def ptx_pattern(regex: str, description: str,
                value: bool = False) -> Callable[[Handler], Handler]:
    """Registers a handler for the opcodes ``regex`` fully matches."""
    def register(fn: Handler) -> Handler:
        if any(p.form == regex for p in PATTERNS):
            raise ValueError(f"PTX pattern {regex!r} registered twice")
        PATTERNS.append(PtxForm(regex, description, fn, "pattern", value, re.compile(regex)))
        return fn
    return register


def ptx_text(regex: str, description: str,
             accepts: Callable[[str], bool] | None = None) -> Callable[[Handler], Handler]:
    """Registers a handler for whole strings ``regex`` fully matches, their
    whitespace collapsed to single spaces (and ``accepts``, if given, accepts);
    tried, in order, before any opcode."""
    def register(fn: Handler) -> Handler:
        TEXTS.append(PtxForm(regex, description, fn, "text", regex=re.compile(regex),
                             accepts=accepts))
        return fn
    return register


def lookup(text: str) -> PtxForm | None:
    """The table entry for an inline-asm string: the first whole-string entry
    matching it, else its opcode's exact entry, else the first pattern matching
    the opcode; None if nothing does."""
    return _lookup(text, _parse(text))


def _lookup(text: str, parsed: tuple) -> PtxForm | None:
    """:func:`lookup`, given ``text`` already parsed as one instruction."""
    whole = " ".join(text.split())
    for entry in TEXTS:
        if entry.regex.fullmatch(whole) and (entry.accepts is None or entry.accepts(text)):
            return entry
    opcode = parsed[2]
    if not opcode:
        return None
    if opcode in OPCODES:
        return OPCODES[opcode]
    return next((p for p in PATTERNS if p.regex.fullmatch(opcode)), None)


def modelled_ptx() -> list[tuple[str, str]]:
    """(form, description) of every PTX form the emulator models, sorted: the
    exact opcodes, and the regular expressions over opcodes or whole strings."""
    entries = [*OPCODES.values(), *PATTERNS, *TEXTS]
    return sorted((e.form, e.description) for e in entries)


class Instr:
    """An ``llvm.inline_asm`` op as a PTX handler sees it."""

    def __init__(self, o: Op, text: str, parsed: tuple = (None, False, "", [])) -> None:
        self.op = o
        self.text = text
        # ``parsed``: (predicate, negated, opcode, args) of a one-instruction
        # string; a string matched as a whole (a WGMMA block...) has none
        self.pred, self.negated, self.opcode, self.args = parsed
        self.loc = o.loc
        hint = " (a tcgen05 form the emulator does not model)" if "tcgen05" in text else ""
        #: what every handler raises for a string it does not model
        self.unknown = Unsupported(f"inline PTX {text!r}{hint}", self.loc)
        self.ins: list[int] = o.ins
        self.outs: list[int] = o.outs
        self.results: list[int] = [s for s, t in zip(o.outs, o.out_types) if t.kind != "none"]
        self.pred_slots: list[int] = [self.ins[int(self.pred)]] if self.pred is not None else []

    @property
    def is_value(self) -> bool:
        """Whether this is a value instruction: `$0`, its first operand, is a result."""
        return (bool(self.results) and self.pred is None and bool(self.args)
                and self.args[0] == "$0")

    @cached_property
    def site(self) -> OpSite:
        """What the synchronization checker reports of this instruction."""
        return self.op.site(self.opcode)

    def arg_slot(self, a: str) -> int:
        """The input slot of operand ``a`` (``$N``, maybe in brackets or braces)."""
        m = ASM_ARG.fullmatch(a.strip("[]{} "))
        if not m:
            raise self.unknown
        k = int(m.group(1)) - len(self.results)
        return self.ins[k]


@rule("llvm.inline_asm")
def inline_asm(o: Op) -> Step:
    from jax._src.lib.mlir import ir
    text = ir.StringAttr(o.attr("asm_string")).value
    parsed = _parse(text)
    entry = _lookup(text, parsed)
    whole = entry is not None and entry.kind == "text"
    i = Instr(o, text) if whole else Instr(o, text, parsed)
    if entry is None:
        raise i.unknown
    # an instruction must also be of the entry's kind (value or side effect),
    # and no handler models a negated predicate
    if not whole and (i.negated or i.is_value != entry.value):
        raise i.unknown
    return entry.handler(i)


# --- value instructions ------------------------------------------------------

F32_TINY = np.float32(np.finfo(np.float32).tiny)


def _ftz(x: np.ndarray) -> np.ndarray:
    """Subnormals to a zero of the same sign (PTX: "sign-preserving zero")."""
    return np.where(np.abs(x) < F32_TINY, np.copysign(np.zeros_like(x), x), x)


def _f32(fn, ftz: bool):
    def f(x):
        x = np.asarray(x, np.float32)
        if ftz:
            x = _ftz(x)
        with np.errstate(all="ignore"):
            y = np.asarray(fn(x.astype(np.float64))).astype(np.float32)
        return _ftz(y) if ftz else y
    return f


UNARY_F32 = {
    "ex2.approx": np.exp2, "lg2.approx": np.log2, "sin.approx": np.sin, "cos.approx": np.cos,
    "tanh.approx": np.tanh, "rsqrt.approx": lambda x: 1 / np.sqrt(x),
    "sqrt.approx": np.sqrt, "rcp.approx": lambda x: 1 / x,
}
PACKED_TYPES = {"f16": np.float16, "bf16": irtypes.SCALARS["bf16"]}


def _packed(fn, elem: str, n_args: int):
    """A packed (x2) or single 16-bit instruction on i32/i16 registers."""
    dt = np.dtype(PACKED_TYPES[elem])

    def f(*regs):
        xs = [np.asarray(r) for r in regs]
        width = xs[0].dtype.itemsize
        views = [np.array(x).view(np.uint16 if width == 2 else np.uint32) for x in xs]
        if width == 4:
            halves = [np.stack([v & 0xFFFF, v >> 16], -1).astype(np.uint16).view(dt) for v in views]
        else:
            halves = [v.view(dt) for v in views]
        with np.errstate(all="ignore"):
            y = np.asarray(fn(*[h.astype(np.float64) for h in halves])).astype(dt)
        if width == 4:
            u = y.view(np.uint16).astype(np.uint32)
            return (u[..., 0] | (u[..., 1] << 16)).view(np.int32)
        return y.view(np.int16)
    return f


def _f32_binary(fn, ftz: bool) -> Callable:
    """``fn`` of two f32 registers; ``.ftz`` flushes subnormal inputs and outputs."""
    if not ftz:
        return fn
    return lambda a, b: _ftz(fn(_ftz(np.asarray(a, np.float32)), _ftz(np.asarray(b, np.float32))))


#: PTX's two-operand float instructions: opcode -> (the modifiers modelled,
#: the function of the modifiers present). ``max``/``min``: ``+0.0 > -0.0``;
#: with ``.NaN`` a NaN operand gives NaN, without it the other operand (a NaN
#: result keeps an operand's payload: the GPU's canonical NaN, like every NaN
#: payload, is not modelled). ``add``/``sub``/``mul``: rounded to nearest.
FLOAT_BINARY: dict[str, tuple[frozenset[str], Callable[[set[str]], Callable]]] = {
    "max": (frozenset({"NaN", "ftz"}), lambda mods: arith.extremum(True, "NaN" in mods)),
    "min": (frozenset({"NaN", "ftz"}), lambda mods: arith.extremum(False, "NaN" in mods)),
    "add": (frozenset({"rn", "ftz"}), lambda mods: np.add),
    "sub": (frozenset({"rn", "ftz"}), lambda mods: np.subtract),
    "mul": (frozenset({"rn", "ftz"}), lambda mods: np.multiply),
}


def _prmt(a, b, c):
    def bits(x):
        return irtypes.unsigned(np.asarray(x, np.int32)).astype(np.uint64)

    out = ptx_block.prmt(bits(a), bits(b), bits(c))
    return np.asarray(out).astype(np.uint32).view(np.int32)


def _pure(o: Op, fn) -> Step:
    ins, out = o.ins, o.outs[0]
    if o.out_types[0].kind not in ("scalar", "vector"):
        raise o.unsupported(f"inline asm returning {o.out_types[0].text}")

    def step(fr: Frame) -> None:
        fr.regs[out] = fn(*[fr.regs[i] for i in ins])
    return step


def _value_fn(opcode: str, n_in: int) -> Callable | None:
    """The numpy function of value instruction ``opcode`` on ``n_in`` registers, or
    None where it is not modelled."""
    parts = opcode.split(".")
    base = ".".join(parts[:2]) if len(parts) > 1 and parts[1] in ("approx", "NaN") else parts[0]
    ftz = "ftz" in parts
    ty = parts[-1]
    if base in UNARY_F32 and n_in == 1:
        if ty == "f32":
            return _f32(UNARY_F32[base], ftz)
        if ty in ("f16", "f16x2", "bf16", "bf16x2") and base == "tanh.approx":
            return _packed(np.tanh, ty.removesuffix("x2"), 1)
        return None
    if base == "abs" and n_in == 1 and ty == "f32":  # exact (abs.ftz flushes subnormals)
        return _f32(np.abs, ftz)
    if base == "abs" and n_in == 1 and ty in ("f16", "f16x2", "bf16", "bf16x2"):
        return _packed(np.abs, ty.removesuffix("x2"), 1)
    if opcode in ("max.s16", "max.u16", "max.s16x2", "max.u16x2", "min.s16", "min.u16",
                  "min.s16x2", "min.u16x2") and n_in == 2:
        return _int16(np.maximum if base == "max" else np.minimum, ty[0] == "s")
    if parts[0] in FLOAT_BINARY and n_in == 2:
        modelled, function_of = FLOAT_BINARY[parts[0]]
        mods = set(parts[1:-1])
        if not mods <= modelled:
            return None  # .xorsign.abs, rounding modes other than .rn: not modelled
        fn = function_of(mods)
        if ty == "f32":
            def f32(a, b):
                return np.asarray(fn(np.asarray(a, np.float32), np.asarray(b, np.float32)),
                                  np.float32)
            return _f32_binary(f32, ftz)
        if ty in ("f16", "f16x2", "bf16", "bf16x2") and not ftz:
            return _packed(fn, ty.removesuffix("x2"), 2)
        return None  # .ftz of 16-bit types: not modelled
    if opcode == "prmt.b32" and n_in == 3:
        return _prmt
    return None


def _int16(fn, signed: bool):
    """max/min.{s16,u16}[x2]: per 16-bit half, as signed or unsigned integers, on
    i16 registers or i32 registers of two halves."""
    half = np.dtype(np.int16 if signed else np.uint16)

    def f(a, b):
        a, b = np.asarray(a), np.asarray(b)
        if a.dtype.itemsize == 2:
            return fn(a.view(half), b.view(half)).view(a.dtype)
        # (..., 2) halves, the low half first, as little-endian memory holds them
        ha = np.ascontiguousarray(a.astype(np.int32))[..., None].view(half)
        hb = np.ascontiguousarray(b.astype(np.int32))[..., None].view(half)
        return np.ascontiguousarray(fn(ha, hb)).view(np.int32)[..., 0]
    return f


def _value_instr(o: Op, opcode: str, n_in: int) -> Step | None:
    fn = _value_fn(opcode, n_in)
    return None if fn is None else _pure(o, fn)


ASM_ARG = re.compile(r"\$(\d+)")


def _parse(text: str) -> tuple[str | None, bool, str, list[str]]:
    """(predicate operand, negated, opcode, args) of a one-instruction string."""
    s = " ".join(text.replace("\n", " ").split()).strip()
    if s.count(";") != 1 or not s.endswith(";") or s.startswith("{"):
        return None, False, "", []
    s = s[:-1].strip()
    pred, neg = None, False
    m = re.match(r"@(!?)\$(\d+)\s+(.*)", s)
    if m:
        neg, pred, s = m.group(1) == "!", m.group(2), m.group(3)
    opcode, _, rest = s.partition(" ")
    args = [a.strip() for a in rest.split(",")] if rest.strip() else []
    return pred, neg, opcode, args


# --- helpers -----------------------------------------------------------------

def _literal_or_slot(a, arg_slot):
    """An operand of a PTX string: ("lit", int) or ("reg", slot); None stays None."""
    if a is None:
        return None
    a = a.strip()
    if re.fullmatch(r"\d+", a):
        return ("lit", int(a))
    return ("reg", arg_slot(a))


def _read(fr: Frame, operand, where: str) -> int:
    kind, v = operand
    return v if kind == "lit" else int(uniform(fr.regs[v], fr, "a barrier operand", where))


REMOTE_ARRIVE = re.compile(
    r"\{ \.reg \.b32 (\w+); @\$(\d+) mapa\.shared::cluster\.u32 \1, \$(\d+), \$(\d+); "
    r"@\$\2 mbarrier\.arrive\.shared::cluster\.b64 _, \[\1\]; \}")


def _remote_arrive(fr: Frame, pred: int, addr: int, rank: int, where: str) -> None:
    """``mapa`` + ``mbarrier.arrive.shared::cluster``: each thread whose
    predicate holds arrives once on the barrier at its SMEM offset in the block
    of CTA rank ``rank``."""
    b = fr.need_block("mbarrier.arrive.shared::cluster", where)
    m = effective(fr, [pred])
    addrs = per_thread(fr.regs[addr], fr.T).astype(np.int64)[m]
    ranks = per_thread(fr.regs[rank], fr.T).astype(np.int64)[m]
    rows = b.warp_rows[m]
    for (a, k) in sorted(set(zip(addrs.tolist(), ranks.tolist()))):
        sel = (addrs == a) & (ranks == k)
        bar = b.peer(k, where).barrier(a, where)
        if fr.sync is not None:  # orders the arriving warps' accesses for the peer's waiters
            fr.sync.release(np.unique(rows[sel]), bar.point)
        bar.arrive(int(sel.sum()), where)


ST_ASYNC = "st.async.cluster.shared::cluster.mbarrier::complete_tx::bytes"


def _st_async(fr: Frame, pred_slots, addr: int, vals: list[int], width: int, bar: int,
              where: str, site) -> None:
    """``st.async``: each thread stores its value(s) at a shared::cluster
    address (usually another block's SMEM) and completes their bytes on the
    mbarrier at a shared::cluster address, when issued."""
    b = fr.need_block("st.async", where)
    m = effective(fr, pred_slots)
    if not m.any():
        return
    r = fr.regs
    bits = np.dtype(np.uint32 if width == 4 else np.uint64)
    addrs = per_thread(r[addr], fr.T).astype(np.int64)
    space = fr.mem["cluster"] if b.cluster.size > 1 else None
    if space is None:
        raise Unsupported("st.async outside a cluster of several blocks", where)
    for k, v in enumerate(vals):
        x = np.asarray(r[v])
        if x.dtype.itemsize != width:
            raise Unsupported(f"st.async of {width} bytes from a {x.dtype} register", where)
        x = per_thread(np.array(x).view(bits), fr.T)
        space.store(addrs + k * width, x, bits, m, where)
    bars = per_thread(r[bar], fr.T).astype(np.int64)[m]
    if fr.sync is not None:
        elems = addrs[m][:, None] + np.arange(len(vals)) * width
        fr.sync.remote_async_writes(fr, m, elems, bars, width, site, where, "st.async")
    if fr.prof is not None:
        fr.prof.access(fr, "cluster", addrs[:, None] + np.arange(len(vals)) * width, 1, width,
                       True, site, mask=m)
    for a in np.unique(bars):
        b.remote_barrier(int(a), where).complete_tx(int((bars == a).sum()) * width * len(vals))


GATHER4 = "cp.async.bulk.tensor.2d.shared::cta.global.tile::gather4.mbarrier::complete_tx::bytes"
SCATTER4 = "cp.async.bulk.tensor.2d.global.shared::cta.tile::scatter4.bulk_group"


#: jax 0.12's TMA tile copies, as inline PTX (0.11 emits nvvm ops): a load
#: ``[smem], [desc, {coords}], [bar]`` or a store ``[desc, {coords}], [smem]``.
TMA_TILE = re.compile(r"cp\.async\.bulk\.tensor\.([1-5])d\.(shared::cta|global)"
                      r"\.(?:global|shared::cta)"
                      r"(?:\.mbarrier::complete_tx::bytes|\.bulk_group)")


def _tma_tile(match: re.Match, args: list[str], arg_slot, pred_slots, where: str, site):
    """The step of a TMA tile load (``shared::cta`` destination) or store."""
    from .. import tma

    if match[2] == "shared::cta":
        smem, desc, *coords, bar = (arg_slot(a) for a in args)
    else:
        desc, *coords, smem = (arg_slot(a) for a in args)
        bar = None

    def step(fr: Frame) -> None:
        b = fr.need_block("TMA copy", where)
        for t, d, s in _tma_issuers(fr, pred_slots, desc, smem, where):
            at = [int(per_thread(fr.regs[c], fr.T)[t]) for c in coords]
            if bar is None:
                tma.store(fr, d, s, at, where, check=tma_store_check(fr, t, site))
            else:
                target = b.barrier(per_thread(fr.regs[bar], fr.T)[t], where)
                n = tma.load(fr, d, s, at, where, smem_space=b.smem,
                             check=tma_load_check(fr, t, b, target, site))
                target.complete_tx(n)
    return step


def _tma_issuers(fr: Frame, pred_slots, desc: int, smem: int, where: str):
    """Each thread issuing a TMA copy: (thread, its descriptor, its SMEM address)."""
    from .. import tma

    for t in np.flatnonzero(effective(fr, pred_slots)):
        yield (t, tma.descriptor(fr, per_thread(fr.regs[desc], fr.T)[t], where),
               int(per_thread(fr.regs[smem], fr.T)[t]))


def _gather4(fr: Frame, pred_slots, smem: int, desc: int, col: int, rows: list[int],
             bar: int | None, where: str, site) -> None:
    """TMA ``tile::gather4`` (``bar`` given) or ``tile::scatter4``, per issuing
    thread, complete when issued."""
    from .. import tma

    b = fr.need_block("tile::gather4", where)
    r = fr.regs
    for t, d, s in _tma_issuers(fr, pred_slots, desc, smem, where):
        c = int(per_thread(r[col], fr.T)[t])
        rs = [int(per_thread(r[x], fr.T)[t]) for x in rows]
        if bar is None:
            tma.scatter4(fr, d, s, c, rs, where, check=tma_store_check(fr, t, site))
        else:
            target = b.barrier(per_thread(r[bar], fr.T)[t], where)
            n = tma.gather4(fr, d, s, c, rs, where, check=tma_load_check(fr, t, b, target, site))
            target.complete_tx(n)


def _bulk_copy(fr: Frame, pred_slots, dst: int, dst_space: str, src: int, src_space: str,
               n: int, bar: int | None, where: str, site) -> None:
    """A non-tensor bulk copy of n bytes, complete when issued: a load
    completes on ``bar``, a store joins the thread's bulk async-group."""
    b = fr.need_block("cp.async.bulk", where)
    m = effective(fr, pred_slots)
    r = fr.regs
    for t in np.flatnonzero(m):
        size = int(per_thread(r[n], fr.T)[t])
        s_addr, d_addr = int(per_thread(r[src], fr.T)[t]), int(per_thread(r[dst], fr.T)[t])
        data = fr.mem[src_space].read_bytes(s_addr, size, where).copy()
        fr.mem[dst_space].write_bytes(d_addr, data, where)
        if fr.prof is not None:
            fr.prof.tma(where, size, store=dst_space == "global")
        target = None if bar is None else b.barrier(per_thread(r[bar], fr.T)[t], where)
        check = (tma_store_check(fr, t, site, "TMA bulk copy") if target is None
                 else tma_load_check(fr, t, b, target, site))
        if check is not None and size:
            # bulk copies move 16-byte chunks (sizes and addresses are multiples)
            unit = 16 if size % 16 == 0 and s_addr % 16 == 0 and d_addr % 16 == 0 else 1
            chunks = np.arange(0, size, unit)
            check(fr.mem[src_space], s_addr + chunks, unit, False)
            check(fr.mem[dst_space], d_addr + chunks, unit, True)
        if target is not None:
            target.complete_tx(size)


# --- the handlers ------------------------------------------------------------
# Each does what the single chain of string matches did before the table: an
# operand count or predicate a handler does not model raises `i.unknown`.

# whole strings

# any string naming wgmma.mma_async, as `wgmma.is_wgmma` says
@ptx_text(r".*wgmma\.mma_async.*", "a WGMMA block as jax's wgmma.py emits it "
          "(wgmma.compile_wgmma: D = A @ B (+ D) for the warpgroup, complete when issued)")
def wgmma_block(i: Instr) -> Step:
    return wgmma.compile_wgmma(i.op, i.text)


@ptx_text(r"", "the empty string with outputs tied to inputs: an optimization barrier, "
          "no code (the outputs are the tied inputs)")
def optimization_barrier(i: Instr) -> Step:
    from jax._src.lib.mlir import ir
    o, ins, unknown = i.op, i.ins, i.unknown
    cons = ir.StringAttr(o.attr("constraints")).value.split(",")
    ins_c = [c for c in cons if not c.startswith("=") and not c.startswith("~")]
    if len(ins_c) != len(ins) or any(not c.isdigit() for c in ins_c):
        raise unknown
    ties = {int(c): k for k, c in enumerate(ins_c)}
    n_out = sum(1 for c in cons if c.startswith("="))
    if sorted(ties) != list(range(n_out)) or len(i.results) != 1:
        raise unknown

    def barrier(fr: Frame) -> None:
        vals = [fr.regs[ins[ties[j]]] for j in range(n_out)]
        if n_out == 1:
            fr.regs[o.outs[0]] = vals[0]
        else:
            fr.regs[o.outs[0]] = tuple(vals)
    return accumulator_use(barrier, MOVES)  # a pending WGMMA accumulator stays pending


@ptx_text(REMOTE_ARRIVE.pattern, "jax's arrival on a peer block's mbarrier (ClusterBarrier): "
          "mapa.shared::cluster + mbarrier.arrive.shared::cluster, predicated")
def remote_arrive(i: Instr) -> Step:
    if i.results:
        raise i.unknown
    m = REMOTE_ARRIVE.fullmatch(" ".join(i.text.split()))
    p_s, a_s, r_s = (i.ins[int(m.group(k))] for k in (2, 3, 4))
    loc = i.loc
    return lambda fr: _remote_arrive(fr, p_s, a_s, r_s, loc)


def _block_with_cvt(text: str, cvt: bool) -> bool:
    parsed = ptx_block.parse(text)
    return parsed is not None and any(op.startswith("cvt.") for op, *_ in parsed[1]) == cvt


@ptx_text(r"\{.*\}", "a block of register instructions around PTX conversions, as jax's "
          "FragmentedArray.astype emits them (emulate/ops/ptx_block.py): "
          "cvt.rn.satfinite[.relu].{e4m3,e5m2,e2m1,e2m3,e3m2}x2.{f32,f16x2,bf16x2}, "
          "cvt.{rz,rp}.satfinite.ue8m0x2.{f32,bf16x2}, cvt.rn[.relu].{f16,bf16}x2.<narrow>x2, "
          "with mov packing; exact, with PTX's satfinite (emulate/floats.py)",
          accepts=lambda text: _block_with_cvt(text, True))
@ptx_text(r"\{[^{]*(?:\{[^{}]*\}[^{]*)*\}", "a block of register instructions without a "
          "conversion, as jax's FragmentedArray.astype emits them (emulate/ops/ptx_block.py): "
          "mov, and/or/xor/not, shl/shr, lop3.b32, prmt.b32 (default mode), "
          "add/sub/mul.{f16,bf16}[x2] -- int8/int4 -> bf16, int4 -> int8/e4m3",
          accepts=lambda text: _block_with_cvt(text, False))
def register_block(i: Instr) -> Step:
    parsed = ptx_block.parse(i.text)
    if parsed is None:
        raise i.unknown
    return ptx_block.compile_block(i.op, parsed, i.unknown)


# value instructions: `$0 = op($1, ...)`, all through `_value_fn`; the patterns
# match exactly the opcodes it models for some operand count (it reads only the
# base name, `.ftz` and the type: other modifiers are ignored)

_MODIFIERS = r"(?:\.[^.]*)*"
_F16 = r"b?f16(?:x2)?"


@ptx_pattern(rf"(?:ex2|lg2|sin|cos|tanh|rsqrt|sqrt|rcp)\.approx{_MODIFIERS}\.f32",
             "ex2/lg2/sin/cos/tanh/rsqrt/sqrt/rcp.approx[.ftz].f32 $0, $1: the exact "
             "function rounded once (.ftz flushes subnormals)", value=True)
@ptx_pattern(rf"tanh\.approx{_MODIFIERS}\.{_F16}",
             "tanh.approx.{f16,f16x2,bf16,bf16x2} $0, $1: exact tanh per half, rounded once",
             value=True)
@ptx_pattern(rf"abs(?!\.(?:approx|NaN)\.){_MODIFIERS}\.(?:f32|{_F16})",
             "abs[.ftz].{f32,f16,f16x2,bf16,bf16x2} $0, $1: exact", value=True)
@ptx_pattern(r"(?:max|min)(?:\.NaN|\.ftz)*\.f32|(?:max|min)(?:\.NaN)*\." + _F16,
             "max/min[.ftz][.NaN].f32, max/min[.NaN].{f16,f16x2,bf16,bf16x2} $0, $1, $2: "
             "+0.0 > -0.0; .NaN NaN-propagating", value=True)
@ptx_pattern(r"(?:add|sub|mul)(?:\.rn|\.ftz)*\.f32|(?:add|sub|mul)(?:\.rn)*\." + _F16,
             "add/sub/mul[.rn][.ftz].f32, add/sub/mul[.rn].{f16,f16x2,bf16,bf16x2} $0, $1, $2: "
             "IEEE, rounded to nearest (other rounding modes are not modelled)", value=True)
@ptx_pattern(r"(?:max|min)\.[su]16(?:x2)?",
             "max/min.{s16,u16}[x2] $0, $1, $2: integer max/min per 16-bit half", value=True)
@ptx("prmt.b32", description="prmt.b32 $0, $1, $2, $3: byte permute (default mode)",
     value=True)
def value_instruction(i: Instr) -> Step:
    n_in = len(i.args) - 1
    if [f"${k}" for k in range(1, n_in + 1)] != i.args[1:] or n_in != len(i.ins):
        raise i.unknown
    step = _value_instr(i.op, i.opcode, n_in)
    if step is None:
        raise i.unknown
    return step


# every mma.sync form reaches the handler, which raises Unsupported naming
# those it does not model
@ptx_pattern(r"mma\.sync\.aligned\..*",
             "mma.sync.aligned.m16n8k{8,16,32,64}.row.col[.satfinite].{f32,s32}.A.B.{f32,s32} "
             "{d0..d3}, {a..}, {b..}, {c0..c3} (emulate/ops/mma_sync.py): each warp's "
             "D = A @ B + C in the PTX ISA's register fragments; f16/bf16/e4m3/e5m2 (fp8 mixed) "
             "into f32 "
             "through the tensor-core adder (emulate/tensorcore.py), s8/u8/s4/u4 (mixed "
             "signedness) into s32 exactly, wrapping (.satfinite: clamped); other forms raise "
             "Unsupported")
def mma_sync_warp(i: Instr) -> Step:
    if i.pred is not None:
        raise i.unknown
    return mma_sync.compile_mma_sync(i.op, i.opcode, i.text, i.unknown)


# side effects

@ptx("fence.mbarrier_init.release.cluster", "prefetch.tensormap", "griddepcontrol.wait",
     "griddepcontrol.launch_dependents", "wgmma.fence.sync.aligned")
@ptx_pattern(r"setmaxnreg\..*", "setmaxnreg.*: nothing to model (register allocation)")
def no_op(i: Instr) -> Step:
    """Nothing the emulator or the checker models: these order no memory access
    the checker tracks."""
    outs = i.outs

    def noop(fr: Frame) -> None:
        for out in outs:
            fr.regs[out] = None
    return noop


@ptx("fence.proxy.async.shared::cta", "fence.proxy.async", "fence.proxy.async.global")
def fence_proxy_async(i: Instr) -> Step:
    """Orders the thread's generic-proxy accesses with async-proxy ones in the
    state space it names, every space where it names none (the checker's
    proxy fence)."""
    if i.args:
        raise i.unknown
    return proxy_fence(i.opcode)


@ptx("cp.async.bulk.commit_group")
def bulk_commit_group(i: Instr) -> Step:
    """Closes the thread's bulk async-group of TMA stores."""
    return guarded(i, bulk_commit)


def guarded(i: Instr, fn: Callable[[Frame, list[int]], None]) -> Step:
    """The step of an instruction without operands that each thread executes
    under its guard (the ``commit_group``s): ``fn(frame, guard slots)``."""
    if i.args:
        raise i.unknown
    pred_slots = i.pred_slots
    return lambda fr: fn(fr, pred_slots)


@ptx("cp.async.bulk.wait_group", "cp.async.bulk.wait_group.read")
def bulk_wait_group(i: Instr) -> Step:
    """Waits until at most N bulk async-groups are pending (.read: their reads)."""
    if len(i.args) > 1 or i.pred is not None:
        raise i.unknown
    pending = int(i.args[0]) if i.args else 0
    read_only = i.opcode.endswith(".read")
    return lambda fr: bulk_wait(fr, pending, read_only)


@ptx("wgmma.commit_group.sync.aligned")
def wgmma_commit_group(i: Instr) -> Step:
    """Closes the warpgroup's WGMMA group."""
    if i.args:
        raise i.unknown
    return wgmma_commit


@ptx("wgmma.wait_group.sync.aligned")
def wgmma_wait_group(i: Instr) -> Step:
    """Waits until at most N WGMMA groups are pending."""
    if len(i.args) != 1:
        raise i.unknown
    pending = int(i.args[0])
    return lambda fr: wgmma_wait(fr, pending)


@ptx("bar.sync", "barrier.sync", "bar.sync.aligned", "barrier.sync.aligned")
def bar_sync(i: Instr) -> Step:
    """Barrier 0 of the whole block, or a named barrier of N threads."""
    text, loc, args = i.text, i.loc, i.args
    if len(args) == 1 and args[0] in ("0",):
        return lambda fr: full_block_barrier(fr, text, loc)
    if len(args) not in (1, 2):
        raise i.unknown
    ident, count = (_literal_or_slot(a, i.arg_slot) for a in (args + [None])[:2])

    def step(fr: Frame) -> None:
        n_ident = _read(fr, ident, loc)
        n = _read(fr, count, loc) if count is not None else fr.need_block(text, loc).block_T
        if n_ident == 0 and count is None:
            return full_block_barrier(fr, text, loc)
        named_barrier(fr, n_ident, n, text, loc)
    return step


@ptx("barrier.cluster.arrive.relaxed.aligned", "barrier.cluster.arrive.aligned",
     "barrier.cluster.arrive", "barrier.cluster.arrive.relaxed",
     "barrier.cluster.arrive.release.aligned", "barrier.cluster.arrive.release")
def barrier_cluster_arrive(i: Instr) -> Step:
    """The thread's arrival on the cluster barrier."""
    if i.args or i.pred is not None:
        raise i.unknown
    text, loc = i.text, i.loc
    return lambda fr: cluster_arrive(fr, text, loc)


@ptx("barrier.cluster.wait.aligned", "barrier.cluster.wait",
     "barrier.cluster.wait.acquire.aligned", "barrier.cluster.wait.acquire")
def barrier_cluster_wait(i: Instr) -> Step:
    """Waits for the cluster barrier's current phase."""
    if i.args or i.pred is not None:
        raise i.unknown
    text, loc = i.text, i.loc
    return lambda fr: cluster_wait(fr, text, loc)


@ptx_pattern(re.escape(ST_ASYNC) + r".*",
             f"{ST_ASYNC}[.v2|.v4].{{b,u,s,f}}{{32,64}} [addr], values, [mbar]: stores at a "
             "shared::cluster address completing their bytes on the mbarrier")
def st_async(i: Instr) -> Step:
    args = i.args
    if len(args) < 3:
        raise i.unknown
    ty = i.opcode[len(ST_ASYNC):]
    vec = 1
    if ty.startswith(".v2") or ty.startswith(".v4"):
        vec, ty = int(ty[2]), ty[3:]
    width = {".b32": 4, ".u32": 4, ".s32": 4, ".f32": 4, ".b64": 8, ".u64": 8, ".s64": 8,
             ".f64": 8}.get(ty)
    if width is None or len(args) != vec + 2:
        raise i.unknown
    a, bar = i.arg_slot(args[0]), i.arg_slot(args[-1])
    vals = [i.arg_slot(x) for x in args[1:-1]]
    pred_slots, loc, site = i.pred_slots, i.loc, i.site
    return lambda fr: _st_async(fr, pred_slots, a, vals, width, bar, loc, site)


@ptx("mapa.shared::cluster.u32", value=True)
def mapa_shared_cluster(i: Instr) -> Step:
    """``$0, $1, $2``: the shared::cluster address of SMEM address ``$1`` in the
    block of CTA rank ``$2`` (jax 0.12's ``get_cluster_ptr``; 0.11.2 emits
    ``nvvm.mapa``, modelled alike)."""
    if i.args != ["$0", "$1", "$2"] or len(i.ins) != 2 or len(i.results) != 1:
        raise i.unknown
    return mapa_step(i.ins[0], i.ins[1], i.results[0], i.loc)


@ptx("mbarrier.arrive.expect_tx.release.cluster.shared::cluster.b64",
     "mbarrier.arrive.expect_tx.release.cta.shared::cta.b64")
def mbarrier_arrive_expect_tx(i: Instr) -> Step:
    """``_, [mbar], tx``: expects tx bytes and arrives once per thread (jax 0.12
    emits the CTA-scope form for a block's own barriers)."""
    args = i.args
    if len(args) != 3 or args[0] != "_":
        raise i.unknown
    a, tx = i.arg_slot(args[1]), i.arg_slot(args[2])
    remote = ".cluster." in i.opcode
    pred_slots, loc = i.pred_slots, i.loc
    return lambda fr: mbarrier_arrive(fr, a, effective(fr, pred_slots), loc, tx_slot=tx,
                                      remote=remote)


@ptx("mbarrier.init.shared::cta.b64")
def mbarrier_init_shared(i: Instr) -> Step:
    """``[mbar], count``: initialises an mbarrier for count arrivals."""
    if len(i.args) != 2:
        raise i.unknown
    a, n = i.arg_slot(i.args[0]), i.arg_slot(i.args[1])
    pred_slots, loc = i.pred_slots, i.loc
    return lambda fr: mbarrier_init(fr, a, n, effective(fr, pred_slots), loc)


@ptx("mbarrier.arrive.release.cta.shared::cta.b64", "mbarrier.arrive.shared::cta.b64",
     "mbarrier.arrive.shared.b64")
def mbarrier_arrive_shared(i: Instr) -> Step:
    """``_, [mbar][, count]``: arrives once (or count times) per thread."""
    args = i.args
    if not args or args[0] != "_":
        raise i.unknown
    a = i.arg_slot(args[1])
    cnt = _literal_or_slot(args[2], i.arg_slot) if len(args) > 2 else None
    pred_slots, loc = i.pred_slots, i.loc
    if cnt is not None and cnt[0] == "lit":
        k = cnt[1]
        return lambda fr: mbarrier_arrive(fr, a, effective(fr, pred_slots), loc, count_const=k)
    cs = cnt[1] if cnt is not None else None
    return lambda fr: mbarrier_arrive(fr, a, effective(fr, pred_slots), loc, count_slot=cs)


@ptx("mbarrier.complete_tx.shared::cta.b64")
def mbarrier_complete_tx(i: Instr) -> Step:
    """``[mbar], tx``: completes tx bytes, releasing like an arrival."""
    if len(i.args) != 2:
        raise i.unknown
    a, n = i.arg_slot(i.args[0]), i.arg_slot(i.args[1])
    pred_slots, loc = i.pred_slots, i.loc

    def complete_tx(fr: Frame) -> None:
        b = fr.need_block("mbarrier.complete_tx", loc)
        m = effective(fr, pred_slots)
        addrs = per_thread(fr.regs[a], fr.T)[m]
        tx = per_thread(fr.regs[n], fr.T)[m]
        rows = b.warp_rows[m]
        for ad, t, row in zip(addrs, tx, rows):
            bar = b.barrier(ad, loc)
            if fr.sync is not None:  # releases like an arrival
                fr.sync.release(row, bar.point)
            bar.complete_tx(int(t))
    return complete_tx


@ptx("cp.async.bulk.shared::cta.global.mbarrier::complete_tx::bytes")
def bulk_copy_load(i: Instr) -> Step:
    """``[smem], [gmem], n, [mbar]``: a non-tensor bulk load of n bytes, completing
    on the mbarrier."""
    if len(i.args) != 4:
        raise i.unknown
    dst, src, n, bar = (i.arg_slot(a) for a in i.args)
    pred_slots, loc, site = i.pred_slots, i.loc, i.site
    return lambda fr: _bulk_copy(fr, pred_slots, dst, "shared", src, "global", n, bar, loc,
                                 site)


@ptx("cp.async.bulk.global.shared::cta.bulk_group")
def bulk_copy_store(i: Instr) -> Step:
    """``[gmem], [smem], n``: a non-tensor bulk store of n bytes in the thread's
    bulk async-group."""
    if len(i.args) != 3:
        raise i.unknown
    dst, src, n = (i.arg_slot(a) for a in i.args)
    pred_slots, loc, site = i.pred_slots, i.loc, i.site
    return lambda fr: _bulk_copy(fr, pred_slots, dst, "global", src, "shared", n, None, loc,
                                 site)


@ptx_pattern(TMA_TILE.pattern, "cp.async.bulk.tensor.{1-5}d tile copies: a load "
             "[smem], [desc, {coords}], [mbar] completing on the mbarrier, or a store "
             "[desc, {coords}], [smem] in the bulk async-group (jax 0.12)")
def tma_tile(i: Instr) -> Step:
    tile = TMA_TILE.fullmatch(i.opcode)
    if len(i.args) != int(tile[1]) + (3 if tile[2] == "shared::cta" else 2):
        raise i.unknown
    return _tma_tile(tile, i.args, i.arg_slot, i.pred_slots, i.loc, i.site)


@ptx(GATHER4)
def tma_gather4(i: Instr) -> Step:
    """``[smem], [desc, {col, r0..r3}], [mbar]``: a TMA gather of four rows."""
    if len(i.args) != 8:
        raise i.unknown
    smem, desc, col, *rows, bar = (i.arg_slot(a) for a in i.args)
    pred_slots, loc, site = i.pred_slots, i.loc, i.site
    return lambda fr: _gather4(fr, pred_slots, smem, desc, col, rows, bar, loc, site)


@ptx(SCATTER4)
def tma_scatter4(i: Instr) -> Step:
    """``[desc, {col, r0..r3}], [smem]``: a TMA scatter of four rows."""
    if len(i.args) != 7:
        raise i.unknown
    desc, col, *rows, smem = (i.arg_slot(a) for a in i.args)
    pred_slots, loc, site = i.pred_slots, i.loc, i.site
    return lambda fr: _gather4(fr, pred_slots, smem, desc, col, rows, None, loc, site)
