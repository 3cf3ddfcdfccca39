"""Atomic inline PTX (:mod:`smalti.emulate.ops.atomics`), op by op: ``red``
of every operation and element type its form admits (the spellings jax
writes: ``FragmentedArray``'s atomic stores, semaphore signals), ``atom`` of
every operation returning the old value (``cas``: semaphore waits), strong
loads and the memory fences that end a wait -- 32 threads on a GMEM or SMEM
buffer, several threads on one element, against numpy applied in thread
order on edge values (zeros, signed extremes, wraparound of ``inc``/``dec``,
NaN for ``min``/``max``)."""

from __future__ import annotations

import numpy as np
import pytest

from .harness import FLOAT_TYPES, assert_same_bits, covers, float_edges, int_edges, run
from .test_ptx import form

T = 32
RED_FORM = form("red.global.relaxed.gpu.add.u32 [$0], $1;")
ATOM_FORM = form("atom.global.add.u32 $0, [$1], $2;")
LD_FORM = form("ld.acquire.sys.u32 $0,[$1];")
FENCES = [f"fence.{sem}.{scope}" for sem in ("acquire", "release", "acq_rel", "sc")
          for scope in ("cta", "cluster", "gpu", "sys")]

I32_EDGES = np.array(int_edges("i32"), np.int64)


def _wrap32(x) -> np.ndarray:
    return np.asarray(x, np.int64).astype(np.uint32)


def _reference(op: str, dt: np.dtype):
    """new = f(old, v) on elements of ``dt``, from the PTX ISA (ints unsigned
    unless ``dt`` is signed)."""
    if op == "add":
        if dt.kind in "fV":
            return lambda a, b: dt.type(np.float64(a) + np.float64(b))
        return lambda a, b: np.array((int(a) + int(b)) & 0xFFFFFFFF, np.uint32).view(dt)[()]
    if op in ("min", "max"):
        if dt.kind in "fV":
            fn = np.fmin if op == "min" else np.fmax  # a NaN operand loses
            return lambda a, b: dt.type(fn(np.float64(a), np.float64(b)))
        return lambda a, b: min(a, b) if op == "min" else max(a, b)
    if op == "and":
        return lambda a, b: a & b
    if op == "or":
        return lambda a, b: a | b
    if op == "xor":
        return lambda a, b: a ^ b
    if op == "exch":
        return lambda a, b: b
    if op == "inc":
        return lambda a, b: dt.type(0) if a >= b else dt.type(a + dt.type(1))
    if op == "dec":
        return lambda a, b: b if a == 0 or a > b else dt.type(a - dt.type(1))
    raise ValueError(op)


def _in_thread_order(mem: np.ndarray, elems: np.ndarray, slot: np.ndarray, active: np.ndarray,
                     fn) -> tuple[np.ndarray, np.ndarray]:
    """``elems`` (T, n) combined into ``mem`` at ``slot * n + j`` by the
    active threads in turn; (memory after, what each found)."""
    mem = mem.copy()
    found = np.zeros_like(elems)
    n = elems.shape[1]
    with np.errstate(all="ignore"):
        for t in np.flatnonzero(active):
            for j in range(n):
                at = slot[t] * n + j
                found[t, j] = mem[at]
                mem[at] = fn(mem[at], elems[t, j])
    return mem, found


def _address(space: str, nbytes_per_thread: int, slots: int) -> tuple[str, str]:
    """MLIR computing %p, the thread's element ``t % slots`` of %buf, and the
    buffer's pointer type."""
    pty = "!llvm.ptr<3>" if space == "shared" else "!llvm.ptr"
    return f"""
      %t = nvvm.read.ptx.sreg.tid.x : i32
      %nslots = llvm.mlir.constant({slots} : i32) : i32
      %width = llvm.mlir.constant({nbytes_per_thread} : i32) : i32
      %slot = llvm.urem %t, %nslots : i32
      %off = llvm.mul %slot, %width : i32
      %p = llvm.getelementptr %buf[%off] : ({pty}, i32) -> {pty}, i8""", pty


