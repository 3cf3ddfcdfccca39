"""Warpgroup lowerings of the special functions: ``erfc``, ``erf_inv``,
``lgamma``, ``digamma``, ``bessel_i0e``, ``bessel_i1e``.

Each is a decomposition written as a jax function on f32 and lowered by
Pallas' ``_lower_fun`` into primitives Pallas lowers (``exp``, ``log``,
``sqrt``, ``sin``, ``cos``, ``erf``, arithmetic, ``select_n``, comparisons)
plus ``floor`` from this plugin; f16 and bf16 are computed in f32 and rounded
once (``_decomposed`` of :mod:`primitives`). The polynomial coefficients were
fitted for this module (weighted least squares at 2000 Chebyshev points, in
float64, against ``scipy.special`` or the zeta series of lgamma); each list
says what it approximates and the fit's relative error, far below f32's.

- ``erfc(x)``: ``1 - erf(x)`` for ``x < 0.5`` (the result is >= 0.48, so no
  cancellation; 2 as x -> -inf). For ``x >= 0.5``, Shepherd and Laframboise's
  form (Math. Comp. 36, 1981): ``erfc(x) = exp(-x^2) S(y) / (1 + 2x)`` with
  ``y = (x - K) / (x + K)``, ``K = 3.75``, ``S`` a polynomial in ``y``
  (``S`` stays between 1 and 1.29 on ``[0, inf)``, ``2 / sqrt(pi)`` at inf,
  so a degree-11 polynomial holds it to 4.5e-9 on all of ``[0.5, inf)``).
  ``x^2 = hi + lo`` exactly (Dekker's product; rounding ``x^2`` would cost
  about ``x^2 / 2`` ulp), ``exp(-x^2) = exp(-hi) (1 - lo)``. Where ``exp(-hi)`` is
  subnormal (x > 9.3) its absolute error times ``S / (1 + 2x) < 1`` stays
  below the result's spacing, so the bound holds down to the underflow near
  x = 10.05 (0 beyond).
- ``erf_inv(x)``: Giles' single-precision approximation ("Approximating the
  erfinv function", GPU Computing Gems, 2010): ``w = -log((1 - x)(1 + x))``,
  a degree-8 polynomial in ``w - 2.5`` (``w < 5``) or in ``sqrt(w) - 3``,
  times ``x``; ``+-1 -> +-inf``, ``|x| > 1`` and NaN -> NaN.
- ``lgamma(x)`` (``log|Gamma(x)|``): ``z P1(z)`` around the zero at 1
  (``z = x - 1``, exact, on ``[0.5, 1.5)``), ``z P2(z)`` around the zero at 2
  (``z = x - 2`` on ``[1.5, 2.5)``), so both zeros keep relative accuracy;
  ``x P1(x) - log x`` on ``(0, 0.5)``; ``lgamma(x - n) + log((x - 1)...(x - n))``
  (exact differences, all terms positive) on ``[2.5, 8)``; Stirling's series
  ``(x - 1/2)(log x - 1) + (log(2 pi) - 1)/2 + 1/(12x) - 1/(360x^3) + ...`` from
  8. For ``x < 0`` the reflection ``log(pi / |sin(pi x)|) - lgamma(1 - x)``,
  with ``sin(pi x)`` from the exact reduction ``x - floor(x + 1/2)``; poles
  (non-positive integers, -inf) -> +inf.
- ``digamma(x)``: ``z R(z)``, ``z = (x - x0_hi) - x0_lo`` around the positive
  zero ``x0 = 1.46163...`` on ``[1, 2.5)`` (relative accuracy there);
  ``psi(x + 1) - 1/x`` on ``(0, 1)``; the recurrence ``psi(x - n) + sum 1/(x - k)``
  (all terms positive) on ``[2.5, 6)``; the asymptotic series ``log x - 1/(2x)
  - sum B_2k / (2k x^2k)`` from 6. For ``x < 0`` the reflection
  ``psi(1 - x) - pi cot(pi x)``, ``cot`` from an exact reduction to
  ``[-1/4, 1/4]`` (``tan`` of the complement beyond); poles (negative
  integers, -inf) -> NaN and ``psi(+-0) = -inf``, as jnp gives.
- ``bessel_i0e``, ``bessel_i1e`` (``exp(-|x|) I0(x)``, ``exp(-|x|) I1(x)``,
  so ``jax.scipy.special.i0e``, ``i1e``, ``i0``, ``i1``): a polynomial in
  ``|x| - 1`` on ``[0, 2)`` (for i1e, ``|x|`` times one), in ``|x| - 5`` on
  ``[2, 8)``, and ``P(1/|x|) / sqrt|x|`` from 8 (0 at inf); i0e even, i1e
  odd (sign of x, ``i1e(-0) = -0``).

Accuracy (on the emulator, whose ``math`` ops are correctly rounded, against
float64 ``scipy.special``; ``tests/vocabulary/test_special.py``), in ulp of
the result, relative:

| function | f32 | f16, bf16 |
|---|---|---|
| erfc | 5 | 1 |
| erf_inv | 4 | 1 |
| lgamma, x > 0 | 4 | 1 |
| digamma, x > 0 | 4 | 1 |
| bessel_i0e, bessel_i1e | 3 | 1 |

For ``x < 0`` lgamma and digamma have zeros between the poles that no
fixed-precision reflection resolves relatively (``log(pi/|sin|)`` and
``lgamma(1 - x)`` cancel): there the bound is 4 ulp of the result or an
absolute ``4 eps max(1, |lgamma(1 - x)|)`` (resp. ``|psi(1 - x)|`` and
``|pi cot(pi x)|``) for f32, whichever is larger, and 1 ulp or the same
absolute bound for f16 / bf16.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
from jax import lax

from smalti.vocabulary.primitives import _abs, _copysign, _decomposed

PI = math.pi

# --- erfc -------------------------------------------------------------------------------

ERFC_K = 3.75
# S(y) = (1 + 2x) erfcx(x), y = (x - K) / (x + K), on x in [0.5, inf); fit 4.5e-9.
ERFC_S = (1.2375126317931255, -0.14024067219430664, 0.0035853321453481958,
          0.082279062948339921, -0.10880306599680534, 0.092283339922775848,
          -0.058693895405823371, 0.02844211079738268, -0.0097631541770490746,
          0.00161479415344797, 0.00034649941682482358, -0.00018382132434609461)
# f32 rounds erfc(x) to 0 from x = 10.06; selecting 0 beyond 20 also covers
# x = inf, where the split below gives NaN.
ERFC_ZERO_FROM = 20.0


def _poly(z: jax.Array, coefficients: Sequence[float]) -> jax.Array:
    """sum c_k z^k by Horner's rule (coefficients lowest first)."""
    acc = jnp.full_like(z, coefficients[-1])
    for c in coefficients[-2::-1]:
        acc = acc * z + c
    return acc


