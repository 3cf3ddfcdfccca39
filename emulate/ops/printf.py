"""``gpu.printf`` (``mgpu.debug_print``, ``pl.debug_print``): printed to
``sys.stdout`` as CUDA's device ``printf`` formats it, once per active
thread, in a deterministic order -- blocks as the emulator runs them, and
within one execution of the op the threads by index.

The format is C's: flags, width and precision as given; length modifiers
(``hh``, ``h``, ``l``, ``ll``, ``z``, ``j``, ``t``) set nothing beyond the
argument's own width; ``%u``/``%x``/``%X``/``%o`` print the argument's bits
unsigned (at its width), ``%d``/``%i`` signed,
``%f``/``%e``/``%g`` the float widened to double (as C's varargs promote it),
``%c`` a character.
``%s``, ``%p`` (device pointers) and ``%a`` are :class:`Unsupported`."""

from __future__ import annotations

import re
import sys

import numpy as np

from .. import irtypes
from ..compiler import Op, Step, rule
from ..errors import Unsupported
from ..machine import Frame
from .nvvm import per_thread

SPEC = re.compile(r"%([-+ #0]*)(\d+|\*)?(?:\.(\d+|\*))?(hh|h|ll|l|z|j|t|L)?([diouxXeEfFgGaAcsp%])")


def _convert(fmt: str, types: list[irtypes.T], where: str):
    """The Python format and, per argument, how to turn its value into what
    the conversion prints."""
    out, conv, k, pos = [], [], 0, 0
    for m in SPEC.finditer(fmt):
        out.append(fmt[pos:m.start()].replace("%", "%%"))
        pos = m.end()
        flags, width, prec, _, c = m.groups()
        if c == "%":
            out.append("%%")
            continue
        if "*" in (width or "") + (prec or "") or c in "spaA":
            raise Unsupported(f"gpu.printf conversion {m.group(0)!r}", where)
        if k >= len(types):
            raise Unsupported(f"gpu.printf format {fmt!r} with more conversions than its "
                              f"{len(types)} arguments", where)
        k += 1
        spec = "%" + flags + (width or "") + (f".{prec}" if prec is not None else "")
        if c in "uxXo":
            out.append(spec + ("d" if c == "u" else c))
            conv.append(lambda v: int(irtypes.unsigned(np.asarray(v))))
        elif c in "di":
            out.append(spec + "d")
            conv.append(lambda v: int(np.asarray(v).astype(np.int64)))
        elif c == "c":
            out.append(spec + "c")
            conv.append(lambda v: chr(int(np.asarray(v)) & 0xFF))
        else:
            out.append(spec + c)
            conv.append(lambda v: float(np.asarray(v).astype(np.float64)))
    out.append(fmt[pos:].replace("%", "%%"))
    if k != len(types):
        raise Unsupported(f"gpu.printf format {fmt!r} with {k} conversions for "
                          f"{len(types)} arguments", where)
    return "".join(out), conv


@rule("gpu.printf")
def printf(o: Op) -> Step:
    fmt = o.attr("format").value
    pyfmt, conv = _convert(fmt, list(o.in_types), o.loc)
    args = o.ins

    def step(fr: Frame) -> None:
        vals = [per_thread(np.asarray(fr.regs[a]), fr.T) for a in args]
        active = range(fr.T) if fr.mask is None else np.flatnonzero(fr.mask)
        lines = [pyfmt % tuple(c(v[t]) for c, v in zip(conv, vals)) for t in active]
        sys.stdout.write("".join(lines))
        sys.stdout.flush()
    return step
