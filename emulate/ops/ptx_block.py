"""Straight-line PTX register blocks: the ``{ .reg ...; instr; ...; }``
strings jax's ``FragmentedArray.astype`` emits for its dtype conversions
(fp8/fp6/fp4/ue8m0 ``cvt``s wrapped in register packing, the int8 -> bf16
``prmt`` + ``sub.bf16x2`` trick, int4 -> bf16/int8/e4m3 look-up tables).

:func:`parse` splits such a string into register declarations and
instructions; it returns None unless every instruction is one this module
models (:func:`semantics`), there is no branch or predicate, and some
instruction writes ``$0``. :func:`compile_block` turns the parse into a step
that runs the instructions in order for all threads at once: every register is
a numpy ``uint64`` array of its bits (one entry per thread, or a scalar when
uniform), masked to the register's declared width.

Modelled instructions (the PTX ISA's definitions):

* ``mov.b{8,16,32,64} d, a``, where ``d`` or ``a`` may be a vector ``{x, y, ...}``
  of equal parts, the first part the least significant (``_`` discards);
* ``and/or/xor.b{16,32}``, ``not.b{16,32}``, ``shl.b{16,32}``,
  ``shr.{b,u}{16,32}`` (logical), ``shr.s{16,32}`` (arithmetic);
* ``lop3.b32 d, a, b, c, immLut``: bit i of d is bit ``(a_i<<2)|(b_i<<1)|c_i``
  of immLut; immLut may be an expression of integer literals and ``& | ^ ~``;
* ``prmt.b32 d, a, b, c`` (default mode; the .f4e/.b4e/.rc8/.ecl/.ecr/.rc16
  modes are not modelled): byte i of d is byte ``c[4i+2:4i]`` of ``{b, a}``, or
  that byte's sign replicated when ``c[4i+3]`` is set;
* ``add/sub/mul[.rn].{f16,bf16}[x2]``: IEEE on each half, rounded to nearest even;
* the ``cvt`` conversions of :mod:`smalti.emulate.floats`:
  ``cvt.rn.satfinite[.relu].{e4m3,e5m2,e2m1,e2m3,e3m2}x2.{f32,f16x2,bf16x2}``,
  ``cvt.{rz,rp}.satfinite.ue8m0x2.{f32,bf16x2}`` and their inverses
  ``cvt.rn[.relu].{f16,bf16}x2.<narrow>x2``. Two f32 sources ``a, b`` put a's
  result in the upper half; an x2 source keeps its halves in place. e2m1x2 is
  one byte (a nibble each); e2m3x2 and e3m2x2 one value in the low 6 bits of
  each byte."""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Callable

import numpy as np

from .. import floats, irtypes
from ..compiler import Op, Step
from ..machine import Frame

U64 = np.uint64
BF16 = np.dtype(irtypes.SCALARS["bf16"])
HALF = {"f16": np.dtype(np.float16), "bf16": BF16}


def _mask(bits: int) -> int:
    return (1 << bits) - 1


# --- instructions --------------------------------------------------------------
# Each takes the source values (uint64 arrays) and returns the destination's.

def _logic(fn: Callable, bits: int) -> Callable:
    return lambda *xs: fn(*xs) & U64(_mask(bits))


def _shift(kind: str, bits: int) -> Callable:
    def shift(a, n):
        a = a & U64(_mask(bits))
        big = n >= U64(bits)  # a shift by the width or more clears (or fills with the sign)
        n = np.minimum(n, U64(bits - 1))
        if kind == "shl":
            return np.where(big, U64(0), (a << n) & U64(_mask(bits)))
        if kind == "shr.s":
            sign = ((a >> U64(bits - 1)) & U64(1)).astype(np.int64)
            signed = a.astype(np.int64) - sign * (1 << bits)
            return (signed >> n.astype(np.int64)).astype(U64) & U64(_mask(bits))
        return np.where(big, U64(0), a >> n)
    return shift


def _lop3(a, b, c, lut):
    out = np.zeros(np.broadcast(a, b, c).shape, U64)
    lut = np.asarray(lut, U64)
    for i in range(32):
        bit = U64(i)
        idx = (((a >> bit) & U64(1)) << U64(2)) | (((b >> bit) & U64(1)) << U64(1)) | (
            (c >> bit) & U64(1))
        out = out | (((lut >> idx) & U64(1)) << bit)
    return out


