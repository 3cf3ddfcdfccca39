"""Differential testing against jax's own Mosaic GPU middle-end (the reference).

Only tests may import jax's ``layout_inference`` / ``dialect_lowering``: they
are what smalti must agree with.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

import jax
from jax._src.lib.mlir import ir
from jax.experimental.mosaic import gpu as mgpu

import smalti
from smalti import kernels

_DUMP_NAME = re.compile(r', mosaic_gpu.dump_basename = "[^"]*"')


def normalized(module: ir.Module) -> str:
    """Module text without the per-process dump counter jax stamps on modules."""
    return _DUMP_NAME.sub("", str(module))


def jax_infer(kernel: kernels.Kernel, arch=(9, 0)) -> None:
    with kernel.context, ir.Location.unknown(kernel.context):
        mgpu.infer_layout(kernel.module, arch=arch)


def jax_lower(kernel: kernels.Kernel) -> None:
    with kernel.context, ir.Location.unknown(kernel.context):
        mgpu.lower_mgpu_dialect(kernel.module, kernel.launch_context)


def smalti_infer(kernel: kernels.Kernel, arch=(9, 0)) -> None:
    smalti.infer_layouts(kernel.module, arch=arch)


def smalti_lower(kernel: kernels.Kernel) -> None:
    smalti.lower(kernel.module, kernel.launch_context)


def assert_same_as_jax(
    body: Callable[..., None],
    in_shapes: Sequence[jax.ShapeDtypeStruct],
    out_shapes: Sequence[jax.ShapeDtypeStruct],
    *,
    lower: bool = True,
    arch=(9, 0),
) -> tuple[kernels.Kernel, kernels.Kernel]:
    """Builds the kernel twice; checks smalti's inferred attributes and lowered
    module equal jax's. Returns (jax's kernel, smalti's kernel)."""
    reference = kernels.build_kernel(body, in_shapes, out_shapes)
    candidate = kernels.build_kernel(body, in_shapes, out_shapes)
    assert normalized(reference.module) == normalized(candidate.module)
    jax_infer(reference, arch)
    smalti_infer(candidate, arch)
    assert normalized(candidate.module) == normalized(reference.module), "inferred layouts differ"
    if lower:
        jax_lower(reference)
        smalti_lower(candidate)
        assert normalized(candidate.module) == normalized(reference.module), "lowered IR differs"
    return reference, candidate
