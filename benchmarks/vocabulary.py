"""Which ordinary jax functions lower inside a Pallas Mosaic GPU kernel
(Warpgroup semantics), with jax 0.11.2 alone and with smalti (its installed
plugins plus ``smalti.vocabulary``), and whether smalti's lowering computes
jnp's answer on the emulator.

    .venv/bin/python -m benchmarks.vocabulary            # the table
    .venv/bin/python -m benchmarks.vocabulary --only floor,expm1

Each function is applied to a (64, 128) f32 block (integers for the bit
functions) that the kernel brings into 128-byte-swizzled SMEM by TMA; a 2-D
result goes back the same way, a smaller one is stored from registers.
Columns:

- *lowers with jax*: Pallas' lowering and jax's middle-end succeed;
- *lowers with smalti*: the same under ``smalti.jax.installed(pipeline)``;
- *emulated equal*: smalti's lowering, run by the emulator, matches: for the
  functions ``smalti.vocabulary`` adds, the exact answer within the bound of
  ``tests/vocabulary/cases.py`` (bit for bit with jnp for the exact ones);
  for sums taken in another order than jnp's (scans, dots), the exact
  answer within the order's rounding bound (``BOUNDED``); for the others,
  jnp on the CPU within ``rtol=1e-5, atol=1e-6``
  (bit for bit for integer results).

The last column is the first line of the error where smalti does not lower.

For the data-movement, scan and sort primitives (:data:`COSTED`), two more
columns say what smalti's lowering costs, from the emulator's profiler
(``smalti.emulate.profile``) over an identity kernel that moves the same
block in and out unchanged (for the gathers, less what the profiler counts
at :func:`_index_bits`' lines: the indices are the caller's work): *extra
wavefronts* (shared-memory wavefronts beyond the identity's) against the
ideal for the primitive's kind, and
*extra inst/el* (``smsp__inst_executed`` beyond the identity's, x 32 per
element of the block: thread-instructions per element) against its ideal.
The ideals (``docs/vocabulary.md``, "What it costs"), for a block of ``B``
bytes of ``s``-byte elements, rows of ``n`` along the primitive's axis:
movement, one conflict-free write and one read pass through SMEM,
``2 B / 128`` wavefronts and ``2 s / 16`` instructions per element (16-byte
vector stores and loads); a gather, the write pass and a read pass at its
indices' own bank conflicts (:func:`gather_reads`); a scan, that pass plus a work-efficient scan's 2
combining operations per element; a sort (and top_k), that pass plus a
bitonic network's ``log2 n (log2 n + 1) / 4`` compare-exchanges per
element, 2 instructions (min, max) each.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import jax.scipy.special as jsp
import ml_dtypes
import numpy as np
import scipy.special
from jax import lax
from jax.experimental.pallas import mosaic_gpu as plgpu

import smalti
import smalti.emulate
import smalti.jax
import smalti.vocabulary
from smalti.emulate.testing import ulp_distance
from tests.vocabulary import cases as C

WG = plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup)
RNG = np.random.default_rng(27)


@dataclass
class Entry:
    name: str
    fn: Callable[..., Any]
    args: list[np.ndarray]
    equal: Callable[[np.ndarray, list[np.ndarray]], bool]
    group: str = "issue 27's table"


def _transforms(dtype):
    cols = 128 // np.dtype(dtype).itemsize
    return (plgpu.TilingTransform((8, cols)), plgpu.SwizzleTransform(128))


def kernel(fn, args):
    """As in issue 27: the inputs brought into 128-byte-swizzled SMEM by TMA;
    a 2-D result written back the same way, any other stored from registers."""
    out = jax.eval_shape(fn, *(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in args))
    n = len(args)
    tma_out = len(out.shape) == 2 and out.shape[1] * np.dtype(out.dtype).itemsize >= 128 \
        and out.shape[0] % 8 == 0

    def body(*refs):
        gins, gout, sins = refs[:n], refs[n], refs[n + 1:2 * n + 1]
        bar = refs[-1]
        for g, s in zip(gins, sins):
            plgpu.copy_gmem_to_smem(g, s, bar)
        plgpu.barrier_wait(bar)
        result = fn(*(s[...] for s in sins))
        if tma_out:
            sout = refs[2 * n + 1]
            sout[...] = result
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(sout, gout)
            plgpu.wait_smem_to_gmem(0)
        else:
            gout[...] = result

    scratch = [plgpu.SMEM(a.shape, a.dtype, transforms=_transforms(a.dtype)) for a in args]
    if tma_out:
        scratch.append(plgpu.SMEM(out.shape, out.dtype, transforms=_transforms(out.dtype)))
    scratch.append(plgpu.Barrier(num_arrivals=n))
    return plgpu.kernel(body, out_type=jax.ShapeDtypeStruct(out.shape, out.dtype),
                        scratch_types=scratch, compiler_params=WG)


def from_case(case: C.Case, dtype) -> Entry:
    args = case.gen(np.random.default_rng(27), dtype)

    def equal(got, args):
        with np.errstate(all="ignore"):
            want = np.asarray(case.truth(*args)).astype(got.dtype)
        ok = ulp_distance(got, want).max() <= case.ulp[np.dtype(dtype)] if got.dtype.kind == "f" \
            else np.array_equal(got, want)
        if case.exact:
            ok = ok and np.array_equal(got, np.asarray(jax.jit(case.fn)(*args)), equal_nan=True)
        return bool(ok)
    return Entry(case.name, case.fn, args, equal)


def like_jnp(fn):
    def equal(got, args):
        want = np.asarray(jax.jit(fn)(*args))
        if want.dtype.kind in "iub":
            return bool(np.array_equal(got, want))
        return bool(np.allclose(got, want, rtol=1e-5, atol=1e-6, equal_nan=True))
    return equal


def within(exact, bound):
    """Equal to the exact answer (float64, from the inputs) within ``bound``
    (also from the inputs): for sums whose order differs from jnp's, where
    jnp's own rounding is of the same size as the tolerance of ``like_jnp``."""
    def equal(got, args):
        wide = [np.asarray(a, np.float64) for a in args]
        return bool(np.all(np.abs(got - exact(*wide)) <= bound(*wide)))
    return equal