def _red(opcode: str, regs: list[np.ndarray], reg_type: str, mem: np.ndarray, slots: int,
         space: str = "global", predicated: bool = False) -> np.ndarray:
    """Each thread's ``red`` of its registers ``regs`` into element ``t % slots``
    of a buffer holding ``mem``; returns the buffer after."""
    nbytes = sum(r.dtype.itemsize for r in regs)
    addr, pty = _address(space, nbytes, slots)
    names = [f"%v{k}" for k in range(len(regs))]
    operands = ", ".join(f"${k + 1}" for k in range(len(regs)))
    operands = f"{{{operands}}}" if len(regs) > 1 else operands
    letter = "h" if reg_type == "i16" else "r"
    constraints = ",".join(["l", *[letter] * len(regs)])
    args = ", ".join(["%p", *names])
    types = ", ".join([pty, *[reg_type] * len(regs)])
    guard = ""
    if predicated:  # only the even threads
        guard = f"@${len(regs) + 1} "
        constraints += ",b"
        args += ", %even"
        types += ", i1"
        addr += """
      %one = llvm.mlir.constant(1 : i32) : i32
      %zero = llvm.mlir.constant(0 : i32) : i32
      %bit = llvm.and %t, %one : i32
      %even = arith.cmpi eq, %bit, %zero : i32"""
    body = addr + (f'\nllvm.inline_asm has_side_effects "{guard}{opcode} [$0], {operands};", '
                   f'"{constraints}" {args} : ({types}) -> ()')
    inputs = {"buf": (pty, mem), **{n[1:]: (reg_type, r) for n, r in zip(names, regs)}}
    return run(body, inputs, threads=T)["buf"]


def _check_red(opcode: str, op: str, dt: np.dtype, regs: list[np.ndarray], reg_type: str,
               mem: np.ndarray, slots: int, space: str = "global", predicated: bool = False):
    got = _red(opcode, regs, reg_type, mem, slots, space, predicated)
    elems = np.concatenate([np.ascontiguousarray(r).reshape(T, -1).view(np.uint8) for r in regs],
                           axis=1).view(dt)
    active = (np.arange(T) % 2 == 0) if predicated else np.ones(T, bool)
    want, _ = _in_thread_order(mem.view(dt), elems, np.arange(T) % slots, active,
                               _reference(op, dt))
    if dt.kind in "fV" and op in ("min", "max"):  # the sign of a zero from two zeros is not said
        np.testing.assert_array_equal(got.view(dt).astype(np.float64), want.astype(np.float64),
                                      err_msg=opcode)
    else:
        assert_same_bits(got.view(dt), want)


def _ints(seed: int, n: int) -> np.ndarray:
    """``n`` 32-bit values: every edge value of i32, then random ones."""
    rng = np.random.default_rng(seed)
    extra = rng.integers(-2 ** 31, 2 ** 31, max(n - I32_EDGES.size, 0))
    return np.concatenate([I32_EDGES, extra])[:n].astype(np.int64)


INT_RED = [("add", "u32"), ("add", "s32"), ("min", "u32"), ("min", "s32"), ("max", "u32"),
           ("max", "s32"), ("and", "b32"), ("or", "b32"), ("xor", "b32"), ("inc", "u32"),
           ("dec", "u32")]
INT_DT = {"u32": np.dtype(np.uint32), "s32": np.dtype(np.int32), "b32": np.dtype(np.uint32)}


@pytest.mark.parametrize("op,ty", INT_RED)
@covers(RED_FORM)
def test_red_of_every_integer_operation_equals_numpy_in_thread_order(op, ty):
    """Over the edge values of i32 (0, +-1, INT_MIN, INT_MAX...): unique
    elements (all at once) and 8 threads to an element (one after another),
    in GMEM (jax's .global ... .gpu spelling) and SMEM (.shared::cta ... .cta),
    and predicated to the even threads; inc/dec wrap at the bound and at 0."""
    dt = INT_DT[ty]
    vals = _wrap32(_ints(1, T)).view(np.int32)
    mem = _wrap32(_ints(2, T)[::-1]).view(np.int32)
    if op in ("inc", "dec"):  # bounds around the memory values: some wrap, some do not
        mem = _wrap32(np.arange(T) % 5).view(np.int32)
        vals = _wrap32(np.array([0, 1, 2, 3, 4, 2 ** 32 - 1] * 6)[:T]).view(np.int32)
    for slots in (T, 4):
        _check_red(f"red.global.relaxed.gpu.{op}.{ty}", op, dt, [vals], "i32", mem, slots)
        _check_red(f"red.shared::cta.relaxed.cta.{op}.{ty}", op, dt, [vals], "i32", mem, slots,
                   space="shared")
    _check_red(f"red.release.sys.global.{op}.{ty}", op, dt, [vals], "i32", mem, 4,
               predicated=True)


