"""What smalti.vocabulary's lowerings compute, on the emulator.

Every function of ``cases.py`` is lowered in a Pallas Mosaic GPU kernel with
Warpgroup semantics -- which jax 0.11.2 refuses -- and run on the CPU by
smalti's emulator, per dtype; the result is compared with the exact answer
(float64, rounded to the dtype) within the case's ulp bound, and, for the
exact functions, bit for bit with jnp on the CPU. Inputs include signed
zeros, infinities, NaN, values at the overflow edges and values near the
points where a naive formula cancels. Blocks arrive both by plain ``x_ref[...]``
loads and by TMA into 128-byte-swizzled SMEM.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.experimental.pallas import mosaic_gpu as plgpu

import smalti
import smalti.emulate
import smalti.jax
import smalti.registry
import smalti.vocabulary
from smalti.diagnostics import SmaltiError
from smalti.emulate.testing import assert_close_ulp, ulp_distance
from tests.vocabulary import cases as C

WG = plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup)


@pytest.fixture(scope="module")
def pipeline():
    return smalti.build_pipeline(plugins={"smalti.vocabulary": smalti.vocabulary})


def plain_kernel(fn, in_dtypes, out_dtype):
    def body(*refs):
        *ins, out = refs
        out[...] = fn(*(r[...] for r in ins))
    return plgpu.kernel(body, out_type=jax.ShapeDtypeStruct(C.SHAPE, out_dtype),
                        compiler_params=WG)


def tma_kernel(fn, in_dtypes, out_dtype):
    """Inputs by TMA into 128-byte-swizzled SMEM, the result back by TMA."""
    n = len(in_dtypes)

    def transforms(dtype):
        cols = 128 // np.dtype(dtype).itemsize
        return (plgpu.TilingTransform((8, cols)), plgpu.SwizzleTransform(128))

    def body(*refs):
        gins, gout, smem_ins, smem_out, bar = refs[:n], refs[n], refs[n + 1:2 * n + 1], \
            refs[2 * n + 1], refs[2 * n + 2]
        for g, s in zip(gins, smem_ins):
            plgpu.copy_gmem_to_smem(g, s, bar)
        plgpu.barrier_wait(bar)
        smem_out[...] = fn(*(s[...] for s in smem_ins))
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(smem_out, gout)
        plgpu.wait_smem_to_gmem(0)

    scratch = [plgpu.SMEM(C.SHAPE, d, transforms=transforms(d)) for d in in_dtypes]
    scratch += [plgpu.SMEM(C.SHAPE, out_dtype, transforms=transforms(out_dtype)),
                plgpu.Barrier(num_arrivals=n)]
    return plgpu.kernel(body, out_type=jax.ShapeDtypeStruct(C.SHAPE, out_dtype),
                        scratch_types=scratch, compiler_params=WG)


def emulate(pipeline, case, dtype, build=plain_kernel, seed=27):
    rng = np.random.default_rng(seed)
    args = case.gen(rng, dtype)
    out_dtype = case.out_dtype(np.dtype(dtype))
    kernel = build(case.fn, [a.dtype for a in args], out_dtype)
    with smalti.jax.installed(pipeline):
        (got,) = smalti.emulate.run(kernel, *args)
    return args, got


def check(case, dtype, args, got):
    with np.errstate(over="ignore"):
        want = np.asarray(case.truth(*args)).astype(got.dtype)
    assert_close_ulp(got, want, case.ulp[np.dtype(dtype)])
    if case.exact:
        assert_close_ulp(got, np.asarray(jax.jit(case.fn)(*args)), 0)


PARAMS = [pytest.param(c, d, id=f"{c.name}-{np.dtype(d).name}") for c in C.ALL for d in c.dtypes]


@pytest.mark.parametrize("case,dtype", PARAMS)
def test_function(pipeline, case, dtype):
    check(case, dtype, *emulate(pipeline, case, dtype))


TMA = ["floor", "expm1", "sinh", "acosh", "cbrt", "pow", "population_count"]


@pytest.mark.parametrize("name", TMA)
def test_through_swizzled_smem(pipeline, name):
    case = C.BY_NAME[name]
    dtype = case.dtypes[1] if len(case.dtypes) > 1 else case.dtypes[0]  # f16 / uint32
    check(case, dtype, *emulate(pipeline, case, dtype, build=tma_kernel))


def test_jax_alone_refuses_them():
    """Without the plugin Pallas raises for these (the reason they are here)."""
    x = np.ones(C.SHAPE, np.float32)
    for fn in (jnp.floor, jnp.expm1, jnp.arcsinh, jnp.cbrt, lambda x: x ** 0):
        with pytest.raises(NotImplementedError):
            smalti.emulate.run(plain_kernel(fn, [np.float32], np.float32), x)


def test_blocked_by_name():
    """Blocking the plugin by name restores Pallas' refusal, smalti still in use."""
    blocked = smalti.build_pipeline(plugins={"smalti.vocabulary": smalti.vocabulary},
                                    block=["smalti.vocabulary"])
    x = np.ones(C.SHAPE, np.float32)
    with smalti.jax.installed(blocked), pytest.raises(NotImplementedError):
        smalti.emulate.run(plain_kernel(jnp.floor, [np.float32], np.float32), x)


