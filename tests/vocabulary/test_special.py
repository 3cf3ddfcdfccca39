"""The special functions of ``smalti.vocabulary`` (``vocabulary/special.py``)
on the emulator, against the exact value.

Each function runs in a Warpgroup kernel on a (64, 128) block per dtype (f32,
f16, bf16) and is compared with float64 ``scipy.special`` rounded to the
dtype, within the bound of its :class:`Case` in ulp of the result. Inputs
include signed zeros, infinities, NaN, the poles, the tails (erfc down to
its f32 underflow near 10.05, erf_inv next to +-1), the zeros of lgamma at
1 and 2 and of digamma at 1.4616..., and the points where the lowerings
switch formulas. Where jnp's convention differs from scipy's (lgamma(-inf) =
+inf, digamma(-0) = -inf) the reference follows jnp.

For x < 0, lgamma and digamma are reflected (``log(pi/|sin(pi x)|) -
lgamma(1 - x)``, ``psi(1 - x) - pi cot(pi x)``), whose terms cancel at the
zeros between the poles: there an element also passes within an absolute
``4 eps_f32 max(1, scale)`` (plus the dtype's ulp bound), ``scale`` the
larger reflected term. Subnormal inputs are left out (a GPU may flush them).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.special as sp
from jax import lax
from jax.experimental.pallas import mosaic_gpu as plgpu

import smalti
import smalti.emulate
import smalti.jax
import smalti.vocabulary
from smalti.diagnostics import SmaltiError
from smalti.emulate.testing import ulp_distance
from tests.vocabulary.cases import BF16, F16, F32, SHAPE, Case, fill, log_uniform

WG = plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup)
EPS32 = float(np.finfo(np.float32).eps)
N = SHAPE[0] * SHAPE[1]
X0 = 1.4616321449683623  # digamma's positive zero


@pytest.fixture(scope="module")
def pipeline():
    return smalti.build_pipeline(plugins={"smalti.vocabulary": smalti.vocabulary})


# --- inputs -----------------------------------------------------------------------------


def _edges(*extra) -> np.ndarray:
    return np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 0.5, -0.5, *extra])


def _near(rng, centre: float, n: int, lo: float = -7, hi: float = -1) -> np.ndarray:
    return centre + log_uniform(rng, lo, hi)[:n]


def g_erfc(rng, dtype):
    body = np.concatenate([rng.uniform(-5, 11, 3072), log_uniform(rng, -8, -0.3)[:1024],
                           rng.uniform(0.4, 0.6, 1024), rng.uniform(8.8, 9.2, 1024),
                           rng.uniform(9.8, 10.1, 1024), rng.uniform(-30, -4, 1024)])
    return [fill(rng, dtype, body, _edges(9.0, 10.0, 10.05, 20.0, 21.0, -20.0, 1e-30, 3.0))]


def g_erf_inv(rng, dtype):
    near_one = (1 - log_uniform(rng, -7.5, -1, signed=False)[:2048]) * rng.choice([-1, 1], 2048)
    body = np.concatenate([rng.uniform(-1, 1, 4096), near_one, log_uniform(rng, -12, -1)[:2048]])
    return [fill(rng, dtype, body, _edges(1.5, -1.5, 0.9966, -0.9966, 1e-30, 0.99999994))]


def g_lgamma(rng, dtype):
    top = {F32: 37.5, F16: 4.8, BF16: 37.5}[np.dtype(dtype)]
    body = np.concatenate([rng.uniform(0, 10, 3072), _near(rng, 1.0, 1024), _near(rng, 2.0, 1024),
                           log_uniform(rng, -6, top, signed=False)[:2048],
                           rng.uniform(0.3, 2.7, 1024)])
    return [fill(rng, dtype, body, _edges(2.0, 1.5, 2.5, 8.0, 3.0, 0.25, 1e-30, 3.4e38, 4.1e36))]


def g_negative(rng, dtype):
    """x < 0: the reflected branch (poles, the zeros between them)."""
    top = {F32: 7.0, F16: 3.0, BF16: 7.0}[np.dtype(dtype)]
    body = -np.concatenate([rng.uniform(0, 12, 4096),
                            log_uniform(rng, -6, top, signed=False)[:2048],
                            rng.uniform(2.3, 2.9, 2048)])
    return [fill(rng, dtype, body, _edges(-2.0, -3.0, -100.0, -2.0 ** 23, -2.5, -2.4570247,
                                          -1e-30, -3.4e38))]


def g_digamma(rng, dtype):
    top = {F32: 37.5, F16: 4.8, BF16: 37.5}[np.dtype(dtype)]
    body = np.concatenate([rng.uniform(0, 10, 3072), _near(rng, X0, 2048, -8, -1),
                           log_uniform(rng, -6, top, signed=False)[:2048],
                           rng.uniform(0.9, 2.6, 512), rng.uniform(5.5, 6.5, 512)])
    return [fill(rng, dtype, body, _edges(X0, 2.5, 6.0, 2.0, 1e-30, 3.4e38))]


def g_bessel(rng, dtype):
    top = {F32: 37.5, F16: 4.8, BF16: 37.5}[np.dtype(dtype)]
    body = np.concatenate([rng.uniform(-12, 12, 4096), log_uniform(rng, -6, top)[:2048],
                           rng.uniform(1.9, 2.1, 1024), rng.uniform(7.8, 8.2, 1024)])
    return [fill(rng, dtype, body, _edges(2.0, -2.0, 8.0, -8.0, 1e-30, -1e-30, 3.4e38))]


# --- exact values (float64; jnp's conventions where scipy's differ) -------------------------


def _f64(x):
    return np.asarray(x).astype(np.float64)


def t_erfc(x):
    return sp.erfc(_f64(x))


def t_erf_inv(x):
    with np.errstate(invalid="ignore"):
        return sp.erfinv(_f64(x))


def t_lgamma(x):
    x = _f64(x)
    return np.where(x == -np.inf, np.inf, sp.gammaln(x))


def t_digamma(x):
    x = _f64(x)
    return np.where(x == 0, -np.inf, sp.psi(x))


def s_lgamma(x):
    """The terms the reflection subtracts: |lgamma(1 - x)| (>= |log(pi/|sin|)|
    wherever they cancel)."""
    with np.errstate(all="ignore"):
        return np.abs(sp.gammaln(1 - _f64(x)))


def s_digamma(x):
    x = _f64(x)
    with np.errstate(all="ignore"):
        return np.maximum(np.abs(sp.psi(1 - x)), np.abs(np.pi / np.tan(np.pi * x)))


BOUNDS = {F32: 4, F16: 1, BF16: 1}

CASES: list[Case] = [
    Case("erfc", lax.erfc, g_erfc, t_erfc, {F32: 5, F16: 1, BF16: 1}),
    Case("erf_inv", lax.erf_inv, g_erf_inv, t_erf_inv, BOUNDS),
    Case("lgamma", lax.lgamma, g_lgamma, t_lgamma, BOUNDS),
    Case("lgamma_negative", lax.lgamma, g_negative, t_lgamma, BOUNDS,
         note="absolute bound at the zeros: 4 eps_f32 max(1, |lgamma(1 - x)|)"),
    Case("digamma", lax.digamma, g_digamma, t_digamma, BOUNDS),
    Case("digamma_negative", lax.digamma, g_negative, t_digamma, BOUNDS,
         note="absolute bound at the zeros: 4 eps_f32 max(1, |psi(1 - x)|, |pi cot(pi x)|)"),
]
CASES += [
    Case("bessel_i0e", lax.bessel_i0e, g_bessel, lambda x: sp.i0e(_f64(x)),
         {F32: 3, F16: 1, BF16: 1}),
    Case("bessel_i1e", lax.bessel_i1e, g_bessel, lambda x: sp.i1e(_f64(x)),
         {F32: 3, F16: 1, BF16: 1}),
]
SCALES = {"lgamma_negative": s_lgamma, "digamma_negative": s_digamma}


# --- kernels ----------------------------------------------------------------------------


def plain_kernel(fn, dtype):
    def body(x_ref, o_ref):
        o_ref[...] = fn(x_ref[...])
    return plgpu.kernel(body, out_type=jax.ShapeDtypeStruct(SHAPE, dtype), compiler_params=WG)


def swizzled_kernel(fn, dtype):
    """The block by TMA into 128-byte-swizzled SMEM, the result back by TMA."""
    cols = 128 // np.dtype(dtype).itemsize
    transforms = (plgpu.TilingTransform((8, cols)), plgpu.SwizzleTransform(128))

    def body(x_gmem, o_gmem, x_smem, o_smem, bar):
        plgpu.copy_gmem_to_smem(x_gmem, x_smem, bar)
        plgpu.barrier_wait(bar)
        o_smem[...] = fn(x_smem[...])
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(o_smem, o_gmem)
        plgpu.wait_smem_to_gmem(0)

    scratch = [plgpu.SMEM(SHAPE, dtype, transforms=transforms),
               plgpu.SMEM(SHAPE, dtype, transforms=transforms), plgpu.Barrier(num_arrivals=1)]
    return plgpu.kernel(body, out_type=jax.ShapeDtypeStruct(SHAPE, dtype),
                        scratch_types=scratch, compiler_params=WG)


def emulate(pipeline, case, dtype, build=plain_kernel, seed=31):
    (x,) = case.gen(np.random.default_rng(seed), dtype)
    with smalti.jax.installed(pipeline):
        (got,) = smalti.emulate.run(build(case.fn, x.dtype), x)
    return x, got


def check(case, dtype, x, got):
    with np.errstate(all="ignore"):
        exact = np.asarray(case.truth(x), np.float64)
        want = exact.astype(got.dtype)
    ulp = case.ulp[np.dtype(dtype)]
    d = ulp_distance(got, want)
    ok = d <= ulp
    if case.name in SCALES:  # cancelling reflection: also an absolute bound
        with np.errstate(all="ignore"):
            spacing = np.abs(np.spacing(want)).astype(np.float64)
            bound = ulp * spacing + 4 * EPS32 * np.maximum(1.0, SCALES[case.name](x))
            ok |= np.isfinite(exact) & (np.abs(got.astype(np.float64) - exact) <= bound)
    if not ok.all():
        k = np.flatnonzero(~ok.ravel())[:5]
        raise AssertionError(
            f"{case.name} {np.dtype(dtype).name}: {int((~ok).sum())} elements beyond the bound "
            f"({ulp} ulp); e.g. x={x.ravel()[k]}, got={got.ravel()[k]}, want={want.ravel()[k]}, "
            f"ulp={d.ravel()[k]}")


PARAMS = [pytest.param(c, d, id=f"{c.name}-{np.dtype(d).name}") for c in CASES for d in c.dtypes]


@pytest.mark.parametrize("case,dtype", PARAMS)
def test_function(pipeline, case, dtype):
    check(case, dtype, *emulate(pipeline, case, dtype))


@pytest.mark.parametrize("name", ["erfc", "lgamma_negative"])
def test_through_swizzled_smem(pipeline, name):
    case = next(c for c in CASES if c.name == name)
    check(case, F16, *emulate(pipeline, case, F16, build=swizzled_kernel, seed=7))


EDGES = {
    "erfc": (lax.erfc, [(-np.inf, 2.0), (np.inf, 0.0), (np.nan, np.nan), (0.0, 1.0), (-0.0, 1.0),
                        (-2.0 ** 30, 2.0), (10.5, 0.0), (1e30, 0.0)]),
    "erf_inv": (lax.erf_inv, [(1.0, np.inf), (-1.0, -np.inf), (0.0, 0.0), (-0.0, -0.0),
                              (1.0000001, np.nan), (-2.0, np.nan), (np.inf, np.nan),
                              (-np.inf, np.nan), (np.nan, np.nan)]),
    "lgamma": (lax.lgamma, [(1.0, 0.0), (2.0, 0.0), (0.0, np.inf), (-0.0, np.inf), (-1.0, np.inf),
                            (-3.0, np.inf), (-2.0 ** 30, np.inf), (np.inf, np.inf),
                            (-np.inf, np.inf), (np.nan, np.nan), (3e38, np.inf)]),
    "digamma": (lax.digamma, [(0.0, -np.inf), (-0.0, -np.inf), (-1.0, np.nan), (-3.0, np.nan),
                              (-2.0 ** 30, np.nan), (np.inf, np.inf), (-np.inf, np.nan),
                              (np.nan, np.nan)]),
    "bessel_i0e": (lax.bessel_i0e, [(0.0, 1.0), (-0.0, 1.0), (np.inf, 0.0), (-np.inf, 0.0),
                                    (np.nan, np.nan)]),
    "bessel_i1e": (lax.bessel_i1e, [(0.0, 0.0), (-0.0, -0.0), (np.inf, 0.0), (-np.inf, -0.0),
                                    (np.nan, np.nan)]),
}


@pytest.mark.parametrize("name", list(EDGES))
def test_edge_values(pipeline, name):
    """The values the conventions fix, bit for bit (signs of zero included):
    erfc(-inf) = 2, erf_inv(+-1) = +-inf, |x| > 1 -> NaN, lgamma at its zeros
    1 and 2 exactly 0 (jnp on the CPU gives 4.8e-7 at 1) and +inf at the
    poles, digamma NaN at the poles and -inf at +-0 (as jnp)."""
    fn, pairs = EDGES[name]
    x = np.full(SHAPE, 0.75, np.float32)
    x.flat[:len(pairs)] = [p[0] for p in pairs]
    with smalti.jax.installed(pipeline):
        (got,) = smalti.emulate.run(plain_kernel(fn, np.float32), x)
    want = np.array([p[1] for p in pairs], np.float32)
    np.testing.assert_array_equal(got.flat[:len(pairs)], want)
    signs = [bool(np.signbit(g)) for g, p in zip(got.flat, pairs) if not np.isnan(p[1])]
    assert signs == [bool(np.signbit(p[1])) for p in pairs if not np.isnan(p[1])]


def test_jax_alone_refuses_them():
    """Without the plugin Pallas raises for these (the reason they are here)."""
    x = np.ones(SHAPE, np.float32)
    for fn in (lax.erfc, lax.erf_inv, lax.lgamma, lax.digamma, lax.bessel_i0e, lax.bessel_i1e):
        with pytest.raises(NotImplementedError, match="Unimplemented primitive"):
            smalti.emulate.run(plain_kernel(fn, np.float32), x)


def test_float64_is_refused_with_a_fix(pipeline):
    with jax.enable_x64(True):
        x = np.ones(SHAPE, np.float64)
        with smalti.jax.installed(pipeline), pytest.raises(SmaltiError) as info:
            smalti.emulate.run(plain_kernel(lambda v: jnp.exp(lax.lgamma(v)), np.float64), x)
    error = info.value
    assert error.code == "SM206" and isinstance(error, NotImplementedError)
    assert "lgamma" in error.message and "float64" in error.message and error.fixes
    assert error.location and "test_special.py" in error.location
