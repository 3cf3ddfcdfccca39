"""smalti in place of jax's middle-end, everywhere jax's tests reach it.

:class:`DropIn` replaces, while it is active:

- ``mgpu.infer_layout`` (also as ``layout_inference.infer_layout``) with
  :func:`smalti.infer_layouts`, taking jax's ``fuel=`` and ``arch=``;
- ``mgpu.lower_mgpu_dialect`` (also as ``dialect_lowering.lower_mgpu_dialect``)
  with :func:`smalti.lower`;
- the Warpgroup pipeline of ``mgpu.as_gpu_kernel`` and of Pallas, through
  :func:`smalti.jax.install`.

The pipeline is smalti's plugins plus the rules tests registered through
jax's private registry (:mod:`smalti.conformance.bridge`): :meth:`refresh`,
called before each test, rebuilds it when those change. Leaving the context
puts back exactly what was there.
"""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType
from typing import Any

import jax.experimental.mosaic.gpu as mgpu
from jax.experimental.mosaic.gpu import dialect_lowering as jax_lowering
from jax.experimental.mosaic.gpu import layout_inference as jax_inference

import smalti.jax
from smalti.conformance import bridge
from smalti.inference import infer_layouts
from smalti.lowering import lower
from smalti.pipeline import build_pipeline

_REPLACED = (
    (mgpu, "infer_layout"),
    (jax_inference, "infer_layout"),
    (mgpu, "lower_mgpu_dialect"),
    (jax_lowering, "lower_mgpu_dialect"),
)


class DropIn:
    """``with DropIn() as drop_in: ...`` — smalti wherever jax's tests call
    jax's inference or lowering. ``on_fallbacks`` is told the SM002 texts of
    each call that handled an op with a rule for another architecture."""

    def __init__(self, on_fallbacks: Callable[[list[str]], None] | None = None) -> None:
        self.base = build_pipeline()
        self.pipeline = self.base
        self.on_fallbacks = on_fallbacks
        self._baseline = dict(bridge.jax_registry())
        self._bridged: dict[str, bridge.JaxRule] = {}
        self._saved: list[tuple[Any, str, Any]] = []

    # --- the replacements ----------------------------------------------------------

    def infer_layout(self, module: Any, *, fuel: int | None = None,
                     arch: tuple[int, int] = (9, 0)) -> None:
        """``mgpu.infer_layout``'s signature, smalti's inference."""
        report = infer_layouts(module, arch=arch, fuel=fuel, pipeline=self.pipeline)
        self._fallbacks(report.arch_fallbacks)

    def lower_mgpu_dialect(self, module: Any, launch_context: Any,
                           auto_barriers: bool = True) -> None:
        """``mgpu.lower_mgpu_dialect``'s signature, smalti's lowering."""
        report = lower(module, launch_context, auto_barriers=auto_barriers,
                       pipeline=self.pipeline)
        self._fallbacks(report.arch_fallbacks)

    def _fallbacks(self, texts: list[str]) -> None:
        if texts and self.on_fallbacks is not None:
            self.on_fallbacks(texts)

    # --- the pipeline ----------------------------------------------------------------

    def refresh(self) -> None:
        """Brings the pipeline up to date with the rules in jax's registry."""
        rules = bridge.registered_rules(self._baseline)
        if rules == self._bridged:
            return
        self._bridged = rules
        if rules:
            plugin = bridge.plugin(rules, self.base)
            self.pipeline = build_pipeline(plugins={bridge.PLUGIN_NAME: plugin})
        else:
            self.pipeline = self.base
        smalti.jax.uninstall()
        smalti.jax.install(self.pipeline)

    # --- the context -----------------------------------------------------------------

    def __enter__(self) -> DropIn:
        for owner, name in _REPLACED:
            self._saved.append((owner, name, getattr(owner, name)))
            setattr(owner, name, getattr(self, name))
        smalti.jax.install(self.pipeline)
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        smalti.jax.uninstall()
        for owner, name, original in reversed(self._saved):
            setattr(owner, name, original)
        self._saved.clear()