def _square_exact(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(hi, lo) with hi + lo = x * x exactly (Veltkamp's split, Dekker's
    product; no fma needed)."""
    c = x * 4097.0
    xh = c - (c - x)
    xl = x - xh
    hi = x * x
    lo = ((xh * xh - hi) + 2.0 * xh * xl) + xl * xl
    return hi, lo


def erfc_f32(x: jax.Array) -> jax.Array:
    small = 1.0 - lax.erf(x)
    y = (x - ERFC_K) / (x + ERFC_K)
    rest = _poly(y, ERFC_S) / (1.0 + 2.0 * x)
    hi, lo = _square_exact(x)
    rest = rest - rest * lo                 # * exp(-lo), |lo| <= 2**-16
    # where exp(-hi) is subnormal its absolute error (2**-150) times rest < 1
    # stays below the result's own spacing: relative accuracy to the underflow
    big = rest * lax.exp(-hi)
    r = lax.select(x < 0.5, small, big)
    return lax.select(x > ERFC_ZERO_FROM, jnp.zeros_like(x), r)


# --- erf_inv ----------------------------------------------------------------------------

# Giles (2010), single precision: erfinv(x) = x p(w), w = -log((1 - x)(1 + x)).
GILES_CENTRAL = (1.50140941, 0.246640727, -0.00417768164, -0.00125372503, 0.00021858087,
                 -4.39150654e-06, -3.5233877e-06, 3.43273939e-07, 2.81022636e-08)
GILES_TAIL = (2.83297682, 1.00167406, 0.00943887047, -0.0076224613, 0.00573950773,
              -0.00367342844, 0.00134934322, 0.000100950558, -0.000200214257)


def erf_inv_f32(x: jax.Array) -> jax.Array:
    w = -lax.log((1.0 - x) * (1.0 + x))
    central = _poly(w - 2.5, GILES_CENTRAL)
    tail = _poly(lax.sqrt(w) - 3.0, GILES_TAIL)
    r = lax.select(w < 5.0, central, tail) * x
    a = _abs(x)
    r = lax.select(a == 1.0, _copysign(jnp.full_like(x, jnp.inf), x), r)
    return lax.select(a > 1.0, jnp.full_like(x, jnp.nan), r)


# --- lgamma -----------------------------------------------------------------------------

# P1(z) = lgamma(1 + z) / z on [-0.5, 0.5] (from the series -gamma z + sum
# (-1)^k zeta(k) z^k / k); fit 2.6e-9.
LGAMMA_1 = (-0.57721566587718598, 0.82246702057322996, -0.4006852340866795,
            0.27058196898049341, -0.20741175981668813, 0.16953277996259081,
            -0.14341916452840073, 0.12558733587430188, -0.11839768601607456,
            0.10228184198930571, -0.051793417204423493, 0.060759920117939438,
            -0.17602375071497239, 0.14712805373288118)
# P2(z) = lgamma(2 + z) / z on [-0.5, 0.5] (series (1 - gamma) z + sum
# (-1)^k (zeta(k) - 1) z^k / k); fit 3.5e-11.
LGAMMA_2 = (0.42278433510492158, 0.32246703367226093, -0.067352302458101157,
            0.02058078858190715, -0.0073855005893024494, 0.002890952577495714,
            -0.0011934201970756778, 0.00050567673822010477, -0.00021920049996761146,
            0.00011496915589219183, -5.5456275000010698e-05)
LGAMMA_STIRLING_FROM = 8.0
HALF_LOG_2PI_MINUS_HALF = 0.5 * math.log(2 * PI) - 0.5


def _lgamma_nonneg(a: jax.Array) -> jax.Array:
    """lgamma(a) for a >= 0 (+inf at 0), NaN for NaN."""
    # around the zero at 1 (and below 0.5 via lgamma(a) = lgamma(1 + a) - log a)
    below = a < 0.5
    u = lax.select(below, a, a - 1.0)
    near_one = u * _poly(u, LGAMMA_1) + 0.0     # lgamma(1) = +0, as C's
    near_one = lax.select(below, near_one - lax.log(a), near_one)
    # around the zero at 2, from [2.5, 8) by lgamma(b + 1) = lgamma(b) + log b
    b, prod = a, jnp.ones_like(a)
    for _ in range(6):
        step = b >= 2.5
        b = lax.select(step, b - 1.0, b)    # exact: b < 8
        prod = lax.select(step, prod * b, prod)
    v = b - 2.0
    near_two = v * _poly(v, LGAMMA_2) + lax.log(prod)
    # Stirling
    r = 1.0 / a
    r2 = r * r
    series = r * (1 / 12 - r2 * (1 / 360 - r2 * (1 / 1260 - r2 * (1 / 1680))))
    stirling = (a - 0.5) * (lax.log(a) - 1.0) + HALF_LOG_2PI_MINUS_HALF + series
    out = lax.select(a < LGAMMA_STIRLING_FROM, near_two, stirling)
    return lax.select(a < 1.5, near_one, out)


def _fraction(x: jax.Array) -> jax.Array:
    """x - floor(x): 0 exactly when x is an integer."""
    return x - lax.floor(x)


def _minus_nearest(x: jax.Array) -> jax.Array:
    """x - n for an integer n within 1/2 of x, exactly, for x <= 0 (x + 1/2
    rounds, if at all, without crossing an integer; x - n is then on x's
    grid, or Sterbenz-exact for x in [-1, -1/2])."""
    return x - lax.floor(x + 0.5)


def lgamma_f32(x: jax.Array) -> jax.Array:
    neg = x < 0
    a = lax.select(neg, 1.0 - x, x)
    lg = _lgamma_nonneg(a)
    s = lax.sin(PI * _abs(_minus_nearest(x)))    # |sin(pi x)|, argument in [0, pi/2]
    reflected = lax.log(PI / s) - lg
    inf = jnp.full_like(x, jnp.inf)
    reflected = lax.select(_fraction(x) == 0.0, inf, reflected)    # poles
    r = lax.select(neg, reflected, lg)
    return lax.select(x == -jnp.inf, inf, r)


# --- digamma ----------------------------------------------------------------------------

DIGAMMA_X0_HI = 1.4616321325302124     # f32(x0), x0 = 1.46163214496836234126...
DIGAMMA_X0_LO = 1.243815006546356e-08  # f32(x0 - x0_hi)
# R(z) = psi(x0 + z) / z on x in [1, 2.5]; fit 4.5e-9.
DIGAMMA_R = (0.96767224860939305, -0.44276313958090258, 0.25849917146768153,
             -0.16394376211115821, 0.10784225054315356, -0.072203004147855063,
             0.048612519232034836, -0.032906554513075427, 0.023261670384834093,
             -0.017160725063974359, 0.011015050442847174, -0.0046456246585786058,
             0.00088657021600472695)
DIGAMMA_ASYMPTOTIC_FROM = 6.0


def _digamma_ge1(x: jax.Array) -> jax.Array:
    """psi(x) for x >= 1, NaN for NaN."""
    # down to [1.5, 2.5) by psi(b + 1) = psi(b) + 1/b (positive terms, no cancellation)
    b, acc = x, jnp.zeros_like(x)
    for _ in range(4):
        step = b >= 2.5
        b = lax.select(step, b - 1.0, b)
        acc = lax.select(step, acc + 1.0 / b, acc)
    z = (b - DIGAMMA_X0_HI) - DIGAMMA_X0_LO   # the first difference is exact
    near_root = z * _poly(z, DIGAMMA_R) + acc
    # asymptotic series, Bernoulli numbers B_2k / 2k
    r = 1.0 / x
    r2 = r * r
    series = r2 * (1 / 12 - r2 * (1 / 120 - r2 * (1 / 252 - r2 * (1 / 240 - r2 * (1 / 132)))))
    asymptotic = (lax.log(x) - 0.5 * r) - series
    return lax.select(x < DIGAMMA_ASYMPTOTIC_FROM, near_root, asymptotic)


def _cotpi(x: jax.Array) -> jax.Array:
    """cot(pi x) for x <= 0, from g = x - n in [-1/2, 1/2] (exact): cos/sin
    of pi g for |g| <= 1/4, else tan of the complement pi (1/2 - |g|)."""
    g = _minus_nearest(x)
    a = _abs(g)
    h = 0.5 - a                                          # exact for a >= 1/4
    near = lax.cos(PI * g) / lax.sin(PI * g)
    far = _copysign(lax.sin(PI * h) / lax.cos(PI * h), g)
    return lax.select(a <= 0.25, near, far)


def digamma_f32(x: jax.Array) -> jax.Array:
    neg = x < 0
    a = lax.select(neg, 1.0 - x, x)
    below = a < 1.0                              # (0, 1): psi(a) = psi(a + 1) - 1/a
    psi = _digamma_ge1(lax.select(below, a + 1.0, a))
    psi = lax.select(below, psi - 1.0 / a, psi)
    psi = lax.select(neg, psi - PI * _cotpi(x), psi)
    psi = lax.select(x == 0.0, jnp.full_like(x, -jnp.inf), psi)
    pole = (neg & (_fraction(x) == 0.0)) | (x == -jnp.inf)
    return lax.select(pole, jnp.full_like(x, jnp.nan), psi)


# --- exponentially scaled Bessel functions I0, I1 -------------------------------------------

# Fitted as the lists above; a = |x|.
# i0e(1 + z), z in [-1, 1]; fit 1.6e-11.
I0E_SMALL = (0.46575960759035451, -0.25784919216320024, 0.15389398480524885,
             -0.076267385705308194, 0.031211732909425353, -0.01076047842620422,
             0.0031904045375107945, -0.00082801024776699747, 0.00019078835481806821,
             -3.9395972475917703e-05, 7.4348346304772607e-06, -1.3761982260276708e-06,
             2.0823909011090872e-07)
# i0e(5 + z), z in [-3, 3]; fit 2.1e-9.
I0E_MID = (0.18354081266606098, -0.01956854725653933, 0.0031713185099816448,
           -0.0005801938909916456, 0.00011285422795301749, -2.2592232449773439e-05,
           4.5209373285501598e-06, -8.7937316947901765e-07, 1.6544265657450444e-07,
           -3.0606980673988289e-08, 5.0195693841661415e-09, -6.1216385468835877e-10,
           9.9664132896465056e-11, -2.7228665874495742e-11, 3.2577095416940109e-12)
# sqrt(a) i0e(a) as a polynomial in t = 1/a, a >= 8; fit 1.0e-10.
I0E_TAIL = (0.39894228036918183, 0.049867821064780347, 0.028044108873304958,
            0.029661881800154433, 0.03035042426152499, 0.33465839172243755,
            -1.8893951244752496, 8.4862450635914097)
# i1e(1 + z) / (1 + z), z in [-1, 1]; fit 5e-12.
I1E_SMALL = (0.20791041534906032, -0.15797163844486481, 0.083063473161489626,
             -0.034483914507674497, 0.011893156624541603, -0.0035112873080265839,
             0.00090611303904865998, -0.00020762616691084106, 4.2760226489229949e-05,
             -7.980887724817131e-06, 1.3719642516140406e-06, -2.3037102460185246e-07,
             3.1946303565204215e-08)
# i1e(5 + z), z in [-3, 3]; fit 2.2e-9.
I1E_MID = (0.16397226692395034, -0.013225906221985063, 0.0014307171938873586,
           -0.00012879159021814132, -6.6341450906309189e-08, 4.5482775418845166e-06,
           -1.6655501910505724e-06, 4.3777048943413012e-07, -9.9000249281773123e-08,
           2.0908511884655284e-08, -3.7095420198552755e-09, 4.5445280371260898e-10,
           -7.6893316285546425e-11, 2.3213980661866932e-11, -2.8896011738342727e-12)
# sqrt(a) i1e(a) as a polynomial in t = 1/a, a >= 8; fit 1.2e-10.
I1E_TAIL = (0.39894228044165569, -0.14960339915029458, -0.046743222151107329,
            -0.041430189837281479, -0.040741416742552626, -0.39201381904035687,
            2.1456428537104109, -9.6108528823116792)


def _bessel_e(a: jax.Array, small: jax.Array, mid: Sequence[float], tail: Sequence[float]
              ) -> jax.Array:
    """Three fitted pieces on a = |x| >= 0: [0, 2), [2, 8), [8, inf] (0 at inf)."""
    out = _poly(1.0 / a, tail) / lax.sqrt(a)
    out = lax.select(a < 8.0, _poly(a - 5.0, mid), out)
    return lax.select(a < 2.0, small, out)


def bessel_i0e_f32(x: jax.Array) -> jax.Array:
    a = _abs(x)
    return _bessel_e(a, _poly(a - 1.0, I0E_SMALL), I0E_MID, I0E_TAIL)


def bessel_i1e_f32(x: jax.Array) -> jax.Array:
    """Odd: sign of x (i1e(-0) = -0)."""
    a = _abs(x)
    return _copysign(_bessel_e(a, a * _poly(a - 1.0, I1E_SMALL), I1E_MID, I1E_TAIL), x)


lower_erfc = _decomposed(erfc_f32)
lower_erf_inv = _decomposed(erf_inv_f32)
lower_lgamma = _decomposed(lgamma_f32)
lower_digamma = _decomposed(digamma_f32)
lower_bessel_i0e = _decomposed(bessel_i0e_f32)
lower_bessel_i1e = _decomposed(bessel_i1e_f32)
