"""smalti: a plugin-based middle-end for JAX's Mosaic GPU.

``infer_layouts(module, arch=...)`` assigns layouts like
``jax.experimental.mosaic.gpu.infer_layout``; ``lower(module, launch_ctx)``
lowers like ``lower_mgpu_dialect``. Every per-op rule comes from a plugin
(see :mod:`smalti.hookspec`).
"""

from __future__ import annotations

import importlib
from importlib import metadata
from typing import TYPE_CHECKING, Any

from smalti.arch_policy import ArchitectureWarning
from smalti.diagnostics import (
    PluginError,
    SmaltiError,
    SmaltiNotImplementedError,
    SmaltiValueError,
    UnsatisfiableLayoutsError,
)
from smalti.hookspec import HOOK_VERSION, hookimpl
from smalti.pipeline import Pipeline, build_pipeline, default_pipeline
from smalti.registry import (
    ANY_ARCH,
    BLACKWELL_AND_LATER,
    HOPPER_AND_LATER,
    Architectures,
    JaxVersions,
)

if TYPE_CHECKING:
    from smalti.inference import InferenceReport, infer_layouts
    from smalti.lowering import LoweringReport, lower

# The drivers are imported on first use: building a pipeline (the plugins,
# `smalti plugins`) does not need them.
_DRIVERS = {
    "InferenceReport": "smalti.inference",
    "infer_layouts": "smalti.inference",
    "LoweringReport": "smalti.lowering",
    "lower": "smalti.lowering",
}


def __getattr__(name: str) -> Any:
    if name == "__version__":
        value = _version()
    else:
        module = _DRIVERS.get(name)
        if module is None:
            raise AttributeError(f"module 'smalti' has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def _version() -> str:
    # Read on first use: finding and parsing the distribution's metadata is
    # a millisecond that importing smalti to build a pipeline does not need.
    try:
        return metadata.version("smalti")
    except metadata.PackageNotFoundError:  # running from a source tree
        return "0+unknown"

__all__ = [
    "ANY_ARCH",
    "ArchitectureWarning",
    "Architectures",
    "BLACKWELL_AND_LATER",
    "HOOK_VERSION",
    "HOPPER_AND_LATER",
    "JaxVersions",
    "InferenceReport",
    "LoweringReport",
    "Pipeline",
    "PluginError",
    "SmaltiError",
    "SmaltiNotImplementedError",
    "SmaltiValueError",
    "UnsatisfiableLayoutsError",
    "build_pipeline",
    "default_pipeline",
    "hookimpl",
    "infer_layouts",
    "lower",
]
