"""smalti: a plugin-based middle-end for JAX's Mosaic GPU.

``infer_layouts(module, arch=...)`` assigns layouts like
``jax.experimental.mosaic.gpu.infer_layout``; ``lower(module, launch_ctx)``
lowers like ``lower_mgpu_dialect``. Every per-op rule comes from a plugin
(see :mod:`smalti.hookspec`).
"""

from __future__ import annotations

from importlib import metadata

from smalti.diagnostics import (
    PluginError,
    SmaltiError,
    SmaltiNotImplementedError,
    SmaltiValueError,
    UnsatisfiableLayoutsError,
)
from smalti.hookspec import HOOK_VERSION, hookimpl
from smalti.inference import InferenceReport, infer_layouts
from smalti.lowering import LoweringReport, lower
from smalti.pipeline import Pipeline, build_pipeline, default_pipeline
from smalti.registry import (
    ANY_ARCH,
    BLACKWELL_AND_LATER,
    HOPPER_AND_LATER,
    Architectures,
)

try:
    __version__ = metadata.version("smalti")
except metadata.PackageNotFoundError:  # running from a source tree
    __version__ = "0+unknown"

__all__ = [
    "ANY_ARCH",
    "Architectures",
    "BLACKWELL_AND_LATER",
    "HOOK_VERSION",
    "HOPPER_AND_LATER",
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
