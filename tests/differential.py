"""Differential testing against jax's own Mosaic GPU middle-end (the reference).

Only tests may import jax's ``layout_inference`` / ``dialect_lowering``: they
are what smalti must agree with.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence

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


def build_twice(body: Callable[..., None], in_shapes: Sequence[jax.ShapeDtypeStruct],
                out_shapes: Sequence[jax.ShapeDtypeStruct], smem_scratch=()
                ) -> tuple[kernels.Kernel, kernels.Kernel]:
    """The same kernel twice: one for jax, one for smalti."""
    reference = kernels.build_kernel(body, in_shapes, out_shapes, smem_scratch=smem_scratch)
    candidate = kernels.build_kernel(body, in_shapes, out_shapes, smem_scratch=smem_scratch)
    assert normalized(reference.module) == normalized(candidate.module)
    return reference, candidate


def walk_ops(module: ir.Module) -> Iterator[ir.Operation]:
    """Every op of ``module``, in pre-order."""
    def visit(op: ir.Operation) -> Iterator[ir.Operation]:
        yield op
        for region in op.regions:
            for block in region.blocks:
                for child in block.operations:
                    yield from visit(child.operation)

    for op in module.body.operations:
        yield from visit(op.operation)


def ops_named(module: ir.Module, name: str) -> list[ir.Operation]:
    return [op for op in walk_ops(module) if op.name == name]


def assert_same_as_jax(
    body: Callable[..., None],
    in_shapes: Sequence[jax.ShapeDtypeStruct],
    out_shapes: Sequence[jax.ShapeDtypeStruct],
    *,
    lower: bool = True,
    arch=(9, 0),
    smem_scratch=(),
) -> tuple[kernels.Kernel, kernels.Kernel]:
    """Builds the kernel twice; checks smalti's inferred attributes and lowered
    module equal jax's. Returns (jax's kernel, smalti's kernel)."""
    reference, candidate = build_twice(body, in_shapes, out_shapes, smem_scratch)
    jax_infer(reference, arch)
    smalti_infer(candidate, arch)
    assert normalized(candidate.module) == normalized(reference.module), "inferred layouts differ"
    if lower:
        jax_lower(reference)
        smalti_lower(candidate)
        assert normalized(candidate.module) == normalized(reference.module), "lowered IR differs"
    return reference, candidate
