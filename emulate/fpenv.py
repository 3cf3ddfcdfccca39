"""The host's floating-point environment while the emulator computes.

The emulator models GPU arithmetic with numpy (and numba) on the host, and
the GPU keeps subnormal numbers unless an instruction says ``.ftz``. The
host must then keep them too. XLA:CPU does not: its threads run with the
SSE control bits FTZ (flush results to zero) and DAZ (read subnormal inputs
as zero) set, and a kernel run by :mod:`smalti.emulate.cpu_mode` runs on
such a thread, as a host callback of the XLA executable. There, every
subnormal a numpy operation makes or reads silently became zero (a ue8m0
code 0, ``2**-127``, converted to bf16 came out ``+0``).

Every run of a kernel (:meth:`smalti.emulate.runner.Program.run`: ``run``,
``run_module``, ``profile`` and the callbacks of ``on_cpu``) is inside
:func:`ieee_subnormals`, which gives the code in it the C library's default
environment (``fesetenv(FE_DFL_ENV)``: round to nearest, exceptions masked,
FTZ and DAZ clear) and puts the caller's back afterwards. Where that cannot
be done (no C library found, or subnormals still flushed after it), it
raises :class:`~smalti.emulate.EmulationError` rather than let the
emulator compute a wrong answer."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
from collections.abc import Iterator

import numpy as np

from .errors import EmulationError

#: ``fenv_t`` is 32 bytes on x86-64 glibc and smaller elsewhere: room to spare.
_ENV_BYTES = 256


def flushes_subnormals() -> bool:
    """Whether this thread's float32 arithmetic flushes subnormal results
    (FTZ) or reads subnormal operands as zero (DAZ)."""
    smallest_normal = np.float32(2.0 ** -126)
    smallest_subnormal = np.float32(2.0 ** -149)
    return bool(smallest_normal * np.float32(0.5) == 0
                or smallest_subnormal * np.float32(2.0) == 0)


@functools.cache
def _libm() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("m") or ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name) if name else None
    except OSError:
        return None


def _default_environment(libm: ctypes.CDLL) -> ctypes.c_void_p:
    """``FE_DFL_ENV``: a symbol on Apple's C library, ``(const fenv_t *) -1``
    in glibc's and musl's."""
    try:
        return ctypes.c_void_p(ctypes.addressof(ctypes.c_char.in_dll(libm, "_FE_DFL_ENV")))
    except ValueError:
        return ctypes.c_void_p(-1)


@contextlib.contextmanager
def ieee_subnormals() -> Iterator[None]:
    """Run the body with subnormals kept (the C library's default floating-
    point environment), then restore the caller's environment."""
    if not flushes_subnormals():
        yield
        return
    libm = _libm()
    saved = ctypes.create_string_buffer(_ENV_BYTES)
    if libm is None or libm.fegetenv(saved) != 0 or \
            libm.fesetenv(_default_environment(libm)) != 0:
        raise _refusal("the C library's fesetenv could not turn that off")
    try:
        if flushes_subnormals():
            raise _refusal("it still does after fesetenv(FE_DFL_ENV)")
        yield
    finally:
        libm.fesetenv(saved)


def _refusal(why: str) -> EmulationError:
    return EmulationError(
        f"this thread flushes subnormal numbers to zero (as XLA:CPU's threads do) and {why}, "
        "so the emulator's arithmetic would be wrong on subnormals; run the kernel with "
        "smalti.emulate.run on a thread of your own, outside jax.jit")