def test_jax_rule_kept_where_jax_has_one(pipeline):
    """integer_pow with y >= 2 or y == -1 is jax's own rule: same answer as
    without the plugin, bit for bit."""
    x = np.random.default_rng(2).standard_normal(C.SHAPE).astype(np.float32)
    for y in (2, 3, 6, -1):
        kernel = plain_kernel(lambda v: lax.integer_pow(v, y), [np.float32], np.float32)  # noqa: B023 -- traced in this iteration
        (theirs,) = smalti.emulate.run(kernel, x)
        with smalti.jax.installed(pipeline):
            (ours,) = smalti.emulate.run(kernel, x)
        assert_close_ulp(ours, theirs, 0)


def test_acosh_near_one(pipeline):
    """acosh(1 + k eps), where log(x + sqrt(x*x - 1)) would cancel: within 4 ulp."""
    eps = np.finfo(np.float32).eps
    x = (1 + eps * np.arange(1, C.SHAPE[0] * C.SHAPE[1] + 1)).astype(np.float32)
    x = x.reshape(C.SHAPE)
    with smalti.jax.installed(pipeline):
        (got,) = smalti.emulate.run(plain_kernel(jnp.arccosh, [np.float32], np.float32), x)
    want = np.arccosh(x.astype(np.float64)).astype(np.float32)
    assert ulp_distance(got, want).max() <= 4


@pytest.mark.parametrize("fn", [jax.nn.softmax, jax.nn.log_softmax], ids=["softmax", "log_softmax"])
def test_softmax(pipeline, fn):
    """jax.nn.softmax needs stop_gradient, which Pallas lacks and the plugin
    lowers as the identity. Bound as in tests/emulate/test_beyond_jax.py:
    exp, -, / round once each, the 128-term sum <= 129 eps relative."""
    x = (np.random.default_rng(5).standard_normal(C.SHAPE) * 4).astype(np.float32)
    # From swizzled SMEM: a plain GMEM load has a strided layout, which no
    # reduction accepts (SM101), as in jax.
    kernel = tma_kernel(fn, [np.float32], np.float32)
    with smalti.jax.installed(pipeline):
        (got,) = smalti.emulate.run(kernel, x)
    x64 = x.astype(np.float64)
    shifted = x64 - x64.max(1, keepdims=True)
    eps = float(np.finfo(np.float32).eps)
    if fn is jax.nn.softmax:
        want = np.exp(shifted) / np.exp(shifted).sum(1, keepdims=True)
        bound = (128 + 4) * eps * want + 1e-45
    else:
        lse = np.log(np.exp(shifted).sum(1, keepdims=True))
        want = shifted - lse
        bound = 4 * eps * (np.abs(shifted) + np.abs(lse)) + 130 * eps
    assert np.all(np.abs(got - want) <= bound)


# --- refusals: smalti errors with a code, the primitive, the line and a fix ----------------


def _refusal(pipeline, fn, *args):
    kernel = plain_kernel(fn, [a.dtype for a in args], args[0].dtype)
    with smalti.jax.installed(pipeline), pytest.raises(SmaltiError) as info:
        smalti.emulate.run(kernel, *args)
    return info.value


def test_accuracy_is_refused_with_a_fix(pipeline):
    x = np.ones(C.SHAPE, np.float32)
    error = _refusal(pipeline, lambda v: lax.tan(v, accuracy=lax.Tolerance(atol=1e-3)), x)
    assert error.code == "SM206" and isinstance(error, NotImplementedError)
    assert "tan" in error.message and error.fixes
    assert error.location and "test_vocabulary.py" in error.location


# --- jax.custom_jvp functions ---------------------------------------------------------------


def _relu_kernel(fn):
    return plain_kernel(fn, [np.float32], np.float32)


