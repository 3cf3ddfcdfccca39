"""Building Warpgroup-semantics Mosaic GPU kernel modules without a GPU.

:func:`build_kernel` runs a kernel body the way ``mgpu.as_gpu_kernel`` does
and returns the module *before* layout inference, with its launch context:
the input of ``smalti.infer_layouts`` and ``smalti.lower``. It is used by the
CLI's example, the test kit and the benchmarks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax._src.interpreters import mlir as mlir_interpreter
from jax._src.lib import mosaic_gpu_dialect as mgpu
from jax._src.lib.mlir import ir, passmanager
from jax._src.lib.mlir.dialects import arith
from jax._src.lib.mlir.dialects import math as mlir_math
from jax.experimental.mosaic.gpu import core as mgpu_core
from jax.experimental.mosaic.gpu import fragmented_array as fa
from jax.experimental.mosaic.gpu import launch_context as lc
from jax.experimental.mosaic.gpu import layouts as mgpu_layouts

from smalti.records import Fields


class Kernel(Fields):
    """A kernel module (Warpgroup semantics) and what lowering it needs."""

    __slots__ = ("context", "module", "launch_context")

    def __init__(self, context: ir.Context, module: ir.Module,
                 launch_context: lc.LaunchContext) -> None:
        self.context = context
        self.module = module
        self.launch_context = launch_context

    def text(self) -> str:
        return str(self.module)


def make_context() -> ir.Context:
    """A new MLIR context with every dialect a Mosaic GPU kernel may use.

    Not jax's shared context: callers may change its settings (e.g. allow
    unregistered dialects for a plugin's ops) without affecting jax.
    """
    context = ir.Context()
    context.append_dialect_registry(mlir_interpreter.upstream_dialects)
    mgpu.register_dialect(context)
    context.load_all_available_dialects()
    return context


def canonicalize(module: ir.Module) -> None:
    """The clean-up jax's pipeline runs before layout inference."""
    passmanager.PassManager.parse("builtin.module(canonicalize,cse)", module.context).run(
        module.operation)


def build_kernel(
    body: Callable[..., None],
    in_shapes: Sequence[jax.ShapeDtypeStruct],
    out_shapes: Sequence[jax.ShapeDtypeStruct],
    *,
    smem_scratch: Any = (),
    grid: tuple[int, int, int] = (1, 1, 1),
    cluster: tuple[int, int, int] = (1, 1, 1),
    block: tuple[int, int, int] = (128, 1, 1),
    name: str = "kernel",
    context: ir.Context | None = None,
) -> Kernel:
    """Traces ``body(launch_ctx, *refs, smem_refs)`` into a Warpgroup-semantics
    kernel module, canonicalized as jax's pipeline does before inference."""
    context = context or make_context()
    with context, ir.Location.unknown(context):
        module, _, _, launch_context = mgpu_core._lower_as_gpu_kernel(
            body, grid, cluster, block, tuple(in_shapes), tuple(out_shapes), (),
            smem_scratch, mgpu_core.LoweringSemantics.Warpgroup, name, name,
        )
        canonicalize(module)
    return Kernel(context, module, launch_context)


def example_kernel(shape: tuple[int, int] = (128, 128),
                   cast_to: fa.FragmentedLayout | None = fa.WGMMA_LAYOUT) -> Kernel:
    """The built-in example: ``out = exp(x) * 2 + y`` on f32, with ``x`` cast to
    ``cast_to`` (so inference has a layout to propagate), unless it is ``None``."""
    f32 = jax.ShapeDtypeStruct(shape, jnp.float32)

    def body(ctx, x_ref, y_ref, out_ref, smem):
        del ctx, smem
        x = mgpu.vector_load(x_ref)
        if cast_to is not None:
            x = mgpu.layout_cast(x, mgpu_layouts.to_layout_attr(cast_to))
        y = mgpu.vector_load(y_ref)
        two = arith.constant(x.type, ir.DenseElementsAttr.get_splat(
            x.type, ir.FloatAttr.get(ir.F32Type.get(), 2.0)))
        z = arith.addf(arith.mulf(mlir_math.exp(x), two), y)
        mgpu.vector_store(z, out_ref)

    return build_kernel(body, [f32, f32], [f32], name="smalti_example")