def prmt(a, b, c):
    """``prmt.b32`` (default mode) on ``uint64`` bits: byte i of the result is
    byte ``c[4i+2:4i]`` of ``{b, a}``, or its sign replicated when ``c[4i+3]``
    is set."""
    src = (a & U64(_mask(32))) | ((b & U64(_mask(32))) << U64(32))
    if np.ndim(c) == 0:  # an immediate or uniform selector (jax's blocks): picked in Python
        return _prmt_uniform(src, int(c), np.broadcast(a, b).shape)
    out = np.zeros(np.broadcast(a, b, c).shape, U64)
    for i in range(4):
        sel = (c >> U64(4 * i)) & U64(0xF)
        byte = (src >> ((sel & U64(7)) * U64(8))) & U64(0xFF)
        sign = np.where(byte & U64(0x80), U64(0xFF), U64(0))
        out = out | (np.where(sel & U64(8), sign, byte) << U64(8 * i))
    return out


def _prmt_uniform(src, c: int, shape: tuple[int, ...]):
    out = np.zeros(shape, U64)
    for i in range(4):
        sel = (c >> (4 * i)) & 0xF
        byte = (src >> U64(8 * (sel & 7))) & U64(0xFF)
        if sel & 8:
            byte = np.where(byte & U64(0x80), U64(0xFF), U64(0))
        out |= byte << U64(8 * i)
    return out


def _halves(x, n: int) -> list:
    """The n 16-bit halves of x (n = 1: a 16-bit register), lowest first."""
    return [(x >> U64(16 * k)) & U64(0xFFFF) for k in range(n)]


def _packed_float(fn: Callable, half: str, n: int) -> Callable:
    dt = HALF[half]

    def f(*xs):
        parts = [_halves(x, n) for x in xs]
        out = U64(0)
        for k in range(n):
            vals = [floats.from_bits16(p[k], dt) for p in parts]
            with np.errstate(all="ignore"):
                y = np.asarray(fn(*vals)).astype(dt).view(np.uint16).astype(U64)
            out = out | (y << U64(16 * k))
        return out
    return f


CVT_DOWN = re.compile(r"cvt\.(rn|rz|rp)((?:\.satfinite|\.relu)*)\."
                      r"(e4m3|e5m2|e2m1|e2m3|e3m2|ue8m0)x2\.(f32|f16x2|bf16x2)")
CVT_UP = re.compile(r"cvt\.rn(\.relu)?\.(f16|bf16)x2\.(e4m3|e5m2|e2m1|e2m3|e3m2|ue8m0)x2")
#: bits each narrow value takes in a packed x2 register
SLOT = {"e2m1": 4, "e2m3": 8, "e3m2": 8}


def _cvt_down(m: re.Match) -> tuple[Callable, int] | None:
    rnd, mods, narrow, src = m.groups()
    mods = mods.split(".")[1:]
    if sorted(mods) not in (["satfinite"], ["relu", "satfinite"]) or len(set(mods)) != len(mods):
        return None
    relu = "relu" in mods
    if (narrow == "ue8m0") != (rnd in ("rz", "rp")) or (narrow == "ue8m0" and relu):
        return None
    if narrow == "ue8m0" and src == "f16x2":
        return None
    fmt, slot = floats.FORMATS[narrow], SLOT.get(narrow, 8)

    def enc(v):
        return floats.encode(v, fmt, rnd, True, relu).astype(U64)
    if src == "f32":
        def from_f32(a, b):
            va = (a & U64(_mask(32))).astype(np.uint32).view(np.float32)
            vb = (b & U64(_mask(32))).astype(np.uint32).view(np.float32)
            return (enc(va) << U64(slot)) | enc(vb)
        return from_f32, 2
    dt = HALF[src.removesuffix("x2")]

    def from_x2(a):
        lo, hi = _halves(a, 2)
        return (enc(floats.from_bits16(hi, dt)) << U64(slot)) | enc(floats.from_bits16(lo, dt))
    return from_x2, 1


def _cvt_up(m: re.Match) -> tuple[Callable, int] | None:
    relu, wide, narrow = m.groups()
    if narrow == "ue8m0" and (wide != "bf16" or relu):
        return None
    fmt, slot, dt = floats.FORMATS[narrow], SLOT.get(narrow, 8), HALF[wide]

    def up(a):
        lo = floats.decode(a & U64(_mask(slot)), fmt)
        hi = floats.decode((a >> U64(slot)) & U64(_mask(slot)), fmt)
        return ((floats.to_bits16(hi, dt, bool(relu)).astype(U64) << U64(16))
                | floats.to_bits16(lo, dt, bool(relu)).astype(U64))
    return up, 1


BINARY_FLOAT = {"add": np.add, "sub": np.subtract, "mul": np.multiply}
LOGIC = {"and": lambda a, b: a & b, "or": lambda a, b: a | b, "xor": lambda a, b: a ^ b}


