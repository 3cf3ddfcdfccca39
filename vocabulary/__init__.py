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

How its rules are registered:

- the constraint and lowering rules of the two dialect ops it adds live in
  modules that do not import Pallas (:data:`RULE_MODULES`); each registers
  its own, at its end, as the modules of :mod:`smalti.plugins` do;
- its Pallas lowerings and estimators live in modules that import Pallas,
  which building a pipeline must not, so they cannot register themselves
  (calling a module's registration function imports the module). They are
  named instead in two declarative tables, :data:`PRIMITIVES` and
  :data:`RESOURCE_ESTIMATORS` (primitive -> ``"module:function"`` in this
  package), registered as :func:`smalti.registry.deferred` rules, imported
  on first use. A table per kind reads as the list of what the plugin lowers
  (``docs/vocabulary.md`` is checked against it), and nothing is left
  unchecked: ``smalti plugins --check`` imports every reference (SM013) and
  the tests run it, so a misspelt one fails CI rather than the first kernel
  that uses the primitive.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from smalti.hookspec import hookimpl
from smalti.plugins.versions import BEFORE_0_12, SINCE_0_12
from smalti.registry import (
    ANY_JAX,
    ConstraintRegistry,
    JaxVersions,
    LoweringRegistry,
    PallasRegistry,
    deferred,
)
from smalti.vocabulary import (
    gather_ops,  # data movement (movement.py)
    math_ops,
)

SMALTI_HOOK_VERSION = 1

#: The Pallas primitives this plugin lowers, as ``"module:attribute"``
#: references (resolved only once smalti is installed into jax), with the
#: function that lowers each, as ``"module:function"`` within this package
#: (a :func:`~smalti.registry.deferred` rule, imported on first use: those
#: modules import Pallas, which building a pipeline must not).
PRIMITIVES: dict[str, str] = {
    # elementwise math (primitives.py)
    "jax._src.lax.lax:floor_p": "primitives:lower_floor",
    "jax._src.lax.lax:ceil_p": "primitives:lower_ceil",
    "jax._src.lax.lax:is_finite_p": "primitives:lower_is_finite",
    "jax._src.lax.lax:expm1_p": "primitives:lower_expm1",
    "jax._src.lax.lax:log1p_p": "primitives:lower_log1p",
    "jax._src.lax.lax:pow_p": "primitives:lower_pow",
    "jax._src.lax.lax:integer_pow_p": "primitives:lower_integer_pow",
    "jax._src.lax.lax:tan_p": "primitives:lower_tan",
    "jax._src.lax.lax:sinh_p": "primitives:lower_sinh",
    "jax._src.lax.lax:cosh_p": "primitives:lower_cosh",
    "jax._src.lax.lax:asinh_p": "primitives:lower_asinh",
    "jax._src.lax.lax:acosh_p": "primitives:lower_acosh",
    "jax._src.lax.lax:atanh_p": "primitives:lower_atanh",
    "jax._src.lax.lax:asin_p": "primitives:lower_asin",
    "jax._src.lax.lax:acos_p": "primitives:lower_acos",
    "jax._src.lax.lax:atan_p": "primitives:lower_atan",
    "jax._src.lax.lax:cbrt_p": "primitives:lower_cbrt",
    "jax._src.lax.lax:population_count_p": "primitives:lower_population_count",
    "jax._src.lax.lax:nextafter_p": "primitives:lower_nextafter",
    "jax._src.ad_util:stop_gradient_p": "primitives:lower_stop_gradient",
    "jax._src.lax.lax:copy_p": "primitives:lower_copy",
    "jax._src.lax.lax:polynomial_p": "primitives:lower_polynomial",
    "jax._src.lax.lax:bitcast_convert_type_p": "primitives:lower_bitcast_convert_type",
    "jax._src.custom_derivatives:custom_jvp_call_p": "primitives:lower_custom_jvp_call",
    "jax._src.custom_derivatives:custom_vjp_call_p": "primitives:lower_custom_vjp_call",
    # special functions (special.py)
    "jax._src.lax.special:erfc_p": "special:lower_erfc",
    "jax._src.lax.special:erf_inv_p": "special:lower_erf_inv",
    "jax._src.lax.special:lgamma_p": "special:lower_lgamma",
    "jax._src.lax.special:digamma_p": "special:lower_digamma",
    "jax._src.lax.special:bessel_i0e_p": "special:lower_bessel_i0e",
    "jax._src.lax.special:bessel_i1e_p": "special:lower_bessel_i1e",
    # reductions (reductions.py)
    "jax._src.lax.lax:argmax_p": "reductions:lower_argmax",
    "jax._src.lax.lax:argmin_p": "reductions:lower_argmin",
    "jax._src.lax.lax:reduce_or_p": "reductions:lower_reduce_or",
    "jax._src.lax.lax:reduce_and_p": "reductions:lower_reduce_and",
    "jax._src.lax.lax:reduce_xor_p": "reductions:lower_reduce_xor",
    "jax._src.lax.lax:select_n_p": "reductions:lower_select_n",
    "jax._src.lax.lax:convert_element_type_p": "reductions:lower_convert_element_type",
    "jax._src.lax.lax:not_p": "reductions:lower_not",
    # data movement (movement.py)
    "smalti.vocabulary.movement:take_p": "movement:lower_take",
    "smalti.vocabulary.lanes:permute_p": "lanes:lower",
    "smalti.vocabulary.lane_exchange:exchange_p": "lane_exchange:lower",
    "smalti.vocabulary.lanes:iota_p": "lanes:lower_iota",
    "smalti.vocabulary.fixed_point:truncate_p": "fixed_point:lower",
    "smalti.vocabulary.column_sort:sort_columns_p": "column_sort:lower",
    "smalti.vocabulary.block_reduce:block_reduce_p": "block_reduce:lower",
    "smalti.vocabulary.rows:row_permute_p": "rows:lower",
    "smalti.vocabulary.lane_scan:lane_scan_p": "lane_scan:lower",
    "smalti.vocabulary.lines:line_p": "lines:lower",
    "smalti.vocabulary.repeats:interleave_p": "repeats:lower",
    # one update per row or column: x.at[jnp.arange(n), cols].add(u) (line_scatter.py)
    "smalti.vocabulary.line_scatter:line_scatter_p": "line_scatter:lower",
    "jax._src.lax.lax:transpose_p": "movement:lower_transpose",
    "smalti.vocabulary.smem_transpose:relabelled_transpose_p": "smem_transpose:lower_relabelled",
    "jax._src.lax.lax:rev_p": "movement:lower_rev",
    "jax._src.lax.lax:pad_p": "movement:lower_pad",
    "jax._src.lax.slicing:slice_p": "movement:lower_slice",
    "jax._src.lax.lax:concatenate_p": "movement:lower_concatenate",
    "jax._src.pjit:jit_p": "movement:lower_jit",
    "jax._src.lax.lax:tile_p": "movement:lower_tile",
    "jax._src.lax.slicing:dynamic_slice_p": "movement:lower_dynamic_slice",
    "jax._src.lax.slicing:dynamic_update_slice_p": "movement:lower_dynamic_update_slice",
    # rank-3 views of blocks (views.py)
    "jax._src.lax.lax:reshape_p": "views:lower_reshape",
    "jax._src.lax.lax:broadcast_in_dim_p": "views:lower_broadcast_in_dim",
    "jax._src.lax.lax:reduce_sum_p": "views:lower_reduce_sum",
    "jax._src.lax.lax:reduce_max_p": "views:lower_reduce_max",
    "jax._src.lax.lax:reduce_min_p": "views:lower_reduce_min",
    "jax._src.lax.lax:stack_p": "views:lower_stack",
    "jax._src.lax.lax:add_p": "views:lower_elementwise",
    "jax._src.lax.lax:sub_p": "views:lower_elementwise",
    "jax._src.lax.lax:mul_p": "views:lower_elementwise",
    "jax._src.lax.lax:div_p": "views:lower_elementwise",
    "jax._src.lax.lax:max_p": "views:lower_elementwise",
    "jax._src.lax.lax:min_p": "views:lower_elementwise",
    "jax._src.lax.lax:rem_p": "views:lower_elementwise",
    "jax._src.lax.lax:eq_p": "views:lower_elementwise",
    "jax._src.lax.lax:ne_p": "views:lower_elementwise",
    "jax._src.lax.lax:lt_p": "views:lower_elementwise",
    "jax._src.lax.lax:le_p": "views:lower_elementwise",
    "jax._src.lax.lax:gt_p": "views:lower_elementwise",
    "jax._src.lax.lax:ge_p": "views:lower_elementwise",
    # gathers and scatters (indexing.py)
    "jax._src.lax.slicing:gather_p": "indexing:lower_gather",
    "jax._src.lax.slicing:scatter_p": "indexing:lower_scatter",
    "jax._src.lax.slicing:scatter_add_p": "indexing:lower_scatter_add",
    "jax._src.lax.slicing:scatter_mul_p": "indexing:lower_scatter_mul",
    "jax._src.lax.slicing:scatter_min_p": "indexing:lower_scatter_min",
    "jax._src.lax.slicing:scatter_max_p": "indexing:lower_scatter_max",
    # scans and sorting (scans.py, sorting.py)
    "jax._src.lax.control_flow.loops:cumsum_p": "scans:lower_cumsum",
    "jax._src.lax.control_flow.loops:cumprod_p": "scans:lower_cumprod",
    "jax._src.lax.control_flow.loops:cummax_p": "scans:lower_cummax",
    "jax._src.lax.control_flow.loops:cummin_p": "scans:lower_cummin",
    "jax._src.lax.control_flow.loops:cumlogsumexp_p": "scans:lower_cumlogsumexp",
    "jax._src.lax.lax:sort_p": "sorting:lower_sort",
    "smalti.vocabulary.sorting:sort_index_p": "sorting:lower_sort_index",
    "jax._src.lax.lax:top_k_p": "sorting:lower_top_k",
    # dot_general of register values (dot.py)
    "jax._src.lax.lax:dot_general_p": "dot:lower_dot_general",
}

#: Pallas resource estimators (how much scratch SMEM a primitive needs), in
#: the same form as :data:`PRIMITIVES`.
RESOURCE_ESTIMATORS: dict[str, str] = {
    "jax._src.custom_derivatives:custom_jvp_call_p": "primitives:estimate_custom_jvp_call",
    "jax._src.custom_derivatives:custom_vjp_call_p": "primitives:estimate_custom_jvp_call",
    # reductions (reductions.py)
    "jax._src.lax.lax:reduce_prod_p": "reductions:estimate_reduction",
    "jax._src.lax.lax:argmax_p": "reductions:estimate_reduction",
    "jax._src.lax.lax:argmin_p": "reductions:estimate_reduction",
    "jax._src.lax.lax:reduce_or_p": "reductions:estimate_reduction",
    "jax._src.lax.lax:reduce_and_p": "reductions:estimate_reduction",
    "jax._src.lax.lax:reduce_xor_p": "reductions:estimate_reduction",
    # data movement (movement.py)
    "smalti.vocabulary.movement:take_p": "movement:take_estimate",
    "smalti.vocabulary.lanes:permute_p": "lanes:estimate",
    "smalti.vocabulary.lane_exchange:exchange_p": "lane_exchange:estimate",
    "smalti.vocabulary.column_sort:sort_columns_p": "column_sort:estimate",
    "smalti.vocabulary.block_reduce:block_reduce_p": "block_reduce:estimate",
    "smalti.vocabulary.rows:row_permute_p": "lanes:estimate",
    "smalti.vocabulary.lane_scan:lane_scan_p": "lanes:estimate",
    "smalti.vocabulary.lines:line_p": "lanes:estimate",
    "smalti.vocabulary.repeats:interleave_p": "repeats:estimate",
    "jax._src.lax.lax:transpose_p": "movement:estimate_transpose",
    "smalti.vocabulary.smem_transpose:relabelled_transpose_p": "movement:estimate_transpose",
    "jax._src.lax.lax:rev_p": "movement:estimate_one",
    "jax._src.lax.lax:pad_p": "movement:estimate_one",
    "jax._src.lax.slicing:slice_p": "movement:estimate_slice",
    "jax._src.lax.lax:tile_p": "movement:estimate_one",
    "jax._src.lax.slicing:dynamic_slice_p": "movement:estimate_one",
    "jax._src.lax.slicing:dynamic_update_slice_p": "movement:estimate_update",
    "jax._src.lax.lax:concatenate_p": "movement:estimate_concatenate",
    # rank-3 views of blocks (views.py)
    "jax._src.lax.lax:reshape_p": "views:estimate_reshape",
    "jax._src.lax.lax:broadcast_in_dim_p": "views:estimate_broadcast_in_dim",
    "jax._src.lax.lax:stack_p": "views:estimate_stack",
    # gathers and scatters (indexing.py)
    "jax._src.lax.slicing:gather_p": "indexing:estimate",
    "jax._src.lax.slicing:scatter_p": "indexing:estimate",
    "jax._src.lax.slicing:scatter_add_p": "indexing:estimate",
    "jax._src.lax.slicing:scatter_mul_p": "indexing:estimate",
    "jax._src.lax.slicing:scatter_min_p": "indexing:estimate",
    "jax._src.lax.slicing:scatter_max_p": "indexing:estimate",
    # scans and sorting (scans.py, sorting.py)
    "jax._src.lax.control_flow.loops:cumsum_p": "scans:estimate_scan",
    "jax._src.lax.control_flow.loops:cumprod_p": "scans:estimate_scan",
    "jax._src.lax.control_flow.loops:cummax_p": "scans:estimate_scan",
    "jax._src.lax.control_flow.loops:cummin_p": "scans:estimate_scan",
    "jax._src.lax.control_flow.loops:cumlogsumexp_p": "scans:estimate_scan",
    "jax._src.lax.lax:sort_p": "sorting:estimate_sort",
    "smalti.vocabulary.sorting:sort_index_p": "sorting:estimate_sort_index",
    "jax._src.lax.lax:top_k_p": "sorting:estimate_top_k",
    # dot_general of register values (dot.py)
    "jax._src.lax.lax:dot_general_p": "dot:estimate_dot_general",
}


#: Rewrites of the jaxprs Pallas lowers (name -> ``"module:function"``):
#: equation pairs fused into one the plugin lowers well.
JAXPR_REWRITES: dict[str, str] = {
    # jnp.repeat / interleaves along the minor axis as one permute (repeats.py)
    "repeats": "repeats:fuse",
    # jnp.argsort's iota and unread outputs of lax.sort (sorting.py)
    "argsort": "sorting:fuse",
    # scatters of one element per row or column as a select (line_scatter.py)
    "line_scatter": "line_scatter:fuse",
}


#: The modules holding constraint and lowering rules for the dialect ops the
#: vocabulary emits that :mod:`smalti.plugins` has no rule for (each has
#: ``register_constraints`` and ``register_lowerings``; none imports Pallas).
RULE_MODULES = (math_ops, gather_ops,)


@hookimpl
def smalti_register_constraint_rules(registry: ConstraintRegistry) -> None:
    for module in RULE_MODULES:
        module.register_constraints(registry)


@hookimpl
def smalti_register_lowering_rules(registry: LoweringRegistry) -> None:
    for module in RULE_MODULES:
        module.register_lowerings(registry)


def _or_jax(rule: Callable[..., Any]) -> Callable[..., Any]:
    """A Pallas rule of the plugin that never takes away what jax lowers:
    where it refuses (SM206), jax's own rule for the primitive (if Pallas
    has one) gets the equation; only if that raises too, or where the
    refusal knows that jax's rule cannot work (``refuse(...,
    jax_cannot=True)``), is the plugin's refusal (which says what to write
    instead) raised."""
    from smalti.diagnostics import SmaltiNotImplementedError

    def call(ctx: Any, *args: Any, **params: Any) -> Any:
        try:
            return rule(ctx, *args, **params)
        except SmaltiNotImplementedError as refusal:
            if refusal.code != "SM206" or getattr(refusal, "jax_cannot", False):
                raise
            from smalti.jax import replaced_rule

            jax_rule = replaced_rule(ctx.prim)
            if jax_rule is None:
                raise
            try:
                return jax_rule(ctx, *args, **params)
            except Exception as e:  # noqa: BLE001 -- jax cannot either: the plugin's reason
                raise refusal from e

    return functools.wraps(rule)(call)


#: What jax's own Pallas has since 0.12, so the vocabulary's rule is for
#: earlier jax only: functions with custom derivatives lower to their body,
#: and reduce_prod reserves its scratch, in jax 0.12 itself.
ONLY_BEFORE_0_12 = frozenset({
    "jax._src.custom_derivatives:custom_jvp_call_p",
    "jax._src.custom_derivatives:custom_vjp_call_p",
    "jax._src.lax.lax:reduce_prod_p",
})


#: Primitives jax has only since 0.12.
ONLY_SINCE_0_12 = frozenset({"jax._src.lax.lax:polynomial_p"})


def _versions(primitive: str) -> JaxVersions:
    if primitive in ONLY_BEFORE_0_12:
        return BEFORE_0_12
    return SINCE_0_12 if primitive in ONLY_SINCE_0_12 else ANY_JAX


@hookimpl
def smalti_register_pallas_lowerings(registry: PallasRegistry) -> None:
    for primitive, reference in PRIMITIVES.items():
        registry.pallas_lowering(primitive, jax=_versions(primitive))(
            _or_jax(deferred(f"{__name__}.{reference}")))
    for primitive, reference in RESOURCE_ESTIMATORS.items():
        registry.resource_estimator(primitive, jax=_versions(primitive))(
            deferred(f"{__name__}.{reference}"))
    for name, reference in JAXPR_REWRITES.items():
        registry.jaxpr_rewrite(name)(deferred(f"{__name__}.{reference}"))
