"""The compiled kernel of :mod:`smalti.emulate.tensorcore_compiled` (numba
imported here, only when that module's sum is first used; compiled
functions at module level, so that numba caches them on disk)."""

import numba
import numpy as np


@numba.njit(cache=True, nogil=True, inline="always")
def exponent(bits, low, none):
    """floor(log2 |x|) of the float64 x with these bits, at least ``low``;
    ``none`` for a zero."""
    e = max(((bits >> 52) & 0x7FF) - 1023, low)
    return none if bits & 0x7FFFFFFFFFFFFFFF == 0 else e


@numba.njit(cache=True, nogil=True)
def kernel(at, bt, c, at_bits, bt_bits, c_bits, has_c, low_a, low_b, low_c,
           alignment_bits, none, out):
    """``out`` = :func:`smalti.emulate.tensorcore_compiled.aligned_sum` of
    ``at`` (K, M), ``bt`` (K, N) and ``c`` (M, N) (zeros where not
    ``has_c``), their float64 bits beside them."""
    k_terms, rows = at.shape
    cols = bt.shape[1]
    eat = np.empty((k_terms, rows), np.int32)
    ebt = np.empty((k_terms, cols), np.int32)
    for k in range(k_terms):
        for m in range(rows):
            eat[k, m] = exponent(at_bits[k, m], low_a, none)
        for n in range(cols):
            ebt[k, n] = exponent(bt_bits[k, n], low_b, none)
    emax = np.empty(cols, np.int32)
    # 2 ** s and 2 ** -s made from their exponent fields (s well inside
    # float64's range for every format here)
    scale_bits = np.empty(cols, np.int64)
    unscale_bits = np.empty(cols, np.int64)
    scale = scale_bits.view(np.float64)
    unscale = unscale_bits.view(np.float64)
    kept = np.empty(cols, np.float64)
    for m in range(rows):
        # step 1: the largest alignment exponent of each output of row m
        if has_c:
            for n in range(cols):
                emax[n] = exponent(c_bits[m, n], low_c, none)
        else:
            emax[:] = 2 * none
        for k in range(k_terms):
            e = eat[k, m]
            for n in range(cols):
                emax[n] = max(emax[n], e + ebt[k, n])
        # steps 2 and 3 in units of 2 ** (emax - alignment_bits): scaled by a
        # power of two, truncated and added, all exactly
        for n in range(cols):
            s = alignment_bits - (0 if emax[n] < none // 2 else emax[n])
            scale_bits[n] = (s + 1023) << 52
            unscale_bits[n] = (1023 - s) << 52
        for n in range(cols):
            kept[n] = np.trunc(c[m, n] * scale[n])
        for k in range(k_terms):
            x = at[k, m]
            for n in range(cols):
                kept[n] += np.trunc(x * bt[k, n] * scale[n])
        for n in range(cols):
            out[m, n] = kept[n] * unscale[n]