def semantics(opcode: str) -> tuple[Callable, int] | None:
    """(function of the source values, number of sources) of a non-``mov``
    instruction, or None where it is not modelled."""
    parts = opcode.split(".")
    base, ty = parts[0], parts[-1]
    bits = int(ty[1:]) if re.fullmatch(r"[bus](16|32)", ty) else None
    if base in LOGIC and len(parts) == 2 and ty[0] == "b" and bits:
        return _logic(LOGIC[base], bits), 2
    if base == "not" and len(parts) == 2 and ty[0] == "b" and bits:
        return _logic(lambda a: ~a, bits), 1
    if base == "shl" and len(parts) == 2 and ty[0] == "b" and bits:
        return _shift("shl", bits), 2
    if base == "shr" and len(parts) == 2 and bits:
        return _shift("shr.s" if ty[0] == "s" else "shr", bits), 2
    if opcode == "lop3.b32":
        return _lop3, 4
    if opcode == "prmt.b32":
        return prmt, 3
    if base in BINARY_FLOAT and parts[1:-1] in ([], ["rn"]):
        m = re.fullmatch(r"(b?f16)(x2)?", ty)
        if m:
            return _packed_float(BINARY_FLOAT[base], m[1], 2 if m[2] else 1), 2
    if m := CVT_DOWN.fullmatch(opcode):
        return _cvt_down(m)
    if m := CVT_UP.fullmatch(opcode):
        return _cvt_up(m)
    return None


# --- parsing -------------------------------------------------------------------

REG_DECL = re.compile(r"\.reg\s+\.(b8|b16|b32|b64|pred)\s+(.+)")
NAME = re.compile(r"[A-Za-z_%][\w%]*")
MOV = re.compile(r"mov\.b(8|16|32|64)")


def _split_operands(rest: str) -> list[str]:
    """Operands separated by top-level commas (not those inside ``{}``/``()``)."""
    out, depth, cur = [], 0, ""
    for ch in rest:
        depth += 1 if ch in "{(" else -1 if ch in "})" else 0
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        out.append(cur.strip())
    return out


@functools.cache  # (operand strings recur: a block's step reads them every run)
def _immediate(a: str) -> int | None:
    """An integer literal, or a parenthesized expression of them with ``& | ^ ~``."""
    try:
        tree = ast.parse(a.strip(), mode="eval").body
    except SyntaxError:
        return None

    def ev(n):
        if isinstance(n, ast.Constant) and isinstance(n.value, int):
            return n.value
        if isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.Invert):
            return ~ev(n.operand)
        if isinstance(n, ast.BinOp) and type(n.op) in (ast.BitAnd, ast.BitOr, ast.BitXor):
            x, y = ev(n.left), ev(n.right)
            return {ast.BitAnd: x & y, ast.BitOr: x | y, ast.BitXor: x ^ y}[type(n.op)]
        raise ValueError
    try:
        return ev(tree) & _mask(64)
    except ValueError:
        return None


def _reg_bits(t: irtypes.T) -> int:
    """The bits of an asm operand of MLIR type ``t`` (a vector: all its elements)."""
    if t.kind == "scalar":
        return t.bits
    if t.kind == "vector" and len(t.shape) == 1:
        return t.bits * t.shape[0]
    return 0


def _to_bits(x, t: irtypes.T) -> np.ndarray:
    """A register's bits as uint64; a vector's element 0 the least significant."""
    u = irtypes.unsigned(np.asarray(x, t.dtype)).astype(U64)
    if t.kind == "scalar":
        return u
    out = U64(0)
    for j in range(t.shape[0]):
        out = out | (u[..., j] << U64(t.bits * j))
    return out


def _from_bits(v: np.ndarray, t: irtypes.T) -> np.ndarray:
    """The vector of type ``t`` whose bits are ``v``."""
    v = np.asarray(v, U64)
    parts = [(v >> U64(t.bits * j)) & U64(_mask(t.bits)) for j in range(t.shape[0])]
    return np.stack(parts, -1).astype(irtypes.UNSIGNED[t.bits]).view(t.dtype)


def _type_bits(ty: str) -> int:
    """The width of an instruction type's operands (``b32``, ``u16``, ``bf16x2``...)."""
    m = re.fullmatch(r"[bus](\d+)", ty)
    if m:
        return int(m[1])
    return 16 if ty in ("f16", "bf16") else 32


def _strip_comments(text: str) -> str:
    return "\n".join(line.split("//")[0] for line in text.splitlines())


