"""Routing jax's own Mosaic GPU pipeline through smalti.

After :func:`install`, every Warpgroup-semantics kernel jax compiles —
``mgpu.as_gpu_kernel(..., thread_semantics=Warpgroup)`` and Pallas Mosaic GPU
kernels with ``LoweringSemantics.Warpgroup`` — has its layouts inferred and
its dialect lowered by smalti, and the plugins' Pallas primitive lowerings
are in force. :func:`uninstall` puts back exactly what was there::

    with smalti.jax.installed():
        jax.jit(kernel).lower(...)

A plugin's Pallas lowering may emit ops of a dialect MLIR does not know (its
own): from the call until smalti has lowered the kernel, the MLIR context
allows unregistered dialects, then the setting is put back.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Iterator
from typing import Any

from jax._src.lib import mosaic_gpu_dialect as dialect
from jax._src.lib.mlir import ir
from jax.experimental.mosaic.gpu import core as mgpu_core
from jax.experimental.mosaic.gpu import launch_context as lc
from jax.experimental.mosaic.gpu import utils as mgpu_utils

from smalti import escaped, kernels
from smalti.inference import infer_layouts
from smalti.lowering import lower
from smalti.pipeline import Pipeline, default_pipeline
from smalti.registry import RuleKind, RuleRecord, resolve

_MISSING = object()
_lock = threading.RLock()
_state: dict[str, Any] = {"depth": 0}


def _dump(module: ir.Module, options: Any, suffix: str) -> None:
    if options is not None and options.mlir_passes:
        mgpu_utils.dump_to_file_or_stdout(
            str(module), f"{options.module_basename}.{suffix}.txt", options.dump_path)


def _lower_mgpu_module_with(pipeline: Pipeline, original: Any):
    def lower_mgpu_module(module: ir.Module, launch_ctx: lc.LaunchContext,
                          lowering_semantics: mgpu_core.LoweringSemantics, *,
                          auto_barriers: bool = True) -> None:
        if lowering_semantics != mgpu_core.LoweringSemantics.Warpgroup:
            return original(module, launch_ctx, lowering_semantics,
                            auto_barriers=auto_barriers)
        options = dialect.get_or_set_dump_options(module)
        # Dead code that inference cannot type must go first, as in jax.
        kernels.canonicalize(module)
        _dump(module, options, "before_layout_inference")  # jax's file names
        try:
            major, minor = mgpu_utils._infer_arch()
            infer_layouts(module, arch=(major, minor), pipeline=pipeline)
            _dump(module, options, "after_layout_inference")
            lower(module, launch_ctx, auto_barriers=auto_barriers, pipeline=pipeline)
        finally:
            _restore_unregistered_dialects()  # the plugins' ops are lowered (or failed)
        launch_ctx.scratch.finalize_size()
        try:
            module.operation.verify()
        except ir.MLIRError as e:
            raise mgpu_core.error.mlir_error_to_verification_error(e) from e

    lower_mgpu_module.__wrapped__ = original  # type: ignore[attr-defined]
    return lower_mgpu_module


def _allowing_unregistered_dialects(lowering: Any, primitive: Any) -> Any:
    """``lowering`` (a plugin's Pallas lowering of ``primitive``), run in a
    context that accepts ops of unregistered dialects until smalti has
    lowered the kernel, and guarded (:func:`smalti.escaped.guarded`)."""
    guarded = escaped.guarded(primitive, lowering)

    @functools.wraps(lowering)
    def wrapper(ctx: Any, *args: Any, **params: Any) -> Any:
        context = ir.Context.current
        assert context is not None  # Pallas lowers inside its module's context
        opened = _state.setdefault("opened", [])
        if not any(c is context for c, _ in opened):
            # jax reuses its contexts: remember the setting to put it back.
            opened.append((context, context.allow_unregistered_dialects))
        context.allow_unregistered_dialects = True
        return guarded(ctx, *args, **params)

    wrapper.smalti_guarded = True  # type: ignore[attr-defined]
    return wrapper


def _restore_unregistered_dialects() -> None:
    for context, previous in reversed(_state.pop("opened", [])):
        context.allow_unregistered_dialects = previous


class _RulesWithRefusal(dict):
    """Pallas' Warpgroup rule table while smalti is installed: the same
    rules, and for a primitive that neither jax nor a plugin lowers, a rule
    that raises smalti's SM206 (a ``NotImplementedError`` with jax's phrase,
    the kernel's line and what to do) instead of Pallas' bare error. Every
    rule it hands out is :func:`smalti.escaped.guarded`: a jax error that
    escapes the rule is SM207. Pallas asks ``primitive in table`` and then
    ``table[primitive]``."""

    def __contains__(self, primitive: object) -> bool:
        return True

    def __getitem__(self, primitive: Any) -> Any:
        # jax errors escaping the rule become smalti errors (SM207); one
        # guard per rule, so that a rule looked up twice is the same object
        rule = super().__getitem__(primitive)
        if getattr(rule, "smalti_guarded", False):
            return rule
        guards = self.__dict__.setdefault("guards", {})
        cached = guards.get(primitive)
        if cached is None or cached[0] is not rule:
            cached = guards[primitive] = (rule, escaped.guarded(primitive, rule))
        return cached[1]

    def __missing__(self, primitive: Any) -> Any:
        return functools.partial(_refuse_unlowered, primitive)


def _refuse_unlowered(primitive: Any, ctx: Any, *args: Any, **params: Any) -> Any:
    from smalti.diagnostics import SmaltiNotImplementedError, format_location

    try:
        location = format_location(ir.Location.current)
    except ValueError:
        location = None
    operands = ", ".join(a.str_short() for a in getattr(ctx, "avals_in", ()))
    name = getattr(primitive, "name", str(primitive))
    raise SmaltiNotImplementedError(
        "SM206", f"Unimplemented primitive in Pallas Mosaic GPU lowering: {name} "
        "(with Warpgroup semantics; neither jax nor an installed smalti plugin lowers it)",
        location=location, values={"primitive": name, "operands": operands},
        fix=["write it with functions that lower (docs/vocabulary.md lists what "
             "smalti.vocabulary adds)",
             "or lower it in a plugin: registry.pallas_lowering(primitive) in "
             "smalti_register_pallas_lowerings (docs/writing-plugins.md)"])


def _swap_pallas_rule_table(install: bool) -> None:
    """Puts :class:`_RulesWithRefusal` in place of Pallas' Warpgroup table, or
    the original back (with any rule jax registered meanwhile)."""
    from jax._src.pallas.mosaic_gpu import core as gpu_core
    from jax._src.pallas.mosaic_gpu import lowering as pallas_lowering

    tables = pallas_lowering.mosaic_lowering_rules
    current = tables[gpu_core.WGxWG_SEMANTICS]
    if install:
        _state["pallas_rules"] = current
        tables[gpu_core.WGxWG_SEMANTICS] = _RulesWithRefusal(current)
        return
    original = _state.pop("pallas_rules")
    for primitive, rule in current.items():
        if not dict.__contains__(original, primitive):
            original[primitive] = rule  # registered by a jax module imported meanwhile
    tables[gpu_core.WGxWG_SEMANTICS] = original


def _pallas_tables() -> dict[RuleKind, dict[Any, Any]]:
    """Pallas' tables that plugins add to: Warpgroup lowerings and resource
    estimators, each keyed by primitive."""
    from jax._src.pallas.mosaic_gpu import core as gpu_core
    from jax._src.pallas.mosaic_gpu import lowering as pallas_lowering

    return {
        RuleKind.PALLAS: pallas_lowering.mosaic_lowering_rules[gpu_core.WGxWG_SEMANTICS],
        RuleKind.PALLAS_RESOURCES: pallas_lowering._resource_estimators,
    }


def replaced_rule(primitive: Any) -> Any:
    """The Pallas Warpgroup lowering that a plugin's rule for ``primitive``
    replaced while smalti is installed (jax's own, or ``None`` where Pallas
    has none), so that the plugin can hand it the cases jax handles."""
    primitive = resolve(primitive)
    for table, saved, previous in _state.get("saved", ()):
        if saved is primitive and table is _pallas_tables()[RuleKind.PALLAS]:
            return None if previous is _MISSING else previous
    table = _pallas_tables()[RuleKind.PALLAS]
    return table[primitive] if dict.__contains__(table, primitive) else None


def _rewritten(record: RuleRecord, jaxpr: Any) -> Any:
    """``jaxpr`` after the rewrite of ``record``; a rewrite that raises, or
    returns other than ``None`` or a jaxpr with the same variables, is a bug
    of its plugin (SM006)."""
    from jax._src import core as jax_core

    from smalti.diagnostics import PluginError, SmaltiError

    fix = [f"fix the rewrite {record.name}",
           f"or block the plugin: SMALTI_BLOCK_PLUGINS={record.plugin}"]
    try:
        new = record.function(jaxpr)
    except SmaltiError:
        raise
    except Exception as e:  # noqa: BLE001 -- any failure of a plugin's rewrite is reported as such
        raise PluginError("SM006", f"plugin {record.plugin!r}'s jaxpr rewrite {record.key!r} "
                          f"raised {type(e).__name__}: {e}",
                          values={"rewrite": record.name}, fix=fix) from e
    if new is None:
        return jaxpr
    same = isinstance(new, jax_core.Jaxpr) and all(
        list(getattr(new, part)) == list(getattr(jaxpr, part))
        for part in ("constvars", "invars", "outvars"))
    if not same:
        raise PluginError("SM006", f"plugin {record.plugin!r}'s jaxpr rewrite {record.key!r} "
                          f"returned {type(new).__name__}, not None or a jaxpr with the "
                          "same constvars, invars and outvars as the one it was given",
                          values={"rewrite": record.name}, fix=fix)
    return new


def _lower_jaxpr_with(rewrites: list[RuleRecord], original: Any) -> Any:
    """Pallas' ``lower_jaxpr_to_mosaic_gpu``, with the plugins' jaxpr
    rewrites (:meth:`smalti.registry.PallasRegistry.jaxpr_rewrite`) applied
    first to every jaxpr lowered with the Warpgroup rule table (the one
    plugins add to): a kernel's body and, since Pallas lowers nested
    jaxprs through the same function, each of theirs."""
    from jax._src.pallas.mosaic_gpu import core as gpu_core

    @functools.wraps(original)
    def lower_jaxpr_to_mosaic_gpu(module_ctx: Any, launch_ctx: Any, jaxpr: Any,
                                  *args: Any, **kwargs: Any) -> Any:
        semantics = (module_ctx.lowering_semantics, module_ctx.primitive_semantics)
        if semantics == gpu_core.WGxWG_SEMANTICS:
            for record in rewrites:
                jaxpr = _rewritten(record, jaxpr)
        return original(module_ctx, launch_ctx, jaxpr, *args, **kwargs)

    return lower_jaxpr_to_mosaic_gpu


def _swap_jaxpr_lowering(pipeline: Pipeline | None) -> None:
    """Puts the rewriting ``lower_jaxpr_to_mosaic_gpu`` in place where the
    pipeline has jaxpr rewrites (``pipeline``), or the original back (``None``)."""
    from jax._src.pallas.mosaic_gpu import lowering as pallas_lowering

    if pipeline is None:
        original = _state.pop("lower_jaxpr", None)
        if original is not None:
            pallas_lowering.lower_jaxpr_to_mosaic_gpu = original
        return
    rewrites = [records[0] for records in pipeline.rules[RuleKind.PALLAS_REWRITE].values()]
    if rewrites:
        _state["lower_jaxpr"] = original = pallas_lowering.lower_jaxpr_to_mosaic_gpu
        pallas_lowering.lower_jaxpr_to_mosaic_gpu = _lower_jaxpr_with(rewrites, original)


def is_installed() -> bool:
    return _state["depth"] > 0


def install(pipeline: Pipeline | None = None) -> None:
    """Routes jax's Warpgroup-semantics pipeline through smalti (reentrant)."""
    with _lock:
        if _state["depth"] == 0:
            pipeline = pipeline or default_pipeline()
            original = mgpu_core.lower_mgpu_module
            _swap_pallas_rule_table(install=True)
            saved = []
            for kind, table in _pallas_tables().items():
                for records in pipeline.rules[kind].values():
                    for record in records:
                        primitive = resolve(record.target)
                        saved.append((table, primitive, table.get(primitive, _MISSING)))
                        table[primitive] = _allowing_unregistered_dialects(
                            record.function, primitive) \
                            if kind is RuleKind.PALLAS else record.function
            mgpu_core.lower_mgpu_module = _lower_mgpu_module_with(pipeline, original)
            _swap_jaxpr_lowering(pipeline)
            _state.update(original=original, saved=saved, pipeline=pipeline)
        _state["depth"] += 1


def uninstall() -> None:
    """Undoes the matching :func:`install`; the last one restores jax exactly."""
    with _lock:
        if _state["depth"] == 0:
            return
        _state["depth"] -= 1
        if _state["depth"]:
            return
        mgpu_core.lower_mgpu_module = _state.pop("original")
        _swap_jaxpr_lowering(None)
        _restore_unregistered_dialects()
        for table, primitive, previous in reversed(_state.pop("saved")):
            if previous is _MISSING:
                table.pop(primitive, None)
            else:
                table[primitive] = previous
        _swap_pallas_rule_table(install=False)
        _state.pop("pipeline")


@contextlib.contextmanager
def installed(pipeline: Pipeline | None = None) -> Iterator[None]:
    """``with smalti.jax.installed(): ...`` — smalti for the duration of the block."""
    install(pipeline)
    try:
        yield
    finally:
        uninstall()
