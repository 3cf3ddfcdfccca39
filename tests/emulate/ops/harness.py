"""Running a few Lane-level ops on the emulator, and knowing which ran.

:func:`run` wraps ``body`` (MLIR text in any dialect the emulator models) in
a ``func.func`` whose arguments are the named inputs and whose results are
the named outputs, compiles it with the emulator's compiler and runs it in
one block of ``threads`` threads (or on the host, ``host=True``, where a
``gpu.launch`` may start blocks of its own), as :mod:`smalti.emulate.runner`
does for a whole kernel. Inputs are registers (numpy values; a leading axis of
``threads`` makes one per thread) or buffers: an input of a ``memref`` or
``!llvm.ptr`` type is given as an array, copied into a fresh buffer of its
memory space (SMEM for ``#gpu.address_space<workgroup>`` / ``ptr<3>``) and
passed as a descriptor or address; what the buffer holds after the run is
returned under its name.

:func:`covers` declares, on a test, the op names and inline-PTX table forms
it exercises; while the test runs, every step that is reached records its op
name (and, for ``llvm.inline_asm``, the table form its string reached), and
the test fails if one it declared was never reached. ``test_coverage.py``
checks that the declarations of all the modules here cover every rule and
every PTX form: so each name is tested, by a test that really runs it, and
that holds whichever tests a session selects."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from smalti.emulate import (
    irtypes,
    runner,  # (importing it registers every rule)
)
from smalti.emulate.compiler import Compiler, Op, Step
from smalti.emulate.machine import Block, Cluster, Frame, Launch
from smalti.emulate.ops import inline_asm as ptx
from smalti.emulate.values import MemRef

_seen: set[str] | None = None  # what ran in the current covering test


@contextmanager
def recording() -> Iterator[set[str]]:
    """Collects the op names (and PTX forms) of the steps that are reached."""
    global _seen
    outer, _seen = _seen, set()
    try:
        yield _seen
    finally:
        if outer is not None:  # a test inside a test: the outer one ran these too
            outer.update(_seen)
        _seen = outer


class RecordingCompiler(Compiler):
    """The emulator's compiler, each step wrapped to record what ran."""

    def op(self, o: Op) -> Step:
        step = super().op(o)
        names = [o.name]
        if o.name == "llvm.inline_asm":
            from jax._src.lib.mlir import ir

            entry = ptx.lookup(ir.StringAttr(o.attr("asm_string")).value)
            if entry is not None:
                names.append(entry.form)

        def recorded(fr: Frame) -> None:
            if _seen is not None:  # reached: what it did (or raised) is the test's to check
                _seen.update(names)
            step(fr)
        if hasattr(step, "accumulators"):  # how it treats WGMMA accumulators, as marked
            recorded.accumulators = step.accumulators  # type: ignore[attr-defined]
        return recorded


def covers(*names: str) -> Callable:
    """Declares that the decorated test runs op ``names`` (or PTX table
    forms); the test fails if the step of any of them was never reached."""
    def decorate(test: Callable) -> Callable:
        @functools.wraps(test)
        def checked(*args: Any, **kwargs: Any) -> None:
            with recording() as seen:
                test(*args, **kwargs)
            missing = sorted(set(names) - seen)
            assert not missing, f"{test.__name__} declares but never ran {missing}"
        checked.covers = names  # type: ignore[attr-defined]
        return checked
    return decorate