def parse(text: str):
    """(register widths, [(opcode, operands, fn, n_sources)]) of a block every
    instruction of which is modelled, or None."""
    s = " ".join(_strip_comments(text).split())
    if not (s.startswith("{") and s.endswith("}")):
        return None
    regs: dict[str, int] = {}
    instrs = []
    for stmt in s[1:-1].split(";"):
        stmt = stmt.strip()
        if not stmt:
            continue
        if stmt.startswith(".reg"):
            m = REG_DECL.fullmatch(stmt)
            if not m or m[1] == "pred":
                return None
            width = int(m[1][1:])
            for name in (n.strip() for n in m[2].split(",")):
                arr = re.fullmatch(r"(\w+)<(\d+)>", name)
                names = [f"{arr[1]}{k}" for k in range(int(arr[2]))] if arr else [name]
                for n in names:
                    if not NAME.fullmatch(n):
                        return None
                    regs[n] = width
            continue
        opcode, _, rest = stmt.partition(" ")
        ops = _split_operands(rest)
        if not ops or opcode.startswith("@"):
            return None
        if MOV.fullmatch(opcode):
            if len(ops) != 2:
                return None
            instrs.append((opcode, ops, None, 1))
            continue
        sem = semantics(opcode)
        if sem is None or len(ops) != sem[1] + 1:
            return None
        instrs.append((opcode, ops, *sem))
    if not any(ops[0] == "$0" for _, ops, _, _ in instrs):
        return None
    return regs, instrs


def compile_block(o: Op, parsed, unknown: Exception) -> Step:
    """The step of a parsed block: inputs ``$n_out...`` from the op's operands,
    outputs ``$0...`` into its result (a tuple for several)."""
    regs, instrs = parsed
    n_out = sum(1 for t in o.out_types if t.kind != "none")
    out_t = o.out_types[0] if n_out else None
    if out_t is None:
        raise unknown
    if out_t.kind == "struct":
        out_bits = [int(b) for b in re.findall(r"\bi(\d+)\b", out_t.text)]
        if not out_t.text.startswith("!llvm.struct<(") or \
                re.sub(r"\bi\d+\b|[\s,()]", "", out_t.text[len("!llvm.struct<"):-1]):
            raise unknown  # only structs of integers
    elif out_t.kind in ("scalar", "vector") and out_t.dtype.kind in "iu" and out_t.bits >= 8:
        out_bits = [_reg_bits(out_t)]
    else:
        raise unknown
    ins = o.ins
    in_bits = [_reg_bits(t) for t in o.in_types]
    if not all(b in (8, 16, 32, 64) for b in in_bits + out_bits):
        raise unknown
    in_types = o.in_types
    n_outs = len(out_bits)
    widths = dict(regs)
    for k, b in enumerate(out_bits + in_bits):
        widths[f"${k}"] = b

    def width_of(name: str) -> int:
        if name not in widths:
            raise unknown
        return widths[name]

    for _, ops, _, _ in instrs:  # an undeclared register is reported at compile time
        for a in ops:
            for part in (p.strip() for p in a.strip("{} ").split(",")):
                if part != "_" and _immediate(part) is None:
                    width_of(part)

    def value(env: dict, a: str, bits: int):
        imm = _immediate(a)
        if imm is not None:
            return U64(imm & _mask(bits))
        if a not in env:
            raise unknown  # read before any write
        return env[a]

    def step(fr: Frame) -> None:
        env: dict = {}
        for k, slot in enumerate(ins):
            env[f"${k + n_outs}"] = _to_bits(fr.regs[slot], in_types[k])
        for opcode, ops, fn, _ in instrs:
            if fn is None:  # mov: pack or unpack
                bits = _type_bits(opcode.split(".")[-1])
                dst, src = ops
                if src.startswith("{"):
                    parts = [p.strip() for p in src.strip("{} ").split(",")]
                    w = bits // len(parts)
                    v = U64(0)
                    for k, p in enumerate(parts):
                        v = v | ((value(env, p, w) & U64(_mask(w))) << U64(w * k))
                else:
                    v = value(env, src, bits) & U64(_mask(bits))
                if dst.startswith("{"):
                    parts = [p.strip() for p in dst.strip("{} ").split(",")]
                    w = bits // len(parts)
                    for k, p in enumerate(parts):
                        if p != "_":
                            env[p] = (v >> U64(w * k)) & U64(_mask(min(w, width_of(p))))
                else:
                    env[dst] = v & U64(_mask(width_of(dst)))
                continue
            dst, *srcs = ops
            sbits = _type_bits(opcode.split(".")[-1])
            vals = [value(env, a, sbits) for a in srcs]
            env[dst] = np.asarray(fn(*vals), U64) & U64(_mask(width_of(dst)))
        outs = []
        for k, b in enumerate(out_bits):
            if f"${k}" not in env:
                raise unknown
            outs.append(np.asarray(env[f"${k}"]).astype(irtypes.UNSIGNED[b])
                        .view(irtypes.SIGNED[b]))
        if out_t.kind == "vector":
            outs = [_from_bits(env["$0"], out_t)]
        fr.regs[o.outs[0]] = outs[0] if n_outs == 1 and out_t.kind != "struct" else tuple(outs)
    return step
