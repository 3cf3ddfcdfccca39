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
A process adds its first :data:`WARM_UP` sums with numpy, so that a small
kernel does not wait for numba's import (:func:`chosen`); the kernel is
compiled on its first use (about a second once, then cached on disk by
numba where the package's folder is writable).
"""

from __future__ import annotations

import functools
import importlib.util
import os
from collections.abc import Callable

import numpy as np

#: the environment variable that turns the compiled sum off ("0")
SWITCH = "SMALTI_EMULATE_COMPILED"


@functools.cache
def installed() -> bool:
    """Whether numba can be imported (looked up once: every WGMMA asks)."""
    return importlib.util.find_spec("numba") is not None


#: sums numpy adds in a process before the compiled one takes over: importing
#: numba and loading its cached kernel (about 0.5 s) pays only for more work
#: than a small kernel's (numpy takes 0.3-0.5 ms an m64n128k16 instruction)
WARM_UP = 1500
_numpy_sums = 0


def available() -> bool:
    """Whether :func:`aligned_sum` can run: numba is installed and the
    environment does not turn it off."""
    return os.environ.get(SWITCH, "1") != "0" and installed()


def chosen() -> bool:
    """Whether this sum runs compiled: where :func:`available`, once the
    kernel is loaded or the process has added :data:`WARM_UP` sums with
    numpy (the two give the same bits, so a run may switch midway)."""
    global _numpy_sums
    if not available():
        return False
    if _kernel.cache_info().currsize or _numpy_sums >= WARM_UP:
        return True
    _numpy_sums += 1
    return False


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
    c = np.zeros((m, n)) if c is None else np.ascontiguousarray(c, np.float64)
    out = np.empty((m, n))
    # the exponents are read from the float64 bits: every value of these
    # formats is a normal float64
    _kernel()(at, bt, c, at.view(np.int64), bt.view(np.int64), c.view(np.int64),
              c is not None, low_a, low_b, low_c, alignment_bits, none, out)
    return out


@functools.cache
def _kernel() -> Callable[..., None]:
    # imported on first use: numba takes a while to import
    from ._tensorcore_kernel import kernel
    return kernel