EPS32 = float(np.finfo(np.float32).eps)


def _dot_bound(a, b):
    """K eps (|a| @ |b|): any summation order of K f32 products."""
    return a.shape[-1] * EPS32 * (np.abs(a) @ np.abs(b)) + np.finfo(np.float32).tiny


def _scan_bound(x, axis=1):
    """(ceil(log2 n) + 1) eps cumsum|x|: a log-depth scan, then rounding."""
    n = x.shape[axis]
    return (np.ceil(np.log2(n)) + 1) * EPS32 * np.cumsum(np.abs(x), axis)


def _half_scan_bound(x, axis=1):
    """A bf16 cumsum summed in f32 in any order (a sequential one's ``i u
    sum |x|``, the loosest), then rounded once: half an ulp of bf16 more."""
    i = np.arange(1, x.shape[axis] + 1).reshape((-1, 1) if axis == 0 else (1, -1))
    return i * EPS32 / 2 * np.cumsum(np.abs(x), axis) + 2.0 ** -8 * np.abs(np.cumsum(x, axis))


#: Equality for the entries whose answer is a sum in another order than jnp's.
BOUNDED = {
    "cumsum bf16": within(lambda x: np.cumsum(x, 1), _half_scan_bound),
    "cumsum rows bf16": within(lambda x: np.cumsum(x, 0), lambda x: _half_scan_bound(x, 0)),
    "cumsum": within(lambda x: np.cumsum(x, 1), _scan_bound),
    "cumsum rev": within(lambda x: np.cumsum(x[:, ::-1], 1)[:, ::-1],
                         lambda x: _scan_bound(x[:, ::-1])[:, ::-1]),
    # jnp's own lgamma is off by 4.8e-7 at 1, where the answer is 0: held to
    # the exact value instead, within the plugin's bound (4 ulp for x > 0).
    "lgamma": within(lambda x: scipy.special.gammaln(x),
                     lambda x: 4 * EPS32 * np.abs(scipy.special.gammaln(x))
                     + np.finfo(np.float32).tiny),
    "dot": within(lambda x: x @ x.T, lambda x: _dot_bound(x, x.T)),
    "matvec": within(lambda x: x @ x[0], lambda x: _dot_bound(x, x[0])),
    "f16 dot": within(lambda x: x @ x.T, lambda x: _dot_bound(x, x.T)),
    "bf16 matvec": within(lambda x: x @ x[0], lambda x: _dot_bound(x, x[0])),
    "vecmat": within(lambda x: x.sum(1) @ x,
                     lambda x: _dot_bound(x.sum(1), x) + 64 * EPS32 * np.abs(x).sum(1) @ np.abs(x)),
}