def _float_vals(ty: str, n: int, seed: int) -> np.ndarray:
    e = float_edges(ty)
    rng = np.random.default_rng(seed)
    return np.concatenate([e, rng.permutation(np.tile(e, n // e.size + 1))])[:n]


@pytest.mark.parametrize("op", ["add", "min", "max"])
@covers(RED_FORM)
def test_red_f32_rounds_each_addition_and_min_max_let_nan_lose(op):
    dt = np.dtype(np.float32)
    vals = _float_vals("f32", T, 3)
    mem = _float_vals("f32", T, 4)[::-1].copy()
    for slots in (T, 4):
        _check_red(f"red.global.relaxed.gpu.{op}.f32", op, dt, [vals.view(np.int32)], "i32",
                   mem.view(np.int32), slots)
    _check_red(f"red.shared::cta.relaxed.cta.{op}.f32", op, dt, [vals.view(np.int32)], "i32",
               mem.view(np.int32), 4, space="shared")


@pytest.mark.parametrize("ty", ["f16", "bf16"])
@pytest.mark.parametrize("op", ["add", "min", "max"])
@covers(RED_FORM)
def test_red_of_halves_in_every_vector_width_jax_writes(ty, op):
    """``.noftz.v4.f16x2`` / ``.v2.f16x2`` (4 or 2 registers of two halves),
    ``.noftz.v2.f16`` on two ``h`` registers, and ``.f16x2`` in SMEM: each
    half rounded once (add) or fmin/fmax (a NaN loses)."""
    dt = np.dtype(FLOAT_TYPES[ty])
    rng = np.random.default_rng(5)
    for vec, regs_per_thread in ((4, 4), (2, 2), (1, 1)):
        n = 2 * regs_per_thread
        halves = _float_vals(ty, T * n, 6).reshape(T, n)
        mem = _float_vals(ty, T * n, 7)[rng.permutation(T * n)]
        regs = [np.ascontiguousarray(halves[:, 2 * k:2 * k + 2]).view(np.int32).reshape(T)
                for k in range(regs_per_thread)]
        vecs = f".v{vec}" if vec > 1 else ""
        for slots in (T, 4):
            _check_red(f"red.global.relaxed.gpu.{op}.noftz{vecs}.{ty}x2", op, dt, regs, "i32",
                       mem.view(np.int16), slots)
    halves = _float_vals(ty, T * 2, 8).reshape(T, 2)
    mem = _float_vals(ty, T * 2, 9)
    h = [np.ascontiguousarray(halves[:, k]).view(np.int16) for k in range(2)]
    _check_red(f"red.global.relaxed.gpu.{op}.noftz.v2.{ty}", op, dt, h, "i16",
               mem.view(np.int16), 4)
    if op == "add":  # jax's SMEM atomics of halves: add only, one register
        reg = np.ascontiguousarray(halves).view(np.int32).reshape(T)
        _check_red(f"red.shared::cta.relaxed.cta.add.{ty}x2", op, dt, [reg], "i32",
                   mem.view(np.int16), 4, space="shared")


def _atom(opcode: str, args: list[np.ndarray], mem: np.ndarray, slots: int,
          space: str = "global") -> tuple[np.ndarray, np.ndarray]:
    """Each thread's ``atom`` on element ``t % slots``: (what each thread got,
    the buffer after)."""
    addr, pty = _address(space, 4, slots)
    names = [f"%a{k}" for k in range(len(args))]
    operands = ", ".join(f"${k + 2}" for k in range(len(args)))
    body = addr + (f'\n%r = llvm.inline_asm has_side_effects "{opcode} $0, [$1], {operands};", '
                   f'"=r,l{",r" * len(args)}" %p, {", ".join(names)} : '
                   f'({pty}{", i32" * len(args)}) -> i32')
    inputs = {"buf": (pty, mem), **{n[1:]: ("i32", a) for n, a in zip(names, args)}}
    got = run(body, inputs, {"r": "i32"}, threads=T)
    return got["r"], got["buf"]


ATOM_OPS = [("exch", "b32"), ("add", "u32"), ("add", "s32"), ("min", "u32"), ("min", "s32"),
            ("max", "u32"), ("max", "s32"), ("and", "b32"), ("or", "b32"), ("xor", "b32"),
            ("inc", "u32"), ("dec", "u32")]


@pytest.mark.parametrize("op,ty", ATOM_OPS)
@covers(ATOM_FORM)
def test_atom_returns_what_memory_held_and_combines_in_thread_order(op, ty):
    dt = INT_DT[ty]
    vals = _wrap32(_ints(11, T)).view(np.int32)
    mem = _wrap32(_ints(12, T)[::-1]).view(np.int32)
    if op in ("inc", "dec"):
        mem = _wrap32(np.arange(T) % 5).view(np.int32)
        vals = _wrap32(np.array([0, 1, 2, 3, 4, 2 ** 32 - 1] * 6)[:T]).view(np.int32)
    for opcode, slots, space in [(f"atom.global.{op}.{ty}", T, "global"),
                                 (f"atom.relaxed.gpu.global.{op}.{ty}", 4, "global"),
                                 (f"atom.acq_rel.cta.shared::cta.{op}.{ty}", 4, "shared")]:
        got, after = _atom(opcode, [vals], mem, slots, space)
        want_mem, found = _in_thread_order(mem.view(dt), vals.view(dt).reshape(T, 1),
                                           np.arange(T) % slots, np.ones(T, bool),
                                           _reference(op, dt))
        assert_same_bits(after.view(dt), want_mem)
        assert_same_bits(got.view(dt), found.reshape(T))


@covers(ATOM_FORM)
def test_atom_cas_stores_where_memory_holds_the_expected_value():
    """jax's semaphore wait: ``atom.relaxed.sys.global.cas.b32``. Threads of
    one element in turn: the first whose expected value matches swaps, and
    each later one sees the new value."""
    mem = _wrap32([0, -1, 2 ** 31 - 1, -2 ** 31]).view(np.int32)
    expected = _wrap32(np.array([0, -1, 7, -2 ** 31, 5, -1, 2 ** 31 - 1, 9] * 4)).view(np.int32)
    new = np.arange(T, dtype=np.int32) * -3
    for opcode in ("atom.relaxed.sys.global.cas.b32", "atom.acquire.gpu.global.cas.b32"):
        got, after = _atom(opcode, [expected, new], mem, 4)

        def cas(old, pair):
            return pair[1] if old == pair[0] else old
        mine, found = mem.copy(), np.zeros(T, np.int32)
        for t in range(T):
            found[t] = mine[t % 4]
            mine[t % 4] = cas(mine[t % 4], (expected[t], new[t]))
        assert_same_bits(after, mine)
        assert_same_bits(got, found)


@covers(LD_FORM)
def test_strong_loads_read_memory_in_every_spelling():
    """``ld.relaxed/acquire.{cta,gpu,sys}[.space].{b32,u32,s32}``: what the
    thread's word holds, INT_MIN/INT_MAX and -1 among them (jax's semaphore
    read is ``ld.acquire.sys.u32 $0,[$1];``, its wait ``ld.relaxed.gpu.global.b32``)."""
    mem = _wrap32(_ints(13, T)).view(np.int32)
    for text, space in [("ld.acquire.sys.u32 $0,[$1];", "global"),
                        ("ld.relaxed.gpu.global.b32 $0, [$1];", "global"),
                        ("ld.acquire.gpu.global.s32 $0, [$1];", "global"),
                        ("ld.relaxed.cta.shared::cta.b32 $0, [$1];", "shared")]:
        assert form(text) == LD_FORM
        addr, pty = _address(space, 4, T)
        got = run(addr + f'\n%r = llvm.inline_asm has_side_effects "{text}", "=r,l" %p : '
                  f"({pty}) -> i32", {"buf": (pty, mem)}, {"r": "i32"}, threads=T)
        assert_same_bits(got["r"], mem)
        assert_same_bits(got["buf"], mem)


@covers(*(form(f"{f};") for f in FENCES))
def test_memory_fences_between_an_atomic_and_a_strong_load_change_nothing():
    """A ``red.add`` of 1 by every thread on one word, each fence, then a
    strong load: every thread reads 32 (and the fences take no operand)."""
    addr, pty = _address("global", 4, 1)
    fences = "\n".join(f'llvm.inline_asm has_side_effects "{f};", "" : () -> ()' for f in FENCES)
    got = run(addr + f"""
      %c1 = llvm.mlir.constant(1 : i32) : i32
      llvm.inline_asm has_side_effects "red.release.gpu.global.add.u32 [$0], $1;", "l,r" %p, %c1 : ({pty}, i32) -> ()
      {fences}
      %r = llvm.inline_asm has_side_effects "ld.acquire.gpu.global.b32 $0, [$1];", "=r,l" %p : ({pty}) -> i32""",  # noqa: E501 -- MLIR text, one op a line
              {"buf": (pty, np.zeros(1, np.int32))}, {"r": "i32"}, threads=T)
    assert got["r"].tolist() == [T] * T