def _assert_near_jnp(got, want, name):
    """Within 4 f32 ulp of jnp's answer (relative, or absolute below 1): the
    functions are a few f32 exp/log ops deep and jnp on the CPU is not exact
    either; NaN and infinities where jnp has them."""
    assert np.array_equal(np.isnan(got), np.isnan(want)), name
    finite = np.isfinite(want)
    assert np.array_equal(got[~finite], want[~finite], equal_nan=True), name
    bound = 4 * np.finfo(np.float32).eps * np.maximum(np.abs(want), 1)
    with np.errstate(invalid="ignore"):
        assert (np.abs(got - want)[finite] <= bound[finite]).all(), name


#: jax 0.12's Pallas lowers custom_jvp / custom_vjp functions itself (and
#: estimates reduce_prod's scratch): the vocabulary registers those rules for
#: earlier jax only, and the tests of its own rules run there.
JAX_LOWERS_CUSTOM_DERIVATIVES = pytest.mark.skipif(
    smalti.registry.installed_jax() >= (0, 12),
    reason="jax >= 0.12 lowers custom_jvp/custom_vjp functions itself")


def test_custom_derivative_rules_are_for_jax_before_0_12():
    """The vocabulary's custom_jvp_call / custom_vjp_call / reduce_prod rules
    are registered for jax < 0.12 only: from 0.12 jax's own are kept."""
    pipeline = smalti.build_pipeline(plugins={"smalti.vocabulary": smalti.vocabulary},
                                     autoload=False)
    records = [r for rs in pipeline.rules.values() for group in rs.values() for r in group] \
        + list(pipeline.other_jax)
    for key in ("custom_jvp_call_p", "custom_vjp_call_p", "reduce_prod_p"):
        mine = [r for r in records if r.plugin == "smalti.vocabulary" and r.key == key]
        assert mine and all(not r.jax.supports((0, 12, 0)) and r.jax.supports((0, 11, 2))
                            for r in mine), key


@JAX_LOWERS_CUSTOM_DERIVATIVES
def test_custom_jvp_functions_lower_and_compute_jnp(pipeline):
    """``jax.custom_jvp`` functions: Pallas' resource estimation refuses
    ``custom_jvp_call`` ("Resource estimation does not support"), so jax
    lowers none of them; with the vocabulary's estimator and lowering (the
    body), each computes jnp's answer: relu and relu6 bit for bit (they only
    compare and select), the others within a few f32 ulp."""
    rng = np.random.default_rng(3)
    x = (rng.standard_normal(C.SHAPE) * 4).astype(np.float32)
    x[0, :6] = [0.0, -0.0, np.inf, -np.inf, np.nan, 6.0]
    y = (rng.standard_normal(C.SHAPE) * 4).astype(np.float32)
    exact = {"relu": jax.nn.relu, "relu6": jax.nn.relu6}
    bounded = {"softplus": jax.nn.softplus, "log_sigmoid": jax.nn.log_sigmoid,
               "mish": jax.nn.mish}
    for name, fn in {**exact, **bounded}.items():
        kernel = _relu_kernel(fn)
        with pytest.raises(NotImplementedError, match="Resource estimation does not support"):
            smalti.emulate.lower(kernel, x)
        with smalti.jax.installed(pipeline):
            (got,) = smalti.emulate.run(kernel, x)
        want = np.asarray(jax.jit(fn)(x))
        if name in exact:
            np.testing.assert_array_equal(got, want, err_msg=name)
        else:
            _assert_near_jnp(got, want, name)

    logaddexp = plain_kernel(jnp.logaddexp, [np.float32] * 2, np.float32)
    with smalti.jax.installed(pipeline):
        (got,) = smalti.emulate.run(logaddexp, x, y)
    _assert_near_jnp(got, np.asarray(jax.jit(jnp.logaddexp)(x, y)), "logaddexp")


@JAX_LOWERS_CUSTOM_DERIVATIVES
def test_custom_vjp_functions_lower_to_their_body(pipeline):
    """A ``jax.custom_vjp`` function (Pallas: "Resource estimation does not
    support custom_vjp_call") computes its forward body; the backward rule
    is never called inside a kernel."""
    @jax.custom_vjp
    def clipped(x):
        return jnp.clip(x, -1.0, 1.0) * 2.0

    def backward(residual, g):
        raise AssertionError("not called in a forward kernel")

    clipped.defvjp(lambda x: (clipped(x), x), backward)
    x = (np.random.default_rng(5).standard_normal(C.SHAPE) * 2).astype(np.float32)
    x[0, :4] = [np.nan, -np.inf, np.inf, -0.0]
    kernel = _relu_kernel(clipped)
    with pytest.raises(NotImplementedError, match="does not support custom_vjp_call"):
        smalti.emulate.lower(kernel, x)
    with smalti.jax.installed(pipeline):
        (got,) = smalti.emulate.run(kernel, x)
    np.testing.assert_array_equal(got, np.asarray(jax.jit(clipped)(x)))