def x32(scale=1.0, shift=0.0):
    return (RNG.standard_normal(C.SHAPE) * scale + shift).astype(np.float32)


def i32():
    return RNG.integers(-2 ** 31, 2 ** 31 - 1, C.SHAPE, dtype=np.int64).astype(np.int32)


def _layer_norm(x):
    m = jnp.mean(x, axis=1, keepdims=True)
    v = jnp.var(x, axis=1, keepdims=True)
    return (x - m) * lax.rsqrt(v + 1e-5)


#: The issue's functions that smalti.vocabulary does not (yet) add, and the
#: everyday ones jax lowers itself, as (name, fn, inputs).
OTHERS: list[tuple[str, Callable, Callable[[], list[np.ndarray]]]] = [
    # jax lowers these already
    ("exp", jnp.exp, lambda: [x32()]), ("log", jnp.log, lambda: [np.exp(x32())]),
    ("tanh", jnp.tanh, lambda: [x32()]), ("sin", jnp.sin, lambda: [x32()]),
    ("cos", jnp.cos, lambda: [x32()]), ("sqrt", jnp.sqrt, lambda: [np.exp(x32())]),
    ("rsqrt", lax.rsqrt, lambda: [np.exp(x32())]), ("erf", lax.erf, lambda: [x32()]),
    ("abs", jnp.abs, lambda: [x32()]), ("round", jnp.round, lambda: [x32(4)]),
    ("square", jnp.square, lambda: [x32()]), ("sigmoid", jax.nn.sigmoid, lambda: [x32()]),
    ("sign", jnp.sign, lambda: [x32()]), ("clz", lax.clz, lambda: [i32()]),
    ("atan2", jnp.arctan2, lambda: [x32(), x32()]), ("x**3", lambda x: x ** 3, lambda: [x32()]),
    ("maximum", jnp.maximum, lambda: [x32(), x32()]), ("max rows", lambda x: x.max(1),
                                                       lambda: [x32()]),
    ("remainder", jnp.remainder, lambda: [x32(4), x32(1, 3)]),
    ("mean keepdims", lambda x: x - x.mean(1, keepdims=True), lambda: [x32()]),
    ("prod rows", lambda x: x.prod(0), lambda: [x32(0.1, 1)]),
    # the issue's list
    ("erfc", lax.erfc, lambda: [x32()]), ("erf_inv", lax.erf_inv, lambda: [x32(0.3)]),
    ("lgamma", lax.lgamma, lambda: [np.exp(x32())]), ("digamma", lax.digamma,
                                                      lambda: [np.exp(x32())]),
    ("copysign", jnp.copysign, lambda: [x32(), x32()]),
    ("argmax", lambda x: jnp.argmax(x, 1), lambda: [x32()]),
    ("argmin", lambda x: jnp.argmin(x, 1), lambda: [x32()]),
    ("any", lambda x: jnp.any(x > 2, 1).astype(jnp.int32), lambda: [x32()]),
    ("all", lambda x: jnp.all(x > -2, 1).astype(jnp.int32), lambda: [x32()]),
    ("sum (all)", jnp.sum, lambda: [x32()]),
    ("transpose", lambda x: x.T, lambda: [x32()]), ("rev", lambda x: x[::-1], lambda: [x32()]),
    ("pad", lambda x: jnp.pad(x[:, :64], ((0, 0), (0, 64))), lambda: [x32()]),
    ("roll", lambda x: jnp.roll(x, 3, 1), lambda: [x32()]),
    ("outer broadcast", lambda x: x[:, :1] + x[:1, :], lambda: [x32()]),
    ("cumsum", lambda x: jnp.cumsum(x, 1), lambda: [x32()]),
    ("cummax", lambda x: lax.cummax(x, 1), lambda: [x32()]),
    ("sort", lambda x: jnp.sort(x, 1), lambda: [x32()]),
    ("top_k", lambda x: lax.top_k(x, 8)[0], lambda: [x32()]),
    ("dot", lambda x: x @ x.T, lambda: [x32()]),
    ("softmax", jax.nn.softmax, lambda: [x32()]), ("log_softmax", jax.nn.log_softmax,
                                                   lambda: [x32()]),
    ("logsumexp", lambda x: jsp.logsumexp(x, 1), lambda: [x32()]),
    ("relu", jax.nn.relu, lambda: [x32()]), ("relu6", jax.nn.relu6, lambda: [x32(4)]),
    ("softplus", jax.nn.softplus, lambda: [x32()]), ("log_sigmoid", jax.nn.log_sigmoid,
                                                     lambda: [x32()]),
    ("logaddexp", jnp.logaddexp, lambda: [x32(), x32()]),
    ("mish", jax.nn.mish, lambda: [x32()]), ("gelu", jax.nn.gelu, lambda: [x32()]),
    ("silu", jax.nn.silu, lambda: [x32()]),
    ("var", lambda x: jnp.var(x, 1), lambda: [x32()]),
    ("std", lambda x: jnp.std(x, 1), lambda: [x32()]),
    ("layer norm", _layer_norm, lambda: [x32()]),
]


