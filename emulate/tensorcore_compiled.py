"""The tensor-core adder's exact sum as machine code, where numba is installed.

:func:`smalti.emulate.tensorcore.mma` spends most of a WGMMA's emulation in
steps 1 to 3 of its rule (the largest alignment exponent of each output,
every term truncated to ``2 ** (emax - 25)``, the truncated terms added):
numpy runs them as a few passes over (M, N) planes per term, about 1 ns per
term and pass. The same steps compiled by numba run in one pass per output
row, the K terms' loop innermost over N, in about a quarter of the time --
the difference between minutes and tens of minutes for a 4096^3 matmul.

Every operation here is exact, as in the numpy code: exponents are
integers, a product of two operands of the tensor core's formats has at
most 22 significant bits (exact in float64), multiplying by a power of two
and truncating are exact, and the truncated terms are integers below
``2 ** 33`` whose float64 sum is exact. So the result has the numpy path's
bits whatever order the compiler adds in; ``tests/emulate/test_tensorcore.py``
holds the two (and the reference) to the same bits on every format.

numba is optional (``pip install smalti[fast]``; the test dependencies
include it). Without it, or with ``SMALTI_EMULATE_COMPILED=0`` in the
environment, :func:`available` is false and ``mma`` keeps its numpy code.
A process adds its first :data:`LOAD_AFTER` sums with numpy, so that a few
small kernels never pay for numba (about 0.8 s of CPU to import it and load
the cached kernel); then a thread beside the emulation loads it, and the
sums run compiled once it is loaded (:func:`chosen`). The kernel is compiled
on its first load ever (seconds, then cached on disk by numba where the
package's folder is writable).
"""

from __future__ import annotations

import functools
import importlib.util
import os
import threading
import warnings
from collections.abc import Callable

import numpy as np

#: the environment variable that turns the compiled sum off ("0")
SWITCH = "SMALTI_EMULATE_COMPILED"


@functools.cache
def installed() -> bool:
    """Whether numba can be imported (looked up once: every WGMMA asks)."""
    return importlib.util.find_spec("numba") is not None


#: sums numpy adds in a process before the compiled adder starts loading in
#: a thread (numpy takes 0.2-0.3 ms an m64n128k16 instruction, the compiled
#: adder 0.05 ms): past this, a process is running a pipeline or a suite of
#: WGMMA kernels, and loading does not hold up the run
LOAD_AFTER = 200
_numpy_sums = 0
_loaded: Callable[..., None] | None = None  # the kernel, once loaded
_loader: threading.Thread | None = None
_load_failed: list[BaseException] = []  # why the thread could not load it
_lock = threading.Lock()


def available() -> bool:
    """Whether :func:`aligned_sum` can run: numba is installed and the
    environment does not turn it off."""
    return os.environ.get(SWITCH, "1") != "0" and installed()


def chosen() -> bool:
    """Whether this sum runs compiled: where :func:`available`, once the
    kernel is loaded. Counts the sums numpy adds and starts the loading
    thread after :data:`LOAD_AFTER` of them (the two give the same bits,
    so a run may switch midway)."""
    global _numpy_sums, _loader
    if _loaded is not None:
        return available()
    if not available() or _load_failed:
        return False
    _numpy_sums += 1
    if _numpy_sums >= LOAD_AFTER and _loader is None:
        _loader = threading.Thread(target=_load_beside, name="smalti tensor-core adder loader")
        _loader.start()  # (not a daemon: an exit waits for it rather than cut an import)
    return False


def _load_beside() -> None:
    try:
        kernel()
    except Exception as e:  # numpy's sums go on (the same bits); said once
        _load_failed.append(e)
        warnings.warn(f"smalti: the compiled tensor-core adder could not be loaded "
                      f"({type(e).__name__}: {e}); WGMMA sums stay numpy's (the same bits, "
                      f"slower). Set {SWITCH}=0 to not try.", RuntimeWarning, stacklevel=1)


def kernel() -> Callable[..., None]:
    """The compiled kernel, loaded here if no thread has yet (waiting for
    one that is loading it)."""
    global _loaded
    with _lock:
        if _loaded is None:
            from ._tensorcore_kernel import kernel as compiled  # imports numba
            _warm(compiled)
            _loaded = compiled
        return _loaded


def _warm(compiled: Callable[..., None]) -> None:
    """One sum of 1 x 1 operands with a real sum's argument types: numba
    loads the machine code for them now, not at the first real sum."""
    x = np.ones((1, 1))
    bits = x.view(np.int64)
    compiled(x, x, x, bits, bits, bits, True, -14, -14, -126, 25, -(1 << 20), np.empty((1, 1)))


def aligned_sum(a: np.ndarray, b: np.ndarray, c: np.ndarray | None, low_a: int, low_b: int,
                low_c: int, alignment_bits: int, none: int) -> np.ndarray:
    """Steps 1 to 3 of the adder's rule, unrounded: the exact (M, N) sum of
    ``c`` (or nothing) and the products ``a[m, k] b[n, k]``, each term
    truncated towards zero to a multiple of ``2 ** (emax - alignment_bits)``.
    ``a`` (M, K) and ``b`` (N, K) hold finite operand values and ``c`` (M,
    N) finite accumulator values, in float64; a value's alignment exponent
    is ``floor(log2 |x|)``, at least ``low_a``, ``low_b`` or ``low_c`` (its
    format's subnormal exponent), and ``none`` for a zero."""
    m, n = a.shape[0], b.shape[0]
    at = np.ascontiguousarray(a.T, np.float64)
    bt = np.ascontiguousarray(b.T, np.float64)
    has_c = c is not None
    c = np.zeros((m, n)) if c is None else np.ascontiguousarray(c, np.float64)
    out = np.empty((m, n))
    # the exponents are read from the float64 bits: every value of these
    # formats is a normal float64
    kernel()(at, bt, c, at.view(np.int64), bt.view(np.int64), c.view(np.int64),
             has_c, low_a, low_b, low_c, alignment_bits, none, out)
    return out
