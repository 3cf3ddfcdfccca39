"""Hook specifications: the whole interface between smalti and its plugins.

A plugin is a module (or any object) with functions named after these hooks
and marked with :data:`hookimpl`, published in the ``smalti`` entry-point group
of its distribution::

    [project.entry-points.smalti]
    my_plugin = "my_package.smalti_plugin"

All hooks are *registration* hooks: smalti calls each once, when it builds a
pipeline, with a typed registry bound to the calling plugin. The plugin adds
its rules to the registry; smalti then compiles every plugin's rules into
dispatch tables keyed by op name. No hook is called per op.

A plugin may set ``SMALTI_HOOK_VERSION = N`` to the version of this
specification it was written for (:data:`HOOK_VERSION`); a plugin written for
a newer specification than this smalti understands is rejected with a clear
message instead of failing half-way.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from smalti.registry import ConstraintRegistry, LoweringRegistry, PallasRegistry

PROJECT_NAME = "smalti"
ENTRY_POINT_GROUP = "smalti"

#: The version of the hook specification below. Bumped when a hook changes
#: incompatibly; plugins declare the version they target as SMALTI_HOOK_VERSION.
HOOK_VERSION = 1

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


@hookspec
def smalti_register_constraint_rules(registry: ConstraintRegistry) -> None:
    """Register layout-inference (constraint) rules.

    A constraint rule states, in the constraint language of
    :mod:`smalti.constraints`, what layouts an op's vector operands and
    results, SMEM refs and TMEM refs may have. It is called once per op
    during inference as ``rule(op, builder)`` with the op (an
    ``ir.OpView``) and a :class:`smalti.rules.ConstraintBuilder`, and must
    give every vector / SMEM / TMEM operand and result of the op a variable::

        @registry.constraint_rule("arith.addf", "arith.mulf")
        def same_layout(op, b):
            b.variable(*b.layout_sites())

    :param registry: the plugin's
        :class:`smalti.registry.ConstraintRegistry`. Add rules with the
        decorator ``registry.constraint_rule(*op_names, **options)`` or with
        ``registry.add(op_name, rule, **options)``. Every option may be left
        out (:class:`smalti.registry.ConstraintOptions`):

        - ``archs``: the GPU architectures the rule supports, a
          :class:`smalti.registry.Architectures` (default: any);
        - ``overrides``: the name of the plugin whose rule for the same op
          this one replaces (default: none; two plugins claiming one op on
          overlapping architectures are otherwise an error);
        - ``opaque_regions``: ``True`` if the op's regions hold Lane-level
          code, which inference does not enter (default ``False``; a rule
          may also say so for one op with ``builder.opaque_regions()``);
        - ``jax``: the jax versions the rule is for, a
          :class:`smalti.registry.JaxVersions`; a pipeline built under
          another jax leaves the rule out (default: any).
    """


@hookspec
def smalti_register_lowering_rules(registry: LoweringRegistry) -> None:
    """Register lowering rules, from Warpgroup- to Lane-semantics IR.

    A lowering rule is called once per op during lowering as
    ``rule(ctx, op)`` with a :class:`smalti.rules.LoweringContext` (the launch
    context, the predicates, helpers to turn IR values into Mosaic GPU
    ``FragmentedArray`` objects and back) and the op, with the insertion
    point set before the op. It returns the values that replace the op's
    results (one per result), after which smalti erases the op; or
    :data:`smalti.rules.RECURSED` if it rewrote the op in place itself::

        @registry.lowering_rule("arith.addf")
        def lower_addf(ctx, op):
            lhs, rhs = ctx.operand_arrays(op)
            return [ctx.to_ir(lhs + rhs, op.result.type)]

    :param registry: the plugin's :class:`smalti.registry.LoweringRegistry`.
        Add rules with the decorator ``registry.lowering_rule(*op_names,
        **options)`` or with ``registry.add(op_name, rule, **options)``.
        Every option may be left out
        (:class:`smalti.registry.LoweringOptions`):

        - ``archs``, ``overrides``, ``opaque_regions`` and ``jax``: as for
          constraint rules (:func:`smalti_register_constraint_rules`);
          ``opaque_regions=True`` also keeps lowering's checks out of the
          op's regions;
        - ``warp_semantics``: ``True`` if the rule also lowers its op inside
          a ``mosaic_gpu.warp_map``, where ``ctx.thread_semantics`` is WARP
          (default ``False``: such an op is refused there, SM204);
        - ``warp_regions``: ``True`` if the rule lowers the op's regions
          under warp semantics (as ``mosaic_gpu.warp_map``'s does): every op
          inside them then needs a rule registered with ``warp_semantics``
          (default ``False``);
        - ``check``: a function ``check(op)`` that raises a smalti error for
          an op the rule cannot lower, for a reason visible before
          rewriting; lowering runs it on every op of the rule before it
          rewrites anything, so that no module is left half-lowered
          (default: none).

        Declare with ``registry.require_lowering(prefix)`` that every op
        whose name starts with ``prefix`` (e.g. ``"mosaic_gpu."``) must be
        lowered by some rule.
    """


@hookspec
def smalti_register_pallas_lowerings(registry: PallasRegistry) -> None:
    """Register Warpgroup-semantics lowerings of Pallas Mosaic GPU primitives.

    While smalti is installed into jax (:func:`smalti.jax.install`), Pallas
    lowers each registered primitive with the plugin's function instead of
    its own, so that a plugin can offer a new op to Pallas users as a plain
    Python function. The function has the signature of a Pallas Mosaic GPU
    lowering rule: ``fn(ctx, *args, **params)`` returning the result
    ``ir.Value`` (or a sequence of them).

    A primitive whose lowering takes scratch SMEM, or whose parameters hold
    a jaxpr, also needs a resource estimator: Pallas sizes a kernel's scratch
    before lowering it, counting primitives it has no estimator for as free
    and refusing those that carry a jaxpr. Its signature is Pallas':
    ``fn(ctx, *avals, **params)`` returning Pallas' ``Resources``.

    A plugin may also rewrite the jaxprs Pallas lowers before their
    equations are lowered (fusing equations that are costly to lower one at
    a time): ``fn(jaxpr)`` returning a jaxpr with the same variables that
    computes the same values, or ``None``.

    :param registry: the plugin's :class:`smalti.registry.PallasRegistry`.
        Add lowerings with the decorator
        ``registry.pallas_lowering(primitive, **options)``, estimators
        with ``registry.resource_estimator(primitive, **options)`` and
        rewrites with ``registry.jaxpr_rewrite(name, **options)`` (applied
        in plugin order to every Warpgroup-semantics jaxpr, nested ones
        included; Pallas sizes scratch from the jaxpr before them);
        ``primitive`` is the primitive object or a ``"module:attribute"``
        reference to it, resolved only when smalti is installed into jax;
        a function whose module imports Pallas is best given as
        ``smalti.registry.deferred("module:function")``, imported on its
        first call. Every option may be left out
        (:class:`smalti.registry.PallasOptions`):

        - ``overrides``: the name of the plugin whose rule for the same
          primitive this one replaces (default: none);
        - ``jax``: the jax versions the rule is for, a
          :class:`smalti.registry.JaxVersions` (default: any).
    """