def f16(scale=1.0):
    return (RNG.standard_normal(C.SHAPE) * scale).astype(np.float16)


def bool_mask():
    return RNG.standard_normal(C.SHAPE) > 0


#: More everyday functions, beyond the issue's list: the rest of jax.numpy's
#: elementwise math, jax.nn's activations, reductions over the other axis and
#: to a scalar, scans, data movement, sorting and matrix products.
MORE: list[tuple[str, Callable, Callable[[], list[np.ndarray]]]] = [
    ("exp2", jnp.exp2, lambda: [x32(4)]), ("log2", jnp.log2, lambda: [np.exp(x32())]),
    ("log10", jnp.log10, lambda: [np.exp(x32())]),
    ("hypot", jnp.hypot, lambda: [x32(), x32()]), ("fmod", jnp.fmod, lambda: [x32(4), x32(1, 3)]),
    ("clip", lambda x: jnp.clip(x, -0.5, 0.5), lambda: [x32()]),
    ("where", lambda x, y: jnp.where(x > y, x, y), lambda: [x32(), x32()]),
    ("isnan", lambda x: jnp.isnan(jnp.log(x)).astype(jnp.int32), lambda: [x32()]),
    ("signbit", lambda x: jnp.signbit(x).astype(jnp.int32), lambda: [x32()]),
    ("rint", jnp.rint, lambda: [x32(4)]), ("fabs", jnp.fabs, lambda: [x32(4)]),
    ("sinc", jnp.sinc, lambda: [x32()]), ("deg2rad", jnp.deg2rad, lambda: [x32(90)]),
    ("logaddexp2", jnp.logaddexp2, lambda: [x32(), x32()]),
    ("float_power", lambda x: jnp.power(jnp.abs(x), 1.5), lambda: [x32()]),
    ("elu", jax.nn.elu, lambda: [x32()]), ("selu", jax.nn.selu, lambda: [x32()]),
    ("celu", jax.nn.celu, lambda: [x32()]), ("leaky_relu", jax.nn.leaky_relu, lambda: [x32()]),
    ("hard_tanh", jax.nn.hard_tanh, lambda: [x32()]),
    ("hard_swish", jax.nn.hard_swish, lambda: [x32(4)]),
    ("gelu (exact)", lambda x: jax.nn.gelu(x, approximate=False), lambda: [x32()]),
    ("logit", jsp.logit, lambda: [RNG.uniform(0.01, 0.99, C.SHAPE).astype(np.float32)]),
    ("ndtr", jsp.ndtr, lambda: [x32(3)]),
    ("ndtri", jsp.ndtri, lambda: [RNG.uniform(0.01, 0.99, C.SHAPE).astype(np.float32)]),
    ("xlogy", jsp.xlogy, lambda: [x32(), np.exp(x32())]),
    ("f16 exp", jnp.exp, lambda: [f16()]), ("f16 floor", jnp.floor, lambda: [f16(4)]),
    ("int32 abs", jnp.abs, lambda: [i32() // 2]),
    ("int32 sign", jnp.sign, lambda: [i32()]),
    ("int32 clip", lambda x: jnp.clip(x, -100, 100), lambda: [i32() // 2 ** 22]),
    ("int32 sum rows", lambda x: x.sum(1), lambda: [i32() // 2 ** 10]),
    ("sum cols", lambda x: x.sum(0), lambda: [x32()]),
    ("max (all)", jnp.max, lambda: [x32()]), ("mean (all)", jnp.mean, lambda: [x32()]),
    ("min keepdims", lambda x: x - x.min(1, keepdims=True), lambda: [x32()]),
    ("argmax cols", lambda x: jnp.argmax(x, 0), lambda: [x32()]),
    ("l2 norm rows", lambda x: jnp.linalg.norm(x, axis=1), lambda: [x32()]),
    ("softmax cols", lambda x: jax.nn.softmax(x, axis=0), lambda: [x32()]),
    ("cumprod", lambda x: jnp.cumprod(x, 1), lambda: [x32(0.01, 1)]),
    ("cummin", lambda x: lax.cummin(x, 0), lambda: [x32()]),
    ("cumsum rev", lambda x: lax.cumsum(x, 1, reverse=True), lambda: [x32()]),
    ("flip cols", lambda x: jnp.flip(x, 1), lambda: [x32()]),
    ("strided slice", lambda x: x[:, ::2], lambda: [x32()]),
    ("concatenate", lambda x: jnp.concatenate([x[:, 64:], x[:, :64]], 1), lambda: [x32()]),
    ("argsort", lambda x: jnp.argsort(x, 1).astype(jnp.int32), lambda: [x32()]),
    ("sort cols", lambda x: jnp.sort(x, 0), lambda: [x32()]),
    ("sort bf16", lambda x: jnp.sort(x, 1), lambda: [bf16()]),
    ("sort cols bf16", lambda x: jnp.sort(x, 0), lambda: [bf16()]),
    ("argsort bf16", lambda x: jnp.argsort(x, 1).astype(jnp.int32), lambda: [bf16()]),
    ("matvec", lambda x: x @ x[0], lambda: [x32()]),
    ("f16 dot", lambda x: jnp.dot(x, x.T, preferred_element_type=jnp.float32),
     lambda: [f16()]),
    ("argsort rows", lambda x: jnp.argsort(x, 0).astype(jnp.int32), lambda: [x32()]),
    ("argsort int32", lambda x: jnp.argsort(x, 1).astype(jnp.int32), lambda: [i32()]),
]


def _pick(x, y):
    """Cross-entropy: logsumexp of y's rows less y at each row's label (here
    the argmax of x)."""
    picked = jnp.take_along_axis(y, jnp.argmax(x, 1)[:, None], axis=1)
    return jax.nn.logsumexp(y, axis=1) - picked[:, 0]


def _group_scale(x):
    """Per-group (of 32 columns) quantization: x over its group's max |x|."""
    groups = x.reshape(64, 4, 32)
    s = jnp.max(jnp.abs(groups), axis=-1)
    return (groups / s[..., None]).reshape(64, 128)


def _index_bits(x, n: int):
    """The gathers' index block: the data's own bits masked to an axis of
    ``n``. In lax's own ops: jnp's are jitted, and a jitted function's
    traced body keeps the source lines of its first caller, which the
    profiler would then count there instead of here."""
    bits = lax.bitcast_convert_type(x, {2: jnp.int16, 4: jnp.int32}[x.dtype.itemsize])
    bits = lax.convert_element_type(bits, jnp.int32)
    return lax.bitwise_and(bits, lax.full_like(bits, n - 1))


def _index_bits_np(x: np.ndarray, n: int) -> np.ndarray:
    return x.view({2: np.int16, 4: np.int32}[x.dtype.itemsize]).astype(np.int32) & (n - 1)


def _index_lines() -> set[str]:
    """The profiler's line keys of :func:`_index_bits`' body."""
    import inspect
    import os

    lines, start = inspect.getsourcelines(_index_bits)
    path = os.path.abspath(inspect.getsourcefile(_index_bits) or "")
    return {f"{path}:{start + k}" for k in range(len(lines))}


def _top2(x):
    v, i = lax.top_k(jax.nn.softmax(x), 2)
    return jnp.concatenate([v, i.astype(jnp.float32)], 1)


def bf16():
    return RNG.standard_normal(C.SHAPE).astype(ml_dtypes.bfloat16)


#: Issue 37's snippets (attention, MoE, normalization, quantization kernels
#: as people write them) and the families they stand for.
ISSUE_37: list[tuple[str, Callable, Callable[[], list[np.ndarray]]]] = [
    ("take_along_axis", _pick, lambda: [x32(), x32()]),
    ("take_along_axis 0", lambda x, y: jnp.take_along_axis(y, jnp.argmax(x, 0)[None, :], axis=0),
     lambda: [x32(), x32()]),
    ("gather rows", lambda x, y: y[jnp.argmax(x, 0)[:64]], lambda: [x32(), x32()]),
    ("gather cols", lambda x, y: y[:, jnp.argmax(x, 1)], lambda: [x32(), x32()]),
    ("scatter set", lambda x, y: y.at[jnp.argmax(x, 0)[:16]].set(x[:16]), lambda: [x32(), x32()]),
    ("scatter add", lambda x, y: y.at[jnp.argmax(x, 0)[:16] // 2].add(1.0),
     lambda: [x32(), x32()]),
    # one element per row: cross-entropy's gradient, put_along_axis
    ("scatter per row", lambda x: jax.nn.softmax(x).at[jnp.arange(64), jnp.argmax(x, 1)].add(-1.0),
     lambda: [x32()]),
    ("put_along_axis", lambda x: jnp.put_along_axis(x, jnp.argmax(x, 1)[:, None], 0.0, axis=1,
                                                    inplace=False), lambda: [x32()]),
    ("group max", lambda x: jnp.max(jnp.abs(x.reshape(64, 4, 32)), axis=-1), lambda: [x32()]),
    ("group scale", _group_scale, lambda: [x32()]),
    ("repeat", lambda x: jnp.repeat(x[:, :64], 2, axis=1), lambda: [x32()]),
    ("tile", lambda x: jnp.tile(x[:, :64], (1, 2)), lambda: [x32()]),
    ("interleave", lambda x: jnp.stack([x[:, :64], x[:, 64:]], -1).reshape(64, 128),
     lambda: [x32()]),
    # take_along_axis of a whole index block, the indices the data's own bits
    ("gather", lambda x: jnp.take_along_axis(x, _index_bits(x, 128), axis=1), lambda: [x32()]),
    ("gather rows 1", lambda x: jnp.take_along_axis(x, _index_bits(x, 64), axis=0),
     lambda: [x32()]),
    ("gather bf16", lambda x: jnp.take_along_axis(x, _index_bits(x, 128), axis=1),
     lambda: [bf16()]),
    ("gather rows bf16", lambda x: jnp.take_along_axis(x, _index_bits(x, 64), axis=0),
     lambda: [bf16()]),
    # the movement and scan lines in bf16 (issue 37's targets are on f32 and bf16 blocks)
    ("interleave bf16", lambda x: jnp.stack([x[:, :64], x[:, 64:]], -1).reshape(64, 128),
     lambda: [bf16()]),
    ("cumsum bf16", lambda x: jnp.cumsum(x, 1), lambda: [bf16()]),
    ("cummax bf16", lambda x: lax.cummax(x, 1), lambda: [bf16()]),
    ("cumsum rows bf16", lambda x: jnp.cumsum(x, 0), lambda: [bf16()]),
    ("cummin rows bf16", lambda x: lax.cummin(x, 0), lambda: [bf16()]),
    ("top_k + concat", _top2, lambda: [x32()]),
    ("top_k 1", lambda x: lax.top_k(x, 1)[0][:, 0], lambda: [x32()]),
    ("sort - x", lambda x: jnp.sort(x, 1) - x, lambda: [x32()]),
    ("argsort pick", lambda x: jnp.take_along_axis(x, jnp.argsort(x, 1), axis=1),
     lambda: [x32()]),
    ("bf16 matvec", lambda x: jnp.dot(x, x[0], preferred_element_type=jnp.float32),
     lambda: [bf16()]),
    ("vecmat", lambda x: x.sum(1) @ x, lambda: [x32()]),
    ("copysign -1", lambda x: jnp.copysign(x, -1.0), lambda: [x32()]),
]


#: Cases of ``tests/vocabulary/cases.py`` added after issue 27's table was
#: drawn up: counted with the further functions.
LATER_CASES = {"copy"}


def entries() -> list[Entry]:
    out = [from_case(c, c.dtypes[0]) for c in C.ALL]
    for e in out:
        if e.name in LATER_CASES:
            e.group = "more everyday functions"
    out += [Entry(name, fn, gen(), BOUNDED.get(name) or like_jnp(fn))
            for name, fn, gen in OTHERS]
    out += [Entry(name, fn, gen(), BOUNDED.get(name) or like_jnp(fn),
                  group="more everyday functions") for name, fn, gen in MORE]
    out += [Entry(name, fn, gen(), BOUNDED.get(name) or like_jnp(fn), group="issue 37's snippets")
            for name, fn, gen in ISSUE_37]
    return out


MOVEMENT, GATHER, SCAN, SORT = "movement", "gather", "scan", "sort"
#: The primitives whose cost the table shows: name -> (kind, axis of its rows).
COSTED: dict[str, tuple[str, int]] = {
    "transpose": (MOVEMENT, 1), "rev": (MOVEMENT, 0), "flip cols": (MOVEMENT, 1),
    "pad": (MOVEMENT, 1), "roll": (MOVEMENT, 1), "concatenate": (MOVEMENT, 1),
    "strided slice": (MOVEMENT, 1), "outer broadcast": (MOVEMENT, 1), "repeat": (MOVEMENT, 1),
    "interleave": (MOVEMENT, 1), "tile": (MOVEMENT, 1), "gather": (GATHER, 1),
    "gather rows 1": (GATHER, 0), "gather bf16": (GATHER, 1), "gather rows bf16": (GATHER, 0),
    "interleave bf16": (MOVEMENT, 1), "cumsum bf16": (SCAN, 1), "cummax bf16": (SCAN, 1),
    "cumsum rows bf16": (SCAN, 0), "cummin rows bf16": (SCAN, 0),
    "cumsum": (SCAN, 1), "cumsum rev": (SCAN, 1), "cummax": (SCAN, 1), "cummin": (SCAN, 0),
    "cumprod": (SCAN, 1),
    "sort": (SORT, 1), "argsort": (SORT, 1), "sort cols": (SORT, 0), "top_k": (SORT, 1),
    "sort bf16": (SORT, 1), "sort cols bf16": (SORT, 0), "argsort bf16": (SORT, 1),
    "argsort rows": (SORT, 0), "argsort int32": (SORT, 1),
}
#: The length of the axis each gather's index block (:func:`_index_bits` of
#: its first input) indexes.
GATHER_AXES = {"gather": 128, "gather rows 1": 64, "gather bf16": 128, "gather rows bf16": 64}
WAVEFRONT_BYTES = 128  # 32 banks x 4 bytes


def gather_reads(indices: np.ndarray, axis: int, itemsize: int) -> int:
    """The wavefronts of a gather's read pass at its indices' own bank
    conflicts: each warp-wide load fetches one register slot of the result
    in WGMMA's layout (lane ``l`` of warp ``w``: row ``64 g + 16 w + 8 h + l
    // 4``, column ``8 j + 2 (l % 4) + b``), each element from a copy of the
    block whose lines are contiguous (row-major for a gather along the
    columns, column-major along the rows) and padded by the number of words
    (0 to 31) that serves these indices best, as many wavefronts as its
    most-requested bank has distinct words. Any lowering whose result is in
    WGMMA's layout loads these groups (or pays another pass to regroup);
    random indices take about 3.5 wavefronts per load, not 1: no layout
    puts 32 arbitrary words on 32 banks."""
    from smalti.emulate.profiling import wavefronts

    rows, cols = indices.shape
    lane = np.arange(32)
    slots = itertools.product(range(rows // 64), range(4), range(2), range(cols // 8), range(2))
    r, c = map(np.array, zip(*((64 * g + 16 * w + 8 * h + lane // 4, 8 * j + 2 * (lane % 4) + b)
                               for g, w, h, j, b in slots)))
    picked = np.asarray(indices, np.int64)[r, c]
    line, length = (r, cols) if axis == 1 else (c, rows)
    per_word = 4 // itemsize
    return min(int(wavefronts((line * (length + per_word * pad) + picked) // per_word).sum())
               for pad in range(32))


def ideal(kind: str, shape: tuple[int, ...], axis: int, itemsize: int,
          indices: np.ndarray | None = None) -> tuple[float, float]:
    """(extra shared wavefronts, extra thread-instructions per element) of the
    ideal lowering of a primitive of ``kind`` along ``axis`` of a block of
    ``shape`` (a gather's at its ``indices``)."""
    nbytes = int(np.prod(shape)) * itemsize
    wavefronts = 2 * nbytes / WAVEFRONT_BYTES  # one conflict-free write + read pass
    if kind == GATHER:  # the write pass, and the reads at the indices' conflicts
        wavefronts = nbytes / WAVEFRONT_BYTES + gather_reads(indices, axis, itemsize)
    inst = 2 * itemsize / 16  # that pass: 16-byte stores and loads, per element
    if kind == SCAN:
        inst += 2  # a work-efficient scan: 2 (n - 1) combines per row of n
    elif kind == SORT:  # bitonic: log2 n (log2 n + 1) / 4 compare-exchanges per element
        lg = float(np.log2(shape[axis]))
        inst += 2 * lg * (lg + 1) / 4  # a min and a max each
    return wavefronts, inst


_IDENTITY: dict = {}


def cost(entry: Entry, prof) -> tuple[int, float, float, float]:
    """(extra wavefronts, their ideal, extra thread-instructions per element,
    their ideal) of ``entry``'s profile against the identity kernel on its
    first input's block (profiled once per shape and dtype); a gather's
    without its index block's computation (its instructions at
    :func:`_index_bits`' lines)."""
    from smalti.emulate.profiling import INST, WAVEFRONTS

    x = entry.args[0]
    kind, axis = COSTED[entry.name]
    key = (x.shape, x.dtype.str)
    if key not in _IDENTITY:
        _IDENTITY[key] = smalti.emulate.profile(kernel(lambda v: v, [x]), x)
    base = _IDENTITY[key]
    indices, callers = None, 0
    if kind == GATHER:
        indices = _index_bits_np(x, GATHER_AXES[entry.name])
        lines = _index_lines()
        callers = sum(c.get(INST, 0) for line, c in prof.by_line.items() if line in lines)
    want = ideal(kind, x.shape, axis, x.dtype.itemsize, indices)
    extra_wf = prof[WAVEFRONTS] - base[WAVEFRONTS]
    extra_inst = (prof[INST] - base[INST] - callers) * 32 / x.size
    return extra_wf, want[0], extra_inst, want[1]


def _lowers(k, args) -> tuple[bool, str]:
    try:
        smalti.emulate.lower(k, *args)
        return True, ""
    except Exception as e:  # noqa: BLE001 -- the table reports any failure
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        return False, f"{type(e).__name__}: {first}"[:90]


def row(entry: Entry, pipeline) -> tuple[str, bool, bool, bool | None, str, tuple | None]:
    """(name, lowers with jax, with smalti, emulated equal, why not, cost or None)."""
    k = kernel(entry.fn, entry.args)
    with_jax, _ = _lowers(k, entry.args)
    spent = None
    with smalti.jax.installed(pipeline):
        with_smalti, why = _lowers(k, entry.args)
        equal = None
        if with_smalti:
            try:
                if entry.name in COSTED:
                    prof = smalti.emulate.profile(k, *entry.args)
                    (got,) = prof.outputs
                    spent = cost(entry, prof)
                else:
                    (got,) = smalti.emulate.run(k, *entry.args)
                equal = entry.equal(got, entry.args)
            except Exception as e:  # noqa: BLE001
                why = f"emulator: {type(e).__name__}: {str(e).splitlines()[0]}"[:90]
                equal = False
    return entry.name, with_jax, with_smalti, equal, why, spent


def _cost_cells(spent: tuple | None) -> str:
    if spent is None:
        return f"{'':<22} | {'':<20}"
    wf, wf_ideal, inst, inst_ideal = spent
    return (f"{wf:>9,d} ({wf_ideal:>8,.0f})".ljust(22) + " | "
            + f"{inst:>8.1f} ({inst_ideal:>6.1f})".ljust(20))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated function names")
    args = parser.parse_args(argv)
    pipeline = smalti.build_pipeline(plugins={"smalti.vocabulary": smalti.vocabulary})
    todo = entries()
    if args.only:
        names = set(args.only.split(","))
        todo = [e for e in todo if e.name in names]
    yes = {True: "yes", False: "no", None: "-"}
    print(f"{'function':<18} | {'lowers with jax':<15} | {'lowers with smalti':<18} | "
          f"{'emulated equal':<14} | {'extra wavefronts':<22} | {'extra inst/el':<20} | why not")
    print(f"{'':<18} | {'':<15} | {'':<18} | {'':<14} | {'  (ideal)':<22} | {'  (ideal)':<20} |")
    print("-" * 148)
    rows, groups = [], []
    for e in todo:
        r = row(e, pipeline)
        rows.append(r)
        groups.append(e.group)
        print(f"{r[0]:<18} | {yes[r[1]]:<15} | {yes[r[2]]:<18} | {yes[r[3]]:<14} | "
              f"{_cost_cells(r[5])} | {r[4]}", flush=True)
    print("-" * 148)
    for group in dict.fromkeys(groups):
        _summary(group, [r for r, g in zip(rows, groups) if g == group])
    if len(set(groups)) > 1:
        _summary("all", rows)
    return 0


def _summary(label: str, rows) -> None:
    n = len(rows)
    jax_n = sum(r[1] for r in rows)
    smalti_n = sum(r[2] for r in rows)
    equal_n = sum(bool(r[3]) for r in rows)
    print(f"{label}: {n} functions: jax lowers {jax_n}, smalti lowers {smalti_n} "
          f"({100 * smalti_n / n:.0f}%), emulated equal {equal_n} of {smalti_n}")


if __name__ == "__main__":
    sys.exit(main())