@JAX_LOWERS_CUSTOM_DERIVATIVES
def test_custom_jvp_estimate_is_the_body_s(pipeline):
    """The estimator the vocabulary registers for ``custom_jvp_call`` reports
    what the function's body needs (a body with a reduction: Pallas'
    reduction scratch; an elementwise one: nothing), and is Pallas' table
    entry only while smalti is installed."""
    import jax._src.custom_derivatives as custom
    from jax._src.pallas.mosaic_gpu import lowering as pallas_lowering

    @jax.custom_jvp
    def row_sum(x):
        return x.sum(0)

    row_sum.defjvp(lambda primals, tangents: (row_sum(*primals), row_sum(*tangents)))

    def call_of(fn):
        jaxpr = jax.make_jaxpr(fn)(jnp.ones(C.SHAPE, jnp.float32)).jaxpr
        [eqn] = [e for e in jaxpr.eqns if e.primitive is custom.custom_jvp_call_p]
        return [v.aval for v in eqn.invars], eqn.params

    ctx = pallas_lowering.ResourceEstimatorContext(
        reduction_scratch_bytes=2048, axis_names=pallas_lowering._AxisNames(grid=()),
        lowering_semantics=plgpu.LoweringSemantics.Warpgroup)
    with smalti.jax.installed(pipeline):
        estimate = pallas_lowering._resource_estimators[custom.custom_jvp_call_p]
        for fn, scratch in [(row_sum, 2048), (jax.nn.relu, 0)]:
            avals, params = call_of(fn)
            assert estimate(ctx, *avals, **params).smem_scratch_bytes == scratch
    assert custom.custom_jvp_call_p not in pallas_lowering._resource_estimators


# --- the documentation ------------------------------------------------------------------------


def test_every_primitive_the_plugin_lowers_is_documented():
    """docs/vocabulary.md names (as `primitive`) every Pallas primitive the
    plugin registers a lowering or an estimator for, and every jaxpr
    rewrite it registers."""
    from pathlib import Path

    doc = (Path(__file__).parents[2] / "docs" / "vocabulary.md").read_text()
    registered = {ref.split(":")[1].removesuffix("_p")
                  for ref in [*smalti.vocabulary.PRIMITIVES,
                              *smalti.vocabulary.RESOURCE_ESTIMATORS]}
    assert registered and not {name for name in registered if f"`{name}`" not in doc}
    assert not {name for name in smalti.vocabulary.JAXPR_REWRITES if f"`{name}`" not in doc}


def test_the_version_lists_name_listed_primitives():
    """A primitive in ONLY_BEFORE_0_12 / ONLY_SINCE_0_12 that no table lists
    (a typo) would leave its rule registered for every jax."""
    vocabulary = smalti.vocabulary
    listed = {*vocabulary.PRIMITIVES, *vocabulary.RESOURCE_ESTIMATORS}
    assert vocabulary.ONLY_BEFORE_0_12 | vocabulary.ONLY_SINCE_0_12 <= listed


@pytest.mark.skipif(smalti.registry.installed_jax() < (0, 12),
                    reason="lax.polynomial is new in jax 0.12")
def test_polynomial_is_horner_s_rule(pipeline):
    """``lax.polynomial`` (jax 0.12; ``jnp.sinc`` uses it): Horner's rule, a
    multiply and an add per term in f32, as numpy computes it in that order
    (jnp on the CPU may fuse them: within the evaluation's bound of that,
    2 N eps sum |a_k x^k|)."""
    coeffs = [1.5, -0.25, 0.125, 3.0, -2.0]
    x = np.random.default_rng(4).uniform(-2, 2, C.SHAPE).astype(np.float32)
    with smalti.jax.installed(pipeline):
        (got,) = smalti.emulate.run(_relu_kernel(lambda v: lax.polynomial(v, coeffs)), x)
    want = np.full_like(x, coeffs[-1])
    for a in reversed(coeffs[:-1]):
        want = want * x + np.float32(a)
    np.testing.assert_array_equal(got, want)
    scale = sum(abs(a) * np.abs(x.astype(np.float64)) ** k for k, a in enumerate(coeffs))
    bound = 2 * len(coeffs) * np.finfo(np.float32).eps * scale
    jnp_answer = np.asarray(jax.jit(lambda v: lax.polynomial(v, coeffs))(x))
    assert np.all(np.abs(got.astype(np.float64) - jnp_answer) <= bound)