def run(body: str, inputs: dict[str, tuple[str, Any]] | None = None,
        returns: dict[str, str] | None = None, *, threads: int = 32, host: bool = False,
        block_id: tuple[int, int, int] = (0, 0, 0), grid: tuple[int, int, int] = (1, 1, 1),
        cluster: tuple[int, int, int] = (1, 1, 1), rank: int = 0,
        smem_bytes: int = 0, prelude: str = "", sanitize: bool = False) -> dict[str, Any]:
    """Runs ``body`` with ``inputs`` (name -> (MLIR type, value)); returns the
    values of ``returns`` (name -> MLIR type) and the final contents of every
    buffer input, by name. ``prelude``: module-level ops (globals) before the
    function. ``sanitize`` (host code only, as in a kernel): the
    synchronization checker watches the launches and raises what it finds."""
    from jax._src.lib.mlir import ir

    from smalti.kernels import make_context

    inputs = inputs or {}
    returns = returns or {}
    params = ", ".join(f"%{n}: {t}" for n, (t, _) in inputs.items())
    rtypes = ", ".join(returns.values())
    ret = (f"return {', '.join('%' + n for n in returns)} : {rtypes}" if returns else "return")
    text = f"{prelude}\nfunc.func @f({params}) -> ({rtypes}) {{\n{body}\n{ret}\n}}"
    with make_context(), ir.Location.unknown():
        module = ir.Module.parse(text)
        comp = RecordingCompiler()
        func = next(op for op in module.body.operations
                    if op.operation.name == "func.func" and str(op.sym_name) == '"f"')
        prog = comp.block(func.regions[0].blocks[0])
        launch = Launch()
        if sanitize:
            from smalti.emulate.sync.checker import Checker

            launch.sync = Checker("raise", "raise")
        blk = None
        if not host:
            cl = Cluster(tuple(b // c for b, c in zip(block_id, cluster)), cluster,
                         tuple(g // c for g, c in zip(grid, cluster)))
            blk = Block(launch, block_id, grid, (threads, 1, 1), smem_bytes, cl, rank)
        regs: list = [None] * comp.nslots
        frame = Frame(regs, launch, blk)
        buffers = {}
        for (name, (t, value)), slot in zip(inputs.items(), prog.args):
            ty = irtypes.parse(t)
            if ty.kind in ("memref", "ptr"):
                buffers[name] = _buffer(frame, ty, np.asarray(value), name)
                regs[slot] = buffers[name][0]
            else:
                regs[slot] = np.asarray(value).astype(ty.dtype) if ty.dtype is not None else value
        with np.errstate(all="ignore"):
            prog.run(frame)
        if launch.sync is not None:
            launch.sync.finish()
        out: dict[str, Any] = {n: regs[s] for n, s in zip(returns, prog.term)}
        for name, (_, region, arr) in buffers.items():
            out[name] = region.data[:arr.nbytes].copy().view(arr.dtype).reshape(arr.shape)
        return out


def _buffer(frame: Frame, ty: irtypes.T, arr: np.ndarray, name: str):
    """A fresh buffer holding ``arr`` in ``ty``'s space: (the register value
    that names it, its region, its array)."""
    if ty.kind == "memref":
        arr = arr.astype(ty.dtype)
    space = frame.mem["shared" if ty.space == "shared" else "global"]
    region = space.alloc(max(arr.nbytes, 1), f"test buffer {name}", align=1024)
    region.data[:arr.nbytes] = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
    base = np.asarray(region.base, np.int64)
    if ty.kind == "ptr":
        return base, region, arr
    strides, acc = [], 1
    for n in reversed(arr.shape):
        strides.append(acc)
        acc *= n
    ref = MemRef(ty.space, ty.dtype, base, base, 0, tuple(arr.shape), tuple(reversed(strides)))
    return ref, region, arr


# --- edge values and references shared by the dialect modules ----------------

INT_TYPES = {"i8": np.int8, "i16": np.int16, "i32": np.int32, "i64": np.int64}
FLOAT_TYPES = {"f16": np.float16, "bf16": irtypes.SCALARS["bf16"].type, "f32": np.float32,
               "f64": np.float64}


def int_edges(ty: str) -> list[int]:
    """Zeros, ones, small odd and even values, and the extremes of ``ty``."""
    bits = np.dtype(INT_TYPES[ty]).itemsize * 8
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    return sorted({0, 1, -1, 2, -2, 3, -7, 7, bits - 1, bits, bits + 1, lo, lo + 1, hi, hi - 1,
                   hi // 3, lo // 3})


def float_edges(ty: str) -> np.ndarray:
    """Signed zeros, infinities, NaN, the largest finite and the smallest
    normal and subnormal values of ``ty``, halves and ordinary numbers."""
    dt = np.dtype(FLOAT_TYPES[ty])
    info = np.finfo(dt)
    vals = [0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 1.5, -2.5, 3.0, 0.1, -7.25, 100.0,
            np.inf, -np.inf, np.nan, float(info.max), -float(info.max),
            float(info.smallest_normal), -float(info.smallest_normal),
            float(info.smallest_subnormal), -float(info.smallest_subnormal)]
    return np.array(vals, np.float64).astype(dt)


def pairs(values) -> tuple[np.ndarray, np.ndarray]:
    """Every (a, b) of ``values`` x ``values``, as two flat arrays."""
    v = np.asarray(values)
    return np.repeat(v, v.size), np.tile(v, v.size)


def wrap(x: int, bits: int) -> int:
    """``x`` as a ``bits``-bit two's-complement integer."""
    x &= (1 << bits) - 1
    return x - (1 << bits) if x >> (bits - 1) else x


def assert_same_bits(got, want) -> None:
    """Equal bit for bit (NaNs of any payload count as equal; -0 != +0)."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    assert got.shape == want.shape, (got.shape, want.shape)
    if got.dtype.kind in "fV" and got.dtype != np.bool_:
        g64, w64 = got.astype(np.float64), want.astype(np.float64)
        both_nan = np.isnan(g64) & np.isnan(w64)
        same = both_nan | ((g64 == w64) & (np.signbit(g64) == np.signbit(w64)))
    else:
        same = got == want
    bad = np.flatnonzero(~same)
    assert not bad.size, (f"{bad.size} of {got.size} differ, e.g. at {bad[:6].tolist()}: got "
                          f"{got.reshape(-1)[bad[:6]].tolist()}, "
                          f"want {want.reshape(-1)[bad[:6]].tolist()}")


@contextmanager
def recording_kernels() -> Iterator[None]:
    """Whole kernels (:func:`smalti.emulate.run`) compiled with the
    recording compiler, for the few forms only jax's own code generators
    write (a WGMMA block)."""
    from unittest import mock

    with mock.patch.object(runner, "Compiler", RecordingCompiler):
        yield
