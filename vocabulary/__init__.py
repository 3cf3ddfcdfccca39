"""smalti's vocabulary plugin: ordinary ``jax.numpy`` / ``jax.nn`` / ``lax``
functions inside Pallas Mosaic GPU kernels with Warpgroup semantics.

jax 0.11.2 has no Warpgroup lowering for many everyday primitives (``floor``,
``ceil``, ``expm1``, ``log1p``, ``pow``, ``tan``, the hyperbolic functions and
their inverses, ``asin``/``acos``/``atan``, ``cbrt``, ``is_finite``,
``population_count``, ``nextafter``, ``stop_gradient`` -- and so
``jax.nn.softmax`` -- and ``integer_pow`` with an exponent below 2 other
than -1).
This plugin registers them through ``smalti_register_pallas_lowerings``: each
lowers to dialect ops that smalti already infers and lowers (``arith``/``math``
ops of :mod:`smalti.plugins`), by an exact decomposition or by a stated-accuracy
one (see ``docs/vocabulary.md``), plus two ``math`` ops that jax's own code
generators already emit (``math.floor`` in ``FragmentedArray.__floordiv__``,
``math.powf`` in ``FragmentedArray.__pow__``), for which it adds the
constraint and lowering rules.

Why a plugin of its own, not part of :mod:`smalti.plugins`:

- :mod:`smalti.plugins` holds the rules for the dialect ops jax's pipeline
  itself produces, and is held to jax's behaviour (same attributes, same IR).
  This plugin goes further: it changes what *Pallas* accepts, replacing
  ``NotImplementedError`` from Pallas with working lowerings that jax does not
  have. That is a language extension, not a middle-end rule, so it is kept
  where it can be turned off as one unit.
- It can be blocked by name (``smalti.build_pipeline(block=["smalti.vocabulary"])``
  or ``SMALTI_BLOCK_PLUGINS=smalti.vocabulary``): Pallas then behaves exactly as
  jax 0.11.2 does for these primitives, while smalti's middle-end stays in use.
- It never replaces a lowering jax has: where a primitive has a Pallas rule
  for some parameters (``integer_pow``), the rule delegates to jax's own for
  those, so kernels jax already lowers produce the same IR.
"""

from __future__ import annotations

from smalti.hookspec import hookimpl
from smalti.registry import ConstraintRegistry, LoweringRegistry, PallasRegistry

from smalti.vocabulary import math_ops

SMALTI_HOOK_VERSION = 1

#: The Pallas primitives this plugin lowers, as ``"module:attribute"``
#: references (resolved only once smalti is installed into jax), with the function of :mod:`smalti.vocabulary.primitives`
#: that lowers each.
PRIMITIVES: dict[str, str] = {
    "jax._src.lax.lax:floor_p": "lower_floor",
    "jax._src.lax.lax:ceil_p": "lower_ceil",
    "jax._src.lax.lax:is_finite_p": "lower_is_finite",
    "jax._src.lax.lax:expm1_p": "lower_expm1",
    "jax._src.lax.lax:log1p_p": "lower_log1p",
    "jax._src.lax.lax:pow_p": "lower_pow",
    "jax._src.lax.lax:integer_pow_p": "lower_integer_pow",
    "jax._src.lax.lax:tan_p": "lower_tan",
    "jax._src.lax.lax:sinh_p": "lower_sinh",
    "jax._src.lax.lax:cosh_p": "lower_cosh",
    "jax._src.lax.lax:asinh_p": "lower_asinh",
    "jax._src.lax.lax:acosh_p": "lower_acosh",
    "jax._src.lax.lax:atanh_p": "lower_atanh",
    "jax._src.lax.lax:asin_p": "lower_asin",
    "jax._src.lax.lax:acos_p": "lower_acos",
    "jax._src.lax.lax:atan_p": "lower_atan",
    "jax._src.lax.lax:cbrt_p": "lower_cbrt",
    "jax._src.lax.lax:population_count_p": "lower_population_count",
    "jax._src.lax.lax:nextafter_p": "lower_nextafter",
    "jax._src.ad_util:stop_gradient_p": "lower_stop_gradient",
    "jax._src.custom_derivatives:custom_jvp_call_p": "lower_custom_jvp_call",
}


@hookimpl
def smalti_register_constraint_rules(registry: ConstraintRegistry) -> None:
    math_ops.register_constraints(registry)


@hookimpl
def smalti_register_lowering_rules(registry: LoweringRegistry) -> None:
    math_ops.register_lowerings(registry)


def _deferred(name: str):
    """The lowering ``name`` of :mod:`.primitives`, imported on first use
    (that module imports Pallas, which building a pipeline must not)."""

    def lower(ctx, *args, **params):
        from smalti.vocabulary import primitives

        return getattr(primitives, name)(ctx, *args, **params)

    lower.__name__ = lower.__qualname__ = name
    return lower


@hookimpl
def smalti_register_pallas_lowerings(registry: PallasRegistry) -> None:
    for primitive, name in PRIMITIVES.items():
        registry.pallas_lowering(primitive)(_deferred(name))
